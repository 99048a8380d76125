"""The worker's side of one connection: handshake, then requests executed in order.

Two tasks per connection. The reader decodes frames and answers PING at once (so a
long GPU call never starves heartbeats); the executor runs requests one by one, in
the order they arrived, as HIP orders a client's calls. A bounded channel between
them bounds the memory one client can make the worker hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel
import sniffio
import structlog

from hipr._version import __version__
from hipr.backends.interface import Backend
from hipr.errors import (
    HipError,
    HipErrorCode,
    ProtocolError,
    SessionLostError,
    VersionMismatchError,
)
from hipr.handlers.args import Args
from hipr.handlers.context import Reply, Request
from hipr.handlers.registry import LATER, REGISTRY, HandlerRegistry
from hipr.observability.observer import WorkerObserver
from hipr.protocol.bounded_cbor import CborLimits
from hipr.protocol.codec import (
    ARGS_LENGTH,
    Frame,
    FrameDecoder,
    encode_frame,
    encode_frame_parts,
)
from hipr.protocol.header import (
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    Flags,
    Header,
    version_major,
    version_text,
)
from hipr.protocol.opcodes import Opcode, opcode_name
from hipr.transports import connect as transport_connect
from hipr.transports.loop_stream import LoopSocketStream as PushStream
from hipr.transports.thread_writes import ThreadWritable
from hipr.worker.config import WorkerConfig
from hipr.worker.fairness import (
    PUMP_FRAMES,
    PUMP_SECONDS,
    READER_FRAMES,
    FairScheduler,
    TurnMember,
    frame_charge,
)
from hipr.worker.isolation import TenantProcesses
from hipr.worker.payloads import PayloadBuffers, Placements
from hipr.worker.recovery import ContextRecovery
from hipr.worker.replay import MAX_ONE_REPLY
from hipr.worker.session import DeferredError, Session, as_hip_error
from hipr.worker.slow_links import HEADER_UNDER_WAY, FrameClock
from hipr.worker.spin import BusyPoll
from hipr.worker.tenants import Tenant, TenantRegistry


class Worker(Protocol):
    """What a connection needs of the worker that accepted it (``hipr.worker.server``
    implements it; connections never import the server)."""

    config: WorkerConfig
    backend: Backend
    observer: WorkerObserver
    isolation: TenantProcesses | None
    recovery: ContextRecovery
    tenants: TenantRegistry
    chunk_bytes: int
    handshake_timeout: float
    draining: bool
    busy_poll: BusyPoll
    #: Turns between the heavy connections of all tenants (``hipr.worker.fairness``).
    fair: FairScheduler

    def authenticate(self, hello: Args, stream: anyio.abc.ByteStream) -> Tenant:
        """The tenant a HELLO's credentials name, or AuthError."""
        ...

    def check_max_clients(self) -> None:
        """Refuse one more client over the worker-wide max_clients."""
        ...

    def open_session(self, tenant: Tenant, peer: str) -> Session:
        """A new session for an authenticated client."""
        ...

    async def resume(self, args: Args, connection: WorkerConnection) -> Session:
        """The detached session a RESUME names, now attached to ``connection``."""
        ...

    def detach(self, session: Session) -> None:
        """Keep a session whose link dropped for a later RESUME."""
        ...

    def forget(self, session: Session) -> None:
        """Drop a closed session from the registry."""
        ...

    async def handshake_refused(self, peer: str, error: HipError) -> None:
        """A HELLO or RESUME from ``peer`` was refused with ``error``: count it, and
        slow a source that keeps failing authentication, before the answer goes."""
        ...


log = structlog.get_logger("hipr.connection")

RECEIVE_SIZE = 1 << 18
#: Frames read ahead of the executor: overlap for pipelined copies, bounded memory.
#: Request bytes read ahead of the executor per connection: overlap for pipelined
#: copies and batches of small frames, with bounded memory.
READ_AHEAD_BYTES = 16 << 20
#: Payloads at least this large are received straight into their own buffer (push mode).
RECEIVE_INTO_BYTES = 256 << 10
#: Seconds without a large payload after which a connection lets its buffers go.
PAYLOAD_IDLE = 1.0
_NO_REPLY = int(Flags.NO_REPLY)
_MORE = int(Flags.MORE)
_DATA = int(Opcode.DATA)
_ERROR_REPLY = Flags.REPLY | Flags.ERROR
#: Requests whose reply never reports a pending fire-and-forget error.
_NOT_SYNCHRONISING = {Opcode.PING, Opcode.GOODBYE, Opcode.BARRIER}
#: Requests that wait for the session's earlier work themselves: their own wait settles
#: the fire-and-forget calls before them, so the deferred error is read after they ran
#: (one GPU-thread round trip instead of two for a launch followed by a synchronize).
_SETTLED_BY_WAITING = {
    Opcode.DEVICE_SYNCHRONIZE,
    Opcode.STREAM_SYNCHRONIZE,
    Opcode.EVENT_SYNCHRONIZE,
}


class _Wakeup:
    """A one-shot wake-up of the task that waits on it, in the running loop's own terms:
    an asyncio future or a trio event. ``anyio.Event`` looks its backend up on every
    creation and wait, which measured ~5 µs of each small request on the worker."""

    __slots__ = ("_fire", "_wait")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """``loop``: the running asyncio loop, or None under trio."""
        if loop is None:
            import trio

            event = trio.Event()
            self._fire: Callable[[], object] = event.set
            self._wait: Callable[[], Awaitable[object]] = event.wait
        else:
            future = loop.create_future()

            def fire() -> None:
                if not future.done():
                    future.set_result(None)

            self._fire = fire
            self._wait = lambda: future

    def set(self) -> None:
        """Wake the waiter (again: no effect)."""
        self._fire()

    async def wait(self) -> None:
        """Until :meth:`set` (at once if it was)."""
        await self._wait()


