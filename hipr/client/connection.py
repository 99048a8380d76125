"""The async client's I/O: anyio streams, a reader task, heartbeats, reconnection.

The protocol's rules (request ids in wire order, the resend buffer, reply routing,
cutting a request into frames) live in :mod:`hipr.client.link`, shared with the
blocking client; this module only moves bytes and waits.

Fire-and-forget frames are coalesced into one write per batch: flushed at every
replied request, when the batch reaches ``coalesce_bytes``, or after a short delay.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from hipr.client.link import (
    BatchItem,
    Buffer,
    EventCallback,
    LinkOptions,
    LinkState,
    Pending,
    Progress,
    ReplySink,
    Sent,
    byte_view,
    check_first_bytes,
    handshake_reply,
    log,
)
from hipr.errors import (
    AuthError,
    HipConnectionError,
    HipError,
    HipTimeoutError,
    SessionLostError,
    VersionMismatchError,
)
from hipr.protocol.codec import FrameDecoder, encode_frame, encode_frame_parts
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode, opcode_name

__all__ = [
    "Buffer",
    "ClientConnection",
    "EventCallback",
    "LinkOptions",
    "Progress",
    "ReplySink",
]

RECEIVE_SIZE = 1 << 18
Connector = Callable[[], Awaitable[anyio.abc.ByteStream]]
_LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
#: Kept for callers that imported the old private name.
_view = byte_view


class ClientConnection(LinkState):
    """A session with a worker that outlives dropped links (anyio I/O)."""

    #: Coroutine calls never run without an event loop here.
    inline = False

    def __init__(
        self,
        url: str,
        connector: Connector,
        max_payload: int,
        options: LinkOptions | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        super().__init__(url, max_payload, options, on_event)
        self._connector = connector
        self._stream: anyio.abc.ByteStream | None = None
        self._decoder = FrameDecoder(max_payload)
        self._link_up = anyio.Event()
        self._send_lock = anyio.Lock()
        self._outbox: list[bytes | bytearray | memoryview] = []
        self._outbox_bytes = 0
        self._outbox_ready = anyio.Event()

    def _wake(self, pending: Pending) -> None:
        if pending.waiter is not None:
            pending.waiter.set()

    # --- handshake -------------------------------------------------------------------
    async def _handshake(
        self, stream: anyio.abc.ByteStream, opcode: Opcode, args: dict[str, Any]
    ) -> tuple[dict[str, Any], FrameDecoder]:
        """Send HELLO or RESUME on a fresh stream; the worker's reply and the decoder
        that holds whatever arrived behind it."""
        decoder = FrameDecoder(self._max_payload)
        for part in encode_frame_parts(opcode, 0, Flags.NONE, args):
            await stream.send(part)  # type: ignore[arg-type]
        first = True
        while True:
            frame = decoder.next_frame()
            if frame is None:
                try:
                    data = await stream.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    raise HipConnectionError(
                        message=f"{self.url} closed the connection during the handshake"
                    ) from None
                if first:
                    check_first_bytes(self.url, data)
                    first = False
                decoder.feed(data)
                continue
            reply = handshake_reply(frame, opcode, self.url)
            if reply is not None:
                return reply, decoder

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
        self._accept_handshake(reply)
        self._install(stream, decoder)
        return reply

    def _install(self, stream: anyio.abc.ByteStream, decoder: FrameDecoder) -> None:
        self._stream = stream
        self._decoder = decoder
        self._last_received = time.monotonic()
        # Whatever was batched for the old link is in the resend buffer already.
        self._outbox, self._outbox_bytes = [], 0
        self._drop_batch()
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
                    if frame.request_id:
                        self._deliver(frame)
                    elif self._from_worker(frame):
                        await self._send_raw(encode_frame_parts(Opcode.PING, 0, Flags.REPLY))
                data = await stream.receive(self._decoder.receive_size())
                self._last_received = time.monotonic()
                self._decoder.feed(data)
        except (anyio.EndOfStream, *_LINK_ERRORS):
            pass
        except HipError as exc:
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
        last_error: BaseException | None = None
        for attempt, timeout in self._attempts():
            try:
                with anyio.fail_after(timeout):
                    stream = await self._connector()
                    try:
                        reply, decoder = await self._handshake(
                            stream, Opcode.RESUME, self._resume_args()
                        )
                    except BaseException:
                        await anyio.aclose_forcefully(stream)
                        raise
            except (SessionLostError, AuthError, VersionMismatchError) as exc:
                self._cannot_resume(exc)
                return False
            except (HipError, TimeoutError, *_LINK_ERRORS) as exc:
                last_error = exc
                await anyio.sleep(self._backoff())
                continue
            async with self._send_lock:
                self._install(stream, decoder)
                again = self._to_resend(int(reply.get("last_executed_id", 0)))
                for sent in again:
                    await self._write_request_locked(sent)
                await self._flush_locked()
            self._emit("resumed", attempt=attempt, resent=len(again))
            return True
        self._gave_up(last_error)
        return False

    # --- failure -----------------------------------------------------------------------
    def _lose(self, error: HipError) -> None:
        super()._lose(error)
        self._link_up.set()  # wake senders waiting for a link: they see the error

    async def aclose(self) -> None:
        """Close for good (after GOODBYE); whatever still waits fails."""
        self._closing = True
        self._broken = self._broken or HipConnectionError(message="the connection is closed")
        stream = self._stream
        self._link_up.set()
        if stream is not None:
            await anyio.aclose_forcefully(stream)

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
        await self._write_batch_locked()
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

    async def _write_batch_locked(self) -> None:
        """Write the open batch of launches or copies (before anything else is written,
        so that frames keep the order of their request ids)."""
        sent = self._close_batch()
        if sent is not None:
            await self._write_request_locked(sent)

    async def _write_request_locked(self, sent: Sent) -> None:
        """Put one request's frames in the outbox (small) or on the wire (large)."""
        total = sent.data.nbytes
        if self._is_small(sent, self.chunk_bytes):
            for part in next(self._frames(sent))[0]:
                self._outbox.append(bytes(part) if isinstance(part, memoryview) else part)
                self._outbox_bytes += len(part)
            if sent.progress is not None:
                sent.progress(total, total)
            return
        await self._flush_locked()
        stream = self._stream
        if stream is None:
            return
        try:
            for parts, done in self._frames(sent):
                for part in parts:
                    await stream.send(part)  # type: ignore[arg-type]
                if sent.progress is not None:
                    sent.progress(done, total)
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
        pending: Pending | None,
        progress: Progress | None = None,
    ) -> int:
        """Assign the next id and send, all under the send lock so ids follow wire order.
        Waits while the link is down; never leaves half a request on the wire."""
        await self._hold_send_lock()
        try:
            sent = self._track(opcode, flags, args, data, pending, progress)
            with anyio.CancelScope(shield=True):
                await self._write_batch_locked()
                await self._write_request_locked(sent)
                if pending is not None or self._outbox_bytes >= self.options.coalesce_bytes:
                    await self._flush_locked()
                elif self._outbox:
                    self._outbox_ready.set()
            return sent.request_id
        finally:
            self._send_lock.release()

    async def _hold_send_lock(self) -> None:
        """Take the send lock with a link up, waiting for one while it is down; raises
        once the session is lost. A free lock is taken without an event-loop pass, so a
        small fire-and-forget request then only joins the outbox (no await at all)."""
        while True:
            if self._broken is not None:
                raise self._broken
            if self._stream is None:
                await self._link_up.wait()
                continue
            try:
                self._send_lock.acquire_nowait()
            except anyio.WouldBlock:
                with anyio.CancelScope(shield=True):
                    await self._send_lock.acquire()
            if self._stream is not None:
                return
            self._send_lock.release()

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
        view = byte_view(data)
        pending = Pending(opcode, sink, anyio.Event())
        request_id = 0
        try:
            if timeout is None:  # no cancel scope to set up on the common path
                request_id = await self._submit(opcode, Flags.NONE, args, view, pending, progress)
                await pending.waiter.wait()
            else:
                with anyio.fail_after(timeout):
                    request_id = await self._submit(
                        opcode, Flags.NONE, args, view, pending, progress
                    )
                    await pending.waiter.wait()
        except TimeoutError:
            self._abandon(request_id)
            raise HipTimeoutError(
                message=f"{opcode_name(opcode)} got no reply within {timeout} s"
            ) from None
        except BaseException:
            if request_id:
                self._abandon(request_id)
            raise
        return self._result(pending)

    async def _post_batched(self, opcode: int, args: dict[str, Any], item: BatchItem) -> None:
        """A fire-and-forget request into the open batch, or a new one (LinkState)."""
        await self._hold_send_lock()
        try:
            if not self._add_to_batch(item):
                filled = self._batch_filled(item)
                with anyio.CancelScope(shield=True):
                    # The batch before goes to the outbox, then this one opens; the
                    # flusher sends it after coalesce_delay, or the next request; a
                    # full one goes now (pipelined with the posts that follow).
                    await self._write_batch_locked()
                    if filled or self._outbox_bytes >= self.options.coalesce_bytes:
                        await self._flush_locked()
                    self._open_batch(opcode, args, item)
                    self._outbox_ready.set()
        finally:
            self._send_lock.release()

    async def notify(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request: no reply; an error comes with a later call.
        The bytes are copied, so the caller may reuse its buffer at once. Launches of one
        configuration, and small copies on one stream, go in batches (LinkOptions)."""
        view = byte_view(data)
        item = self._batch_item(opcode, args, view)
        if item is not None:
            await self._post_batched(opcode, args, item)
        else:
            if view.nbytes:
                view = memoryview(bytes(view))
            await self._submit(opcode, Flags.NO_REPLY, args, view, None)
        if self._unacked_bytes > self.options.resend_buffer_bytes:
            # Bound the resend buffer: a barrier's reply acknowledges everything before it.
            await self.request(Opcode.BARRIER)
