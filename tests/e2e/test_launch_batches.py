"""LAUNCH_KERNELS (protocol 1.1): many launches of one kernel configuration in one
frame run as if each came as its own LAUNCH_KERNEL: in order, each pointer checked, a
refused launch stopping none of the others, a resent batch never run twice. Raw
frames, so that what the worker receives is exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hipr.errors import HipError
from hipr.errors import HipErrorCode as E
from hipr.handlers.module import MAX_BATCH_LAUNCHES, MAX_KERNEL_ARGS_BYTES
from hipr.kernels.kernel_args import pack_args
from hipr.protocol import Opcode
from tests.e2e.raw import RawSession
from tests.e2e.test_inline_launches import ThreadNotingEmulator, fill_launch, read_floats

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Plain sockets: push mode under asyncio, the reader task under trio."""
    return str(request.param)


@pytest.fixture
def backend() -> ThreadNotingEmulator:
    return ThreadNotingEmulator(device_count=1, total_memory=64 << 20)


def fill_args(ptr: int, value: float, count: int = 1) -> bytes:
    """fill_f32's packed arguments: ``count`` floats of ``value`` at ``ptr``."""
    return pack_args([np.uint64(ptr), np.float32(value), np.uint64(count)]).data


def batch(function: int, blobs: list[bytes], **more: Any) -> dict[str, Any]:
    """LAUNCH_KERNELS arguments: 1-thread fill_f32 launches, a pointer at offset 0."""
    return {"function": function, "grid": [1], "block": [1], "ptrs": [0], "args": blobs, **more}


async def test_a_batch_runs_every_launch_in_order(
    raw_session: RawSession, backend: ThreadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 64)
    # Element i gets i + 1; a last launch overwrites element 0: only order makes it 100.
    blobs = [fill_args(ptr + 4 * i, float(i + 1)) for i in range(64)]
    blobs.append(fill_args(ptr, 100.0))
    data = raw_session.frame(Opcode.LAUNCH_KERNELS, batch(function, blobs), no_reply=True)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    assert await raw_session.replies(data, 1) == [{}]
    assert len(backend.launch_threads) == 65
    expected = np.arange(1, 65, dtype=np.float32)
    expected[0] = 100.0
    assert (await read_floats(raw_session, ptr, 64) == expected).all()


async def test_a_batch_that_waits_for_its_reply_runs_every_launch(
    raw_session: RawSession,
) -> None:
    ptr, function = await fill_launch(raw_session, 8)
    blobs = [fill_args(ptr + 4 * i, 7.0) for i in range(8)]
    assert await raw_session.call(Opcode.LAUNCH_KERNELS, batch(function, blobs)) == {}
    assert (await read_floats(raw_session, ptr, 8) == 7.0).all()


async def test_a_refused_launch_stops_none_of_the_others(raw_session: RawSession) -> None:
    ptr, function = await fill_launch(raw_session, 3)
    stray = ptr + (1 << 40)  # inside no allocation of this session
    blobs = [fill_args(ptr, 1.0), fill_args(stray, 2.0), fill_args(ptr + 8, 3.0)]
    data = raw_session.frame(Opcode.LAUNCH_KERNELS, batch(function, blobs), no_reply=True)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    with pytest.raises(HipError) as refused:
        await raw_session.replies(data, 1)
    assert refused.value.code == E.hipErrorInvalidValue
    assert "launch 2 of 3" in refused.value.message
    assert "not inside an allocation" in refused.value.message
    assert list(await read_floats(raw_session, ptr, 3)) == [1.0, 0.0, 3.0]


