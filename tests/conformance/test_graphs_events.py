"""Graphs (stream capture and explicit, with dependencies) and events timing a kernel,
through the whole stack, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import hipr
from hipr.client import AsyncGpu, DevicePtr
from tests.conformance.conftest import Target

pytestmark = pytest.mark.anyio

BLOCK = 256


def grid_for(n: int) -> int:
    """Blocks of BLOCK threads covering ``n`` elements."""
    return -(-n // BLOCK)


async def read_f32(gpu: AsyncGpu, ptr: DevicePtr, n: int) -> np.ndarray:
    """``n`` float32s from ``ptr``."""
    out = np.empty(n, np.float32)
    await gpu.memcpy_dtoh(ptr, 4 * n, out=out)
    return out


async def test_graph_by_stream_capture(target: Target) -> None:
    """H2D, kernel, D2D and memset captured on a stream; nothing runs until the graph
    is launched, which may happen many times after the graph itself is destroyed."""
    n = 100_003
    data = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    async with hipr.aconnect(target.url) as gpu:
        a, b, z = [await gpu.malloc(4 * n) for _ in range(3)]
        for p in (a, b, z):
            await gpu.memset(p, 0xFF, 4 * n)
        scale = await gpu.builtin("scale_f32")
        s = await gpu.stream_create()
        await s.begin_capture()
        host = data.copy()
        await gpu.memcpy_htod_async(a, host, stream=s)
        host[:] = 0  # the captured node holds its own copy of the bytes
        await scale.launch(grid_for(n), BLOCK, [a, np.float32(2.0), np.uint64(n)], stream=s)
        await gpu.memcpy_dtod(b, a, 4 * n, stream=s)
        await gpu.memset(z, 0, 4 * n, stream=s)
        graph = await s.end_capture()
        untouched = np.full(n, 0xFFFFFFFF, np.uint32).view(np.float32)
        for p in (a, b, z):  # captured, not run
            assert (await read_f32(gpu, p, n)).tobytes() == untouched.tobytes()
        gexec = await graph.instantiate()
        await graph.destroy()
        for _ in range(2):
            await gexec.launch(s)
        await s.synchronize()
        expected = data * np.float32(2.0)
        assert np.array_equal(await read_f32(gpu, a, n), expected)
        assert np.array_equal(await read_f32(gpu, b, n), expected)
        assert not (await read_f32(gpu, z, n)).any()
        await gexec.destroy()
        await s.destroy()
        for p in (a, b, z):
            await gpu.free(p)


async def test_explicit_graph_with_dependencies(target: Target) -> None:
    r"""A diamond: memset -> fill(a=3) -> {copy a->b, scale b*2} and {axpy c+=0.5a}
    -> add d=b+c; launched twice (c accumulates, the rest is idempotent).

        memset(a) -> fill(a) -> memcpy(b<-a) -> scale(b) -\
                             \-> axpy(c += .5a) --------> add(d = b + c)
    """
    n = 70_001
    c0 = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    async with hipr.aconnect(target.url) as gpu:
        a, b, d = [await gpu.malloc(4 * n) for _ in range(3)]
        c = await gpu.malloc_htod(c0)
        fill, scale, axpy, add = [
            await gpu.builtin(k) for k in ("fill_f32", "scale_f32", "axpy_f32", "vector_add_f32")
        ]
        nn = np.uint64(n)
        grid = grid_for(n)
        g = await gpu.graph_create()
        n1 = await g.add_memset(a, 0, 4 * n)
        n2 = await g.add_kernel(fill, grid, BLOCK, [a, np.float32(3.0), nn], dependencies=[n1])
        n3 = await g.add_memcpy(b, a, 4 * n, dependencies=[n2])
        n4 = await g.add_kernel(scale, grid, BLOCK, [b, np.float32(2.0), nn], dependencies=[n3])
        n5 = await g.add_kernel(axpy, grid, BLOCK, [c, a, np.float32(0.5), nn], dependencies=[n2])
        await g.add_kernel(add, grid, BLOCK, [d, b, c, nn], dependencies=[n4, n5])
        gexec = await g.instantiate()
        c_now = c0
        for _ in range(2):
            await gexec.launch()
            await gpu.synchronize()
            c_now = c_now + np.float32(0.5) * np.float32(3.0)
            assert (await read_f32(gpu, a, n) == 3.0).all()
            assert (await read_f32(gpu, b, n) == 6.0).all()
            assert np.array_equal(await read_f32(gpu, c, n), c_now)
            assert np.array_equal(await read_f32(gpu, d, n), np.float32(6.0) + c_now)
        await gexec.destroy()
        await g.destroy()
        for p in (a, b, c, d):
            await gpu.free(p)


async def test_events_time_a_kernel(target: Target) -> None:
    """Events around 8 fills of 64 MiB, on the default stream and on a stream."""
    n = 16 << 20
    async with hipr.aconnect(target.url) as gpu:
        x = await gpu.malloc(4 * n)
        fill = await gpu.builtin("fill_f32")
        s = await gpu.stream_create()
        e0, e1 = await gpu.event_create(), await gpu.event_create()
        for stream in (None, s):
            await e0.record(stream)
            for k in range(8):
                await fill.launch(1024, BLOCK, [x, np.float32(k), np.uint64(n)], stream=stream)
            await e1.record(stream)
            await e1.synchronize()
            assert await e1.query() and await e0.query()
            ms = await gpu.event_elapsed_ms(e0, e1)
            assert ms == await e0.elapsed_ms(e1)
            if target.is_gpu:
                # 512 MiB written at a few TB/s: well above the timer's resolution.
                assert 0 < ms < 10_000, ms
            else:
                assert 0 <= ms < 10_000, ms
            tail = await gpu.memcpy_dtoh(x + 4 * (n - 4), 16, stream=stream)
            assert np.array_equal(np.frombuffer(tail, np.float32), np.full(4, 7.0, np.float32))
        for obj in (e0, e1, s):
            await obj.destroy()
        await gpu.free(x)


async def test_session_end_frees_everything(target: Target) -> None:
    """A session that leaves allocations, streams, events, modules and graphs behind:
    once it ends, the backend holds nothing for it. (A backend may keep one shared
    built-in module per device: that is in the baseline, taken after a first use.)"""
    for _ in range(2):
        async with hipr.aconnect(target.url) as gpu:
            await gpu.builtin("fill_f32")
    baseline = target.runtime.stats()
    assert baseline.allocations == baseline.streams == baseline.events == 0, baseline
    async with hipr.aconnect(target.url) as gpu:
        x = await gpu.malloc(1 << 20)
        await gpu.stream_create()
        await gpu.event_create()
        fill = await gpu.builtin("fill_f32")
        g = await gpu.graph_create()
        await g.add_kernel(fill, 4, BLOCK, [x, np.float32(1.0), np.uint64(1024)])
        await g.instantiate()
        if target.has_compiler:
            await gpu.compile('#include <hip/hip_runtime.h>\nextern "C" __global__ void k() {}\n')
        await gpu.synchronize()
    assert target.runtime.stats() == baseline
