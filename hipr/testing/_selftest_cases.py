"""The GPU self-test's cases, in running order (registered with
:func:`~hipr.testing._selftest_harness.case`). The illegal address runs last, in a child
process: on CUDA it poisons the context for good."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import threading
import time

import numpy as np

from hipr.backends import load_backend
from hipr.errors import HipError
from hipr.kernels.builtins import BUILTIN_SOURCE, BUILTINS
from hipr.testing._selftest_harness import (
    CAPABILITIES,
    Ctx,
    E,
    MiB,
    case,
    check_pack_layout,
    expect_error,
    pack,
)

#: Each vendor's device facts: the architecture's prefix and the warp size.
_ARCH_PREFIX = {"cuda": "sm_", "hip": "gfx", "emulator": ""}
_WARP_SIZE = {"cuda": (32,), "hip": (32, 64), "emulator": (32, 64)}


@case("argument packing layout (mixed_args_probe: 72 bytes)")
def _pack(c: Ctx) -> None:
    check_pack_layout()


@case("device count and properties")
def _props(c: Ctx) -> None:
    b = c.b
    assert b.device_count() >= 1
    p = b.device_properties(c.device)
    print(f"    {p}")
    assert p.name and p.arch.startswith(_ARCH_PREFIX[c.name]), p.arch
    if c.name == "cuda":
        assert p.arch == f"sm_{p.major}{p.minor}", p.arch
    assert p.total_memory > 1 << 30 and p.multiprocessor_count > 0
    assert p.warp_size in _WARP_SIZE[c.name] and p.max_threads_per_block >= 1024
    assert p.clock_rate_khz > 0 and p.max_shared_memory_per_block >= 48 * 1024
    assert p.pci_bus_id.count(":") == 2 and "." in p.pci_bus_id, p.pci_bus_id
    expect_error(E.hipErrorInvalidDevice, lambda: b.device_properties(b.device_count()))
    expect_error(E.hipErrorInvalidDevice, lambda: b.bind_thread(-1))
    free, total = b.mem_get_info()
    assert 0 < free <= total, (free, total)
    print(f"    mem_get_info: free={free} total={total}")


@case("malloc/free, malloc(0), OOM")
def _malloc(c: Ctx) -> None:
    b = c.b
    before = b.stats()
    ptrs = [b.malloc(n) for n in (1, 3, 4097, MiB + 1)]
    s = b.stats()
    assert s.allocations == before.allocations + 4, s
    assert s.allocated_bytes == before.allocated_bytes + 1 + 3 + 4097 + MiB + 1, s
    assert len(set(ptrs)) == 4 and all(p % 256 == 0 for p in ptrs)
    for p in ptrs:
        b.free(p)
    if "hip_leniency" in CAPABILITIES[c.name]:
        assert b.malloc(0) == 0
    else:  # the emulator refuses what HIP lets pass silently
        expect_error(E.hipErrorInvalidValue, lambda: b.malloc(0))
    b.free(0)
    _, total = b.mem_get_info()
    exc = expect_error(E.hipErrorOutOfMemory, lambda: b.malloc(total * 4))
    print(f"    OOM: {exc}")
    assert b.stats() == before, b.stats()


@case("copies: sizes 0, 1, odd, 1 MiB+7 at offsets; sync and on a stream")
def _copies(c: Ctx) -> None:
    b = c.b
    rng = np.random.default_rng(1)
    stream = b.stream_create()
    cap = 2 * MiB + 64
    a, bb = b.malloc(cap), b.malloc(cap)
    try:
        for size in (0, 1, 3, 17, 4097, MiB + 7):
            for s in (None, stream):
                data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                b.memset(a, 0, cap, s)
                b.memcpy_htod(a + 13, memoryview(data), s)  # read-only bytes source
                b.memcpy_dtod(bb + 5, a + 13, size, s)
                out = bytearray(size)
                b.memcpy_dtoh(memoryview(out), bb + 5, s)
                assert bytes(out) == data, f"size {size} stream {s is not None}"
                # neighbours untouched by the offset copy
                head = c.read_bytes(a, 13)
                assert head == b"\0" * 13
                if size:
                    tail = c.read_bytes(a + 13 + size, 3)
                    assert tail == b"\0" * 3, tail
        # numpy and non-contiguous sources
        arr = np.arange(1000, dtype=np.float32)
        b.memcpy_htod(a, arr.data, stream)
        strided = np.arange(2000, dtype=np.float32)[::2]
        if "hip_leniency" in CAPABILITIES[c.name]:
            b.memcpy_htod(bb, strided.data, stream)
        else:
            expect_error(E.hipErrorInvalidValue, lambda: b.memcpy_htod(bb, strided.data, stream))
            b.memcpy_htod(bb, strided.copy().data, stream)
        b.stream_synchronize(stream)
        assert np.array_equal(c.download(a, arr), arr)
        assert np.array_equal(c.download(bb, strided.copy()), strided)
    finally:
        b.free(a)
        b.free(bb)
        b.stream_destroy(stream)


@case("async H2D: source reused right after the call (pinned staging)")
def _staging(c: Ctx) -> None:
    b = c.b
    stream = b.stream_create()
    n = min(4 * MiB, c.sizes.big)
    ptr = b.malloc(n)
    try:
        src = bytearray(b"\x11" * n)
        # Keep the stream busy so the copy is still queued when we scribble on src.
        busy = b.malloc(c.sizes.busy)
        for _ in range(c.sizes.busy_launches):
            c.launch("fill_f32", [busy, 1.0, c.sizes.busy // 4], c.sizes.busy // 4, stream)
        b.memcpy_htod(ptr, memoryview(src), stream)
        src[:] = b"\x22" * n
        b.stream_synchronize(stream)
        got = c.read_bytes(ptr, n)
        assert got == b"\x11" * n, "device saw the overwritten source"
        b.free(busy)
    finally:
        b.free(ptr)
        b.stream_destroy(stream)


@case("64 MiB and 64 MiB+1 copies (staged and unstaged; --small: 2 MiB), memset")
def _big(c: Ctx) -> None:
    b = c.b
    stream = b.stream_create()
    rng = np.random.default_rng(2)
    for n in (c.sizes.big, c.sizes.big + 1):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        ptr = b.malloc(n)
        try:
            # The stream pass runs twice: the first pays for pinning a staging block.
            for s in (None, stream, stream):
                b.memset(ptr, 0, n, s)
                t0 = time.perf_counter()
                b.memcpy_htod(ptr, data.data, s)
                b.stream_synchronize(s)
                t1 = time.perf_counter()
                out = np.empty_like(data)
                b.memcpy_dtoh(out.data, ptr, s)
                t2 = time.perf_counter()
                assert hashlib.sha256(out.data).digest() == hashlib.sha256(data.data).digest()
                label = "stream" if s is not None else "sync"
                print(
                    f"    {n} B {label}: H2D {n / (t1 - t0) / 1e9:.1f} GB/s, "
                    f"D2H {n / (t2 - t1) / 1e9:.1f} GB/s"
                )
            b.memset(ptr + 1, 0xAB, n - 2)
            b.synchronize()
            out = np.empty(n, np.uint8)
            b.memcpy_dtoh(out.data, ptr)
            assert out[0] == data[0] and out[-1] == data[-1]
            assert (out[1:-1] == 0xAB).all()
        finally:
            b.free(ptr)
    b.stream_destroy(stream)


@case("streams: query, wait_event across streams, destroy twice refused")
def _streams(c: Ctx) -> None:
    b = c.b
    s1, s2 = b.stream_create(), b.stream_create()
    ev = b.event_create()
    n = c.sizes.stream_elements
    x = b.malloc(n * 4)
    try:
        c.launch("fill_f32", [x, 2.0, n], n, s1)
        b.event_record(ev, s1)
        b.stream_wait_event(s2, ev)
        c.launch("scale_f32", [x, 3.0, n], n, s2)
        b.stream_synchronize(s2)
        assert b.stream_query(s1) and b.stream_query(s2) and b.stream_query(None)
        assert b.event_query(ev)
        out = np.empty(n, np.float32)
        b.memcpy_dtoh(out.data, x)
        assert (out == 6.0).all(), out[:4]
    finally:
        b.free(x)
        b.event_destroy(ev)
        b.stream_destroy(s1)
        b.stream_destroy(s2)
    expect_error(E.hipErrorInvalidHandle, lambda: b.stream_destroy(s1))
    expect_error(E.hipErrorInvalidHandle, lambda: b.event_destroy(ev))


@case("events time a kernel")
def _events(c: Ctx) -> None:
    b = c.b
    s = b.stream_create()
    start, end = b.event_create(), b.event_create()
    n = c.sizes.event_elements
    x = b.malloc(n * 4)
    try:
        b.event_record(start, s)
        for _ in range(4):
            c.launch("fill_f32", [x, 1.0, n], n, s, block=256)
        b.event_record(end, s)
        b.event_synchronize(end)
        ms = b.event_elapsed_ms(start, end)
        gbs = 4 * n * 4 / (ms / 1e3) / 1e9
        print(f"    4 x fill_f32 over {4 * n / MiB:.0f} MiB: {ms:.3f} ms ({gbs:.0f} GB/s written)")
        assert 0 < ms < 10_000
    finally:
        b.free(x)
        b.event_destroy(start)
        b.event_destroy(end)
        b.stream_destroy(s)


@case("compile BUILTIN_SOURCE: CUBIN, cache hit, PTX for compute_XY", frozenset({"nvidia"}))
def _compile(c: Ctx) -> None:
    b = c.b
    t0 = time.perf_counter()
    image = b.compile(BUILTIN_SOURCE, "builtins_selftest.hip", ["-lineinfo"])
    t1 = time.perf_counter()
    again = b.compile(BUILTIN_SOURCE, "builtins_selftest.hip", ["-lineinfo"])
    t2 = time.perf_counter()
    assert image.startswith(b"\x7fELF"), image[:16]
    assert again == image
    print(
        f"    CUBIN {len(image)} B, compile {1e3 * (t1 - t0):.0f} ms, "
        f"cached {1e6 * (t2 - t1):.0f} us"
    )
    mod = b.module_load(image)
    for name in BUILTINS:
        b.module_get_function(mod, name)
    expect_error(E.hipErrorNotFound, lambda: b.module_get_function(mod, "no_such_kernel"))
    b.module_unload(mod)
    major = b.device_properties(c.device).major
    minor = b.device_properties(c.device).minor
    virtual = [f"--gpu-architecture=compute_{major}{minor}"]
    ptx = b.compile(BUILTIN_SOURCE, "builtins_ptx.hip", virtual)
    assert b".entry fill_f32" in ptx or b".entry" in ptx, ptx[:200]
    try:
        mod = b.module_load(ptx)
        b.module_unload(mod)
        print(f"    PTX {len(ptx)} B loaded through the driver JIT")
    except HipError as exc:
        # NVRTC newer than the driver writes PTX the driver's JIT cannot read.
        if exc.details.get("cuda_result") != 222:
            raise
        print(f"    PTX {len(ptx)} B: driver JIT too old for this NVRTC ({exc})")


@case("compile error carries the compiler's log; bad options refused", frozenset({"nvidia"}))
def _compile_error(c: Ctx) -> None:
    b = c.b
    src = (
        "#include <hip/hip_runtime.h>\n"
        'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n'
    )
    exc = expect_error(E.hipErrorInvalidSource, lambda: b.compile(src, "broken.hip", ()))
    assert "undefined_name" in exc.message and "broken.hip" in exc.message, exc.message
    print("    " + exc.message.replace("\n", "\n    ")[:400])
    expect_error(E.hipErrorInvalidValue, lambda: b.compile(src, "x.hip", ["--no-such-flag"]))
    amd = ["--offload-arch=gfx942"]
    expect_error(E.hipErrorInvalidValue, lambda: b.compile(src, "x.hip", amd))
    try:
        b.module_load(b"\x7fELF garbage" * 10)
    except HipError as exc:
        assert exc.code in (E.hipErrorInvalidImage, E.hipErrorInvalidValue), exc
        print(f"    garbage image: {exc}")
    else:
        raise AssertionError("a garbage image loaded")


HIP_STYLE = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void warp_sums(float* out, const float* x, int n) {
  HIP_DYNAMIC_SHARED(float, tile)
  int64_t i = (uint32_t)(hipBlockIdx_x * hipBlockDim_x + hipThreadIdx_x);
  float v = i < n ? x[i] : 0.0f;
  tile[hipThreadIdx_x] = v;
  __syncthreads();
  v = tile[hipThreadIdx_x];
  for (int d = warpSize / 2; d > 0; d >>= 1) v += __shfl_down(v, d);
  if ((hipThreadIdx_x & (warpSize - 1)) == 0) out[i / warpSize] = v;
#ifndef __HIP_PLATFORM_NVIDIA__
#error the HIP prelude must define __HIP_PLATFORM_NVIDIA__
#endif
}
"""


