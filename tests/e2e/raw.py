"""Raw hipr frames against a test worker, for tests that need exact control over which
requests arrive together (a list of frames sent in one write)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import numpy as np
import pytest

from hipr.errors import HipError
from hipr.kernels.kernel_args import pack_args
from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
from hipr.worker.server import Worker

if TYPE_CHECKING:  # the conftest imports this module for its fixture
    from tests.e2e.conftest import Endpoint


class RawSession:
    """A hand-driven session: requests written as given, replies read back."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.next_id = 1
        #: The bulk bytes of the last reply read.
        self.last_bulk = memoryview(b"")

    def frame(
        self, opcode: Opcode, args: Any, *, no_reply: bool = False, bulk: bytes = b""
    ) -> bytes:
        self.next_id += 1
        flags = Flags.NO_REPLY if no_reply else Flags.NONE
        return encode_frame(opcode, self.next_id, flags, args, bulk)

    async def replies(self, data: bytes, count: int) -> list[Any]:
        """Send ``data`` in one write; the next ``count`` replies' arguments."""
        await self.stream.send(data)
        found: list[Any] = []
        with anyio.fail_after(10):
            while len(found) < count:
                for frame in self.decoder.frames():
                    if frame.request_id == 0 and Flags.REPLY not in frame.flags:
                        continue  # the worker's heartbeat PING: not a reply
                    if Flags.ERROR in frame.flags:
                        raise HipError.from_wire(frame.args)
                    found.append(frame.args)
                    self.last_bulk = frame.bulk
                if len(found) < count:
                    self.decoder.feed(await self.stream.receive())
        return found

    async def call(self, opcode: Opcode, args: Any) -> Any:
        return (await self.replies(self.frame(opcode, args), 1))[0]


@pytest.fixture
async def raw_session(endpoint: Endpoint, worker: Worker) -> AsyncIterator[RawSession]:
    """A raw session with the test worker, past its HELLO."""
    stream = await endpoint.raw()
    session = RawSession(stream)
    await session.replies(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "raw"}), 1)
    yield session
    await stream.aclose()


def launch_frame(
    session: RawSession, function: int, ptr: int, value: float, count: int, blocks: int = 1
) -> bytes:
    """A fire-and-forget fill_f32 of ``count`` floats; ``blocks`` of 1,024 threads, or one
    thread."""
    packed = pack_args([np.uint64(ptr), np.float32(value), np.uint64(count)])
    block = 1024 if blocks > 1 else 1
    args = {"function": function, "grid": [blocks], "block": [block], **packed.to_wire()}
    # pack_args refuses plain ints, and a raw address is not a DevicePtr: mark it.
    args["ptrs"] = [0]
    return session.frame(Opcode.LAUNCH_KERNEL, args, no_reply=True)
