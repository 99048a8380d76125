"""The async client's I/O: anyio streams, a reader task, heartbeats, reconnection.

The protocol's rules (request ids in wire order, the resend buffer, reply routing,
cutting a request into frames) live in :mod:`hipr.client.link`, shared with the
blocking client; this module only moves bytes and waits.

Fire-and-forget frames are coalesced into one write per batch: flushed at every
replied request, when the batch reaches ``coalesce_bytes``, or after a short delay.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import anyio.abc

from hipr.client.link import (
    PING_FRAME,
    Beat,
    Buffer,
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
from hipr.errors import HipConnectionError, HipError
from hipr.protocol.codec import FrameDecoder
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode

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
        self._outbox_ready = anyio.Event()

    def _wake(self, pending: Pending) -> None:
        if pending.waiter is not None:
            pending.waiter.set()

    # --- handshake -------------------------------------------------------------------
    async def _shake_hands(
        self, stream: anyio.abc.ByteStream, handshake: HandshakeReader
    ) -> tuple[dict[str, Any], FrameDecoder]:
        """Write the handshake on a fresh stream and read until its answer (the I/O of
        :class:`~hipr.client.link.HandshakeReader`); closes the stream on failure."""
        try:
            for part in handshake.parts:
                await stream.send(part)  # type: ignore[arg-type]
            while True:
                try:
                    data = await stream.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    data = b""
                reply = handshake.feed(data)
                if reply is not None:
                    return reply, handshake.decoder
        except BaseException:
            await anyio.aclose_forcefully(stream)
            raise

    async def open(self, hello: dict[str, Any]) -> dict[str, Any]:
        """Connect and say HELLO; the worker's answer."""
        timeout = self.options.connect_timeout
        with anyio.fail_after(timeout):
            stream = await self._connector()
        handshake = self._hello(hello)
        try:
            with anyio.fail_after(timeout):
                reply, decoder = await self._shake_hands(stream, handshake)
        except TimeoutError:
            raise handshake.no_answer(timeout) from None
        self._accept_handshake(reply)
        self._install(stream, decoder)
        return reply

    def _install(self, stream: anyio.abc.ByteStream, decoder: FrameDecoder) -> None:
        self._stream = stream
        self._decoder = decoder
        self._link_installed()
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
                    else:
                        answer = self._from_worker(frame)
                        if answer is not None:
                            await self._send_raw(answer)
                data = await stream.receive(self._decoder.receive_size())
                self._last_received = time.monotonic()
                self._decoder.feed(data)
        except (anyio.EndOfStream, *_LINK_ERRORS):
            pass
        except HipError as exc:
            self._lose(exc)
        finally:
            self._stream = None
            self._link_closed()
            self._link_up = anyio.Event()
            scope.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(stream)

    async def _heartbeat(self, scope: anyio.CancelScope) -> None:
        period = self._tick_period()
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            # The reader task reads all the time: silence counts from the last frame.
            beat = self._beat(now, 0.0)
            if beat is Beat.DEAD:
                silent = now - self._last_received
                log.warning("link silent; treating it as dead", url=self.url, seconds=silent)
                scope.cancel()
                return
            if beat is Beat.PING:
                await self._send_raw(PING_FRAME)

    async def _flusher(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready = anyio.Event()
            await anyio.sleep(self.options.coalesce_delay)
            async with self._send_lock:
                await self._send_writes(self._flush_writes())

    async def _reconnect(self) -> bool:
        for attempt, timeout in self._attempts():
            try:
                with anyio.fail_after(timeout):
                    stream = await self._connector()
                    reply, decoder = await self._shake_hands(stream, self._resume())
            except (HipError, TimeoutError, *_LINK_ERRORS) as exc:
                if not self._attempt_failed(exc):
                    return False
                await anyio.sleep(self._backoff())
                continue
            async with self._send_lock:
                self._install(stream, decoder)
                again = self._resumed(reply)
                await self._send_writes(self._resend_writes(again))
            self._emit("resumed", attempt=attempt, resent=len(again))
            return True
        self._gave_up()
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
    async def _send_raw(self, data: bytes) -> None:
        """A frame outside the request sequence (heartbeats); dropped if the link is down."""
        with anyio.CancelScope(shield=True):
            async with self._send_lock:
                stream = self._stream
                if stream is None:
                    return
                await self._send_writes(self._flush_writes())
                try:
                    await stream.send(data)
                except _LINK_ERRORS:
                    pass

    async def _send_writes(self, writes: Iterable[Part]) -> None:
        """Write what the link state gives, in order (under the send lock). A link that
        fails meanwhile is left to the reader, which sees it dead; the resend covers
        what was not written."""
        stream = self._stream
        try:
            for part in writes:
                assert stream is not None  # the state writes nothing without a link
                await stream.send(part)  # type: ignore[arg-type]
        except _LINK_ERRORS:
            pass

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
                await self._send_writes(self._submit_writes(sent, flush=pending is not None))
            if self._flush_due():
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
        deadline = self._deadline(timeout)
        request_id = 0
        try:
            if deadline is None:  # no cancel scope to set up on the common path
                request_id = await self._submit(opcode, Flags.NONE, args, view, pending, progress)
                await pending.waiter.wait()
            else:
                with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                    request_id = await self._submit(
                        opcode, Flags.NONE, args, view, pending, progress
                    )
                    await pending.waiter.wait()
        except TimeoutError:
            raise self._timed_out(request_id, opcode, timeout) from None
        except BaseException:
            self._stopped_waiting(request_id, pending)
            raise
        return self._result(pending)

    async def notify(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request: no reply; an error comes with a later call.
        The bytes are copied, so the caller may reuse its buffer at once. Launches of one
        configuration, and small copies on one stream, go in batches (LinkOptions)."""
        await self._hold_send_lock()
        try:
            writes = self._post_writes(opcode, args, data)
            if writes is not None:
                await self._send_posted(writes)
        finally:
            self._send_lock.release()
        if self._needs_barrier():
            await self.request(Opcode.BARRIER)

    async def launch(self, plan: LaunchPlan, data: bytes) -> None:
        """A fire-and-forget kernel launch from its plan (``Function._launch_plan``)."""
        await self._hold_send_lock()
        try:
            writes = self._launch_writes(plan, data)
            if writes is not None:
                await self._send_posted(writes)
        finally:
            self._send_lock.release()
        if self._needs_barrier():
            await self.request(Opcode.BARRIER)

    async def _send_posted(self, writes: Iterable[Part]) -> None:
        """Write a fire-and-forget request's writes (under the send lock); the flusher
        sends what waits after ``coalesce_delay``, or the next request does."""
        with anyio.CancelScope(shield=True):
            await self._send_writes(writes)
        if self._flush_due():
            self._outbox_ready.set()