async def test_a_refused_launch_is_the_reply_of_a_batch_that_waits(
    raw_session: RawSession,
) -> None:
    ptr, function = await fill_launch(raw_session, 2)
    blobs = [fill_args(ptr, 1.0), fill_args(ptr + 4, 2.0), fill_args(0xDEAD_0000, 3.0)]
    with pytest.raises(HipError, match="launch 3 of 3"):
        await raw_session.call(Opcode.LAUNCH_KERNELS, batch(function, blobs))
    assert list(await read_floats(raw_session, ptr, 2)) == [1.0, 2.0]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"args": []}, f"a list of 1 to {MAX_BATCH_LAUNCHES} byte strings"),
        ({"args": b"\x00" * 24}, "a list of 1 to"),
        ({"args": [b"\x00" * 24] * (MAX_BATCH_LAUNCHES + 1)}, "a list of 1 to"),
        ({"args": [b"\x00" * 24, "text"]}, "a list of byte strings"),
        ({"args": [b"\x00" * (MAX_KERNEL_ARGS_BYTES + 1)]}, "a list of byte strings"),
        ({"args": None}, "missing argument 'args'"),
        ({"function": 999}, "function"),
        ({"grid": [0]}, "1 to 3 integers"),
        ({"ptrs": [2**64]}, "ptrs"),
        ({"ptrs": [24]}, "past the arguments"),
        ({"stream": 77}, "stream"),
    ],
)
async def test_malformed_batches_are_refused_and_the_session_goes_on(
    raw_session: RawSession, change: dict[str, Any], fragment: str
) -> None:
    ptr, function = await fill_launch(raw_session, 1)
    bad = batch(function, [fill_args(ptr, 5.0)])
    bad.update(change)
    with pytest.raises(HipError, match=fragment):
        await raw_session.call(Opcode.LAUNCH_KERNELS, bad)
    good = batch(function, [fill_args(ptr, 6.0)])
    assert await raw_session.call(Opcode.LAUNCH_KERNELS, good) == {}
    assert list(await read_floats(raw_session, ptr, 1)) == [6.0]


async def test_a_resent_batch_is_not_run_again(raw_session: RawSession) -> None:
    ptr, function = await fill_launch(raw_session, 1)
    first = raw_session.frame(
        Opcode.LAUNCH_KERNELS, batch(function, [fill_args(ptr, 5.0)] * 3), no_reply=True
    )
    overwrite = raw_session.frame(
        Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 4}, bulk=np.float32(9.0).tobytes()
    )
    assert await raw_session.replies(first + overwrite, 1) == [{}]
    # The same request id again, as a client resends after a dropped link.
    assert await raw_session.replies(first + raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {}), 1)
    assert list(await read_floats(raw_session, ptr, 1)) == [9.0]


# --- MEMCPY_HTOD_MANY ------------------------------------------------------------------


def copies(dsts: list[int], pieces: list[bytes], **more: Any) -> tuple[dict[str, Any], bytes]:
    """MEMCPY_HTOD_MANY arguments and bulk bytes."""
    args = {"dst": dsts, "size": [len(p) for p in pieces], **more}
    return args, b"".join(pieces)


@pytest.mark.parametrize("on_stream", [False, True])
async def test_many_small_copies_land_in_order(raw_session: RawSession, on_stream: bool) -> None:
    ptr, _ = await fill_launch(raw_session, 64)
    stream = (await raw_session.call(Opcode.STREAM_CREATE, {}))["stream"] if on_stream else None
    dsts = [ptr + 4 * i for i in range(64)] + [ptr]
    pieces = [np.float32(i + 1).tobytes() for i in range(64)] + [np.float32(100).tobytes()]
    args, bulk = copies(dsts, pieces, stream=stream)
    data = raw_session.frame(Opcode.MEMCPY_HTOD_MANY, args, no_reply=True, bulk=bulk)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    assert await raw_session.replies(data, 1) == [{}]
    expected = np.arange(1, 65, dtype=np.float32)
    expected[0] = 100.0
    assert (await read_floats(raw_session, ptr, 64) == expected).all()


