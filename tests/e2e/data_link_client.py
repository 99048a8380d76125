"""A hand-driven session with data links (protocol 1.4), for the tests of striped
uploads: DATA_LINK handshakes and chunk frames made by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import anyio.abc

from hipr.errors import HipError
from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
from tests.e2e.conftest import Endpoint
from tests.e2e.raw import RawSession

#: The chunk size of the test workers (``max_frame_bytes`` 8 MiB: chunks of 4 MiB).
CHUNK = 4 << 20


@dataclasses.dataclass
class Striped:
    """A session past its HELLO, and what HELLO said."""

    raw: RawSession
    hello: dict[str, Any]
    endpoint: Endpoint
    links: list[anyio.abc.ByteStream] = dataclasses.field(default_factory=list)

    async def open_link(self, **override: Any) -> anyio.abc.ByteStream:
        """A new data link of this session (its DATA_LINK answered), or HipError."""
        stream = await self.endpoint.raw()
        args = {
            "session_id": self.hello["session_id"],
            "resume_token": self.hello["resume_token"],
            **override,
        }
        try:
            (reply,) = await RawSession(stream).replies(
                encode_frame(Opcode.DATA_LINK, 0, Flags.NONE, args), 1
            )
        except HipError:
            await stream.aclose()
            raise
        assert 0 <= reply["index"] < self.hello["data_links"]
        self.links.append(stream)
        return stream


def chunk_frame(request_id: int, offset: int, data: bytes) -> bytes:
    """One chunk of a striped upload, as a data link carries it."""
    return encode_frame(Opcode.DATA, request_id, Flags.NONE, {"offset": offset}, data)


def pattern(size: int) -> bytes:
    """Bytes that differ at every offset of a chunk."""
    return (bytes(range(251)) * (size // 251 + 1))[:size]


async def receive_chunks(
    link: anyio.abc.ByteStream, request_id: int, count: int
) -> dict[int, bytes]:
    """The next ``count`` download chunks of ``request_id`` on ``link``, by offset."""
    decoder = FrameDecoder(max_payload=64 << 20)
    chunks: dict[int, bytes] = {}
    with anyio.fail_after(20):
        while len(chunks) < count:
            frame = decoder.next_frame()
            if frame is None:
                decoder.feed(await link.receive(1 << 20))
                continue
            assert frame.opcode == Opcode.DATA and frame.flags == Flags.REPLY, frame.header
            assert frame.request_id == request_id
            chunks[frame.args["offset"]] = bytes(frame.bulk)
    return chunks
