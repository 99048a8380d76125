"""The client's side of a session: framing, reply routing, heartbeats, reconnection.

Exactly-once over a flaky link works like this. Request ids increase in the order
requests go on the wire (they are assigned under the send lock). Every request stays
in an ordered resend buffer until a reply to it, or to a later request, proves that
the worker ran it (the worker runs a session's requests in order). When the link
dies, the client reconnects with exponential backoff and jitter, sends RESUME with
its session id and secret resume token, and re-sends the buffer in order; the worker
skips fire-and-forget requests it already ran and answers replied ones from its cache
of recent replies, so nothing is lost and nothing runs twice.

Fire-and-forget frames are coalesced into one write per batch: flushed at every
replied request, when the batch reaches ``coalesce_bytes``, or after a short delay.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc
import structlog

from hipr.errors import (
    AuthError,
    HipConnectionError,
    HipError,
    HipTimeoutError,
    ProtocolError,
    SessionLostError,
    VersionMismatchError,
)
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame, encode_frame_parts
from hipr.protocol.header import MAX_REQUEST_ID, Flags
from hipr.protocol.opcodes import Opcode, opcode_name

log = structlog.get_logger("hipr.client")

RECEIVE_SIZE = 1 << 18
Buffer = bytes | bytearray | memoryview
Connector = Callable[[], Awaitable[anyio.abc.ByteStream]]
#: ``progress(done_bytes, total_bytes)``, called as a large copy's chunks go or come.
Progress = Callable[[int, int], None]
#: ``on_event(kind, details)``: kind is disconnected, reconnecting, resumed or session_lost.
EventCallback = Callable[[str, dict[str, Any]], None]
_LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class ReplySink(Protocol):
    """Where a reply's bulk bytes go, chunk by chunk; ``reset`` before a replayed reply."""

    def write(self, chunk: memoryview) -> None:
        """Take the next chunk."""
        ...

    def reset(self) -> None:
        """Forget what was written: the reply is coming again from its start."""
        ...


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """Heartbeats, reconnection and batching of one client connection."""

    #: Send a heartbeat when nothing was received for this long (seconds).
    heartbeat_interval: float = 5.0
    #: A link silent for this long is dead.
    heartbeat_timeout: float = 15.0
    #: Reconnection gives up after this many attempts ...
    reconnect_attempts: int = 10
    #: ... or this many seconds, whichever comes first.
    reconnect_timeout: float = 60.0
    #: First backoff delay; doubled after each failed attempt, with jitter.
    reconnect_delay: float = 0.05
    reconnect_max_delay: float = 5.0
    #: Bytes of unacknowledged requests kept for resending before the client waits.
    resend_buffer_bytes: int = 64 << 20
    #: Fire-and-forget bytes batched into one write.
    coalesce_bytes: int = 64 << 10
    #: Longest a fire-and-forget frame waits for its batch (seconds).
    coalesce_delay: float = 0.002
    #: Time for one connection attempt and its handshake.
    connect_timeout: float = 30.0


@dataclass(slots=True)
class _Pending:
    opcode: int
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: HipError | None = None
    sink: ReplySink | None = None
    bulk: bytearray | None = None


@dataclass(slots=True)
class _Sent:
    """A request on the wire, kept until the worker has provably run it."""

    request_id: int
    opcode: int
    flags: Flags
    args: Any
    data: memoryview
    progress: Progress | None = None

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + 64


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "none"
    if isinstance(error, TimeoutError):
        return "timed out"
    return str(error) or type(error).__name__


def _view(data: Buffer) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        try:
            view = view.cast("B")
        except TypeError as exc:
            raise HipError(
                1, f"host buffer must be C-contiguous ({exc}); use numpy.ascontiguousarray"
            ) from None
    return view


