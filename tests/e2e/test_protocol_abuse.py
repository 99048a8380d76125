"""Raw frames against a real worker: refusals are clear, and others keep being served."""

from __future__ import annotations

import itertools
import os

import anyio
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError
from hipr.protocol import Flags, FrameDecoder, Header, Opcode, encode_frame
from hipr.protocol.header import PROTOCOL_VERSION, version_text
from hipr.worker.server import Worker
from tests.e2e.conftest import Endpoint

pytestmark = pytest.mark.anyio


async def exchange(endpoint: Endpoint, data: bytes, *, expect_close: bool = True) -> list:
    """Send raw bytes; the frames the worker answered with until it closed."""
    stream = await endpoint.raw()
    decoder = FrameDecoder()
    frames = []
    with anyio.fail_after(10):
        await stream.send(data)
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
            decoder.feed(chunk)
            frames.extend(decoder.frames())
            if not expect_close and frames:
                break
    await stream.aclose()
    return frames


def hello(version: int = PROTOCOL_VERSION) -> bytes:
    return encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "raw"}, version=version)


async def assert_worker_still_serves(endpoint: Endpoint) -> None:
    async with endpoint.aconnect() as gpu:
        p = await gpu.malloc(16)
        await gpu.memcpy_htod(p, b"0123456789abcdef")
        assert await gpu.memcpy_dtoh(p, 16) == b"0123456789abcdef"


async def test_unknown_major_version_gets_a_clear_error(endpoint: Endpoint, worker: Worker) -> None:
    frames = await exchange(endpoint, hello(version=0x0900))
    assert len(frames) == 1 and Flags.ERROR in frames[0].flags
    error = HipError.from_wire(frames[0].args)
    assert isinstance(error, hipr.VersionMismatchError)
    assert f"protocol {version_text(PROTOCOL_VERSION)}" in error.message
    assert "9.0" in error.message
    await assert_worker_still_serves(endpoint)


async def test_first_frame_must_be_hello(endpoint: Endpoint, worker: Worker) -> None:
    frames = await exchange(endpoint, encode_frame(Opcode.MALLOC, 1, Flags.NONE, {"size": 8}))
    assert "first frame must be HELLO" in HipError.from_wire(frames[0].args).message
    await assert_worker_still_serves(endpoint)


async def test_bad_magic_closes_with_protocol_error(endpoint: Endpoint, worker: Worker) -> None:
    frames = await exchange(endpoint, hello() + b"XXXX" + b"\0" * 40)
    errors = [HipError.from_wire(f.args) for f in frames if Flags.ERROR in f.flags]
    assert errors and isinstance(errors[-1], hipr.ProtocolError)
    assert "bad magic" in errors[-1].message
    await assert_worker_still_serves(endpoint)


async def test_oversized_frame_closes_with_protocol_error(
    endpoint: Endpoint, worker: Worker, backend: EmulatorBackend
) -> None:
    huge = Header(Opcode.MEMCPY_HTOD, 2, Flags.NONE, 2**64 - 1).pack()
    frames = await exchange(endpoint, hello() + huge)
    errors = [HipError.from_wire(f.args) for f in frames if Flags.ERROR in f.flags]
    assert errors and "over the limit" in errors[-1].message
    await assert_worker_still_serves(endpoint)
    assert backend.stats().is_zero()


async def test_malformed_cbor_is_answered_and_the_session_goes_on(
    endpoint: Endpoint, worker: Worker
) -> None:
    bad_payload = b"\x03\x00\x00\x00\xff\xff\xff"
    bad = Header(Opcode.MALLOC, 2, Flags.NONE, len(bad_payload)).pack() + bad_payload
    ping = encode_frame(Opcode.DEVICE_COUNT, 3)
    stream = await endpoint.raw()
    decoder = FrameDecoder()
    got: dict[int, object] = {}
    with anyio.fail_after(10):
        await stream.send(hello() + bad + ping)
        while 3 not in got:
            decoder.feed(await stream.receive())
            for frame in decoder.frames():
                got[frame.request_id] = frame
    await stream.aclose()
    assert Flags.ERROR in got[2].flags  # type: ignore[attr-defined]
    assert "malformed CBOR" in HipError.from_wire(got[2].args).message  # type: ignore[attr-defined]
    assert got[3].args == {"count": 2}  # type: ignore[attr-defined]


