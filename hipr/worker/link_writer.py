"""What a worker connection writes: whole frames under one lock, heartbeat answers that
must not wait, and the replies a session's GPU thread writes itself."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import anyio.abc

from hipr.errors import HipError
from hipr.protocol.codec import Frame, encode_frame, encode_frame_parts
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.transports.base import (
    PushDelivery,
    ThreadWriter,
    TransportAttribute,
    stream_capability,
)

__all__ = ["LINK_ERRORS", "LinkLost", "LinkWriter"]


class LinkLost(Exception):
    """The link died under a request; the request did not complete and will be resent."""


#: What a write or read raises once the link is gone.
LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, LinkLost, OSError)


class LinkWriter:
    """The sending side of one connection: frames from several tasks never interleave."""

    __slots__ = ("_owed_pongs", "lock", "push", "stream", "thread_writer")

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        #: Held while a frame is being written.
        self.lock = anyio.Lock()
        #: Push mode: the stream's delivery, once the reader has started it.
        self.push: PushDelivery | None = None
        #: The stream, where other threads may write to it (plain sockets), else None.
        self.thread_writer: ThreadWriter | None = stream_capability(
            stream, TransportAttribute.thread_writer
        )
        #: Push mode: answers to heartbeats that arrived while a frame was being sent.
        self._owed_pongs: list[bytes] = []

    async def send(
        self,
        opcode: int,
        request_id: int,
        flags: Flags,
        args: Any = None,
        bulk: bytes | bytearray | memoryview = b"",
    ) -> None:
        """Send one frame."""
        await self.send_parts(encode_frame_parts(opcode, request_id, flags, args, bulk))

    async def send_parts(self, parts: list[bytes | bytearray | memoryview]) -> None:
        """Write whole frames under the send lock; a free lock is taken without an
        event-loop pass (anyio's ``async with`` always yields once)."""
        lock = self.lock
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            for part in parts:
                await self.stream.send(part)  # type: ignore[arg-type]
        finally:
            if self._owed_pongs:
                self._pay_pongs()
            lock.release()

    async def send_bytes(self, data: bytes) -> None:
        """Write one frame's bytes (see :meth:`send_parts`)."""
        await self.send_parts([data])

    async def send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        """An error reply."""
        await self.send(opcode, request_id, Flags.REPLY | Flags.ERROR, error.to_wire())

    async def try_send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        """An error reply, if the link still takes it within two seconds."""
        with anyio.move_on_after(2):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await self.send_error(opcode, request_id, error)

    def pong(self, frame: Frame) -> None:
        """Push mode: answer a PING now (a heartbeat must not wait for the GPU), or right
        after the frame being sent, whose bytes it must not split."""
        if frame.flags & (Flags.REPLY | Flags.NO_REPLY) or self.push is None:
            return
        self._owed_pongs.append(encode_frame(Opcode.PING, frame.request_id, Flags.REPLY, {}))
        if not self.lock.locked():
            self._pay_pongs()

    def _pay_pongs(self) -> None:
        pongs, self._owed_pongs = self._owed_pongs, []
        if self.push is not None:
            with contextlib.suppress(*LINK_ERRORS):
                for pong in pongs:
                    self.push.write_nowait(pong)

    async def flush_thread_write(self) -> None:
        """Send the rest of a reply a GPU thread began, if the socket took only part."""
        stream = self.thread_writer
        if stream is not None and stream.thread_write_held:
            await self.lock.acquire()
            try:
                await stream.flush_thread_write()
            finally:
                self.lock.release()
