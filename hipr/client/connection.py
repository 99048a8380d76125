"""The client's side of a connection: request ids, reply routing, chunked bulk data.

One reader task routes every reply frame to the request waiting for it, so several
tasks may share a connection. A request's frames (its first frame and its DATA
continuations) are sent under one lock so they never interleave with another's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from hipr.errors import HipConnectionError, HipError, HipTimeoutError, ProtocolError
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame_parts
from hipr.protocol.header import MAX_REQUEST_ID, Flags
from hipr.protocol.opcodes import Opcode, opcode_name

RECEIVE_SIZE = 1 << 18
Buffer = bytes | bytearray | memoryview
#: Where a reply's bulk bytes go: called with each chunk in order.
Sink = Callable[[memoryview], None]


@dataclass(slots=True)
class _Pending:
    opcode: int
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: HipError | None = None
    sink: Sink | None = None
    bulk: bytearray | None = None


class ClientConnection:
    """A framed, multiplexed request/reply link to a worker."""

    def __init__(self, stream: anyio.abc.ByteStream, url: str, max_payload: int) -> None:
        self.stream = stream
        self.url = url
        self.chunk_bytes = 1 << 20
        self._decoder = FrameDecoder(max_payload)
        self._send_lock = anyio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._broken: HipError | None = None

    # --- lifecycle -----------------------------------------------------------------
    async def reader(self) -> None:
        """Route replies until the stream ends; then fail whatever still waits."""
        error: HipError = HipConnectionError(message=f"connection to {self.url} was closed")
        try:
            while True:
                try:
                    data = await self.stream.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    break
                self._decoder.feed(data)
                for frame in self._decoder.frames():
                    self._route(frame)
        except ProtocolError as exc:
            error = exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            error = HipConnectionError(message=f"connection to {self.url} failed: {exc!r}")
        finally:
            self._fail_all(self._broken or error)

    def _fail_all(self, error: HipError) -> None:
        self._broken = self._broken or error
        for pending in self._pending.values():
            pending.error = pending.error or error
            pending.done.set()
        self._pending.clear()

    @property
    def broken(self) -> HipError | None:
        """Why the connection can no longer be used, if it can't."""
        return self._broken

    async def aclose(self) -> None:
        """Close the stream (the reader then fails anything still pending)."""
        self._broken = self._broken or HipConnectionError(message="the connection is closed")
        await self.stream.aclose()

    # --- replies -------------------------------------------------------------------
    def _route(self, frame: Frame) -> None:
        if frame.request_id == 0:
            # Worker-initiated: an error here ends the connection (protocol violation,
            # shutdown notice); the worker closes right after sending it.
            if Flags.ERROR in frame.flags:
                self._fail_all(HipError.from_wire(frame.args))
            return
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
                        pending.sink(frame.bulk)
                    except HipError as exc:
                        pending.error = exc
                else:
                    if pending.bulk is None:
                        pending.bulk = bytearray()
                    pending.bulk += frame.bulk
            if Flags.MORE in frame.flags:
                return
            pending.result = frame.args
        del self._pending[frame.request_id]
        pending.done.set()

    # --- requests ------------------------------------------------------------------
    def _next_id(self) -> int:
        request_id = next(self._ids)
        if request_id > MAX_REQUEST_ID:
            self._ids = itertools.count(2)
            request_id = 1
        return request_id

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise self._broken

    async def _send_frames(
        self, opcode: int, request_id: int, flags: Flags, args: Any, data: memoryview
    ) -> None:
        chunk = self.chunk_bytes
        first = data[:chunk]
        rest = data[chunk:]
        head_flags = flags | (Flags.MORE if rest.nbytes else Flags.NONE)
        try:
            async with self._send_lock:
                for part in encode_frame_parts(opcode, request_id, head_flags, args, first):
                    await self.stream.send(part)  # type: ignore[arg-type]
                offset = 0
                while offset < rest.nbytes:
                    piece = rest[offset : offset + chunk]
                    offset += piece.nbytes
                    more = Flags.MORE if offset < rest.nbytes else Flags.NONE
                    for part in encode_frame_parts(Opcode.DATA, request_id, more, None, piece):
                        await self.stream.send(part)  # type: ignore[arg-type]
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            error = HipConnectionError(message=f"connection to {self.url} failed: {exc!r}")
            self._fail_all(error)
            raise error from exc

    async def request(
        self,
        opcode: Opcode,
        args: Any = None,
        data: Buffer = b"",
        *,
        sink: Sink | None = None,
        timeout: float | None = None,
    ) -> tuple[Any, bytes]:
        """Send a request and wait for its reply: (result, bulk bytes not given to sink)."""
        self._check_usable()
        request_id = self._next_id()
        pending = _Pending(opcode, sink=sink)
        self._pending[request_id] = pending
        try:
            with anyio.fail_after(timeout):
                await self._send_frames(opcode, request_id, Flags.NONE, args, _bytes_view(data))
                await pending.done.wait()
        except TimeoutError:
            raise HipTimeoutError(
                message=f"{opcode_name(opcode)} got no reply within {timeout} s"
            ) from None
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result, bytes(pending.bulk) if pending.bulk else b""

    async def notify(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request: no reply; an error comes with a later call."""
        self._check_usable()
        await self._send_frames(opcode, self._next_id(), Flags.NO_REPLY, args, _bytes_view(data))


def _bytes_view(data: Buffer) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        try:
            view = view.cast("B")
        except TypeError as exc:
            raise HipError(
                1, f"host buffer must be C-contiguous ({exc}); use numpy.ascontiguousarray"
            ) from None
    return view