async def test_silent_client_is_dropped_after_the_handshake_timeout(
    endpoint: Endpoint, worker: Worker
) -> None:
    worker.handshake_timeout = 0.3
    stream = await endpoint.raw()
    with anyio.fail_after(5):
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await stream.receive()
    await stream.aclose()


async def test_fire_and_forget_ping_gets_no_reply(endpoint: Endpoint, worker: Worker) -> None:
    stream = await endpoint.raw()
    decoder = FrameDecoder()
    got = []
    with anyio.fail_after(10):
        await stream.send(
            hello() + encode_frame(Opcode.PING, 5, Flags.NO_REPLY) + encode_frame(Opcode.PING, 6)
        )
        while not any(f.request_id == 6 for f in got):
            decoder.feed(await stream.receive())
            got.extend(decoder.frames())
    await stream.aclose()
    assert [f.request_id for f in got if f.opcode == Opcode.PING] == [6]


def _frames_until(decoder: FrameDecoder, request_id: int, received: list) -> bool:
    received.extend(decoder.frames())
    return any(f.request_id == request_id and Flags.MORE not in f.flags for f in received)


async def test_large_payload_in_ragged_pieces_arrives_intact(
    endpoint: Endpoint, worker: Worker
) -> None:
    """A large frame's bytes cut at odd places (a piece of the header, the args and a
    few bulk bytes together, then uneven runs): under asyncio the worker takes the
    payload over mid-way and receives the rest straight into its own buffer."""
    size = (3 << 20) + 4099
    data = os.urandom(size)
    stream = await endpoint.raw()
    decoder = FrameDecoder()
    received: list = []
    with anyio.fail_after(20):
        await stream.send(hello())
        await stream.send(encode_frame(Opcode.MALLOC, 2, Flags.NONE, {"size": size}))
        while not _frames_until(decoder, 2, received):
            decoder.feed(await stream.receive())
        pointer = received[-1].args["ptr"]
        args = {"dst": pointer, "size": size}
        frame = encode_frame(Opcode.MEMCPY_HTOD, 3, Flags.NONE, args, data)
        cuts = [0, 7, 40, 300_001, 300_002, 1_000_000, 2_999_999, len(frame)]
        for start, end in itertools.pairwise(cuts):
            await stream.send(frame[start:end])
            await anyio.sleep(0.01)  # each piece its own read on the worker
        while not _frames_until(decoder, 3, received):
            decoder.feed(await stream.receive())
        assert Flags.ERROR not in received[-1].flags, received[-1].args
        await stream.send(
            encode_frame(Opcode.MEMCPY_DTOH, 4, Flags.NONE, {"src": pointer, "size": size})
        )
        back = bytearray()
        while True:
            decoder.feed(await stream.receive())
            done = False
            for reply in decoder.frames():
                if reply.request_id == 4:
                    assert Flags.ERROR not in reply.flags, reply.args
                    back += reply.bulk
                    done = Flags.MORE not in reply.flags
            if done:
                break
    await stream.aclose()
    assert bytes(back) == data


async def test_large_frame_cut_off_midway_leaves_the_worker_serving(
    endpoint: Endpoint, worker: Worker
) -> None:
    """A client that announces a 6 MiB frame, sends part of it and leaves: the
    partial payload is dropped with the link, and everyone else is served."""
    frame = encode_frame(
        Opcode.MEMCPY_HTOD, 2, Flags.NONE, {"dst": 0x1000, "size": 6 << 20}, bytes(6 << 20)
    )
    stream = await endpoint.raw()
    with anyio.fail_after(10):
        await stream.send(hello())
        await stream.send(frame[: 2 << 20])
    await stream.aclose()
    await assert_worker_still_serves(endpoint)
