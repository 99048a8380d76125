"""Devices and memory through the whole stack: properties, copies of every awkward size
at unaligned offsets in every direction, memset, and memory returning to its baseline."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hipr
from hipr.errors import HipErrorCode as E
from tests.conformance.conftest import Target

pytestmark = pytest.mark.anyio

MiB = 1 << 20

#: 0, 1, odd, and large enough to take many chunks of the wire and of the GPU copies.
COPY_SIZES = [0, 1, 4097, 64 * MiB]


async def test_device_properties(target: Target) -> None:
    async with hipr.aconnect(target.url) as gpu:
        assert gpu.worker_info()["backend"] == target.backend
        count = await gpu.device_count()
        assert count >= 1
        assert await gpu.get_device() == 0
        props = await gpu.device_properties(0)
        free, total = await gpu.mem_get_info()
        assert props.name and isinstance(props.name, str)
        assert props.total_memory == total and 0 < free <= total
        assert props.multiprocessor_count > 0 and props.clock_rate_khz > 0
        assert props.max_threads_per_block >= 256
        assert props.max_threads_per_block & (props.max_threads_per_block - 1) == 0
        assert re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", props.pci_bus_id), (
            props.pci_bus_id
        )
        if target.backend == "cuda":
            assert re.fullmatch(r"sm_\d{2,3}", props.arch), props.arch
            assert props.arch == f"sm_{props.major}{props.minor}"
            assert props.warp_size == 32 and props.max_threads_per_block == 1024
            assert props.total_memory > 1 << 30
        elif target.backend == "hip":
            assert props.arch.startswith("gfx"), props.arch
            assert props.warp_size in (32, 64)
        else:
            assert props.arch and props.warp_size in (32, 64)
        with pytest.raises(hipr.HipError) as info:
            await gpu.set_device(count)
        assert info.value.code == E.hipErrorInvalidDevice
        with pytest.raises(hipr.HipError) as info:
            await gpu.device_properties(count)
        assert info.value.code == E.hipErrorInvalidDevice


@pytest.mark.parametrize("size", COPY_SIZES, ids=lambda s: f"{s}B")
async def test_copies_with_offsets(target: Target, size: int) -> None:
    """H2D, D2H, D2D and memset of ``size`` bytes at odd offsets into allocations with
    guard bytes on both sides: the bytes land where asked and nowhere else."""
    src_off, dst_off, guard = 3, 4099, 17
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    async with hipr.aconnect(target.url) as gpu:
        a = await gpu.malloc(src_off + size + guard)
        b = await gpu.malloc(dst_off + size + guard)
        await gpu.memset(a, 0xA5, a.size)
        await gpu.memset(b, 0x5A, b.size)

        await gpu.memcpy_htod(a + src_off, payload)
        assert await gpu.memcpy_dtoh(a + src_off, size) == payload.tobytes()
        whole = np.frombuffer(await gpu.memcpy_dtoh(a, a.size), dtype=np.uint8)
        assert (whole[:src_off] == 0xA5).all() and (whole[src_off + size :] == 0xA5).all()

        await gpu.memcpy_dtod(b + dst_off, a + src_off, size)
        out = np.empty(b.size, dtype=np.uint8)
        assert await gpu.memcpy_dtoh(b, out=out) is out
        assert np.array_equal(out[dst_off : dst_off + size], payload)
        assert (out[:dst_off] == 0x5A).all() and (out[dst_off + size :] == 0x5A).all()

        await gpu.memset(b + dst_off, 0xC3, size)
        await gpu.memcpy_dtoh(b, out=out)
        assert (out[dst_off : dst_off + size] == 0xC3).all()
        assert (out[:dst_off] == 0x5A).all() and (out[dst_off + size :] == 0x5A).all()
        # The source was read, never written.
        assert await gpu.memcpy_dtoh(a + src_off, size) == payload.tobytes()
        await gpu.free(a)
        await gpu.free(b)


@pytest.mark.parametrize("size", [1, 4097, 3 * MiB + 5], ids=lambda s: f"{s}B")
async def test_stream_copies_with_offsets(target: Target, size: int) -> None:
    """The same on a stream: async H2D (source reusable at once), D2D, memset, D2H."""
    payload = np.random.default_rng(size + 1).integers(0, 256, size, dtype=np.uint8)
    async with hipr.aconnect(target.url) as gpu:
        s = await gpu.stream_create()
        a = await gpu.malloc(size + 9)
        b = await gpu.malloc(size + 9)
        host = payload.copy()
        await gpu.memcpy_htod_async(a + 5, host, stream=s)
        host[:] = 0  # the bytes were sent before the call returned
        await gpu.memcpy_dtod(b + 1, a + 5, size, stream=s)
        await gpu.memset(a + 5, 0, size, stream=s)
        await s.synchronize()
        got = await gpu.memcpy_dtoh(b + 1, size, stream=s)
        assert got == payload.tobytes()
        assert await gpu.memcpy_dtoh(a + 5, size, stream=s) == bytes(size)
        assert await s.query()
        for p in (a, b):
            await gpu.free(p)
        await s.destroy()


async def test_copies_out_of_bounds_are_refused(target: Target) -> None:
    async with hipr.aconnect(target.url) as gpu:
        p = await gpu.malloc(4096)
        q = await gpu.malloc(4096)
        for call in (
            gpu.memcpy_dtoh(int(p) + 4000, 97),
            gpu.memset(int(p) + 1, 0, 4096),
            gpu.memcpy_dtod(int(q), int(p) + 1, 4096),
        ):
            with pytest.raises(hipr.HipError) as info:
                await call
            assert info.value.code == E.hipErrorInvalidValue
        await gpu.memcpy_htod(int(p) + 4095, b"\x01")
        assert await gpu.memcpy_dtoh(int(p) + 4095, 1) == b"\x01"
        await gpu.free(p)
        await gpu.free(q)


async def test_mem_get_info_returns_to_baseline(target: Target) -> None:
    """Free memory drops by at least what is allocated and comes back after free, and
    after a session that never freed ends."""
    # The driver may adjust its own reservations by a page or two; a leak of the
    # allocation would be at least 64 MiB.
    slack = 0 if target.backend == "emulator" else 4 * MiB
    size = 64 * MiB
    async with hipr.aconnect(target.url) as gpu:
        base_free, total = await gpu.mem_get_info()
        p = await gpu.malloc(size)
        q = await gpu.malloc(size + 1)
        free, _ = await gpu.mem_get_info()
        assert free <= base_free - 2 * size, (base_free, free)
        await gpu.free(p)
        await gpu.free(q)
        free, again_total = await gpu.mem_get_info()
        assert again_total == total
        assert abs(free - base_free) <= slack, (base_free, free)

    async with hipr.aconnect(target.url) as gpu:
        await gpu.malloc(size)
        await gpu.malloc_htod(b"\x01" * 4097)
        free, _ = await gpu.mem_get_info()
        assert free <= base_free - size
    # The worker frees what a session left before it answers GOODBYE.
    async with hipr.aconnect(target.url) as gpu:
        free, _ = await gpu.mem_get_info()
        assert abs(free - base_free) <= slack, (base_free, free)


async def test_many_small_stream_copies_each_land_where_sent(target: Target) -> None:
    """Fire-and-forget 4-byte copies over two streams, more than one pinned carve block
    holds (GPU backends stage them in pieces of one block per stream), the source
    rewritten after each call: every value arrives at its own offset."""
    count = 3000
    async with hipr.aconnect(target.url) as gpu:
        streams = [await gpu.stream_create(), await gpu.stream_create()]
        dst = await gpu.malloc(4 * count)
        src = np.zeros(1, np.uint32)
        for i in range(count):
            src[0] = i
            await gpu.memcpy_htod_async(dst + 4 * i, src, stream=streams[i % 2])
        await gpu.synchronize()
        got = np.frombuffer(await gpu.memcpy_dtoh(dst, 4 * count), dtype=np.uint32)
        assert np.array_equal(got, np.arange(count, dtype=np.uint32))
        await gpu.free(dst)
        for s in streams:
            await s.destroy()


@pytest.mark.parametrize("on_stream", [False, True], ids=["default-stream", "stream"])
async def test_runs_of_small_copies_and_launches_land_in_order(
    target: Target, on_stream: bool
) -> None:
    """Runs of fire-and-forget 4-byte copies on one stream (batched into
    MEMCPY_HTOD_MANY) and of launches of one kernel (LAUNCH_KERNELS), one run after
    another on the same stream: each value where it was sent, the last writer winning."""
    count = 2500
    async with hipr.aconnect(target.url) as gpu:
        stream = await gpu.stream_create() if on_stream else None
        dst = await gpu.malloc(4 * count)
        fill = await gpu.builtin("fill_f32")
        src = np.zeros(1, np.float32)
        for i in range(count):
            src[0] = i
            await gpu.memcpy_htod_async(dst + 4 * i, src, stream=stream)
        for i in range(0, count, 3):
            await fill.launch(1, 1, [dst + 4 * i, np.float32(-1.0), np.uint64(1)], stream=stream)
        src[0] = 7.0
        for i in range(0, count, 5):
            await gpu.memcpy_htod_async(dst + 4 * i, src, stream=stream)
        await gpu.synchronize()
        expected = np.arange(count, dtype=np.float32)
        expected[::3] = -1.0
        expected[::5] = 7.0
        got = np.frombuffer(await gpu.memcpy_dtoh(dst, 4 * count), dtype=np.float32)
        assert np.array_equal(got, expected)
        await gpu.free(dst)
        if stream is not None:
            await stream.destroy()


@pytest.mark.parametrize("on_stream", [False, True], ids=["default-stream", "stream"])
async def test_a_run_of_small_copies_of_every_size_lands_whole(
    target: Target, on_stream: bool
) -> None:
    """Fire-and-forget copies of 1 to 4,096 bytes at odd offsets in one run (one
    MEMCPY_HTOD_MANY; on a GPU backend one unordered batch of copies where the runtime
    has it), then a run whose pieces overlap (one copy each, in order): every byte where
    it was sent, the gaps untouched, the last writer winning."""
    rng = np.random.default_rng(7)
    sizes = [1, 3, 4, 7, 64, 100, 511, 1000, 4096, 2, 33]
    region = sum(sizes) + 5 * len(sizes) + 16
    async with hipr.aconnect(target.url) as gpu:
        stream = await gpu.stream_create() if on_stream else None
        dst = await gpu.malloc(region)
        await gpu.memset(dst, 0, region)
        expected = np.zeros(region, np.uint8)

        async def post(offset: int, size: int) -> None:
            piece = rng.integers(1, 256, size, dtype=np.uint8)
            expected[offset : offset + size] = piece
            await gpu.memcpy_htod_async(dst + offset, piece, stream=stream)
            piece[:] = 0  # the bytes were taken when the call returned

        offset = 3
        for size in sizes:
            await post(offset, size)
            offset += size + 5
        await gpu.synchronize()
        got = np.frombuffer(await gpu.memcpy_dtoh(dst, region), np.uint8)
        assert np.array_equal(got, expected)
        for start, size in ((0, 64), (32, 64), (16, 8), (60, 4096), (100, 1)):
            await post(start, size)
        await gpu.synchronize()
        got = np.frombuffer(await gpu.memcpy_dtoh(dst, region), np.uint8)
        assert np.array_equal(got, expected)
        await gpu.free(dst)
        if stream is not None:
            await stream.destroy()