async def test_a_refused_piece_stops_none_of_the_others(raw_session: RawSession) -> None:
    ptr, _ = await fill_launch(raw_session, 3)
    four = [np.float32(v).tobytes() for v in (1.0, 2.0, 3.0)]
    args, bulk = copies([ptr, ptr + (1 << 40), ptr + 8], four)
    data = raw_session.frame(Opcode.MEMCPY_HTOD_MANY, args, no_reply=True, bulk=bulk)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    with pytest.raises(HipError, match="piece 2 of 3"):
        await raw_session.replies(data, 1)
    assert list(await read_floats(raw_session, ptr, 3)) == [1.0, 0.0, 3.0]
    # Waiting for its reply, the same refusal is the reply.
    with pytest.raises(HipError, match="piece 2 of 3"):
        await raw_session.replies(raw_session.frame(Opcode.MEMCPY_HTOD_MANY, args, bulk=bulk), 1)


@pytest.mark.parametrize(
    ("args", "bulk", "fragment"),
    [
        ({"dst": [], "size": []}, b"", "lists of 1 to"),
        ({"dst": [1, 2], "size": [4]}, b"\0" * 4, "of one length"),
        ({"dst": "x", "size": [4]}, b"\0" * 4, "a list of at most"),
        ({"dst": [1], "size": [-4]}, b"", "a list of integers"),
        ({"dst": [1], "size": [2**64]}, b"", "a list of integers"),
        ({"dst": [1], "size": [8]}, b"\0" * 4, "add up to 8 bytes, received 4"),
        ({"dst": [1], "size": [4]}, b"\0" * 8, "add up to 4 bytes, received 8"),
        ({"dst": [1] * 4097, "size": [0] * 4097}, b"", "a list of at most 4096"),
        ({"dst": [1], "size": [4], "stream": 99}, b"\0" * 4, "stream"),
    ],
)
async def test_malformed_copies_are_refused_and_the_session_goes_on(
    raw_session: RawSession, args: dict[str, Any], bulk: bytes, fragment: str
) -> None:
    ptr, _ = await fill_launch(raw_session, 1)
    with pytest.raises(HipError, match=fragment):
        await raw_session.replies(raw_session.frame(Opcode.MEMCPY_HTOD_MANY, args, bulk=bulk), 1)
    good, data = copies([ptr], [np.float32(6.0).tobytes()])
    frame = raw_session.frame(Opcode.MEMCPY_HTOD_MANY, good, bulk=data)
    assert await raw_session.replies(frame, 1) == [{}]
    assert list(await read_floats(raw_session, ptr, 1)) == [6.0]


async def test_pieces_in_one_buffer_are_checked_with_one_look_up(
    raw_session: RawSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces that all lie in one allocation cost one range check for the batch; pieces
    in two allocations are checked one by one, and land as well."""
    from hipr.sessions.state import Session

    looked: list[int] = []
    check_range = Session.check_range

    def counting(self: Session, address: int, size: int, what: str = "range") -> Any:
        looked.append(address)
        return check_range(self, address, size, what)

    monkeypatch.setattr(Session, "check_range", counting)
    ptr, _ = await fill_launch(raw_session, 16)
    other, _ = await fill_launch(raw_session, 4)
    floats = [np.float32(i + 1).tobytes() for i in range(16)]
    args, bulk = copies([ptr + 4 * i for i in range(16)], floats)
    looked.clear()
    data = raw_session.frame(Opcode.MEMCPY_HTOD_MANY, args, no_reply=True, bulk=bulk)
    assert await raw_session.replies(data + raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {}), 1)
    assert looked == [ptr]
    assert list(await read_floats(raw_session, ptr, 16)) == [float(i + 1) for i in range(16)]
    args, bulk = copies([ptr, other, ptr + 4, other + 4], floats[:4])
    looked.clear()
    data = raw_session.frame(Opcode.MEMCPY_HTOD_MANY, args, no_reply=True, bulk=bulk)
    assert await raw_session.replies(data + raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {}), 1)
    assert len(looked) == 1 + 4  # the span's look-up, then each piece's
    assert list(await read_floats(raw_session, other, 2)) == [2.0, 4.0]
