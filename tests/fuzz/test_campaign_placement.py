"""The fuzz campaign adapts to the worker it is given (issue 34): the good client on a
device that exists, fuzz sessions beside it on a one-device worker, and on a GPU no
fuzzed kernel that could stray out of its allocation or fault the shared device."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.protocol.codec import FrameDecoder
from hipr.protocol.opcodes import Opcode
from hipr.testing.fuzz import (
    KERNEL_OPCODES,
    SHARED_BYTES_PER_THREAD,
    TAME_MAX_BLOCKS,
    IdSource,
    Targets,
    _product,
    structured_frame,
)
from hipr.testing.fuzz_campaign import FuzzOptions, placed, run_fuzz_campaign


def test_the_good_client_goes_where_the_worker_has_a_device() -> None:
    one = placed(FuzzOptions(), EmulatorBackend(device_count=1))
    assert (one.good_device, one.reserved_device) == (0, None)  # fuzz shares device 0
    three = placed(FuzzOptions(), EmulatorBackend(device_count=3))
    assert (three.good_device, three.reserved_device) == (2, 2)  # fuzz stays on 0 and 1
    pinned = placed(FuzzOptions(good_device=1), EmulatorBackend(device_count=3))
    assert (pinned.good_device, pinned.reserved_device) == (1, 1)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        placed(FuzzOptions(good_device=1), EmulatorBackend(device_count=1))


def test_fuzzed_kernels_stay_wild_only_where_faults_are_their_own() -> None:
    two = EmulatorBackend(device_count=2)
    assert placed(FuzzOptions(), two).kernel_faults is True
    assert placed(FuzzOptions(kernel_faults=False), two).kernel_faults is False
    # One device: a fuzzed kernel's fault would be the good client's too (it is the
    # device's), so the kernels are tame unless asked.
    assert placed(FuzzOptions(), EmulatorBackend()).kernel_faults is False
    assert placed(FuzzOptions(kernel_faults=True), EmulatorBackend()).kernel_faults is True


@pytest.mark.anyio
async def test_a_campaign_on_a_one_device_worker(anyio_backend: str) -> None:
    """Issue 34: with GOOD_DEVICE fixed at 1, every good call on a one-GPU host failed
    with 'device 1 does not exist', so that oracle verified nothing there."""
    report = await run_fuzz_campaign(
        FuzzOptions(seed=5, frames=800, concurrency=4),
        EmulatorBackend(device_count=1, total_memory=256 << 20),
    )
    assert report.ok, report.summary()
    assert (report.devices, report.good_device) == (1, 0)
    assert report.good_verified > 0 and not report.good_errors


def _decoded(data: bytes) -> Any:
    decoder = FrameDecoder(1 << 24)
    decoder.feed(data)
    (frame,) = list(decoder.frames())
    return frame


#: (offset of each pointer, offset of the element count) of the kernels a session aims at.
LAYOUT = {"fill_f32": ([0], 16), "reduce_sum_f32": ([0, 8], 16)}


@pytest.mark.parametrize("kernel", sorted(LAYOUT))
def test_tamed_launches_stay_inside_the_sessions_allocation(kernel: str) -> None:
    t = Targets(ptr=0x7F00_0000_1000, size=4096, function=3, kernel=kernel, kernel_faults=False)
    pointers, count_at = LAYOUT[kernel]
    rng, ids, seen = random.Random(34), IdSource.seeded(random.Random(1)), 0
    while seen < 1000:
        frame = structured_frame(rng, t, ids)
        if frame.opcode not in KERNEL_OPCODES:
            continue
        args = _decoded(frame.data).args
        if not isinstance(args, dict):
            continue
        seen += 1
        assert args.get("function") in (t.function, 2**64 - 1)
        # The worker reads a null or absent field as its default, and refuses arguments
        # that are not byte strings: only those could run.
        buffers = args.get("args")
        assert buffers is not None, "no arguments: the kernel would read garbage"
        blobs = buffers if isinstance(buffers, list) else [buffers]
        if not blobs or not all(type(blob) is bytes for blob in blobs):
            continue
        for blob in blobs:
            assert all(struct.unpack_from("<Q", blob, p)[0] == t.ptr for p in pointers)
            assert 4 * struct.unpack_from("<Q", blob, count_at)[0] <= t.size
        listed = args.get("ptrs")
        assert listed is not None, "no pointer checked"
        if isinstance(listed, list) and all(isinstance(p, int) for p in listed):
            assert set(pointers) <= set(listed)
        blocks = _product(args.get("grid"))
        assert blocks is None or blocks <= TAME_MAX_BLOCKS
        threads = _product(args.get("block"))
        shared = args.get("shared_mem")
        need = SHARED_BYTES_PER_THREAD.get(kernel, 0) * (threads or 0)
        if shared is None or (type(shared) is int and shared >= 0):
            assert (shared or 0) >= need, (shared, args.get("block"))


def test_damaged_frames_carry_no_kernel_request() -> None:
    from hipr.testing.fuzz import without_kernels

    t = Targets(kernel_faults=False)
    rng, ids = random.Random(7), IdSource.seeded(random.Random(2))
    opcodes = {without_kernels(lambda: structured_frame(rng, t, ids)).opcode for _ in range(500)}
    assert not opcodes & KERNEL_OPCODES and Opcode.MALLOC in opcodes