class ClientConnection:
    """A session with a worker that outlives dropped links."""

    def __init__(
        self,
        url: str,
        connector: Connector,
        max_payload: int,
        options: LinkOptions | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        self.url = url
        self.options = options or LinkOptions()
        self.chunk_bytes = 1 << 20
        self.session_id = ""
        self._connector = connector
        self._max_payload = max_payload
        self._on_event = on_event
        self._resume_token = ""
        self._stream: anyio.abc.ByteStream | None = None
        self._decoder = FrameDecoder(max_payload)
        self._link_up = anyio.Event()
        self._send_lock = anyio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._unacked: OrderedDict[int, _Sent] = OrderedDict()
        self._unacked_bytes = 0
        self._next_id = 1
        self._last_received = time.monotonic()
        self._outbox: list[bytes | bytearray | memoryview] = []
        self._outbox_bytes = 0
        self._outbox_ready = anyio.Event()
        self._broken: HipError | None = None
        self._closing = False

    # --- events ----------------------------------------------------------------------
    def _emit(self, kind: str, **details: Any) -> None:
        log.info(kind, url=self.url, session=self.session_id, **details)
        if self._on_event is not None:
            try:
                self._on_event(kind, details)
            except Exception:  # a user callback must not take the connection down
                log.exception("on_event callback failed", event=kind)

    @property
    def broken(self) -> HipError | None:
        """Why the session can no longer be used, if it can't."""
        return self._broken

    # --- handshake -------------------------------------------------------------------
    async def _handshake(
        self, stream: anyio.abc.ByteStream, opcode: Opcode, args: dict[str, Any]
    ) -> tuple[dict[str, Any], FrameDecoder]:
        """Send HELLO or RESUME on a fresh stream; the worker's reply and the decoder
        that holds whatever arrived behind it."""
        decoder = FrameDecoder(self._max_payload)
        for part in encode_frame_parts(opcode, 0, Flags.NONE, args):
            await stream.send(part)  # type: ignore[arg-type]
        while True:
            frame = decoder.next_frame()
            if frame is None:
                try:
                    decoder.feed(await stream.receive(RECEIVE_SIZE))
                except anyio.EndOfStream:
                    raise HipConnectionError(
                        message=f"{self.url} closed the connection during the handshake"
                    ) from None
                continue
            if frame.request_id != 0 or frame.opcode not in (opcode, 0):
                continue  # e.g. a heartbeat that crossed our handshake
            if Flags.ERROR in frame.flags:
                raise HipError.from_wire(frame.args)
            if frame.error is not None:
                raise frame.error
            if not isinstance(frame.args, dict):
                raise ProtocolError(message=f"unexpected handshake reply from {self.url}")
            return frame.args, decoder

    async def open(self, hello: dict[str, Any]) -> dict[str, Any]:
        """Connect and say HELLO; the worker's answer."""
        with anyio.fail_after(self.options.connect_timeout):
            stream = await self._connector()
        try:
            with anyio.fail_after(self.options.connect_timeout):
                reply, decoder = await self._handshake(stream, Opcode.HELLO, hello)
        except TimeoutError:
            await anyio.aclose_forcefully(stream)
            raise HipConnectionError(
                message=f"{self.url} accepted the connection but did not answer HELLO within "
                f"{self.options.connect_timeout} s: is it a hipr worker?"
            ) from None
        except BaseException:
            await anyio.aclose_forcefully(stream)
            raise
        self.session_id = str(reply.get("session_id", ""))
        self._resume_token = str(reply.get("resume_token", ""))
        self.chunk_bytes = int(reply.get("chunk_bytes", self.chunk_bytes))
        self._install(stream, decoder)
        return reply

    def _install(self, stream: anyio.abc.ByteStream, decoder: FrameDecoder) -> None:
        self._stream = stream
        self._decoder = decoder
        self._last_received = time.monotonic()
        # Whatever was batched for the old link is in the resend buffer already.
        self._outbox, self._outbox_bytes = [], 0
        self._link_up.set()

    # --- the supervisor: one link after another ----------------------------------------
    async def run(self) -> None:
        """Serve links until closed or the session is lost (run it in a task group)."""
        try:
            while not self._closing:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._reader, tg.cancel_scope)
                    tg.start_soon(self._heartbeat, tg.cancel_scope)
                    tg.start_soon(self._flusher)
                if self._closing or self._broken is not None:
                    return
                self._emit("disconnected")
                if not await self._reconnect():
                    return
        finally:
            self._fail_all(self._broken or HipConnectionError(message="the connection is closed"))

    async def _reader(self, scope: anyio.CancelScope) -> None:
        stream = self._stream
        assert stream is not None
        try:
            while True:
                for frame in self._decoder.frames():
                    await self._route(frame)
                data = await stream.receive(self._decoder.receive_size())
                self._last_received = time.monotonic()
                self._decoder.feed(data)
        except (anyio.EndOfStream, *_LINK_ERRORS):
            pass
        except ProtocolError as exc:
            self._lose(exc)
        finally:
            self._stream = None
            self._link_up = anyio.Event()
            scope.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(stream)

    async def _heartbeat(self, scope: anyio.CancelScope) -> None:
        options = self.options
        period = max(0.01, min(options.heartbeat_interval, options.heartbeat_timeout) / 4)
        while True:
            await anyio.sleep(period)
            silent = time.monotonic() - self._last_received
            if silent >= options.heartbeat_timeout:
                log.warning("link silent; treating it as dead", url=self.url, seconds=silent)
                scope.cancel()
                return
            if silent >= options.heartbeat_interval:
                await self._send_raw(encode_frame_parts(Opcode.PING, 0, Flags.NONE))

    async def _flusher(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready = anyio.Event()
            await anyio.sleep(self.options.coalesce_delay)
            async with self._send_lock:
                await self._flush_locked()

    async def _reconnect(self) -> bool:
        options = self.options
        deadline = time.monotonic() + options.reconnect_timeout
        delay = options.reconnect_delay
        last_error: BaseException | None = None
        for attempt in range(1, options.reconnect_attempts + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._emit("reconnecting", attempt=attempt)
            try:
                with anyio.fail_after(min(remaining, options.connect_timeout)):
                    stream = await self._connector()
                    try:
                        reply, decoder = await self._handshake(
                            stream,
                            Opcode.RESUME,
                            {"session_id": self.session_id, "resume_token": self._resume_token},
                        )
                    except BaseException:
                        await anyio.aclose_forcefully(stream)
                        raise
            except (SessionLostError, AuthError, VersionMismatchError) as exc:
                self._lose(
                    SessionLostError(message=f"session {self.session_id} cannot resume: {exc}")
                )
                return False
            except (HipError, TimeoutError, *_LINK_ERRORS) as exc:
                last_error = exc
                # Full jitter: clients cut off together don't come back in lockstep.
                await anyio.sleep(
                    min(delay, max(0.0, deadline - time.monotonic())) * random.uniform(0.5, 1.0)
                )
                delay = min(delay * 2, options.reconnect_max_delay)
                continue
            async with self._send_lock:
                self._install(stream, decoder)
                resent = await self._resend_locked(int(reply.get("last_executed_id", 0)))
            self._emit("resumed", attempt=attempt, resent=resent)
            return True
        self._lose(
            SessionLostError(
                message=f"lost the link to {self.url} and could not reconnect within "
                f"{options.reconnect_attempts} attempts / {options.reconnect_timeout:g} s "
                f"(last error: {_describe(last_error)}); the session and its handles are gone"
            )
        )
        return False

    async def _resend_locked(self, last_executed: int) -> int:
        """Re-send, in order, what the worker may not have run; returns how many."""
        resent = 0
        for request_id, sent in list(self._unacked.items()):
            if request_id <= last_executed and Flags.NO_REPLY in sent.flags:
                self._forget_sent(request_id)
                continue
            pending = self._pending.get(request_id)
            if pending is not None:
                pending.bulk = None
                if pending.sink is not None:
                    pending.sink.reset()
            await self._write_request_locked(sent)
            resent += 1
        await self._flush_locked()
        return resent

    # --- failure -----------------------------------------------------------------------
    def _lose(self, error: HipError) -> None:
        if self._broken is None:
            self._broken = error
            if isinstance(error, SessionLostError):
                self._emit("session_lost", error=error.message)
        self._fail_all(error)
        self._link_up.set()  # wake senders waiting for a link: they see the error

    def _fail_all(self, error: HipError) -> None:
        self._broken = self._broken or error
        for pending in self._pending.values():
            pending.error = pending.error or error
            pending.done.set()
        self._pending.clear()

    def begin_close(self) -> None:
        """The session is ending on purpose: a link that drops from now on (the worker
        closes it after GOODBYE) is not a reason to reconnect."""
        self._closing = True

    async def aclose(self) -> None:
        """Close for good (after GOODBYE); whatever still waits fails."""
        self._closing = True
        self._broken = self._broken or HipConnectionError(message="the connection is closed")
        stream = self._stream
        self._link_up.set()
        if stream is not None:
            await anyio.aclose_forcefully(stream)

    # --- replies -----------------------------------------------------------------------
    async def _route(self, frame: Frame) -> None:
        if frame.request_id == 0:
            await self._worker_initiated(frame)
            return
        final = Flags.MORE not in frame.flags
        if final and frame.opcode != Opcode.PING:
            # Requests run in order: an answer to this one proves all earlier ones ran.
            while self._unacked:
                first = next(iter(self._unacked))
                if first > frame.request_id:
                    break
                self._forget_sent(first)
        pending = self._pending.get(frame.request_id)
        if pending is None:
            return  # the caller timed out and left; the reply is dropped
        if frame.error is not None:
            pending.error = frame.error
        elif Flags.ERROR in frame.flags:
            pending.error = HipError.from_wire(frame.args)
        else:
            if frame.bulk.nbytes:
                if pending.sink is not None:
                    try:
                        pending.sink.write(frame.bulk)
                    except HipError as exc:
                        pending.error = exc
                else:
                    if pending.bulk is None:
                        pending.bulk = bytearray()
                    pending.bulk += frame.bulk
            if not final:
                return
            pending.result = frame.args
        if not final:
            return
        del self._pending[frame.request_id]
        pending.done.set()

    async def _worker_initiated(self, frame: Frame) -> None:
        if frame.opcode == Opcode.PING and Flags.REPLY not in frame.flags:
            await self._send_raw(encode_frame_parts(Opcode.PING, 0, Flags.REPLY))
        elif frame.opcode == Opcode.GOODBYE:
            reason = frame.args.get("reason", "") if isinstance(frame.args, dict) else ""
            self._lose(SessionLostError(message=f"the worker ended the session: {reason}"))
        elif Flags.ERROR in frame.flags:
            error = HipError.from_wire(frame.args)
            self._lose(
                error
                if isinstance(error, SessionLostError)
                else SessionLostError(message=f"the worker closed the session: {error}")
            )

    def _forget_sent(self, request_id: int) -> None:
        sent = self._unacked.pop(request_id, None)
        if sent is not None:
            self._unacked_bytes -= sent.nbytes

    # --- sending -----------------------------------------------------------------------
    async def _send_raw(self, parts: list[bytes | bytearray | memoryview]) -> None:
        """Frames outside the request sequence (heartbeats); dropped if the link is down."""
        with anyio.CancelScope(shield=True):
            async with self._send_lock:
                stream = self._stream
                if stream is None:
                    return
                try:
                    await self._flush_locked()
                    for part in parts:
                        await stream.send(part)  # type: ignore[arg-type]
                except _LINK_ERRORS:
                    pass

    async def _flush_locked(self) -> None:
        if not self._outbox:
            return
        stream = self._stream
        batch, self._outbox, self._outbox_bytes = self._outbox, [], 0
        if stream is None:
            return  # the resend after reconnecting carries these requests
        try:
            await stream.send(b"".join(batch))
        except _LINK_ERRORS:
            pass  # the reader sees the dead link; resend covers the batch

    async def _write_request_locked(self, sent: _Sent) -> None:
        """Put one request's frames in the outbox (small) or on the wire (large)."""
        chunk = self.chunk_bytes
        data = sent.data
        first, rest = data[:chunk], data[chunk:]
        head_flags = sent.flags | (Flags.MORE if rest.nbytes else Flags.NONE)
        parts = encode_frame_parts(sent.opcode, sent.request_id, head_flags, sent.args, first)
        if not rest.nbytes and data.nbytes < 4096:
            for part in parts:
                self._outbox.append(bytes(part) if isinstance(part, memoryview) else part)
                self._outbox_bytes += len(part)
            if sent.progress is not None:
                sent.progress(data.nbytes, data.nbytes)
            return
        await self._flush_locked()
        stream = self._stream
        if stream is None:
            return
        try:
            for part in parts:
                await stream.send(part)  # type: ignore[arg-type]
            if sent.progress is not None:
                sent.progress(first.nbytes, data.nbytes)
            offset = 0
            while offset < rest.nbytes:
                piece = rest[offset : offset + chunk]
                offset += piece.nbytes
                more = Flags.MORE if offset < rest.nbytes else Flags.NONE
                for part in encode_frame_parts(Opcode.DATA, sent.request_id, more, None, piece):
                    await stream.send(part)  # type: ignore[arg-type]
                if sent.progress is not None:
                    sent.progress(first.nbytes + offset, data.nbytes)
                if time.monotonic() - self._last_received >= self.options.heartbeat_interval:
                    # A long upload holds the send lock and hears nothing back: without a
                    # heartbeat slipped between its chunks (the worker answers PINGs ahead
                    # of its queue) a live link would be taken for dead mid-copy.
                    await stream.send(encode_frame(Opcode.PING, 0))
        except _LINK_ERRORS:
            pass  # the reader sees the dead link; resend covers this request

    async def _submit(
        self,
        opcode: int,
        flags: Flags,
        args: Any,
        data: memoryview,
        pending: _Pending | None,
        progress: Progress | None = None,
    ) -> int:
        """Assign the next id and send, all under the send lock so ids follow wire order.
        Waits while the link is down; never leaves half a request on the wire."""
        while True:
            if self._broken is not None:
                raise self._broken
            if self._stream is None:
                await self._link_up.wait()
                continue
            # Fast path: a free lock is taken without an event-loop pass, and a small
            # fire-and-forget request then only joins the batch (no await at all).
            try:
                self._send_lock.acquire_nowait()
            except anyio.WouldBlock:
                with anyio.CancelScope(shield=True):
                    await self._send_lock.acquire()
            try:
                if self._stream is None:
                    continue
                return await self._submit_locked(opcode, flags, args, data, pending, progress)
            finally:
                self._send_lock.release()

    async def _submit_locked(
        self,
        opcode: int,
        flags: Flags,
        args: Any,
        data: memoryview,
        pending: _Pending | None,
        progress: Progress | None,
    ) -> int:
        request_id = self._next_id
        self._next_id = 1 if request_id >= MAX_REQUEST_ID else request_id + 1
        if pending is not None:
            self._pending[request_id] = pending
        sent = _Sent(request_id, opcode, flags, args, data, progress)
        self._unacked[request_id] = sent
        self._unacked_bytes += sent.nbytes
        with anyio.CancelScope(shield=True):
            await self._write_request_locked(sent)
            if pending is not None or self._outbox_bytes >= self.options.coalesce_bytes:
                await self._flush_locked()
            elif self._outbox:
                self._outbox_ready.set()
        return request_id

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
        """Send a request and wait for its reply: (result, bulk bytes not given to sink).

        A call that times out raises HipTimeoutError; the session stays usable, and a
        request already sent may still run on the worker (as with a GPU runtime).
        """
        view = _view(data)
        pending = _Pending(opcode, sink=sink)
        request_id = 0
        try:
            if timeout is None:  # no cancel scope to set up on the common path
                request_id = await self._submit(opcode, Flags.NONE, args, view, pending, progress)
                await pending.done.wait()
            else:
                with anyio.fail_after(timeout):
                    request_id = await self._submit(
                        opcode, Flags.NONE, args, view, pending, progress
                    )
                    await pending.done.wait()
        except TimeoutError:
            sent = self._unacked.get(request_id)
            if sent is not None and sent.data.nbytes:
                # The caller gets its buffer back now; a resend must not read it later.
                sent.data = memoryview(bytes(sent.data))
            raise HipTimeoutError(
                message=f"{opcode_name(opcode)} got no reply within {timeout} s"
            ) from None
        finally:
            if request_id:
                self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result, bytes(pending.bulk) if pending.bulk else b""

    async def notify(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request: no reply; an error comes with a later call.
        The bytes are copied, so the caller may reuse its buffer at once."""
        view = _view(data)
        if view.nbytes:
            view = memoryview(bytes(view))
        await self._submit(opcode, Flags.NO_REPLY, args, view, None)
        if self._unacked_bytes > self.options.resend_buffer_bytes:
            # Bound the resend buffer: a barrier's reply acknowledges everything before it.
            await self.request(Opcode.BARRIER)