class _FrameQueue:
    """Frames from the reader task to the executor, in order. Unbounded in frames (the
    reader bounds it in bytes). A plain deque and one wake-up per wait: an anyio memory
    stream spends an extra event-loop pass and several backend look-ups per item, which
    measured 20 µs of each small request's round trip on the 2-core test machine."""

    __slots__ = ("_closed", "_frames", "_loop", "_waiter")

    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._waiter: _Wakeup | None = None
        self._closed = False
        #: Looked up once: the loop the executor waits on (None under trio).
        self._loop: asyncio.AbstractEventLoop | None = (
            None if sniffio.current_async_library() == "trio" else asyncio.get_running_loop()
        )

    def put(self, frame: Frame) -> None:
        """Queue ``frame`` and wake the executor if it waits."""
        self._frames.append(frame)
        if self._waiter is not None:
            self._waiter.set()

    def close(self) -> None:
        """No more frames: a waiting executor gets ``EndOfStream`` once the queue is empty."""
        self._closed = True
        if self._waiter is not None:
            self._waiter.set()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closed

    @property
    def queued(self) -> bool:
        """True while frames wait for the executor."""
        return bool(self._frames)

    @property
    def executor_waiting(self) -> bool:
        """True while the executor waits for a frame and none is queued."""
        return self._waiter is not None and not self._frames

    def take(self) -> Frame | None:
        """The next frame if one is queued, without waiting."""
        return self._frames.popleft() if self._frames else None

    def fire_and_forget_next(self) -> bool:
        """True when the next queued frame asks for no reply (a launch in a stream of
        launches, say), False when it waits for one or nothing is queued."""
        # int(): IntFlag's own ``&`` runs Python-level enum code on every request.
        return bool(self._frames) and bool(int(self._frames[0].header.flags) & _NO_REPLY)

    async def get(self) -> Frame:
        """The next frame, waiting for one; ``EndOfStream`` after :meth:`close`."""
        while not self._frames:
            if self._closed:
                raise anyio.EndOfStream
            self._waiter = _Wakeup(self._loop)
            try:
                await self._waiter.wait()
            finally:
                self._waiter = None
        return self._frames.popleft()


class _Closing(Exception):
    """The connection must end (after a fatal protocol error or a goodbye)."""


class _LinkLost(Exception):
    """The link died under a request; the request did not complete and will be resent."""


_LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, _LinkLost, OSError)


