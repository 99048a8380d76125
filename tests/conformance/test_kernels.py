"""Kernels through the whole stack: argument widths and alignment checked element by
element against numpy, every built-in kernel, run-time compilation and its errors."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import hipr
from hipr.client import AsyncGpu, DevicePtr
from hipr.errors import HipErrorCode as E
from tests.conformance.conftest import Target

pytestmark = pytest.mark.anyio


class ProbeStruct(ctypes.Structure):
    """``struct ProbeStruct { signed char a; double b; short c; }`` of mixed_args_probe."""

    _fields_ = [("a", ctypes.c_int8), ("b", ctypes.c_double), ("c", ctypes.c_int16)]


async def upload(gpu: AsyncGpu, array: np.ndarray) -> DevicePtr:
    """A device copy of ``array``."""
    return await gpu.malloc_htod(array)


async def download(gpu: AsyncGpu, ptr: DevicePtr, like: np.ndarray) -> np.ndarray:
    """``like``-shaped array read back from ``ptr``."""
    out = np.empty_like(like)
    await gpu.memcpy_dtoh(ptr, out=out)
    return out


def assert_elementwise(got: np.ndarray, expected: np.ndarray) -> None:
    """Exact equality, naming the first element that differs."""
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, (
        f"{bad.size} of {got.size} elements differ; first at [{bad[0]}]: "
        f"got {got[bad[0]]!r}, expected {expected[bad[0]]!r}"
    )


PROBE_CASES = {
    # Values chosen so that any misplaced or truncated argument changes the sum.
    "extremes": (-128, -(2**31) + 1, np.float32(1 / 3), 2.0**-30, -32768, (127, 1e-3, 32767)),
    "plain": (-7, 123456, np.float32(1.5), 0.25, -300, (5, 2.5, -2)),
}


@pytest.mark.parametrize("case", PROBE_CASES)
@pytest.mark.parametrize(("grid", "block"), [(1, 64), (13, 128)], ids=["stride", "wide"])
async def test_mixed_args_probe(target: Target, case: str, grid: int, block: int) -> None:
    """int8, int32, float, double, int16, a struct {int8; double; int16} and a uint64,
    packed with C alignment (72 bytes), arrive intact on every backend."""
    a8, a32, f32, f64, a16, (sa, sb, sc) = PROBE_CASES[case]
    n = 4097
    async with hipr.aconnect(target.url) as gpu:
        out = await gpu.malloc(8 * n)
        await gpu.memset(out, 0xFF, 8 * n)
        probe = await gpu.builtin("mixed_args_probe")
        args = [
            out,
            np.int8(a8),
            np.int32(a32),
            np.float32(f32),
            np.float64(f64),
            np.int16(a16),
            ProbeStruct(sa, sb, sc),
            np.uint64(n),
        ]
        await probe.launch(grid, block, args)
        await gpu.synchronize()
        got = await download(gpu, out, np.empty(n, np.float64))
        # The kernel's left-to-right sum in doubles, which Python floats are.
        base = float(a8) + float(a32) + float(np.float32(f32)) + f64 + float(a16)
        base = base + float(sa) + sb + float(sc)
        assert_elementwise(got, base + np.arange(n, dtype=np.float64))
        await gpu.free(out)


async def test_mixed_args_probe_refuses_untyped_arguments(target: Target) -> None:
    async with hipr.aconnect(target.url) as gpu:
        out = await gpu.malloc(8)
        probe = await gpu.builtin("mixed_args_probe")
        with pytest.raises(hipr.HipError) as info:
            await probe.launch(1, 1, [out, 1, np.int32(2)])
        assert info.value.code == E.hipErrorInvalidValue
        assert "argument 1" in info.value.message
        with pytest.raises(hipr.HipError) as info:
            await probe.launch(1, 1, [out, np.int8(1), 2.5])
        assert info.value.code == E.hipErrorInvalidValue
        assert "argument 2" in info.value.message
        await gpu.free(out)


@pytest.mark.parametrize("n", [1, 4097, (1 << 20) + 3])
async def test_builtin_kernels_match_numpy(target: Target, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    block = 256
    # A grid smaller than n / block for large n: the kernels' grid-stride loops cover it.
    grid = min(-(-n // block), 1024)
    async with hipr.aconnect(target.url) as gpu:
        px, py = await upload(gpu, x), await upload(gpu, y)
        pz = await gpu.malloc(4 * n)
        fill, scale, axpy, add, reduce_sum = [
            await gpu.builtin(name)
            for name in ("fill_f32", "scale_f32", "axpy_f32", "vector_add_f32", "reduce_sum_f32")
        ]

        await fill.launch(grid, block, [pz, np.float32(-2.5), np.uint64(n)])
        assert_elementwise(await download(gpu, pz, x), np.full(n, -2.5, np.float32))

        await add.launch(grid, block, [pz, px, py, np.uint64(n)])
        assert_elementwise(await download(gpu, pz, x), x + y)

        await scale.launch(grid, block, [pz, np.float32(0.5), np.uint64(n)])
        assert_elementwise(await download(gpu, pz, x), (x + y) * np.float32(0.5))

        await gpu.memcpy_dtod(pz, py, 4 * n)
        await axpy.launch(grid, block, [pz, px, np.float32(1.75), np.uint64(n)])
        # A GPU compiler may fuse a*x+y into one FMA: one rounding instead of two.
        expected = y + np.float32(1.75) * x
        np.testing.assert_allclose(await download(gpu, pz, x), expected, rtol=1e-6, atol=1e-6)

        # reduce_sum: out[0] zeroed first, a power-of-two block, 4 bytes of shared
        # memory per thread; blocks add atomically, so float order may vary on a GPU.
        await gpu.memset(pz, 0, 4)
        await reduce_sum.launch(grid, block, [pz, px, np.uint64(n)], shared_mem=4 * block)
        await gpu.synchronize()
        total = np.frombuffer(await gpu.memcpy_dtoh(pz, 4), np.float32)[0]
        exact = float(x.astype(np.float64).sum())
        assert abs(float(total) - exact) <= 1e-5 * float(np.abs(x).sum()) + 1e-6, (total, exact)

        for p in (px, py, pz):
            await gpu.free(p)


MIXED_SOURCE = r"""
#include <hip/hip_runtime.h>

