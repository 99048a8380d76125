"""Running a connection's requests, in order, as HIP orders a client's calls.

One request path, taken two ways: the executor task (:meth:`RequestExecutor.run`) takes
each queued request and awaits its handler; in push mode the loop's I/O callback runs a
lone request itself (:meth:`RequestExecutor.answer_now`) when its handler has a
synchronous variant and nothing else of the connection is under way. Both decide the
same way which earlier fire-and-forget error a reply reports, which requests spend the
tenant's request rate, how a handler's failure becomes the reply's error
(:meth:`_handler_failed`), what a request leaves behind (:meth:`_settle`) and what its
reply is (:meth:`_reply_data`, kept for a resend).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import anyio

from hipr.errors import HipError, HipErrorCode, ProtocolError
from hipr.handlers.args import Args
from hipr.handlers.context import Reply, Request
from hipr.handlers.device_wait import LAUNCHES, WAITING, asks_to_wait, finish_waiting
from hipr.handlers.registry import LATER, HandlerRegistry
from hipr.observability.observer import WorkerObserver
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame, encode_frame_parts
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode, opcode_name
from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.reply_cache import MAX_ONE_REPLY
from hipr.sessions.state import DeferredError, Session, as_hip_error
from hipr.worker.express import ExpressLaunch
from hipr.worker.fairness import TurnMember, frame_charge
from hipr.worker.frame_queue import READ_AHEAD_BYTES, FrameQueue
from hipr.worker.link_reader import LinkReader
from hipr.worker.link_writer import LINK_ERRORS, LinkLost, LinkWriter
from hipr.worker.recovery import ContextRecovery
from hipr.worker.replay import answer_resent

__all__ = ["Closing", "RequestExecutor"]

_NO_REPLY = int(Flags.NO_REPLY)
_MORE = int(Flags.MORE)
_ERROR_REPLY = Flags.REPLY | Flags.ERROR
_REPLY = Flags.REPLY
#: Requests whose reply never reports a pending fire-and-forget error, and that spend
#: none of the tenant's request rate.
_NOT_SYNCHRONISING = frozenset({Opcode.PING, Opcode.GOODBYE, Opcode.BARRIER})
#: Requests that wait for the session's earlier work themselves: their own wait settles
#: the fire-and-forget calls before them, so the deferred error is read after they ran
#: (one GPU-thread round trip instead of two for a launch followed by a synchronize).
_SETTLED_BY_WAITING = frozenset(
    {Opcode.DEVICE_SYNCHRONIZE, Opcode.STREAM_SYNCHRONIZE, Opcode.EVENT_SYNCHRONIZE}
)
#: Requests that do not report the earlier fire-and-forget errors before they run.
_REPORTS_NOTHING_EARLIER = _NOT_SYNCHRONISING | _SETTLED_BY_WAITING


class Closing(Exception):
    """The connection must end (after a fatal protocol error or a goodbye)."""


class Worker(Protocol):
    """What the executor reads of the worker."""

    observer: WorkerObserver
    recovery: ContextRecovery
    busy_poll: BusyPoll


class RequestExecutor:
    """Runs one session's requests for its connection (module doc); the handlers' link
    (``hipr.handlers.context.RequestLink``)."""

    def __init__(
        self,
        worker: Worker,
        session: Session,
        registry: HandlerRegistry,
        reader: LinkReader,
        writer: LinkWriter,
        turns: TurnMember,
        log: Any,
    ) -> None:
        self.worker = worker
        self.session = session
        self.registry = registry
        self._reader = reader
        self._writer = writer
        self._send_lock = writer.lock
        self._frames: FrameQueue = reader.frames
        self._decoder: FrameDecoder = reader.decoder
        self._turns = turns
        self._log = log
        #: The executor waits for its next request (none is under way): the I/O
        #: callback may answer a lone request itself.
        self.between_requests = False
        #: Worker shutdown or a lost context: finish the request under way, take no more.
        self.draining = False
        #: A GOODBYE is under way or done: the session ends with the connection, even if
        #: the worker is cancelled before the executor returns.
        self.ends_session = False
        #: The last request run was refused by max_request_rate: throttle before the next.
        self._rate_refused = False
        #: The request under way sent part of its reply already (``send_chunk``).
        self._streamed_reply = False
        #: (request id, reply bytes) of a reply the session's GPU thread sent itself
        #: (``answer_from_gpu_thread``); written by that thread, taken by the executor.
        self._answered_early: tuple[int, bytes] | None = None
        # Read once: a log line per request only when someone asked for debug logs.
        self._log_requests = logging.getLogger("hipr.connection").isEnabledFor(logging.DEBUG)
        #: Where the backend has the native launch-and-wait, the express path of a lone
        #: LAUNCH_KERNEL with ``synchronize`` or small MEMCPY_DTOH (``hipr.worker.express``).
        self._express = (
            ExpressLaunch(self, reader.decoder)
            if getattr(session.backend, "native_launch", False)
            else None
        )

    # --- the executor task ----------------------------------------------------------
    async def run(self) -> bool:
        """Run requests until the queue ends or a drain; False when the session must
        end (a goodbye)."""
        while not self.draining:
            self.between_requests = True
            try:
                frame = await self._next_frame()
            except anyio.EndOfStream:
                return True
            finally:
                self.between_requests = False
            if not await self.execute(frame):
                return False
            if self._rate_refused:
                self._rate_refused = False
                await self._throttle()
        return True

    async def _next_frame(self) -> Frame:
        """The next queued frame, released from the in-flight count."""
        session = self.session
        frames = self._frames
        frame = frames.take()
        if frame is None:
            session.flush_posts()  # nothing more queued: start what was posted
            frame = await frames.get()
            self._turns.rested()
        elif self._turns.spent():
            await self._next_turn()
        size = frame_charge(frame.header.payload_length)
        inflight = frames.inflight
        if inflight > READ_AHEAD_BYTES >= inflight - size:
            frames.drained.set()
            frames.drained = anyio.Event()
        frames.inflight = inflight - size
        session.gate.release_inflight(size)
        reader = self._reader
        if reader.held_frame is not None:
            reader.pump()
        # A fire-and-forget request already read behind this one: fire-and-forget calls
        # go to the GPU thread in a batch, overlapping with the loop decoding the next
        # frames. Not when a reply-awaiting request is next (the synchronize after a
        # launch): that one waits for the call anyway, and finds it done inline instead
        # of after two thread hand-offs.
        session.burst = frames.fire_and_forget_next()
        return frame

    async def _next_turn(self) -> None:
        """The executor's slice ran out with requests still queued: let the other
        connections in (``hipr.worker.fairness``), then go on."""
        session = self.session
        session.flush_posts()  # what this slice posted runs meanwhile
        self._turns.weigh(session.gate.quotas.weight)
        await self._turns.next_turn()

    async def _throttle(self) -> None:
        """A request was refused by max_request_rate: run none of this connection's
        requests until the tenant's bucket has refilled a little, so that a flood backs
        up into the read-ahead and the peer's socket instead of being read and refused
        at line rate."""
        session = self.session
        seconds = session.gate.refill_seconds()
        if seconds > 0:
            session.flush_posts()
            await anyio.sleep(seconds)

    async def execute(self, frame: Frame) -> bool:
        """Run one request; False when the connection should end."""
        session = self.session
        # Read once, as plain ints: this runs for every request, and IntFlag arithmetic
        # and repeated frame look-ups were a measurable part of a small request's cost.
        opcode = frame.opcode
        flags = int(frame.flags)
        no_reply = bool(flags & _NO_REPLY)
        more = bool(flags & _MORE)
        spec = self.registry.get(opcode)
        name = opcode_name(opcode)
        request_id = frame.request_id
        request = Request(
            opcode, name, request_id, Args(None, name), frame.bulk, no_reply, more, self
        )
        error: HipError | None = None
        result: Any = None
        started = time.perf_counter()
        # It waits for the session's earlier work itself (a synchronize, a launch with
        # ``synchronize``): the earlier fire-and-forget error is reported after it ran.
        waited = not no_reply and (
            opcode in _SETTLED_BY_WAITING or asks_to_wait(opcode, no_reply, frame.args)
        )
        # The I/O callback ran its work and left its wait here: only the wait is left
        # (its checks, rate and launches are done; nothing of it may run twice).
        launched = request_id != 0 and request_id == session.launched_pending
        if launched:
            session.launched_pending = 0
        elif 0 < request_id <= session.last_executed_id and await answer_resent(
            session, frame, request, self._writer
        ):
            return True
        if launched:
            pass
        elif opcode == Opcode.DATA:
            raise Closing(
                ProtocolError(
                    message=f"DATA frame of request {frame.request_id} does not continue a request"
                )
            )
        if spec is None:
            error = HipError(HipErrorCode.hipErrorNotSupported, f"unknown opcode {name}")
        elif frame.error is not None:
            error = frame.error
        elif no_reply and not spec.fire_and_forget:
            error = HipError(
                HipErrorCode.hipErrorNotSupported, f"{name} cannot be sent fire-and-forget"
            )
        elif more and not spec.streams_request:
            error = ProtocolError(message=f"{name} takes no continuation data")
        elif not launched and opcode not in _NOT_SYNCHRONISING and (quota := _over_rate(session)):
            # (A launched request spent its rate where it was launched: refused now, its
            # reply would say it did not run.)
            error = quota
        elif (
            not no_reply
            and opcode not in _REPORTS_NOTHING_EARLIER
            and not waited
            and (deferred := await session.settled_deferred_error())
        ):
            error = _reported(deferred, "this request did not run")
        if error is None:
            assert spec is not None
            try:
                request.args = Args(frame.args, name)
                result = await (
                    finish_waiting(session, request) if launched else spec.fn(session, request)
                )
            except HipError as exc:
                error = exc
            except (Closing, LinkLost, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise  # the connection is ending: not a handler bug
            except Exception as exc:  # a handler bug must not take the worker down
                error = self._handler_failed(exc, name)
        if request.more:
            await request.drain()
        error = self._settle(session, waited, name, request_id, no_reply, error, started)
        answered = self._answered_early
        if answered is not None:
            self._answered_early = None
            if answered[0] == request_id:
                if error is None and result != {}:
                    # A handler that asked for an early reply must answer {}: the client
                    # has that reply already. A bug, said loudly; the reply stands.
                    self._log.error("GPU thread's reply differs from the result", opcode=name)
                await self._finish_answered_early(session, name, request_id, answered[1], error)
                return True
        if error is None and opcode == Opcode.GOODBYE:
            self.ends_session = True
            # Recorded first: a worker cancelled right after the reply still ends (not
            # detaches) the session. Freed before answering: when the client's close()
            # returns, all is released.
            with anyio.CancelScope(shield=True):
                await session.close()
        if not no_reply:
            data = self._reply_data(session, frame, error, result)
            if isinstance(data, bytes):
                await self._writer.send_bytes(data)
            else:
                await self._writer.send_parts(data)
            # After the send: starting the spinner is a task's start, not to be paid
            # between the worker's finding the work done and the reply's leaving.
            self.worker.busy_poll.note_activity()
        return error is not None or opcode != Opcode.GOODBYE

    # --- the inline path ------------------------------------------------------------
    def answer_express(self, data: bytes) -> bool:
        """The express path's look at a read (``LinkReader.on_data``, push mode)."""
        express = self._express
        return express is not None and express.answer(data)

    def answer_now(self, frame: Frame) -> bool:
        """Run a lone request right here in the I/O callback, when its handler has a
        synchronous variant (``HandlerSpec.now``) and nothing else of the connection is
        under way: the executor task is not woken, which saves a task switch and its
        wake-up machinery on every such request. Requests that follow in the same read
        are taken the same way, one after the other, in order; fire-and-forget calls
        followed by more of them are batched onto the GPU thread, as the executor does.
        False, with nothing done, when the request must go to the executor: the request
        is unusual (a resend, continuation data, a rate quota to spend), the next one's
        header has not fully arrived, or the variant answers LATER."""
        spec = self.registry.get(frame.opcode)
        push = self._reader.push
        if spec is None or spec.now is None or push is None:
            return False
        if frame.request_id == self.session.launched_pending:
            return False  # its work was done here already (a held frame offered again)
        session = self.session
        header = frame.header
        flags = int(header.flags)
        opcode = header.opcode
        request_id = header.request_id
        no_reply = bool(flags & _NO_REPLY)
        if (
            not self._idle_and_writable(push)
            or flags & _MORE
            or frame.error is not None
            or (no_reply and not spec.fire_and_forget)
            or 0 < request_id <= session.last_executed_id
        ):
            return False
        # A launch awaiting its reply is the executor's, unless it asks to be waited for
        # (``synchronize``): that one waits for the earlier work as a synchronize does.
        waits = False
        if not no_reply and opcode in LAUNCHES:
            if not asks_to_wait(opcode, no_reply, frame.args):
                return False
            waits = True
        # A reply-awaiting request first reports the fire-and-forget errors before it,
        # once those calls have run (else the executor waits for them).
        reports_earlier = not no_reply and opcode not in _REPORTS_NOTHING_EARLIER and not waits
        if reports_earlier and not session.settled_now():
            return False
        decoder = self._decoder
        if decoder.buffered:
            next_flags = decoder.next_flags()
            if next_flags is None:
                return False  # part of a next request: the executor takes this one
            burst = bool(next_flags & _NO_REPLY)
        else:
            burst = False
        charged = opcode not in _NOT_SYNCHRONISING
        if charged and not session.gate.try_admit():
            return False  # over max_request_rate: the executor refuses it, and throttles
        name = opcode_name(opcode)
        started = time.perf_counter()
        error: HipError | None = None
        result: Any = None
        session.burst = burst
        deferred = session.take_deferred_error() if reports_earlier else None
        try:
            if deferred is not None:
                error = _reported(deferred, "this request did not run")
            else:
                request = Request(
                    opcode,
                    name,
                    request_id,
                    Args(frame.args, name),
                    frame.bulk,
                    no_reply,
                    False,
                    self,
                )
                result = spec.now(session, request)
        except HipError as exc:
            error = exc
        except Exception as exc:  # a handler bug must not take the worker down
            error = self._handler_failed(exc, name)
        if result is LATER:
            if charged:
                session.gate.refund()  # the executor charges it when it runs it
            return False
        if result is WAITING:
            # Launched here; the wait goes to the executor, which runs nothing else of it.
            session.launched_pending = request_id
            return False
        if not burst:
            session.flush_posts()  # what it queued on the GPU thread starts now
        waited = waits or (not no_reply and opcode in _SETTLED_BY_WAITING)
        error = self._settle(session, waited, name, request_id, no_reply, error, started)
        if no_reply:
            return True
        answered = self._answered_early
        if answered is not None and answered[0] == request_id:
            # Sent by the native launch-and-wait the moment its kernel was seen done.
            self._answered_early = None
            self._keep_answered_early(session, name, request_id, answered[1], error)
            try:
                push.write_nowait(b"")  # the rest of it, if the socket took only part
            except LINK_ERRORS:
                pass
            return True
        data = self._reply_data(session, frame, error, result)
        # A link lost here is found by the stream's own end; the reply waits in the
        # session's reply cache for the resend. (try rather than contextlib.suppress:
        # this runs for every small request, and costs nothing when nothing is raised.)
        try:
            if isinstance(data, bytes):
                push.write_nowait(data)
            else:
                for part in data:
                    push.write_nowait(part)  # type: ignore[arg-type]
        except LINK_ERRORS:
            pass
        return True

    # --- what both paths share ------------------------------------------------------
    def _idle_and_writable(self, push: Any) -> bool:
        """What a request answered in the I/O callback needs of its connection (the
        inline path's and the express path's): the executor waits between requests
        with nothing queued, no drain, no frame being written, and the socket takes a
        write now."""
        return (
            self.between_requests
            and not self.draining
            and self._frames.executor_waiting
            and not self._send_lock.locked()
            and push.writable_now
        )

    def _handler_failed(self, exc: Exception, name: str) -> HipError:
        """A handler raised something other than a HipError: a bug, logged with its
        traceback and reported as an internal error; the worker serves on."""
        self._log.exception("handler failed", opcode=name)
        return as_hip_error(exc, name)

    def _settle(
        self,
        session: Session,
        waited: bool,
        name: str,
        request_id: int,
        no_reply: bool,
        error: HipError | None,
        started: float,
    ) -> HipError | None:
        """A request's bookkeeping once it ran: its final error (an earlier fire-and-forget
        failure that its synchronisation reports comes first), noted as run, counted,
        logged; a fire-and-forget request's error is kept for the next synchronising one.
        ``waited``: the request waited for the session's earlier work itself (a
        synchronize, a launch with ``synchronize``)."""
        if waited:
            # Its wait ran after every earlier call: their error, if any, is known now
            # and comes first (a GPU reports the earliest failure at a synchronisation).
            late = session.take_deferred_error()
            if late is not None:
                error = (
                    late.error  # a launch of this very request (``synchronize``)
                    if late.request_id == request_id
                    else _reported(late, "reported at this synchronisation")
                )
        self._note_run(session, name, request_id, no_reply, error, started)
        if error is not None:
            # A fault that poisoned the context becomes ContextLostError (and recovery).
            error = self.worker.recovery.check(session, error)
            quota = error.details.get("quota")
            if quota:
                self.worker.observer.quota_rejected(session.tenant, str(quota))
                if quota == "max_request_rate":
                    self._rate_refused = True
            if no_reply:
                session.defer_error(error, name, request_id)
        return error

    def _note_run(
        self,
        session: Session,
        name: str,
        request_id: int,
        no_reply: bool,
        error: HipError | None,
        started: float,
    ) -> None:
        """A request ran: noted as the session's last, counted, logged."""
        if request_id:
            session.last_executed_id = request_id
        outcome = "ok" if error is None else error.name
        elapsed = time.perf_counter() - started
        self.worker.observer.request_done(session.tenant, name, outcome, elapsed)
        if self._log_requests:
            self._log.debug(
                "request",
                opcode=name,
                request_id=request_id,
                no_reply=no_reply,
                outcome=outcome,
                ms=round(elapsed * 1000, 3),
            )

    def _reply_data(
        self, session: Session, frame: Frame, error: HipError | None, result: Any
    ) -> bytes | list[bytes | bytearray | memoryview]:
        """A final reply's bytes (``error``'s, else ``result``'s), kept first in the
        session's reply cache so that the same request resent after a dropped link gets
        the same answer without running again; or, too large to keep (a resent read runs
        again instead), its parts unjoined."""
        if error is None and type(result) is dict and not result and not self._streamed_reply:
            # The usual reply (a synchronize, a free, a launch waited for): one small
            # frame, built whole and kept, with none of the general path's steps.
            request_id = frame.request_id
            data = encode_frame(frame.opcode, request_id, _REPLY, result)
            if request_id:
                session.replies.put(request_id, data)
            return data
        if error is not None:
            parts = encode_frame_parts(
                frame.opcode, frame.request_id, _ERROR_REPLY, error.to_wire(), b""
            )
            bulk: Any = b""
        else:
            reply = result if isinstance(result, Reply) else Reply(result)
            bulk = reply.bulk
            parts = encode_frame_parts(
                frame.opcode, frame.request_id, Flags.REPLY, reply.result, bulk
            )
        streamed, self._streamed_reply = self._streamed_reply, False
        size = len(bulk) if type(bulk) is bytes else memoryview(bulk).nbytes
        if streamed or not frame.request_id or size > MAX_ONE_REPLY:
            return parts
        data = b"".join(parts)
        session.replies.put(frame.request_id, data)
        return data

    # --- RequestLink: what handlers ask of their connection -------------------------
    async def receive_data(self, request_id: int) -> tuple[memoryview, bool]:
        """The next continuation chunk of ``request_id`` and whether it is the last."""
        try:
            frame = await self._next_frame()
        except anyio.EndOfStream:
            raise LinkLost from None
        if frame.opcode != Opcode.DATA or frame.request_id != request_id:
            raise Closing(
                ProtocolError(
                    message=f"expected DATA of request {request_id}, got "
                    f"{opcode_name(frame.opcode)} of request {frame.request_id}"
                )
            )
        return frame.bulk, Flags.MORE not in frame.flags

    async def send_chunk(self, request_id: int, opcode: int, bulk: memoryview | bytes) -> None:
        """Part of a reply's bulk data."""
        self._streamed_reply = True
        await self._writer.send(opcode, request_id, Flags.REPLY | Flags.MORE, None, bulk)

    def chunk_buffer(self, size: int) -> memoryview:
        """A buffer for one chunk of a streamed reply: from the payload buffers, so a
        download reuses the same few mappings chunk after chunk instead of faulting
        fresh pages in for each, and gives them back once the connection is idle."""
        return self._reader.payload_buffers.take(size)

    @contextlib.contextmanager
    def placing(self, request_id: int, window: memoryview) -> Iterator[bool]:
        """While open, the DATA payloads of ``request_id`` that the loop receives into
        buffers of their own go straight into ``window`` instead (``hipr.worker.payloads``'s
        ``Placements``); yields whether any can (push mode, and the request is the one
        streaming). A payload under way when it closes still lands in ``window``, and
        the executor takes no other request before that payload is whole."""
        reader = self._reader
        placing = reader.push is not None and reader.placements.place(request_id, window)
        try:
            yield placing
        finally:
            if placing:
                reader.placements.stop()

    def answer_from_gpu_thread(self, request: Request) -> Callable[[], object] | None:
        """On a stream that takes writes from other threads, the GPU thread writes the
        reply straight to the socket (``hipr.transports.base.ThreadWriter``), unless a
        frame is being written or queued, or an earlier fire-and-forget error is
        pending; the executor then finishes the request without sending it again."""
        stream = self._writer.thread_writer
        session = self.session
        request_id = request.request_id
        if stream is None or request.no_reply or not request_id:
            return None
        write_from_thread = stream.write_from_thread
        data = b"".join(encode_frame_parts(request.opcode, request_id, Flags.REPLY, {}))
        busy = self._send_lock.locked

        def answer() -> None:
            if not session.error_pending and write_from_thread(data, busy):
                self._answered_early = (request_id, data)

        return answer

    def reply_target(self, request: Request) -> tuple[int, bytes] | None:
        """A descriptor and the empty reply for a native call to send once the request's
        work is seen done (``RequestLink.reply_target``): where the stream takes writes
        from outside the loop, nothing is queued or half-written, and no earlier
        fire-and-forget error must be reported instead."""
        request_id = request.request_id
        if request.no_reply or not request_id or self.session.error_pending:
            return None
        fd = self.reserve_reply()
        if fd < 0:
            return None
        # The bytes _reply_data would build for the request's {} (kept for a resend).
        return fd, encode_frame(request.opcode, request_id, _REPLY, {})

    def reply_written(self, request: Request, target: tuple[int, bytes], sent: int) -> None:
        """After :meth:`reply_target`: a reply the socket took (whole or in part) is this
        request's, answered early; the connection finishes it without sending it again."""
        self.release_reply(target[1], sent)
        if sent > 0:
            self._answered_early = (request.request_id, target[1])

    def reserve_reply(self) -> int:
        """A socket descriptor a native call may send one reply to, this connection's
        other writes held back until :meth:`release_reply`; -1 where it may not (no
        plain socket, a frame queued or half-written)."""
        stream = self._writer.thread_writer
        if stream is None:
            return -1
        return stream.reserve_native_write(self._send_lock.locked)

    def release_reply(self, data: bytes, sent: int) -> None:
        """After :meth:`reserve_reply`: ``sent`` bytes of ``data`` left (0 or negative:
        none); the rest goes first with the next write."""
        stream = self._writer.thread_writer
        assert stream is not None
        stream.native_written(data, sent)

    # --- the express path (hipr.worker.express) -------------------------------------
    def express_ready(self, request_id: int) -> bool:
        """True when a lone request read just now may be answered by the express path:
        push mode, nothing of the connection under way, queued or held, the socket
        writable, no earlier error to report, and ``request_id`` new (not a resend, not
        one launched already)."""
        reader = self._reader
        push = reader.push
        session = self.session
        return (
            push is not None
            and self._idle_and_writable(push)
            and reader.held_frame is None
            and not self._decoder.buffered
            and request_id > session.last_executed_id
            and request_id != session.launched_pending
            and not session.error_pending
        )

    def finish_express(
        self,
        request_id: int,
        reply: bytes,
        sent: int,
        started: float,
        name: str = "LAUNCH_KERNEL",
    ) -> None:
        """An express request (an opcode's ``name``) ran and its reply is ``reply``, of
        which the socket took ``sent`` bytes from the native call (0 or negative: none):
        send the rest, keep it for a resend, count it, as :meth:`_settle` and
        :meth:`_reply_data` would."""
        if sent < len(reply):  # not sent from the native call, or only in part
            push = self._reader.push
            assert push is not None
            try:
                push.write_nowait(b"" if sent > 0 else reply)  # b"": the rest it holds
            except LINK_ERRORS:
                pass  # a lost link is found by the stream's own end; the reply waits below
        session = self.session
        session.replies.put(request_id, reply)
        self._note_run(session, name, request_id, False, None, started)

    async def _finish_answered_early(
        self, session: Session, name: str, request_id: int, data: bytes, error: HipError | None
    ) -> None:
        """The executor's part of a reply the GPU thread sent: keep it for a resend, send
        the rest of it if the socket took only part, keep the spin window open."""
        self._keep_answered_early(session, name, request_id, data, error)
        await self._writer.flush_thread_write()
        self.worker.busy_poll.note_activity()

    def _keep_answered_early(
        self, session: Session, name: str, request_id: int, data: bytes, error: HipError | None
    ) -> None:
        """A reply sent before the request's bookkeeping (by the GPU thread or a native
        call): kept for a resend. Nothing may set an error between the sender's look and
        this one; should a bug do so, the error still reaches the client at its next
        synchronisation."""
        if error is not None:
            self._log.warning("error after a reply sent early", opcode=name)
            session.defer_error(error, name, request_id)
        session.replies.put(request_id, data)


def _over_rate(session: Session) -> HipError | None:
    """The request-rate refusal, if the tenant's bucket is empty."""
    try:
        session.gate.admit_request()
    except HipError as exc:
        return exc
    return None


def _reported(deferred: DeferredError, how: str) -> HipError:
    """A fire-and-forget request's kept error, as the reply of a later request."""
    return type(deferred.error)(
        deferred.error.code,
        f"{deferred.error.message} (from an earlier asynchronous {deferred.opcode}, "
        f"request {deferred.request_id}; {how})",
    )
