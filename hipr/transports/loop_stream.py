"""A connected socket as an anyio ``ByteStream`` driven by asyncio's own transport.

Under asyncio (and uvloop) the cheapest way for Python to read a socket is a protocol
whose ``data_received`` the loop calls as bytes arrive: the socket stays registered for
reading, and a waiting task is woken by resolving one future. Waiting with
``wait_readable`` instead registers and unregisters the socket on every wait (two
``epoll_ctl`` calls and a callback handle), and anyio's own asyncio stream pauses and
resumes reading around every ``receive()`` and writes with a zero high-water mark: on
the 2-core test machine both cost 13-15 µs more per round trip than this stream.

Reading is paused only when more than ``READ_HIGH_WATER`` bytes wait unread, so a slow
consumer still bounds memory; a send waits only while the transport's write buffer is
above its high-water mark. Under trio, :func:`hipr.transports.unix.socket_stream` keeps
the portable ``wait_readable`` stream.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

import anyio
from anyio.abc import ByteStream

from hipr.transports._common import socket_attributes
from hipr.transports.base import TransportAttribute
from hipr.transports.thread_writes import ThreadWrites

__all__ = ["LoopSocketStream", "open_loop_stream"]

#: Unread bytes above which the loop stops reading the socket (until they are taken).
READ_HIGH_WATER = 8 << 20
#: Bytes the transport may buffer for sending before a send waits for them to drain. A
#: write the socket cannot take at once is copied into the transport's buffer whole, so
#: a connection holds at most one reply chunk (4 MiB) plus this: small, because a
#: worker may serve hundreds of slow readers (4 MiB here measured no faster).
WRITE_HIGH_WATER = 256 << 10


#: A read into a payload this large gives the loop's other callbacks a turn before the
#: next read of the same socket (``_Protocol._yield_turn``).
YIELD_AFTER_BYTES = 256 << 10

#: The read buffer the loop receives into between large payloads (uvloop's own size).
SCRATCH_BYTES = 256 << 10


_SCRATCH = threading.local()


def _scratch() -> memoryview:
    """The calling thread's scratch read buffer, shared by all of its loop's streams:
    the loop fills it and calls ``buffer_updated`` back to back, which copies the bytes
    out, so one buffer per loop serves every connection (one per connection would cost
    a worker with thousands of clients a quarter of a MiB each)."""
    view: memoryview | None = getattr(_SCRATCH, "view", None)
    if view is None:
        view = _SCRATCH.view = memoryview(bytearray(SCRATCH_BYTES))
    return view


class _Protocol(asyncio.BufferedProtocol):
    """Collects received bytes and wakes the one task waiting for them.

    A buffered protocol, so that the loop receives into a buffer of ours: into a scratch
    buffer ordinarily, and in push mode straight into the place a large payload must
    end up when the consumer names one (``target``), so that its bytes are copied once,
    from the kernel, instead of into a new ``bytes`` per read and again when joined."""

    def __init__(self) -> None:
        self._scratch_view = _scratch()
        #: Push mode: where the next bytes should go (None: the scratch buffer), and
        #: what to call once some arrived there.
        self.target: Callable[[], memoryview | None] | None = None
        self.target_filled: Callable[[int], None] | None = None
        self._into_target = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof = False
        self.error: BaseException | None = None
        self.closed = False
        self.reader: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.reading_paused = False
        self.writing_paused = False
        #: Push mode (``LoopSocketStream.deliver_to``): bytes go straight to these.
        self.on_data: Callable[[bytes], None] | None = None
        self.on_end: Callable[[], None] | None = None
        #: Reading paused for a turn of the loop (:meth:`_yield_turn`).
        self._yielding = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports quack like asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.target is not None:
            view = self.target()
            if view is not None:
                self._into_target = True
                return view
        self._into_target = False
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_target:
            assert self.target_filled is not None
            self.target_filled(nbytes)
            if nbytes >= YIELD_AFTER_BYTES:
                self._yield_turn()
        else:
            self.data_received(bytes(self._scratch_view[:nbytes]))

    def _yield_turn(self) -> None:
        """After a large read into a payload: stop reading this socket until the loop
        has served the other callbacks that are ready. The loop would otherwise read on
        while bytes keep coming (libuv up to 32 reads of a MiB per wake-up), and another
        tenant's small call waited behind an upload's chunks: at worst 4.7-9.5 ms on the
        H200 host, 2.4-2.8 ms with these turns, the upload as fast
        (``benchmarks/upload_neighbour.py``, docs/gpu-runs/2026-11-26-ring-floor.txt)."""
        if self.reading_paused or self.closed or self._yielding:
            return
        assert self.transport is not None
        self._yielding = True
        self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._take_turn_again)

    @property
    def yielding(self) -> bool:
        """True while reading is paused for a turn of the loop."""
        return self._yielding

    def _take_turn_again(self) -> None:
        self._yielding = False
        if not self.reading_paused and not self.closed:
            assert self.transport is not None
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.on_data is not None:
            self.on_data(data)
            return
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > READ_HIGH_WATER and not self.reading_paused:
            self.reading_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        _wake(self.reader)

    def eof_received(self) -> bool:
        self.eof = True
        _wake(self.reader)
        if self.on_end is not None:
            self.on_end()
        return True  # keep the write side open: the peer may still read our replies

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None:
            self.error = exc
        _wake(self.reader)
        _wake(self.drained)
        if self.on_end is not None:
            self.on_end()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        _wake(self.drained)


def _wake(waiter: asyncio.Future[None] | None) -> None:
    # A waiter cancelled at the moment bytes arrive is already done: setting it again
    # would make the loop report InvalidStateError.
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class LoopSocketStream(ByteStream):
    """A stream socket served by the running asyncio loop's transport (see module doc)."""

    def __init__(
        self, transport: asyncio.Transport, protocol: _Protocol, sock: socket.socket
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._sock = sock
        self._closed = False
        #: Writes of whole frames from other threads (``write_from_thread``).
        self.thread_writes = ThreadWrites(sock)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Bytes from the peer (at most ``max_bytes``); ``EndOfStream`` once it closed."""
        if max_bytes < 1:
            raise ValueError("max_bytes must be a positive integer")
        protocol = self._protocol
        while not protocol.chunks:
            if self._closed:
                raise anyio.ClosedResourceError
            if protocol.error is not None:
                raise anyio.BrokenResourceError from protocol.error
            if protocol.eof or protocol.closed:
                raise anyio.EndOfStream
            if protocol.reader is not None:
                raise anyio.BusyResourceError("receiving")
            waiter = protocol.reader = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                protocol.reader = None
        if self._closed:
            raise anyio.ClosedResourceError
        chunk = protocol.chunks.popleft()
        if len(chunk) > max_bytes:
            protocol.chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        protocol.buffered -= len(chunk)
        if protocol.reading_paused and protocol.buffered <= READ_HIGH_WATER // 2:
            protocol.reading_paused = False
            self._transport.resume_reading()
        return chunk

    async def send(self, item: bytes) -> None:
        """Queue ``item`` on the transport; wait while its buffer is over the mark."""
        if self._closed:
            raise anyio.ClosedResourceError
        protocol = self._protocol
        if protocol.closed or self._transport.is_closing():
            raise anyio.BrokenResourceError from protocol.error
        self._write(item)
        while protocol.writing_paused and not protocol.closed:
            waiter = protocol.drained = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                protocol.drained = None
        if protocol.closed and protocol.error is not None:
            raise anyio.BrokenResourceError from protocol.error
        # Without a wait above, a burst of sends would never let other tasks run: the
        # caller's next await of a receive (or the loop's next pass) does that.

    def deliver_to(
        self,
        on_data: Callable[[bytes], None],
        on_end: Callable[[], None],
        target: Callable[[], memoryview | None] | None = None,
        target_filled: Callable[[int], None] | None = None,
    ) -> None:
        """Push mode: from now on the loop hands each arriving chunk to ``on_data``, in
        the I/O callback itself, and calls ``on_end`` at end of stream or when the link
        breaks; ``receive`` is not used any more. Bytes already buffered go first.
        Before each read, ``target()`` may name the buffer the next bytes must land in
        (then ``target_filled(n)`` reports them instead of ``on_data``).

        A worker connection uses it to decode requests as they arrive, with no task
        woken just to read (one event-loop pass less per request), and to receive a
        large payload straight into its own buffer."""
        protocol = self._protocol
        protocol.on_data = on_data
        protocol.on_end = on_end
        protocol.target = target
        protocol.target_filled = target_filled
        while protocol.chunks:
            chunk = protocol.chunks.popleft()
            protocol.buffered -= len(chunk)
            on_data(chunk)
        if protocol.reading_paused:
            protocol.reading_paused = False
            self._transport.resume_reading()
        if protocol.eof or protocol.closed or self._closed:
            on_end()

    def pause_reading(self, paused: bool) -> None:
        """Push mode's back-pressure: stop (or restart) reading the socket."""
        protocol = self._protocol
        if paused != protocol.reading_paused and not protocol.closed and not self._closed:
            protocol.reading_paused = paused
            if paused:
                self._transport.pause_reading()
            elif not protocol.yielding:  # else the turn's end resumes it
                self._transport.resume_reading()

    @property
    def unread_bytes(self) -> int:
        """Bytes the loop read from the socket that neither ``receive`` nor push
        delivery has taken yet."""
        return self._protocol.buffered

    @property
    def writable_now(self) -> bool:
        """True when a write would be taken at once: open, and not held back by the
        transport's high-water mark (a peer that does not read)."""
        protocol = self._protocol
        return not (
            self._closed
            or protocol.closed
            or protocol.writing_paused
            or self._transport.is_closing()
        )

    def write_nowait(self, data: bytes) -> None:
        """Queue ``data`` for sending without waiting (a small frame that must not wait
        for a task: a heartbeat's answer). The caller keeps whole frames whole."""
        if self._closed or self._protocol.closed or self._transport.is_closing():
            raise anyio.BrokenResourceError
        self._write(data)

    def _write(self, data: bytes) -> None:
        """Queue ``data`` on the transport, after the rest of a frame that another
        thread began (see :meth:`write_from_thread`)."""
        thread_writes = self.thread_writes
        with thread_writes.lock:
            if thread_writes.held:
                self._transport.write(thread_writes.take_held())
            if data:
                self._transport.write(data)

    def write_from_thread(self, data: bytes, busy: Callable[[], bool]) -> bool:
        """From a thread other than the loop's: send ``data`` (one whole frame) at once
        if nothing is queued ahead of it and ``busy()`` says no frame is half-written
        (``hipr.transports.thread_writes``); False, with nothing sent, otherwise."""
        return self.thread_writes.write(data, busy, self._transport.get_write_buffer_size)

    def reserve_native_write(self, busy: Callable[[], bool]) -> int:
        """On the loop: a descriptor a native call may send one whole frame to, this
        stream's writes held back until :meth:`native_written`; -1 when it may not now
        (``ThreadWrites.reserve``)."""
        return self.thread_writes.reserve(busy, self._transport.get_write_buffer_size)

    def native_written(self, data: bytes, sent: int) -> None:
        """After :meth:`reserve_native_write`: ``sent`` bytes of ``data`` left (0 or a
        negative ``-errno``: none); the rest goes first with the next write."""
        self.thread_writes.reserved_written(data, sent)

    @property
    def thread_write_held(self) -> bool:
        """True while the rest of a frame a thread began waits unsent."""
        return bool(self.thread_writes.held)

    async def flush_thread_write(self) -> None:
        """Send the rest of a frame that :meth:`write_from_thread` began, if the socket
        took only part of it (call before the connection's next frame, under its send
        lock)."""
        if not self._closed:
            self._write(b"")

    async def send_eof(self) -> None:
        """Half-close: the peer reads end of stream and can still send to us."""
        if self._closed:
            raise anyio.ClosedResourceError
        if self._transport.can_write_eof():
            self._transport.write_eof()
        await anyio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Close; a task waiting in ``receive``/``send`` gets ``ClosedResourceError``."""
        if not self._closed:
            self._closed = True
            with self.thread_writes.lock:
                self.thread_writes.close()
            self._transport.abort()  # unsent bytes are dropped, as closing a socket does
            _wake(self._protocol.reader)
            _wake(self._protocol.drained)
        await anyio.lowlevel.checkpoint()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """anyio's ``SocketAttribute`` family (addresses, ports for TCP, raw socket), and
        the stream's capabilities: push delivery and writes from other threads."""
        return {
            **socket_attributes(self._sock, connected=True),
            TransportAttribute.push_delivery: lambda: self,
            TransportAttribute.thread_writer: lambda: self,
        }


async def open_loop_stream(sock: socket.socket) -> LoopSocketStream:
    """Hand a connected socket to the running asyncio loop and wrap its transport."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    transport, protocol = await loop.connect_accepted_socket(_Protocol, sock)
    return LoopSocketStream(transport, protocol, sock)