struct Mixed { char a; double b; short c; };   // 24 bytes, aligned to 8
struct Small { char x; short y; };             // 4 bytes, aligned to 2

extern "C" __global__ void mixed_widths(signed char c8, double* out, short s16, Small sm,
                                        int i32, long long i64, float f32, double f64,
                                        Mixed st, const int* in, unsigned long long n) {
  if (hipBlockIdx_x == 0 && hipThreadIdx_x == 0) {
    out[0] = c8;  out[1] = s16;  out[2] = sm.x;  out[3] = sm.y;  out[4] = i32;
    out[5] = (double)i64;  out[6] = f32;  out[7] = f64;
    out[8] = st.a;  out[9] = st.b;  out[10] = st.c;  out[11] = (double)n;
  }
  for (unsigned long long i = hipBlockIdx_x * hipBlockDim_x + hipThreadIdx_x; i < n;
       i += (unsigned long long)hipBlockDim_x * hipGridDim_x)
    out[12 + i] = (double)in[i] * f32 + c8 + s16 + sm.y + st.c;
}
"""


class Mixed(ctypes.Structure):
    _fields_ = [("a", ctypes.c_char), ("b", ctypes.c_double), ("c", ctypes.c_short)]


class Small(ctypes.Structure):
    _fields_ = [("x", ctypes.c_char), ("y", ctypes.c_short)]


async def test_compiled_kernel_with_mixed_argument_widths(target: Target) -> None:
    """char, pointer, short, a 4-byte struct, int, long long, float, double, a 24-byte
    struct, pointer, uint64: 96 bytes of arguments with every alignment gap."""
    if not target.has_compiler:
        pytest.skip("the emulator has no device compiler (test_compile_error checks it)")
    n = 5003
    values = np.random.default_rng(9).integers(-1000, 1000, n, dtype=np.int32)
    c8, s16, i32, i64 = -5, -300, -123456, -(2**40) - 3
    f32, f64 = 1.25, -0.375
    small, mixed = Small(b"\x07", 1234), Mixed(b"\x09", 2.5, -2)
    async with hipr.aconnect(target.url) as gpu:
        mod = await gpu.compile(MIXED_SOURCE, name="mixed.hip")
        fn = await mod.function("mixed_widths")
        pin = await upload(gpu, values)
        out = await gpu.malloc(8 * (12 + n))
        args = [
            np.int8(c8),
            out,
            np.int16(s16),
            small,
            np.int32(i32),
            np.int64(i64),
            np.float32(f32),
            np.float64(f64),
            mixed,
            pin,
            np.uint64(n),
        ]
        await fn.launch(7, 128, args)
        got = await download(gpu, out, np.empty(12 + n, np.float64))
        scalars = [c8, s16, 7, 1234, i32, i64, f32, f64, 9, 2.5, -2, n]
        assert_elementwise(got[:12], np.array(scalars, dtype=np.float64))
        # Small integers times 1.25 and small sums: exact in doubles, FMA or not.
        expected = values.astype(np.float64) * f32 + c8 + s16 + 1234 + -2
        assert_elementwise(got[12:], expected)
        await gpu.free(pin)
        await gpu.free(out)
        await mod.unload()


BROKEN_SOURCE = (
    "#include <hip/hip_runtime.h>\n"
    'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n'
)


async def test_compile_error(target: Target) -> None:
    """A GPU backend's compile error carries the compiler log; the emulator refuses to
    compile with hipErrorNotSupported and says why. The session carries on either way."""
    async with hipr.aconnect(target.url) as gpu:
        with pytest.raises(hipr.HipError) as info:
            await gpu.compile(BROKEN_SOURCE, name="broken.hip")
        err = info.value
        if target.has_compiler:
            assert err.code == E.hipErrorInvalidSource, err
            assert "undefined_name" in err.message and "broken.hip" in err.message, err.message
            assert "error" in err.message
            # The session is fine: a good module compiles, a missing kernel is NotFound.
            mod = await gpu.compile(MIXED_SOURCE, name="ok.hip")
            with pytest.raises(hipr.HipError) as info:
                await mod.function("no_such_kernel")
            assert info.value.code == E.hipErrorNotFound
            await mod.unload()
        else:
            assert err.code == E.hipErrorNotSupported, err
            assert "no device compiler" in err.message and "builtin" in err.message
            with pytest.raises(hipr.HipError) as info:
                await gpu.module_load(b"\x7fELF not a code object")
            assert info.value.code == E.hipErrorInvalidImage
        with pytest.raises(hipr.HipError) as info:
            await gpu.builtin("no_such_builtin")
        assert info.value.code == E.hipErrorNotFound
        assert await gpu.ping() > 0


def test_readme_builtin_example(target: Target) -> None:
    """The README's first example, synchronous client, on every backend."""
    with hipr.connect(target.url) as gpu:
        n = 1 << 20
        a = np.arange(n, dtype=np.float32)
        p = gpu.malloc(a.nbytes)
        gpu.memcpy_htod(p, a)
        q = gpu.malloc(a.nbytes)
        gpu.memcpy_dtod(q, p, a.nbytes)
        c = gpu.malloc(a.nbytes)
        k = gpu.builtin("vector_add_f32")
        k.launch(grid=(n // 256 + 1, 1, 1), block=(256, 1, 1), args=[c, p, q, np.uint64(n)])
        gpu.synchronize()
        out = np.empty_like(a)
        gpu.memcpy_dtoh(c, a.nbytes, out=out)
        assert_elementwise(out, a + a)
        for ptr in (p, q, c):
            gpu.free(ptr)


README_SOURCE = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void scale(float* x, float a, unsigned long long n) {
    unsigned long long i = hipBlockIdx_x * hipBlockDim_x + hipThreadIdx_x;
    if (i < n) x[i] *= a;
}
"""


def test_readme_compiled_example(target: Target) -> None:
    """The README's run-time compiled kernel, verbatim, then checked against numpy."""
    if not target.has_compiler:
        pytest.skip("the emulator has no device compiler (test_compile_error checks it)")
    with hipr.connect(target.url) as gpu:
        mod = gpu.compile(README_SOURCE, name="k.hip", options=[])
        fn = mod.function("scale")
        x = gpu.malloc(4096)
        gpu.memset(x, 0, 4096)
        data = np.arange(1024, dtype=np.float32) - 100
        gpu.memcpy_htod(x, data)
        fn.launch(
            (4, 1, 1),
            (256, 1, 1),
            args=[x, np.float32(2.0), np.uint64(1024)],
            shared_mem=0,
            stream=None,
        )
        gpu.synchronize()
        out = np.empty(1024, np.float32)
        gpu.memcpy_dtoh(x, out=out)
        assert_elementwise(out, data * 2)
        gpu.free(x)
        mod.unload()
