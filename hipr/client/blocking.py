"""The sync client's I/O: blocking sockets driven in the caller's own thread.

A call sends its request and reads its own reply, with no event loop and no thread
hop: one socket round trip plus the protocol's own work (benchmarks/README.md has the
figures). The protocol's rules come from :class:`~hipr.client.link.LinkState`, shared
with the async client.

Several threads may share one connection. Sending is serialised by a lock (request ids
follow wire order). Reading is done by one thread at a time, whichever caller is
waiting: it reads frames and hands every reply to its owner, then gives the reading
role to the next waiter when its own reply is in (leader/follower). A single caller
never waits on a condition or another thread.

A small daemon thread keeps an idle link alive (heartbeats as
:meth:`~hipr.client.link.LinkState._beat` decides, answers to the worker's PINGs),
flushes batched fire-and-forget frames after ``coalesce_delay`` and notices a closed
link while nobody calls. It takes no part in a call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import cbor2

from hipr.client.link import (
    PING_FRAME,
    Beat,
    Buffer,
    DirectSink,
    EventCallback,
    HandshakeReader,
    LaunchPlan,
    LinkOptions,
    LinkState,
    Part,
    Pending,
    Progress,
    ReplySink,
    byte_view,
    log,
)
from hipr.client.stream_io import StreamIO, io_for
from hipr.client.wait_forecast import FORECAST_OPCODES, WaitForecast, WaitPlan
from hipr.errors import HipConnectionError, HipError, ProtocolError
from hipr.protocol.codec import ARGS_LENGTH, Frame, FrameDecoder
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.transports.base import BlockingStream

#: Opens a new blocking stream to the worker (the transport's connect_blocking).
BlockingConnector = Callable[[float], BlockingStream]
_LINK_ERRORS = (OSError, EOFError)
_RECEIVE = 1 << 16
#: Replies with at least this much payload go straight into the caller's buffer.
_DIRECT_MIN = 1 << 16


class _LinkDown(Exception):
    """The link failed under us; the caller reconnects (or waits for whoever does)."""


class BlockingConnection(LinkState):
    """A session with a worker over a blocking stream, outliving dropped links."""

    #: API coroutines run to completion without suspending on this connection.
    inline = True

    def __init__(
        self,
        url: str,
        connector: BlockingConnector,
        max_payload: int,
        options: LinkOptions | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        super().__init__(url, max_payload, options, on_event)
        self._connector = connector
        self._stream: BlockingStream | None = None
        self._io: StreamIO | None = None
        self._buffer = bytearray(_RECEIVE)
        self._send_lock = threading.RLock()
        #: Held while a new link is installed (its decoder, a new generation, the pending
        #: requests reset for resending), and by the reader while it hands a reply to its
        #: request: bytes read from a link just replaced are then dropped, never fed to
        #: the new link's decoder nor delivered to a request already sent again.
        self._link_lock = threading.Lock()
        self._state = threading.Condition(threading.Lock())
        #: True while one thread reads on behalf of all (the leader).
        self._reading = False
        #: Threads waiting for a reply without the reading role.
        self._followers = 0
        #: Bumped each time a new link is installed (reconnect happens once per loss).
        self._generation = 0
        #: The reading side of the current link, replaced as one object so that a reader
        #: takes a stream's I/O, its decoder and its generation together without a lock.
        self._reading_side: tuple[StreamIO | None, FrameDecoder, int] = (
            None,
            FrameDecoder(max_payload),
            0,
        )
        self._keeper: threading.Thread | None = None
        self._keeper_wake = threading.Event()
        #: True (under the send lock) from a wake of the keep-alive thread for a flush
        #: until that flush: frames written meanwhile leave with it, without waking the
        #: thread again, so a program's launch + synchronize pairs wake it once per
        #: ``coalesce_delay`` rather than once per pair.
        self._flush_armed = False
        #: Seconds a waiter polls without sleeping before it blocks (LinkOptions).
        self._spin = self.options.spin_seconds()
        #: When a synchronize's wait outlasts the spin: nap, then poll (wait_forecast);
        #: None where the client does not spin or forecasts are off.
        self._forecast = (
            WaitForecast(self._spin) if self._spin and self.options.forecast_waits else None
        )

    # --- waking waiters ----------------------------------------------------------------
    def _wake(self, pending: Pending) -> None:
        # Only followers wait on the condition; a lone caller is the reader itself.
        if self._followers:
            with self._state:
                self._state.notify_all()

    # --- connecting --------------------------------------------------------------------
    def _shake_hands(
        self, connector_timeout: float, handshake: HandshakeReader
    ) -> tuple[BlockingStream, dict[str, Any], FrameDecoder]:
        """Connect, write the handshake and read until its answer (the I/O of
        :class:`~hipr.client.link.HandshakeReader`)."""
        stream = self._connector(connector_timeout)
        try:
            stream.settimeout(connector_timeout)
            for part in handshake.parts:
                stream.sendall(part)
            buffer = bytearray(_RECEIVE)
            while True:
                try:
                    n = stream.recv_into(buffer)
                except TimeoutError:
                    raise handshake.no_answer(connector_timeout) from None
                reply = handshake.feed(memoryview(buffer)[:n])
                if reply is not None:
                    return stream, reply, handshake.decoder
        except BaseException:
            stream.close()
            raise

    def open(self, hello: dict[str, Any]) -> dict[str, Any]:
        """Connect and say HELLO; the worker's answer. Starts the keep-alive thread."""
        stream, reply, decoder = self._shake_hands(self.options.connect_timeout, self._hello(hello))
        self._accept_handshake(reply)
        self._install(stream, decoder)
        self._keeper = threading.Thread(
            target=self._keep_alive, name=f"hipr-keepalive {self.url}", daemon=True
        )
        self._keeper.start()
        return reply

    def _install(self, stream: BlockingStream, decoder: FrameDecoder) -> None:
        self._stream = stream
        # heartbeat_timeout bounds a send into a route that stopped moving (open but
        # silent), and a read inside a frame: the link is then taken for dead and
        # resumed, as a silent read would be. A reply's wait has its own limit.
        self._io = io_for(stream, self._send_lock, self.options.heartbeat_timeout)
        self._link_installed()
        self._generation += 1
        self._reading_side = (self._io, decoder, self._generation)

    def _link_failed(self, generation: int) -> None:
        """Reconnect and resume after the link of ``generation`` failed (once, by the
        first thread to notice; later ones find a newer generation and return)."""
        with self._send_lock:
            if self._generation != generation or self._broken is not None:
                return
            stream, self._stream = self._stream, None
            self._link_closed()
            if stream is not None:
                stream.close()
            if self._closing:
                self._lose(HipConnectionError(message="the connection is closed"))
                return
            self._emit("disconnected")
            self._reconnect()

    def _reconnect(self) -> None:
        for attempt, timeout in self._attempts():
            try:
                stream, reply, decoder = self._shake_hands(timeout, self._resume())
            except (HipError, TimeoutError, *_LINK_ERRORS) as exc:
                if not self._attempt_failed(exc):
                    return
                time.sleep(self._backoff())
                continue
            with self._link_lock:
                self._install(stream, decoder)
                again = self._resumed(reply)
            try:
                self._send_writes(self._resend_writes(again))
            except _LINK_ERRORS:
                pass  # the next read finds the link dead again and starts over
            self._emit("resumed", attempt=attempt, resent=len(again))
            with self._state:
                self._state.notify_all()  # followers: a new link may carry your reply
            return
        self._gave_up()

    def _lose(self, error: HipError) -> None:
        super()._lose(error)
        with self._state:
            self._state.notify_all()

    # --- sending -----------------------------------------------------------------------
    def _send_writes(self, writes: Iterable[Part]) -> None:
        """Write what the link state gives, in order (under the send lock)."""
        io = self._io
        for part in writes:
            assert io is not None  # the state writes nothing without a link
            io.send_all(part)

    def _arm_flush(self) -> None:
        """Under the send lock, after writing a fire-and-forget frame that stays in the
        outbox or the open batch: have the keep-alive thread send it within
        ``coalesce_delay``, unless a flush is already on its way."""
        if not self._flush_armed:
            self._flush_armed = True
            self._keeper_wake.set()

    def _submit(
        self,
        opcode: int,
        flags: Flags,
        args: Any,
        data: memoryview,
        pending: Pending | None,
        progress: Progress | None = None,
    ) -> int:
        """Give the request its id and send it (or batch it); a link that fails under
        the send is reconnected here, and the resend carries the request."""
        with self._send_lock:
            if self._broken is not None:
                raise self._broken
            generation = self._generation
            sent = self._track(opcode, flags, args, data, pending, progress)
            try:
                self._send_writes(self._submit_writes(sent, flush=pending is not None))
            except _LINK_ERRORS:
                pass
            else:
                if self._flush_due():
                    self._arm_flush()
                return sent.request_id
        self._link_failed(generation)
        return sent.request_id

    # --- receiving ---------------------------------------------------------------------
    def _read_once(self, timeout: float | None) -> bool:
        """Read what the link has (at most ``timeout`` seconds) and route it; False on
        timeout. Raises _LinkDown when the link failed, or was replaced meanwhile.

        The reader, the decoder and the generation are taken together: another thread
        may find the link dead under a send and install a new one while this one waits
        in a read, and the bytes of the old link must reach the old decoder only."""
        reader, decoder, generation = self._reading_side
        if self._stream is None or reader is None:
            raise _LinkDown
        frame = decoder.next_frame()
        if frame is None:
            try:
                n = reader.read(self._buffer, timeout)
            except _LINK_ERRORS:
                raise _LinkDown from None
            if n is None:
                return False
            if not n:
                raise _LinkDown
            self._last_received = time.monotonic()
            decoder.feed(memoryview(self._buffer)[:n])
            frame = decoder.next_frame()
            if frame is None and self._receive_direct(reader, decoder, generation):
                frame = decoder.next_frame()
        while frame is not None:
            if frame.request_id:
                self._deliver_of(generation, frame)
            else:
                answer = self._from_worker(frame)
                if answer is not None:
                    self._send_raw(answer)
            frame = decoder.next_frame()
        return True

    def _deliver_of(self, generation: int, frame: Frame) -> None:
        """Deliver a reply read from the link of ``generation``; _LinkDown, with nothing
        delivered, when that link has been replaced: its request was reset and sent again
        on the new link, which will answer it."""
        with self._link_lock:
            if self._generation != generation:
                raise _LinkDown
            self._deliver(frame)

    def _receive_direct(self, reader: StreamIO, decoder: FrameDecoder, generation: int) -> bool:
        """Receive a large reply's bulk bytes straight into the caller's buffer (a
        device-to-host copy into ``out``): no decoder buffer, no join, no second copy.
        False when the frame under way is not such a reply."""
        header = decoder.partial_header()
        if (
            header is None
            or not header.request_id
            or header.payload_length < _DIRECT_MIN
            or Flags.ERROR in header.flags
        ):
            return False
        pending = self._pending.get(header.request_id)
        sink = pending.sink if pending is not None else None
        if not isinstance(sink, DirectSink):
            return False
        header, head = decoder.take_partial()
        remaining = header.payload_length - len(head)

        def at_least(count: int) -> bytes:
            # The small CBOR part first, never reading past this frame's payload.
            nonlocal head, remaining
            while len(head) < count and remaining:
                piece = self._recv_some(reader, min(_RECEIVE, remaining))
                head += piece
                remaining -= len(piece)
            return head

        if len(at_least(ARGS_LENGTH.size)) < ARGS_LENGTH.size:
            raise ProtocolError(message="reply payload shorter than its length prefix")
        start = ARGS_LENGTH.size + ARGS_LENGTH.unpack_from(head)[0]
        if start > header.payload_length:
            raise ProtocolError(message="reply's CBOR part overruns its payload")
        at_least(start)
        try:
            args = cbor2.loads(head[ARGS_LENGTH.size : start]) if start > ARGS_LENGTH.size else None
        except Exception as exc:  # cbor2 raises several types for malformed input
            raise ProtocolError(message=f"malformed CBOR in a reply: {exc}") from None
        bulk = header.payload_length - start
        window = sink.window(bulk)
        if window is None:
            raise ProtocolError(message="the worker sent more bytes than asked for")
        already = len(head) - start
        window[:already] = head[start:]
        got = already
        while got < bulk:
            got += self._recv_into(reader, window[got:])
        self._last_received = time.monotonic()
        with self._link_lock:
            if self._generation != generation:
                raise _LinkDown  # as in _deliver_of; the resent request refills the buffer
            sink.advance(bulk)
            self._deliver(Frame(header, args))
        return True

    def _recv_into(self, reader: StreamIO, view: memoryview) -> int:
        try:
            n = reader.read_more(view)
        except _LINK_ERRORS:
            raise _LinkDown from None
        if not n:
            raise _LinkDown
        return n

    def _recv_some(self, reader: StreamIO, limit: int) -> bytes:
        view = memoryview(self._buffer)[: max(1, limit)]
        n = self._recv_into(reader, view)
        return bytes(view[:n])

    def _send_raw(self, data: bytes) -> None:
        """A frame outside the request sequence (heartbeats); dropped if the link is down."""
        with self._send_lock:
            io = self._io
            if self._stream is None or io is None:
                return
            try:
                self._send_writes(self._flush_writes())
                io.send_all(data)
            except _LINK_ERRORS:
                pass

    def _wait(self, pending: Pending, deadline: float | None) -> None:
        """Wait for ``pending``'s reply, reading the link ourselves unless another
        thread already does."""
        options = self.options
        # Silence counts from when we began to wait, not from the last frame received:
        # nobody may have read the link before (a long upload held the send lock, which
        # the keep-alive thread waits for), and that is no sign of a dead link.
        waiting_since = time.monotonic()
        while not pending.finished:
            with self._state:
                if pending.finished:
                    return
                if self._reading:
                    self._followers += 1
                    try:
                        self._state.wait(_remaining(deadline, options.heartbeat_interval))
                    finally:
                        self._followers -= 1
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError
                    continue
                self._reading = True
            generation = self._generation
            # Poll without sleeping first: a quick reply then costs no thread wake-up.
            spin_until = time.monotonic() + self._spin if self._spin else 0.0
            if deadline is not None:
                spin_until = min(spin_until, deadline)
            forecast = self._forecast
            plan = forecast.plan(pending.opcode, waiting_since) if forecast else None
            try:
                while not pending.finished:
                    if spin_until:
                        if not self._read_once(0) and time.monotonic() >= spin_until:
                            spin_until = self._nap(plan, deadline) if plan else 0.0
                            plan = None
                    elif not self._read_once(_remaining(deadline, options.heartbeat_interval)):
                        now = time.monotonic()
                        if deadline is not None and now >= deadline:
                            raise TimeoutError
                        beat = self._beat(now, waiting_since)
                        if beat is Beat.DEAD:
                            silent = now - max(self._last_received, waiting_since)
                            log.warning(
                                "link silent; treating it as dead", url=self.url, seconds=silent
                            )
                            raise _LinkDown
                        if beat is Beat.PING:
                            self._send_raw(PING_FRAME)
                    if self._broken is not None and not pending.finished:
                        raise self._broken
            except _LinkDown:
                self._release_reader()
                self._link_failed(generation)
                continue
            except ProtocolError as exc:
                # The stream cannot be resynchronised after a malformed frame.
                self._release_reader()
                self._lose(exc)
                self.close()
                raise
            except BaseException:
                self._release_reader()
                raise
            self._release_reader()

    def _nap(self, plan: WaitPlan, deadline: float | None) -> float:
        """After the spin window, for a wait whose end is forecast: sleep until shortly
        before that end (woken at once by bytes to read), then poll again until shortly
        after it. The new end of polling; 0.0 when there is nothing left to poll for."""
        reader = self._io
        if reader is None:
            return 0.0
        nap_until = plan.nap_until if deadline is None else min(plan.nap_until, deadline)
        now = time.monotonic()
        if nap_until > now:
            try:
                reader.wait_readable(nap_until - now)
            except _LINK_ERRORS:
                raise _LinkDown from None
        return plan.poll_until if deadline is None else min(plan.poll_until, deadline)

    def _release_reader(self) -> None:
        with self._state:
            self._reading = False
            if self._followers:
                self._state.notify_all()

    # --- the keep-alive thread ---------------------------------------------------------
    def _keep_alive(self) -> None:
        options = self.options
        period = self._tick_period()
        while not self._closing and self._broken is None:
            woke = self._keeper_wake.wait(period)
            if woke:
                self._keeper_wake.clear()
                time.sleep(options.coalesce_delay)
            if self._closing or self._broken is not None:
                return
            with self._send_lock:
                self._flush_armed = False
                try:
                    self._send_writes(self._flush_writes())
                except _LINK_ERRORS:
                    pass
            self._tend_idle_link()

    def _tend_idle_link(self) -> None:
        """While nobody reads: answer the worker's PINGs, notice a closed link, and send
        a heartbeat when one is due. Silence is not judged here: this thread polls now
        and then and misses what a call read meanwhile (the waiting call judges it)."""
        with self._state:
            if self._reading:
                return
            self._reading = True
        generation = self._generation
        try:
            self._read_once(0)
        except _LinkDown:
            self._release_reader()
            if not self._closing:
                self._link_failed(generation)
            return
        except (HipError, TimeoutError):
            pass
        except BaseException:
            self._release_reader()
            raise
        # Not in a `finally` that tests the shared flag: after _LinkDown, another thread
        # may hold the reading role by now, and releasing it would let two threads read.
        self._release_reader()
        if self._beat(time.monotonic(), None) is Beat.PING:
            self._send_raw(PING_FRAME)

    # --- requests ----------------------------------------------------------------------
    async def request(
        self,
        opcode: Opcode,
        args: Any = None,
        data: Buffer = b"",
        *,
        sink: ReplySink | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> tuple[Any, bytes]:
        """Send a request and wait for its reply, blocking this thread: (result, bulk
        bytes not given to sink). An ``async def`` only so that the API's coroutines,
        shared with the async client, run on it to completion without an event loop."""
        return self.call(opcode, args, data, sink=sink, timeout=timeout, progress=progress)

    def call(
        self,
        opcode: Opcode,
        args: Any = None,
        data: Buffer = b"",
        *,
        sink: ReplySink | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> tuple[Any, bytes]:
        """The blocking request itself."""
        view = byte_view(data)
        pending = Pending(opcode, sink)
        deadline = self._deadline(timeout)
        request_id = 0
        try:
            request_id = self._submit(opcode, Flags.NONE, args, view, pending, progress)
            forecast = self._forecast
            if forecast is not None and opcode in FORECAST_OPCODES:
                started = time.monotonic()
                self._wait(pending, deadline)
                forecast.record(opcode, time.monotonic() - started)
            else:
                self._wait(pending, deadline)
        except TimeoutError:
            raise self._timed_out(request_id, opcode, timeout) from None
        except BaseException:
            self._stopped_waiting(request_id, pending)
            raise
        return self._result(pending)

    def wait_for_reply(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """:meth:`call` for a request whose reply carries nothing the caller needs (a
        synchronize): blocks until it arrives; an error reply raises."""
        self.call(opcode, args, data)

    async def notify(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request (:meth:`post`; an ``async def`` for the API's
        coroutines, as :meth:`request` is)."""
        self.post(opcode, args, data)

    def post(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request: no reply; an error comes with a later call.
        The bytes are copied, so the caller may reuse its buffer at once. Launches of one
        configuration, and small copies on one stream, go in batches (LinkOptions)."""
        with self._send_lock:
            if self._broken is not None:
                raise self._broken
            writes = self._post_writes(opcode, args, data)
            if writes is None:
                return
            generation = self._generation
            sent = self._write_posted(writes)
        self._after_post(sent, generation)

    async def launch(self, plan: LaunchPlan, data: bytes) -> None:
        """:meth:`post_launch` (an ``async def`` for the API's coroutines)."""
        self.post_launch(plan, data)

    def post_launch(self, plan: LaunchPlan, data: bytes) -> None:
        """:meth:`post` of a kernel launch from its plan (``Function._launch_plan``)."""
        with self._send_lock:
            if self._broken is not None:
                raise self._broken
            writes = self._launch_writes(plan, data)
            if writes is None:
                return
            generation = self._generation
            sent = self._write_posted(writes)
        self._after_post(sent, generation)

    def _write_posted(self, writes: Iterable[Part]) -> bool:
        """Under the send lock: a fire-and-forget request's writes; False when the link
        failed under them (the resend carries the request)."""
        try:
            self._send_writes(writes)
        except _LINK_ERRORS:
            return False
        if self._flush_due():
            self._arm_flush()
        return True

    def _after_post(self, sent: bool, generation: int) -> None:
        """Out of the send lock: resume a link that failed under the writes, and bound
        the resend buffer (a barrier's reply acknowledges everything before it)."""
        if not sent:
            self._link_failed(generation)
        if self._needs_barrier():
            self.call(Opcode.BARRIER)

    # --- closing -----------------------------------------------------------------------
    def goodbye(self, timeout: float = 5.0) -> None:
        """End the session on purpose (the worker frees it), then close."""
        if self._broken is None:
            self.begin_close()
            try:
                self.call(Opcode.GOODBYE, timeout=timeout)
            except HipError:
                pass
        self.close()

    def close(self) -> None:
        """Close for good; whatever still waits fails."""
        self._closing = True
        self._keeper_wake.set()
        with self._send_lock:
            stream, self._stream = self._stream, None
            if stream is not None:
                try:
                    self._send_writes(self._flush_writes())  # what is batched goes last
                except _LINK_ERRORS:
                    pass
                stream.close()
            self._link_closed()
        self._lose(HipConnectionError(message="the connection is closed"))

    async def aclose(self) -> None:
        """Close (the async API's name for :meth:`close`)."""
        self.close()


def _remaining(deadline: float | None, cap: float) -> float:
    """Seconds to block at most: until ``deadline``, and never over ``cap``."""
    if deadline is None:
        return cap
    return max(0.0, min(cap, deadline - time.monotonic()))