@case("HIP-spelled kernel through the prelude (dynamic shared, __shfl_down)", frozenset({"nvidia"}))
def _hip_style(c: Ctx) -> None:
    b = c.b
    from hipr.backends.cuda_backend import HIP_PRELUDE

    assert "hipThreadIdx_x" in HIP_PRELUDE
    mod = b.module_load(b.compile(HIP_STYLE, "warp_sums.hip", ()))
    fn = b.module_get_function(mod, "warp_sums")
    n = 4096
    x = np.random.default_rng(3).random(n, dtype=np.float32)
    px, pout = c.upload(x), b.malloc(n // 32 * 4)
    try:
        ref = x.reshape(-1, 32).sum(axis=1, dtype=np.float64)
        exact = struct.pack("<QQi", pout, px, n)  # 20 bytes: the kernel's parameter space
        padded = exact + b"\0" * 4  # sizeof-style tail, as a struct packer would add
        print(f"    parameter space: {b._param_size(fn)} B")
        for args in (exact, padded):
            b.memset(pout, 0, n // 32 * 4)
            b.launch(fn, (n // 256, 1, 1), (256, 1, 1), 256 * 4, None, args)
            out = c.download(pout, np.empty(n // 32, np.float32))
            assert np.allclose(out, ref, rtol=1e-5), (len(args), out[:4], ref[:4])
        junk = exact + b"\1\0\0\0"  # not padding: left for the driver to refuse
        exc = expect_error(
            E.hipErrorLaunchOutOfResources,
            lambda: b.launch(fn, (n // 256, 1, 1), (256, 1, 1), 1024, None, junk),
        )
        print(f"    24-byte buffer with a non-zero tail: {exc}")
    finally:
        b.free(px)
        b.free(pout)
        b.module_unload(mod)


PROBES = {
    "prelude then <cstdint>": "#include <hip/hip_runtime.h>\n#include <cstdint>\n"
    'extern "C" __global__ void k(int64_t* p) { *p = (uint8_t)1; }\n',
    "native __ballot/__any (not in the prelude)": "#include <hip/hip_runtime.h>\n"
    'extern "C" __global__ void k(int* p) { *p = __any(1) + (int)__ballot(1); }\n',
}


@case("INFO probes of NVRTC beyond the prelude (reported, never fail)", frozenset({"nvidia"}))
def _probes(c: Ctx) -> None:
    for label, src in PROBES.items():
        try:
            c.b.compile(src, "probe.hip", ())
            print(f"    {label}: compiles")
        except HipError as exc:
            first = [ln for ln in exc.message.splitlines() if "error" in ln][:2]
            print(f"    {label}: refused: {' | '.join(first)[:300]}")


@case("every built-in kernel vs numpy")
def _builtins(c: Ctx) -> None:
    b = c.b
    rng = np.random.default_rng(4)
    for n in c.sizes.builtin_elements:
        x = rng.standard_normal(n).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        px, py, pz = c.upload(x), c.upload(y), b.malloc(4 * n)
        try:
            c.launch("fill_f32", [pz, -2.5, n], n)
            assert (c.download(pz, x) == np.float32(-2.5)).all()

            c.launch("vector_add_f32", [pz, px, py, n], n)
            assert np.array_equal(c.download(pz, x), x + y)

            c.launch("scale_f32", [pz, 0.5, n], n)
            assert np.array_equal(c.download(pz, x), (x + y) * np.float32(0.5))

            b.memcpy_dtod(pz, py, 4 * n)
            c.launch("axpy_f32", [pz, px, 1.75, n], n)
            ref = y + np.float32(1.75) * x
            assert np.allclose(c.download(pz, x), ref, rtol=1e-6, atol=1e-6)

            b.memset(pz, 0, 4)
            c.launch("reduce_sum_f32", [pz, px, n], n, block=256, shared=256 * 4)
            total = c.download(pz, np.empty(1, np.float32))[0]
            ref_sum = float(x.astype(np.float64).sum())
            tol = 1e-3 * max(1.0, float(np.abs(x).sum()))
            assert abs(total - ref_sum) <= tol, (total, ref_sum)

            pd = b.malloc(8 * n)
            try:
                vals = [pd, -7, 123456, 1.5, 0.25, -300, (5, 2.5, -2), n]
                c.launch("mixed_args_probe", vals, n)
                got = c.download(pd, np.empty(n, np.float64))
                ref64 = -7.0 + 123456.0 + 1.5 + 0.25 - 300.0 + 5.0 + 2.5 - 2.0 + np.arange(n)
                assert np.allclose(got, ref64, rtol=0, atol=1e-9), (got[:3], ref64[:3])
            finally:
                b.free(pd)
        finally:
            b.free(px)
            b.free(py)
            b.free(pz)
    # One geometry far larger than needed, one far smaller: the grid-stride loop copes.
    n = 10_000
    pz = b.malloc(4 * n)
    f = c.fn("fill_f32")
    kinds = ("ptr", "f32", "u64")
    b.launch(f, (1, 1, 1), (32, 1, 1), 0, None, pack(kinds, [pz, 7.0, n]))
    b.synchronize()
    assert (c.download(pz, np.empty(n, np.float32)) == 7.0).all()
    b.launch(f, (1000, 1, 1), (1024, 1, 1), 0, None, pack(kinds, [pz, 8.0, n]))
    assert (c.download(pz, np.empty(n, np.float32)) == 8.0).all()
    too_big = pack(kinds, [pz, 8.0, n])
    # CUDA's driver answers INVALID_VALUE; HIP and the emulator, InvalidConfiguration.
    refused = (E.hipErrorInvalidValue, E.hipErrorInvalidConfiguration)
    exc = expect_error(refused, lambda: b.launch(f, (1, 1, 1), (4096, 1, 1), 0, None, too_big))
    print(f"    4096-thread block refused: {exc}")
    b.free(pz)


@case("graph by stream capture (staged H2D, kernel, D2D, memset), launched twice")
def _graph_capture(c: Ctx) -> None:
    b = c.b
    n = 1 << 20
    s = b.stream_create()
    data = np.random.default_rng(5).random(n, dtype=np.float32)
    src = bytearray(data.tobytes())
    a, bb, z = b.malloc(4 * n), b.malloc(4 * n), b.malloc(4 * n)
    b.memset(z, 0xFF, 4 * n)
    b.stream_begin_capture(s)
    b.memcpy_htod(a, memoryview(src), s)
    c.launch("scale_f32", [a, 2.0, n], n, s)
    b.memcpy_dtod(bb, a, 4 * n, s)
    b.memset(z, 0, 4 * n, s)
    graph = b.stream_end_capture(s)
    src[:] = b"\0" * len(src)  # the graph must own its copy of the source bytes
    gexec = b.graph_instantiate(graph)
    b.graph_destroy(graph)  # the instantiation lives on, with its host buffer
    for _ in range(2):
        b.graph_launch(gexec, s)
    b.stream_synchronize(s)
    assert np.array_equal(c.download(bb, data), data * np.float32(2.0))
    assert (c.download(z, data) == 0).all()
    b.graph_exec_destroy(gexec)
    for p in (a, bb, z):
        b.free(p)
    b.stream_destroy(s)


@case("graph by capture on the default (per-thread) stream", frozenset({"default_stream_capture"}))
def _graph_capture_default(c: Ctx) -> None:
    b = c.b
    n = 4096
    x = b.malloc(4 * n)
    b.stream_begin_capture(None)
    c.launch("fill_f32", [x, 4.0, n], n, None)
    b.memset(x, 0, 4)  # "synchronous" memset on the capturing default stream
    graph = b.stream_end_capture(None)
    gexec = b.graph_instantiate(graph)
    b.graph_launch(gexec, None)
    b.stream_synchronize(None)
    out = c.download(x, np.empty(n, np.float32))
    assert out[0] == 0 and (out[1:] == 4.0).all()
    b.graph_exec_destroy(gexec)
    b.graph_destroy(graph)
    b.free(x)


@case("graph built explicitly: memset -> kernel -> memcpy -> kernel (+ empty nodes)")
def _graph_explicit(c: Ctx) -> None:
    b = c.b
    n = 100_003
    a, bb = b.malloc(4 * n), b.malloc(4 * n)
    g = b.graph_create()
    kinds = ("ptr", "f32", "u64")
    block, grid = (256, 1, 1), ((n + 255) // 256, 1, 1)
    n1 = b.graph_add_memset(g, [], a, 0, 4 * n)
    n2 = b.graph_add_kernel(g, [n1], c.fn("fill_f32"), grid, block, 0, pack(kinds, [a, 3.0, n]))
    n3 = b.graph_add_memcpy(g, [n2], bb, a, 4 * n)
    n4 = b.graph_add_kernel(g, [n3], c.fn("scale_f32"), grid, block, 0, pack(kinds, [bb, 2.0, n]))
    b.graph_add_memset(g, [n4], bb, 0, 0)
    b.graph_add_memcpy(g, [n1], bb, a, 0)
    gexec = b.graph_instantiate(g)
    b.graph_launch(gexec, None)
    b.synchronize()
    assert (c.download(bb, np.empty(n, np.float32)) == 6.0).all()
    assert (c.download(a, np.empty(n, np.float32)) == 3.0).all()
    b.graph_exec_destroy(gexec)
    b.graph_destroy(g)
    b.free(a)
    b.free(bb)


@case("8 threads at once: bind, copy, launch on own and default streams")
def _threads(c: Ctx) -> None:
    b = c.b
    errors: list[str] = []

    def worker(k: int) -> None:
        try:
            b.bind_thread(c.device)
            n = c.sizes.thread_elements + k
            s = b.stream_create()
            x = b.malloc(4 * n)
            for rep in range(5):
                stream = s if rep % 2 else None
                c.launch("fill_f32", [x, float(k), n], n, stream)
                c.launch("scale_f32", [x, 2.0, n], n, stream)
                out = np.empty(n, np.float32)
                b.memcpy_dtoh(out.data, x, stream)
                if not (out == 2.0 * k).all():
                    errors.append(f"thread {k} rep {rep}: {out[:3]}")
            b.free(x)
            b.stream_destroy(s)
        except Exception as exc:  # collected and reported by the main thread
            errors.append(f"thread {k}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@case("stats back to zero")
def _stats(c: Ctx) -> None:
    s = c.b.stats()
    print(f"    {s}")
    assert s.is_zero(), s


@case("close")
def _close(c: Ctx) -> None:
    c.b.close()
    c.b.close()


def child_illegal_address(backend: str, device: int) -> int:
    """Run in a child: a kernel writes to an unmapped address; the next synchronise
    must report it as HIP does (hipErrorIllegalAddress)."""
    b = load_backend(backend)
    b.bind_thread(device)
    f = b.module_get_function(b.builtin_module(), "fill_f32")
    bad = 0x10  # never mapped
    args = pack(("ptr", "f32", "u64"), [bad, 1.0, 1 << 20])
    b.launch(f, (64, 1, 1), (256, 1, 1), 0, None, args)  # returns: the failure is async
    try:
        b.synchronize()
    except HipError as exc:
        print(f"synchronize raised {exc.name} ({exc.code}): {exc.message}")
        try:
            b.malloc(16)
            print("later call: ok")
        except HipError as later:
            print(f"later call raised {later.name}: sticky, as expected")
        return 0 if exc.code == E.hipErrorIllegalAddress else 2
    print("synchronize did not raise")
    return 1


@case("illegal address surfaces at the next synchronize (child process)")
def _illegal(c: Ctx) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hipr.testing.gpu_selftest",
            "--illegal-address-child",
            "--backend",
            c.name,
            "--device",
            str(c.device),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    out = (proc.stdout + proc.stderr).strip()
    print("    " + out.replace("\n", "\n    "))
    assert proc.returncode == 0, f"child exit {proc.returncode}"