class WorkerConnection:
    """One client connection to the worker."""

    def __init__(
        self,
        worker: Worker,
        stream: anyio.abc.ByteStream,
        peer: str,
        registry: HandlerRegistry = REGISTRY,
    ) -> None:
        self.worker = worker
        self.stream = stream
        self.peer = peer
        self.registry = registry
        self.session: Session | None = None
        config = worker.config
        # Until the handshake is over, frames are at most max_hello_bytes (refused from
        # their header); every frame's CBOR is bounded (hipr.protocol.bounded_cbor).
        self._decoder = FrameDecoder(
            min(config.max_frame_bytes, config.max_hello_bytes), CborLimits(config.max_cbor_items)
        )
        #: Called once the handshake is over, whatever its outcome (the worker's
        #: count of unfinished handshakes).
        self.on_handshake_over: Callable[[], None] | None = None
        self._send_lock = anyio.Lock()
        self._frames = _FrameQueue()
        #: The executor waits for its next request (none is under way).
        self._between_requests = False
        self._queue_drained = anyio.Event()
        #: Push mode (asyncio): the stream's protocol hands bytes to ``_on_data``.
        self._push: PushStream | None = None
        #: Push mode: a decoded frame waiting for read-ahead or in-flight room.
        self._held_frame: Frame | None = None
        #: Push mode: answers to heartbeats that arrived while a frame was being sent.
        self._owed_pongs: list[bytes] = []
        self._protocol_error: ProtocolError | None = None
        #: Push mode: a large frame whose payload the loop receives straight into
        #: ``_payload`` (see ``_receive_payload_into``), and how much of it has arrived.
        self._payload_header: Header | None = None
        self._payload: memoryview | None = None
        self._payload_filled = 0
        self._payload_buffers = PayloadBuffers(
            pinned=getattr(worker.backend, "payload_buffer", None)
        )
        #: Push mode: where a streamed upload's DATA payloads land (RequestLink.placing).
        self._placements = Placements()
        self._payload_placed = False
        self._last_payload = 0.0
        self._log = log.bind(peer=peer)
        #: Request bytes read but not yet taken by the executor (max_inflight_bytes),
        #: each frame counted for at least ``fairness.FRAME_COST``.
        self._inflight = 0
        #: The executor's slice and turns (``hipr.worker.fairness``); its tenant's once
        #: the session is known.
        self._turns: TurnMember = worker.fair.member("")
        #: The last request run was refused by max_request_rate: throttle before the next.
        self._rate_refused = False
        #: Push mode: the rest of a read is decoded in the loop's next pass (a slice ran out).
        self._pump_later = False
        #: True when the session must be freed at the end, not kept for a RESUME.
        self._ends_session = False
        self._draining = False
        #: Set when a kernel fault poisoned the context: told to the client, then closed.
        self._lost: HipError | None = None
        self._streamed_reply = False
        #: (request id, reply bytes) of a reply the session's GPU thread sent itself
        #: (``answer_from_gpu_thread``); written by that thread, taken by the executor.
        self._answered_early: tuple[int, bytes] | None = None
        #: The stream, where other threads may write to it (plain sockets), else None.
        self._thread_writable: ThreadWritable | None = (
            stream if isinstance(stream, ThreadWritable) else None
        )
        self._last_received = time.monotonic()
        self._done = anyio.Event()
        # Read once: a log line per request only when someone asked for debug logs.
        self._log_requests = logging.getLogger("hipr.connection").isEnabledFor(logging.DEBUG)

    # --- sending -------------------------------------------------------------------
    async def send(
        self,
        opcode: int,
        request_id: int,
        flags: Flags,
        args: Any = None,
        bulk: bytes | bytearray | memoryview = b"",
    ) -> None:
        """Send one frame; frames from several tasks never interleave."""
        parts = encode_frame_parts(opcode, request_id, flags, args, bulk)
        await self._send_parts(parts)

    async def _send_parts(self, parts: list[bytes | bytearray | memoryview]) -> None:
        """Write whole frames under the send lock; a free lock is taken without an
        event-loop pass (anyio's ``async with`` always yields once)."""
        try:
            self._send_lock.acquire_nowait()
        except anyio.WouldBlock:
            await self._send_lock.acquire()
        try:
            for part in parts:
                await self.stream.send(part)  # type: ignore[arg-type]
        finally:
            if self._owed_pongs:
                self._pay_pongs()
            self._send_lock.release()

    async def send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        """An error reply."""
        await self.send(opcode, request_id, Flags.REPLY | Flags.ERROR, error.to_wire())

    async def send_chunk(self, request_id: int, opcode: int, bulk: memoryview | bytes) -> None:
        """Part of a reply's bulk data (RequestLink)."""
        self._streamed_reply = True
        await self.send(opcode, request_id, Flags.REPLY | Flags.MORE, None, bulk)

    def chunk_buffer(self, size: int) -> memoryview:
        """A buffer for one chunk of a streamed reply (RequestLink): from the payload
        buffers, so a download reuses the same few mappings chunk after chunk instead of
        faulting fresh pages in for each (2-core test machine, emulator, 256 MiB into
        numpy: 3.1 -> 3.5 GB/s), and gives them back once the connection is idle."""
        self._last_payload = time.monotonic()
        return self._payload_buffers.take(size)

    @contextlib.contextmanager
    def placing(self, request_id: int, window: memoryview) -> Iterator[bool]:
        """While open, the DATA payloads of ``request_id`` that the loop receives into
        buffers of their own go straight into ``window`` instead (``hipr.worker.payloads``'s
        ``Placements``); yields whether any can (push mode, and the request is the one
        streaming). A payload under way when it closes still lands in ``window``, and
        the executor takes no other request before that payload is whole."""
        placing = self._push is not None and self._placements.place(request_id, window)
        try:
            yield placing
        finally:
            if placing:
                self._placements.stop()

    async def _send_bytes(self, data: bytes) -> None:
        await self._send_parts([data])

    def answer_from_gpu_thread(self, request: Request) -> Callable[[], object] | None:
        """See ``RequestLink.answer_from_gpu_thread``: on a plain socket stream, the GPU
        thread writes the reply straight to the socket (``hipr.transports.thread_writes``),
        unless a frame is being written or queued, or an earlier fire-and-forget error
        is pending; the executor then finishes the request without sending it again."""
        stream = self._thread_writable
        session = self.session
        request_id = request.request_id
        if stream is None or session is None or request.no_reply or not request_id:
            return None
        write_from_thread = stream.write_from_thread
        data = b"".join(encode_frame_parts(request.opcode, request_id, Flags.REPLY, {}))
        busy = self._send_lock.locked

        def answer() -> None:
            if not session.error_pending and write_from_thread(data, busy):
                self._answered_early = (request_id, data)

        return answer

    async def _finish_answered_early(
        self, session: Session, name: str, request_id: int, data: bytes, error: HipError | None
    ) -> None:
        """The executor's part of a reply the GPU thread sent: keep it for a resend, send
        the rest of it if the socket took only part, keep the spin window open."""
        if error is not None:
            # Nothing may set an error between the thread's look and this one; should a
            # bug do so, the error still reaches the client at its next synchronisation.
            self._log.warning("error after a reply sent from the GPU thread", opcode=name)
            session.defer_error(error, name, request_id)
        session.replies.put(request_id, data)
        stream = self._thread_writable
        if stream is not None and stream.thread_writes.held:
            await self._send_lock.acquire()
            try:
                await stream.flush_thread_write()
            finally:
                self._send_lock.release()
        self.worker.busy_poll.note_activity()

    # --- receiving -----------------------------------------------------------------
    async def _read_frames(self, on_frame: Callable[[Frame], Any]) -> None:
        """Read until end of stream, handing each frame to ``on_frame``."""
        while True:
            # Frames may already be buffered behind the handshake: hand them over first.
            for frame in self._decoder.frames():
                await on_frame(frame)
            try:
                data = await self.stream.receive(self._decoder.receive_size())
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            self._last_received = time.monotonic()
            self.worker.busy_poll.note_activity()
            self._decoder.feed(data)

    async def receive_data(self, request_id: int) -> tuple[memoryview, bool]:
        """The next continuation chunk of ``request_id`` and whether it is the last."""
        try:
            frame = await self._next_frame()
        except anyio.EndOfStream:
            raise _LinkLost from None
        if frame.opcode != Opcode.DATA or frame.request_id != request_id:
            raise _Closing(
                ProtocolError(
                    message=f"expected DATA of request {request_id}, got "
                    f"{opcode_name(frame.opcode)} of request {frame.request_id}"
                )
            )
        return frame.bulk, Flags.MORE not in frame.flags

    # --- lifecycle -----------------------------------------------------------------
    async def run(self) -> None:
        """Serve the connection to its end, then free everything it made."""
        try:
            with anyio.fail_after(self.worker.handshake_timeout):
                hello = await self._receive_first_frame()
            if hello is None:
                return
            self.session = await self._handshake(hello)
            self._handshake_over()
            if self.session is None:
                return
            self._log = self._log.bind(session=self.session.id, tenant=self.session.tenant)
            self._decoder.max_payload = self.worker.config.max_frame_bytes
            self._turns = self.worker.fair.member(self.session.tenant)
            self._turns.weigh(self.session.gate.quotas.weight)
            tenant_frame_limit = self.session.gate.quotas.max_frame_bytes
            if tenant_frame_limit is not None:
                self._decoder.max_payload = min(self._decoder.max_payload, tenant_frame_limit)
            self._log.info("session started")
            # Caught inside the task group: leaving it would wrap them in an ExceptionGroup.
            ending: BaseException | None = None
            async with anyio.create_task_group() as tg:
                self._reader_scope = tg.cancel_scope
                if not self._start_push():
                    tg.start_soon(self._reader, tg.cancel_scope)
                tg.start_soon(self._heartbeat)
                try:
                    await self._executor()
                    if self._protocol_error is not None:
                        await self._try_send_error(0, 0, self._protocol_error)
                except (_Closing, *_LINK_ERRORS) as exc:
                    ending = exc
                tg.cancel_scope.cancel()
            if ending is not None:
                raise ending
            if self._draining:
                self._ends_session = True
                with anyio.move_on_after(2), contextlib.suppress(*_LINK_ERRORS):
                    if self._lost is not None:
                        await self.send_error(0, 0, self._lost)
                    else:
                        await self.send(
                            Opcode.GOODBYE, 0, Flags.NONE, {"reason": "the worker is shutting down"}
                        )
        except TimeoutError:
            self._log.info("handshake timed out")
            self.worker.observer.refused("handshake_timeout", self.peer)
        except _LINK_ERRORS as exc:
            self._log.info("link lost", error=repr(exc))
        except ProtocolError as exc:
            self._ends_session = True
            self._log.warning("protocol error", error=str(exc))
            self._count_protocol_error(exc)
            await self._try_send_error(0, 0, exc)
        except _Closing as closing:
            self._ends_session = True
            error = closing.args[0] if closing.args else None
            if isinstance(error, HipError):
                self._log.warning("closing connection", error=str(error))
                await self._try_send_error(0, 0, error)
        finally:
            self._handshake_over()
            with anyio.CancelScope(shield=True):
                await self._finish()

    def _handshake_over(self) -> None:
        over, self.on_handshake_over = self.on_handshake_over, None
        if over is not None:
            over()

    def _count_protocol_error(self, exc: ProtocolError) -> None:
        """Count a protocol error, and a frame refused by a limit (``details["refused"]``:
        its size, or its CBOR's items or depth) by the peer that sent it."""
        observer = self.worker.observer
        observer.protocol_error(exc.kind)
        refused = exc.details.get("refused")
        if refused:
            observer.refused(str(refused), self.peer)

    def _frame_under_way(self) -> tuple[object | None, int]:
        """The frame being received and its payload length, for the frame clock; None
        while the executor has work queued (reading may be held back by the worker
        itself then) or no frame is under way."""
        if not self._frames.executor_waiting:
            return None, 0
        header = self._payload_header or self._decoder.partial_header()
        if header is not None:
            return header, header.payload_length
        return (HEADER_UNDER_WAY if self._decoder.buffered else None), 0

    async def _finish(self) -> None:
        try:
            session = self.session
            if session is not None:
                session.flush_posts()  # posted work runs now, even while detached
                if self._inflight:
                    session.gate.release_inflight(self._inflight)
                    self._inflight = 0
                self._turns.leave()
                if session.connection is self:
                    session.connection = None
                    if self._ends_session or self.worker.draining:
                        try:
                            await session.close()
                        finally:
                            self.worker.forget(session)
                            self._log.info("session ended")
                    else:
                        self.worker.detach(session)
                        self._log.info("session detached; waiting for a resume")
            await anyio.aclose_forcefully(self.stream)
        finally:
            self._done.set()

    @property
    def finished(self) -> anyio.Event:
        """Set once the connection has ended and let go of its session."""
        return self._done

    async def abandon(self) -> None:
        """Let go of the session for a RESUME on another connection: drop this link, let
        the request under way finish (its reply is kept for the resent request), return
        once the session is free."""
        await anyio.aclose_forcefully(self.stream)
        await self._done.wait()

    def lose_context(self, error: HipError) -> None:
        """A kernel fault poisoned the context (``hipr.worker.recovery``): finish the
        request under way, tell the client ``error``, end the session and close."""
        self._lost = error
        self.drain()

    def drain(self) -> None:
        """Worker shutdown: finish the request under way, then say goodbye and close."""
        self._draining = True
        self._end_push()
        scope = getattr(self, "_reader_scope", None)
        if scope is not None:
            scope.cancel()

    async def _heartbeat(self) -> None:
        config = self.worker.config
        period = max(
            0.01, min(config.heartbeat_interval, config.heartbeat_timeout, config.frame_timeout) / 4
        )
        frame_clock = FrameClock(config.frame_timeout)
        pinged = time.monotonic()
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            if len(self._payload_buffers) and now - self._last_payload > PAYLOAD_IDLE:
                self._payload_buffers.release()  # no upload under way: memory back
            silent = now - self._last_received
            if silent >= config.heartbeat_timeout:
                self._log.warning("link silent; treating it as dead", seconds=round(silent, 1))
                # Closing (not cancelling) lets the request under way finish cleanly.
                await anyio.aclose_forcefully(self.stream)
                return
            if frame_clock.overdue(now, *self._frame_under_way()):
                # Bytes trickle in, so the link is not silent, but no frame completes.
                self._log.warning("frame not completed in time; closing the link")
                self.worker.observer.refused("frame_timeout", self.peer)
                await anyio.aclose_forcefully(self.stream)
                return
            # Every session hears from the worker, silent or not: a peer that keeps the
            # link busy without completing frames must still answer.
            if silent >= config.heartbeat_interval or now - pinged >= config.heartbeat_interval:
                pinged = now
                with contextlib.suppress(*_LINK_ERRORS):
                    await self.send(Opcode.PING, 0, Flags.NONE)

    async def _try_send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        with anyio.move_on_after(2):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await self.send_error(opcode, request_id, error)

    async def _receive_first_frame(self) -> Frame | None:
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return None
            self._decoder.feed(data)

    async def _handshake(self, frame: Frame) -> Session | None:
        if version_major(frame.header.version) != PROTOCOL_MAJOR:
            error = VersionMismatchError(
                message=f"this worker speaks protocol {version_text(PROTOCOL_VERSION)}; the client "
                f"sent {version_text(frame.header.version)}: upgrade the older side"
            )
            self._log.warning("version mismatch", client=version_text(frame.header.version))
            await self._try_send_error(frame.opcode, frame.request_id, error)
            return None
        if frame.opcode == Opcode.RESUME and frame.error is None:
            return await self._resume(frame)
        if frame.opcode != Opcode.HELLO:
            self._ends_session = True
            await self._try_send_error(
                frame.opcode,
                frame.request_id,
                ProtocolError(
                    message=f"the first frame must be HELLO, not {opcode_name(frame.opcode)}"
                ),
            )
            return None
        if frame.error is not None:
            await self._try_send_error(frame.opcode, frame.request_id, frame.error)
            return None
        try:
            args = Args(frame.args, "HELLO")
            client = args.text("client", default="unknown", max_length=256)
            tenant = self.worker.authenticate(args, self.stream)
            if self.worker.isolation is not None:
                self.worker.check_max_clients()
                child = await self.worker.isolation.child_for(tenant)
                hello = dict(frame.args)
                hello["token"] = child.token
                first = encode_frame(
                    Opcode.HELLO, frame.request_id, Flags.NONE, hello, version=frame.header.version
                )
                await self._relay(child.url, first, tenant.name)
                return None
            await self.worker.recovery.admit()
            session = self.worker.open_session(tenant, self.peer)
        except HipError as exc:
            self._log.warning("handshake refused", error=str(exc))
            await self.worker.handshake_refused(self.peer, exc)
            await self._try_send_error(frame.opcode, frame.request_id, exc)
            return None
        reply = {
            **self._session_reply(session),
            "tenant": session.tenant,
            "max_frame_bytes": self.worker.config.max_frame_bytes,
            "heartbeat_interval": self.worker.config.heartbeat_interval,
            "resume_token": session.resume_token,
        }
        session.connection = self
        try:
            await self.send(Opcode.HELLO, frame.request_id, Flags.REPLY, reply)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
                self.worker.forget(session)
            raise
        self._log.debug("hello", client=client)
        return session

    async def _reader(self, scope: anyio.CancelScope) -> None:
        handed = 0

        async def on_frame(frame: Frame) -> None:
            nonlocal handed
            handed += 1
            if not self._turns.heavy:
                self._turns.scheduler.light_at = self._last_received
            if handed >= READER_FRAMES:
                # A read of many small frames: let other connections in (fair service).
                handed = 0
                await anyio.lowlevel.checkpoint()
            if frame.opcode == Opcode.PING and not frame.flags & Flags.MORE:
                # Answered at once, out of order: a heartbeat must not wait for the GPU.
                if not frame.flags & (Flags.REPLY | Flags.NO_REPLY):
                    await self.send(Opcode.PING, frame.request_id, Flags.REPLY, {})
                return
            assert self.session is not None
            while self._inflight > READ_AHEAD_BYTES:
                await self._queue_drained.wait()
            size = frame_charge(frame.header.payload_length)
            await self.session.gate.hold_inflight(size, self._inflight)
            self._inflight += size
            # No event-loop pass per frame: the queue is bounded in bytes, not frames.
            self._frames.put(frame)

        try:
            await self._read_frames(on_frame)
        except ProtocolError as exc:
            self._log.warning("protocol error", error=str(exc))
            self._count_protocol_error(exc)
            await self._try_send_error(0, 0, exc)
        finally:
            self._frames.close()

    # --- push mode: requests decoded in the loop's I/O callback (asyncio) ------------
    def _start_push(self) -> bool:
        """Under asyncio, on a plain socket: let the stream's protocol hand arriving
        bytes straight to the decoder, in place of a reader task that the loop would
        wake for every request (one event-loop pass and its bookkeeping, measured at
        a tenth of a null request's round trip). Elsewhere (trio, TLS) the reader task."""
        push = self.stream if isinstance(self.stream, PushStream) else None
        if push is None:
            return False
        self._push = push
        self._pump()  # frames already decoded behind the handshake go first
        push.deliver_to(
            self._on_data, self._end_push, self._payload_target, self._payload_filled_by
        )
        return True

    def _receive_payload_into(self) -> None:
        """A large frame under way in the decoder: take it over, so that the rest of its
        payload is received straight into a buffer of its own (one copy, from the
        kernel) instead of piece by piece and joined (``hipr bench --only floor,sync``
        on the 2-core test machine: 256 MiB uploads 2.0-2.2 -> 2.9-3.1 GB/s). The
        buffers are anonymous mappings reused while the upload runs
        (``hipr.worker.payloads``): fresh pages
        are committed only as bytes fill them, so a client that announces a large frame
        (within ``max_frame_bytes``) and sends nothing costs address space, not memory."""
        header = self._decoder.partial_header()
        if header is None or header.payload_length < RECEIVE_INTO_BYTES or self._frames.closed:
            return
        header, head = self._decoder.take_partial()
        self._payload_header = header
        placed = self._placements.target(header, head)
        if placed is not None:
            # The bulk goes straight to its destination; the empty arguments' length
            # prefix, already in ``head``, is not kept.
            self._payload = placed
            self._payload_filled = len(head) - ARGS_LENGTH.size
            self._payload_placed = True
            return
        buffer = self._payload_buffers.take(header.payload_length)
        self._last_payload = time.monotonic()
        buffer[: len(head)] = head
        self._payload = buffer
        self._payload_filled = len(head)

    def _payload_target(self) -> memoryview | None:
        if self._payload is None:
            return None
        return self._payload[self._payload_filled :]

    def _payload_filled_by(self, nbytes: int) -> None:
        self._last_received = time.monotonic()
        self._payload_filled += nbytes
        payload = self._payload
        assert payload is not None and self._payload_header is not None
        if self._payload_filled < payload.nbytes:
            return
        header = self._payload_header
        try:
            frame = (
                Frame(header, None, payload)
                if self._payload_placed
                else self._decoder.decode_payload(header, payload)
            )
        except ProtocolError as exc:  # over the CBOR limits: refused, the link ends
            self._payload = self._payload_header = None
            self._log.warning("protocol error", error=str(exc))
            self._count_protocol_error(exc)
            self._protocol_error = exc
            self._end_push()
            return
        self._payload = self._payload_header = None
        self._payload_filled = 0
        self._payload_placed = False
        if header.opcode == _DATA or int(header.flags) & _MORE:
            self._placements.note(frame)
        if self._frames.closed:
            return
        self._held_frame = frame  # taken first by the pump, in order
        self._pump()

    def _on_data(self, data: bytes) -> None:
        if self._frames.closed:
            return
        now = self._last_received = time.monotonic()
        if not self._turns.heavy:
            self._turns.scheduler.light_at = now  # heavy connections share the loop now
        self._decoder.feed(data)
        self._pump()
        # After the requests are taken (or answered here): the spinner's start is not
        # paid before them.
        self.worker.busy_poll.note_activity()

    def _pump(self) -> None:
        """Queue the decoded requests for the executor, answering heartbeats at once,
        as far as the read-ahead bound and the tenant's in-flight bytes allow; at the
        first frame that must wait, reading pauses until the executor makes room."""
        session = self.session
        push = self._push
        assert session is not None
        # Frames taken in this pass of the loop, and since when (fair service: a read
        # of thousands of small frames is taken a slice per pass).
        taken = 0
        started = 0.0
        try:
            while not self._frames.closed:
                frame = self._held_frame
                if frame is None:
                    taken += 1
                    if taken > 1:
                        if taken == 2:
                            started = time.perf_counter()
                        elif taken > PUMP_FRAMES or time.perf_counter() - started >= PUMP_SECONDS:
                            self._pump_next_pass()
                            return
                    frame = self._decoder.next_frame()
                    if frame is None:
                        break
                    header = frame.header
                    # Plain ints: an IntFlag test costs more than the rest of this line.
                    if header.opcode == _DATA or int(header.flags) & _MORE:
                        self._placements.note(frame)
                else:
                    self._held_frame = None
                writable = push is None or push.writable_now
                if not writable and self._frames.queued:
                    # Replies wait unread by the peer: read nothing more from it until it
                    # reads (the executor's next send waits for that, then pumps again).
                    self._held_frame = frame
                    if push is not None:
                        push.pause_reading(True)
                    return
                if frame.opcode == Opcode.PING and not frame.flags & Flags.MORE:
                    if writable or frame.flags & (Flags.REPLY | Flags.NO_REPLY):
                        self._pong(frame)
                        continue
                    # Its answer would wait unsent: the executor answers it, in order, as
                    # its send allows (a peer that never reads cannot pile up answers).
                elif self._answer_now(frame):
                    continue
                size = frame_charge(frame.header.payload_length)
                if self._inflight > READ_AHEAD_BYTES or not session.gate.try_hold_inflight(
                    size, self._inflight
                ):
                    self._held_frame = frame
                    if push is not None:
                        push.pause_reading(True)
                    return
                self._inflight += size
                self._frames.put(frame)
        except ProtocolError as exc:
            self._log.warning("protocol error", error=str(exc))
            self._count_protocol_error(exc)
            self._protocol_error = exc
            self._end_push()
            return
        except Exception:  # a bug here must end this connection, not the loop's callback
            self._log.exception("decoding requests failed")
            self._end_push()
            return
        if self._frames.executor_waiting:
            session.flush_posts()  # a burst answered here, cut by the end of the read
        if push is not None:
            self._receive_payload_into()
            push.pause_reading(False)

    def _pump_next_pass(self) -> None:
        """The pump's slice of this pass is used up: stop reading, and take the rest of
        what was read in the loop's next pass, after the other connections' turns."""
        push = self._push
        assert push is not None and self.session is not None
        push.pause_reading(True)
        if self._frames.executor_waiting:
            self.session.flush_posts()  # what was answered here starts meanwhile
        if not self._pump_later:
            self._pump_later = True
            asyncio.get_running_loop().call_soon(self._pump_rest)

    def _pump_rest(self) -> None:
        self._pump_later = False
        if not self._frames.closed:
            self._pump()

    def _pong(self, frame: Frame) -> None:
        """Answer a PING now (a heartbeat must not wait for the GPU), or right after the
        frame being sent, whose bytes it must not split."""
        if frame.flags & (Flags.REPLY | Flags.NO_REPLY) or self._push is None:
            return
        self._owed_pongs.append(encode_frame(Opcode.PING, frame.request_id, Flags.REPLY, {}))
        if not self._send_lock.locked():
            self._pay_pongs()

    def _pay_pongs(self) -> None:
        pongs, self._owed_pongs = self._owed_pongs, []
        if self._push is not None:
            with contextlib.suppress(*_LINK_ERRORS):
                for pong in pongs:
                    self._push.write_nowait(pong)

    def _end_push(self) -> None:
        """Push mode's end of input (end of stream, a broken link, a protocol error or
        a drain): no more requests; the executor finishes those queued."""
        if self._push is not None:
            self._frames.close()

    async def _next_frame(self) -> Frame:
        """The next queued frame, released from the in-flight count."""
        frame = self._frames.take()
        if frame is None:
            assert self.session is not None
            self.session.flush_posts()  # nothing more queued: start what was posted
            frame = await self._frames.get()
            self._turns.rested()
        elif self._turns.spent():
            await self._next_turn()
        size = frame_charge(frame.header.payload_length)
        if self._inflight > READ_AHEAD_BYTES >= self._inflight - size:
            self._queue_drained.set()
            self._queue_drained = anyio.Event()
        self._inflight -= size
        assert self.session is not None
        self.session.gate.release_inflight(size)
        if self._held_frame is not None:
            self._pump()
        # A fire-and-forget request already read behind this one: fire-and-forget calls
        # go to the GPU thread in a batch, overlapping with the loop decoding the next
        # frames. Not when a reply-awaiting request is next (the synchronize after a
        # launch): that one waits for the call anyway, and finds it done inline instead
        # of after two thread hand-offs.
        self.session.burst = self._frames.fire_and_forget_next()
        return frame

    async def _next_turn(self) -> None:
        """The executor's slice ran out with requests still queued: let the other
        connections in (``hipr.worker.fairness``), then go on."""
        session = self.session
        assert session is not None
        session.flush_posts()  # what this slice posted runs meanwhile
        self._turns.weigh(session.gate.quotas.weight)
        await self._turns.next_turn()

    async def _throttle(self) -> None:
        """A request was refused by max_request_rate: run none of this connection's
        requests until the tenant's bucket has refilled a little, so that a flood backs
        up into the read-ahead and the peer's socket instead of being read and refused
        at line rate."""
        session = self.session
        assert session is not None
        seconds = session.gate.refill_seconds()
        if seconds > 0:
            session.flush_posts()
            await anyio.sleep(seconds)

    async def _executor(self) -> None:
        while not self._draining:
            # Between requests: the I/O callback may answer a lone request itself.
            self._between_requests = True
            try:
                frame = await self._next_frame()
            except anyio.EndOfStream:
                return
            finally:
                self._between_requests = False
            if not await self._execute(frame):
                self._ends_session = True
                return
            if self._rate_refused:
                self._rate_refused = False
                await self._throttle()

    async def _execute(self, frame: Frame) -> bool:
        """Run one request; False when the connection should end."""
        assert self.session is not None
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
        if 0 < request_id <= session.last_executed_id and await self._replay(frame, request):
            return True
        if opcode == Opcode.DATA:
            raise _Closing(
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
        elif opcode not in _NOT_SYNCHRONISING and (quota := _over_rate(session)):
            error = quota
        elif (
            not no_reply
            and opcode not in _NOT_SYNCHRONISING
            and opcode not in _SETTLED_BY_WAITING
            and (deferred := await session.settled_deferred_error())
        ):
            error = _reported(deferred, "this request did not run")
        if error is None:
            assert spec is not None
            try:
                request.args = Args(frame.args, name)
                result = await spec.fn(session, request)
            except HipError as exc:
                error = exc
            except (_Closing, _LinkLost, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise  # the connection is ending: not a handler bug
            except Exception as exc:  # a handler bug must not take the worker down
                self._log.exception("handler failed", opcode=name)
                error = as_hip_error(exc, name)
        if request.more:
            await request.drain()
        error = self._settle(session, opcode, name, request_id, no_reply, error, started)
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
        if error is not None:
            if not no_reply:
                await self._reply(session, frame, Flags.REPLY | Flags.ERROR, error.to_wire(), b"")
            return True
        if opcode == Opcode.GOODBYE:
            # Recorded first: a worker cancelled right after the reply still ends (not
            # detaches) the session. Freed before answering: when the client's close()
            # returns, all is released.
            self._ends_session = True
            with anyio.CancelScope(shield=True):
                await session.close()
        if not no_reply:
            reply = result if isinstance(result, Reply) else Reply(result)
            await self._reply(session, frame, Flags.REPLY, reply.result, reply.bulk)
        return opcode != Opcode.GOODBYE

    def _settle(
        self,
        session: Session,
        opcode: int,
        name: str,
        request_id: int,
        no_reply: bool,
        error: HipError | None,
        started: float,
    ) -> HipError | None:
        """A request's bookkeeping once it ran: its final error (an earlier fire-and-forget
        failure that its synchronisation reports comes first), noted as run, counted,
        logged; a fire-and-forget request's error is kept for the next synchronising one."""
        if opcode in _SETTLED_BY_WAITING and not no_reply:
            # Its wait ran after every earlier call: their error, if any, is known now
            # and comes first (a GPU reports the earliest failure at a synchronisation).
            late = session.take_deferred_error()
            if late is not None:
                error = _reported(late, "reported at this synchronisation")
        if request_id:
            session.last_executed_id = request_id
        observer = self.worker.observer
        outcome = "ok" if error is None else error.name
        elapsed = time.perf_counter() - started
        observer.request_done(session.tenant, name, outcome, elapsed)
        if self._log_requests:
            self._log.debug(
                "request",
                opcode=name,
                request_id=request_id,
                no_reply=no_reply,
                outcome=outcome,
                ms=round(elapsed * 1000, 3),
            )
        if error is not None:
            # A fault that poisoned the context becomes ContextLostError (and recovery).
            error = self.worker.recovery.check(session, error)
            quota = error.details.get("quota")
            if quota:
                observer.quota_rejected(session.tenant, str(quota))
                if quota == "max_request_rate":
                    self._rate_refused = True
            if no_reply:
                session.defer_error(error, name, request_id)
        return error

    def _reply_frames(
        self, session: Session, frame: Frame, flags: Flags, result: Any, bulk: Any
    ) -> bytes | list[bytes | bytearray | memoryview]:
        """A final reply's bytes, kept first in the session's reply cache so that the same
        request resent after a dropped link gets the same answer without running again;
        or, too large to keep (a resent read runs again instead), its parts unjoined."""
        parts = encode_frame_parts(frame.opcode, frame.request_id, flags, result, bulk)
        streamed, self._streamed_reply = self._streamed_reply, False
        size = len(bulk) if type(bulk) is bytes else memoryview(bulk).nbytes
        if streamed or not frame.request_id or size > MAX_ONE_REPLY:
            return parts
        data = b"".join(parts)
        session.replies.put(frame.request_id, data)
        return data

    async def _reply(
        self, session: Session, frame: Frame, flags: Flags, result: Any, bulk: Any
    ) -> None:
        """Send a final reply (see :meth:`_reply_frames`)."""
        data = self._reply_frames(session, frame, flags, result, bulk)
        if isinstance(data, bytes):
            await self._send_bytes(data)
        else:
            await self._send_parts(data)
        # After the send: starting the spinner is a task's start, not to be paid
        # between the worker's finding the work done and the reply's leaving.
        self.worker.busy_poll.note_activity()

    def _answer_now(self, frame: Frame) -> bool:
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
        push = self._push
        session = self.session
        if spec is None or spec.now is None or push is None or session is None:
            return False
        header = frame.header
        flags = int(header.flags)
        opcode = header.opcode
        request_id = header.request_id
        no_reply = bool(flags & _NO_REPLY)
        if (
            not self._between_requests
            or self._draining
            or not self._frames.executor_waiting
            or self._send_lock.locked()
            or not push.writable_now
            or flags & _MORE
            or frame.error is not None
            or (no_reply and not spec.fire_and_forget)
            or 0 < request_id <= session.last_executed_id
        ):
            return False
        # A reply-awaiting request first reports the fire-and-forget errors before it,
        # once those calls have run (else the executor waits for them), unless its own
        # wait settles them (a synchronize) or it never reports them (PING, BARRIER).
        reports_earlier = not (
            no_reply or opcode in _SETTLED_BY_WAITING or opcode in _NOT_SYNCHRONISING
        )
        if reports_earlier and not session.settled_now():
            return False
        if self._decoder.buffered:
            next_flags = self._decoder.next_flags()
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
            self._log.exception("handler failed", opcode=name)
            error = as_hip_error(exc, name)
        if result is LATER:
            if charged:
                session.gate.refund()  # the executor charges it when it runs it
            return False
        if not burst:
            session.flush_posts()  # what it queued on the GPU thread starts now
        error = self._settle(session, opcode, name, request_id, no_reply, error, started)
        if no_reply:
            return True
        if error is not None:
            data = self._reply_frames(session, frame, _ERROR_REPLY, error.to_wire(), b"")
        else:
            reply = result if isinstance(result, Reply) else Reply(result)
            data = self._reply_frames(session, frame, Flags.REPLY, reply.result, reply.bulk)
        # A link lost here is found by the stream's own end; the reply waits in the
        # session's reply cache for the resend. (try rather than contextlib.suppress:
        # this runs for every small request, and costs nothing when nothing is raised.)
        try:
            if isinstance(data, bytes):
                push.write_nowait(data)
            else:
                for part in data:
                    push.write_nowait(part)  # type: ignore[arg-type]
        except _LINK_ERRORS:
            pass
        return True

    async def _replay(self, frame: Frame, request: Request) -> bool:
        """Answer a request that already ran; False when it must run again instead."""
        assert self.session is not None
        if request.more:
            await request.drain()
        if request.no_reply:
            return True
        cached = self.session.replies.get(frame.request_id)
        if cached is not None:
            await self._send_bytes(cached)
            return True
        if frame.opcode == Opcode.MEMCPY_DTOH and frame.request_id == self.session.last_executed_id:
            return False  # a read with nothing run after it: reading again gives the same bytes
        await self.send_error(
            frame.opcode,
            frame.request_id,
            HipError(
                HipErrorCode.hipErrorUnknown,
                f"the reply to request {frame.request_id} was lost with the link and is too "
                "large to keep; the request ran once: repeat the call to read its result",
            ),
        )
        return True

    async def _relay_resume(self, frame: Frame, args: Args) -> None:
        """Isolated: send a RESUME to the process of the tenant that holds the session."""
        isolation = self.worker.isolation
        assert isolation is not None
        session_id = args.text("session_id", max_length=64)
        tenant_name = isolation.session_tenants.get(session_id)
        tenant = self.worker.tenants.get(tenant_name) if tenant_name else None
        if tenant is None:
            raise SessionLostError(
                message=f"session {session_id} no longer exists on this worker: the worker "
                "or its tenant process restarted"
            )
        child = await isolation.child_holding(session_id, tenant)
        first = encode_frame(
            Opcode.RESUME, frame.request_id, Flags.NONE, frame.args, version=frame.header.version
        )
        await self._relay(child.url, first, tenant.name)

    async def _relay(self, url: str, first: bytes, tenant: str) -> None:
        """Pass this connection to a tenant's process, byte for byte, until either ends.
        The first reply is read on the way, to learn which process holds the session."""
        isolation = self.worker.isolation
        assert isolation is not None
        self._handshake_over()  # authenticated here: no longer a pending handshake
        upstream = await transport_connect(url)
        self._log = self._log.bind(tenant=tenant)
        try:
            await upstream.send(first + self._decoder.take_buffered())
            replies = FrameDecoder(self.worker.config.max_frame_bytes)
            reply: Frame | None = None
            while reply is None:
                data = await upstream.receive(RECEIVE_SIZE)
                await self.stream.send(data)
                replies.feed(data)
                reply = replies.next_frame()
            if Flags.ERROR not in reply.flags and isinstance(reply.args, dict):
                session_id = str(reply.args.get("session_id", ""))
                isolation.note_session(session_id, tenant, url)
                self._log.info("relaying to the tenant's process", session=session_id)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_pump, self.stream, upstream, tg.cancel_scope)
                tg.start_soon(_pump, upstream, self.stream, tg.cancel_scope)
        except _LINK_ERRORS:
            pass
        except anyio.EndOfStream:
            pass
        finally:
            await anyio.aclose_forcefully(upstream)

    def _session_reply(self, session: Session) -> dict[str, Any]:
        """What both HELLO and RESUME replies tell the client."""
        return {
            "protocol": PROTOCOL_VERSION,
            "worker_version": __version__,
            "backend": self.worker.backend.name,
            "session_id": session.id,
            "chunk_bytes": self.worker.chunk_bytes,
        }

    async def _resume(self, frame: Frame) -> Session | None:
        try:
            args = Args(frame.args, "RESUME")
            if self.worker.isolation is not None:
                await self._relay_resume(frame, args)
                return None
            session = await self.worker.resume(args, self)
        except HipError as exc:
            self._log.warning("resume refused", error=str(exc))
            await self.worker.handshake_refused(self.peer, exc)
            await self._try_send_error(frame.opcode, frame.request_id, exc)
            return None
        reply = {
            **self._session_reply(session),
            "last_executed_id": session.last_executed_id,
        }
        try:
            await self.send(Opcode.RESUME, frame.request_id, Flags.REPLY, reply)
        except BaseException:
            session.connection = None
            self.worker.detach(session)
            raise
        self.worker.observer.session_resumed(session.tenant)
        self._log.info("session resumed", session=session.id)
        return session


async def _pump(
    source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream, scope: anyio.CancelScope
) -> None:
    """Copy ``source`` to ``sink`` until either side ends; then end the relay."""
    try:
        while True:
            await sink.send(await source.receive(RECEIVE_SIZE))
    except (anyio.EndOfStream, *_LINK_ERRORS):
        pass
    finally:
        scope.cancel()


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
