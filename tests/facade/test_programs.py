"""Whole programs written as hip-python's documentation writes them, with only the import
changed: ``from hipr import hip, hiprtc``. On the emulator the kernels are hipr's built-ins
(the sources define kernels of the same names and signatures); on a GPU backend
(HIPR_TEST_BACKEND=cuda) the same sources compile for real."""

from __future__ import annotations

import array
import ctypes
import math
import warnings

import numpy as np
import pytest

from hipr import hip, hiprtc
from tests.facade.conftest import FacadeTarget

pytestmark = pytest.mark.timeout(120)


def hip_check(call_result: tuple[object, ...]) -> object:
    """The helper hip-python's examples define: raise on a non-success enum."""
    err = call_result[0]
    result = call_result[1:]
    if len(result) == 1:
        result = result[0]  # type: ignore[assignment]
    if isinstance(err, hip.hipError_t) and err != hip.hipError_t.hipSuccess:
        raise RuntimeError(str(err))
    if isinstance(err, hiprtc.hiprtcResult) and err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
        raise RuntimeError(str(err))
    return result


KERNELS = rb"""
#include <hip/hip_runtime.h>

extern "C" __global__ void scale_f32(float* x, float a, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x) x[i] *= a;
}

extern "C" __global__ void axpy_f32(float* y, const float* x, float a, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x) y[i] += a * x[i];
}

struct ProbeStruct { signed char a; double b; short c; };

extern "C" __global__ void mixed_args_probe(double* out, signed char a8, int a32, float f,
                                            double d, short a16, ProbeStruct s,
                                            unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)blockDim.x * gridDim.x)
    out[i] = (double)a8 + (double)a32 + (double)f + d + (double)a16
             + (double)s.a + s.b + (double)s.c + (double)i;
}
"""


class ProbeStruct(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int8), ("b", ctypes.c_double), ("c", ctypes.c_int16)]


def _compile(source: bytes, name: bytes = b"kernels.hip") -> object:
    """The compile sequence of hip-python's examples, device arch passed back as an option."""
    props = hip.hipDeviceProp_t()
    hip_check(hip.hipGetDeviceProperties(props, 0))
    arch = props.gcnArchName
    prog = hip_check(hiprtc.hiprtcCreateProgram(source, name, 0, [], []))
    cflags = [b"--offload-arch=" + arch.encode()]
    (err,) = hiprtc.hiprtcCompileProgram(prog, len(cflags), cflags)
    if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
        log_size = hip_check(hiprtc.hiprtcGetProgramLogSize(prog))
        log = bytearray(log_size)  # type: ignore[call-overload]
        hip_check(hiprtc.hiprtcGetProgramLog(prog, log))
        raise RuntimeError(log.decode())
    code_size = hip_check(hiprtc.hiprtcGetCodeSize(prog))
    code = bytearray(code_size)  # type: ignore[call-overload]
    hip_check(hiprtc.hiprtcGetCode(prog, code))
    module = hip_check(hip.hipModuleLoadData(code))
    hip_check(hiprtc.hiprtcDestroyProgram(prog.createRef()))  # type: ignore[attr-defined]
    return module


def test_device_query_program(facade: FacadeTarget) -> None:
    count = hip_check(hip.hipGetDeviceCount())
    lines = []
    for device in range(count):  # type: ignore[call-overload]
        props = hip.hipDeviceProp_t()
        hip_check(hip.hipGetDeviceProperties(props, device))
        lines.append(f"{props.name}: {props.totalGlobalMem >> 20} MiB, {props.gcnArchName}")
        for attrib in (
            hip.hipDeviceAttribute_t.hipDeviceAttributeMaxGridDimX,
            hip.hipDeviceAttribute_t.hipDeviceAttributeMaxBlockDimZ,
            hip.hipDeviceAttribute_t.hipDeviceAttributeMaxSharedMemoryPerBlock,
        ):
            value = hip_check(hip.hipDeviceGetAttribute(attrib, device))
            assert isinstance(value, int) and value > 0, attrib.name
    assert len(lines) == count


def test_stream_copies_and_memsets_program(facade: FacadeTarget) -> None:
    size = 1 << 16
    host = array.array("i", range(size))
    result = array.array("i", [0] * size)
    num_bytes = host.itemsize * len(host)
    stream = hip_check(hip.hipStreamCreate())
    dx = hip_check(hip.hipMalloc(num_bytes))
    hip_check(hip.hipMemsetAsync(dx, 0, num_bytes, stream))
    hip_check(
        hip.hipMemcpyAsync(dx, host, num_bytes, hip.hipMemcpyKind.hipMemcpyHostToDevice, stream)
    )
    hip_check(hip.hipMemsetAsync(dx, 0, num_bytes // 2, stream))
    hip_check(
        hip.hipMemcpyAsync(result, dx, num_bytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost, stream)
    )
    hip_check(hip.hipStreamSynchronize(stream))
    assert list(result[: size // 2]) == [0] * (size // 2)
    assert result[size // 2 :] == host[size // 2 :]
    hip_check(hip.hipFree(dx))
    hip_check(hip.hipStreamDestroy(stream))


def test_runtime_compiled_kernel_with_scalar_arguments(facade: FacadeTarget) -> None:
    module = _compile(KERNELS)
    kernel = hip_check(hip.hipModuleGetFunction(module, b"scale_f32"))
    n = 4096
    x_h = np.linspace(0, 1, n, dtype=np.float32)
    x_d = hip_check(hip.hipMalloc(x_h.nbytes))
    hip_check(hip.hipMemcpy(x_d, x_h, x_h.nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice))
    block = hip.dim3(x=128)
    grid = hip.dim3(math.ceil(n / block.x))
    hip_check(
        hip.hipModuleLaunchKernel(
            kernel,
            *grid,
            *block,
            sharedMemBytes=0,
            stream=None,
            kernelParams=None,
            extra=(x_d, ctypes.c_float(3.0), ctypes.c_uint64(n)),
        )
    )
    hip_check(hip.hipDeviceSynchronize())
    out = np.zeros_like(x_h)
    hip_check(hip.hipMemcpy(out, x_d, x_h.nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
    np.testing.assert_allclose(out, 3.0 * x_h, rtol=1e-6)
    hip_check(hip.hipFree(x_d))
    hip_check(hip.hipModuleUnload(module))


def test_extra_of_mixed_widths_arrives_intact(facade: FacadeTarget) -> None:
    """char, int, float, double, short, a struct and pointers in one ``extra`` tuple."""
    module = _compile(KERNELS)
    kernel = hip_check(hip.hipModuleGetFunction(module, "mixed_args_probe"))
    n = 64
    out_d = hip_check(hip.hipMalloc(n * 8))
    extra = (
        out_d,
        ctypes.c_int8(-3),
        ctypes.c_int32(1000),
        ctypes.c_float(0.5),
        ctypes.c_double(0.25),
        ctypes.c_int16(-20),
        ProbeStruct(7, 1.125, 300),
        ctypes.c_uint64(n),
    )
    hip_check(hip.hipModuleLaunchKernel(kernel, 1, 1, 1, 64, 1, 1, 0, None, None, extra))
    out = np.zeros(n, np.float64)
    hip_check(hip.hipMemcpy(out, out_d, n * 8, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
    base = -3 + 1000 + 0.5 + 0.25 - 20 + 7 + 1.125 + 300
    np.testing.assert_allclose(out, base + np.arange(n))
    hip_check(hip.hipFree(out_d))
    hip_check(hip.hipModuleUnload(module))


def test_iterative_solver_timed_with_events(facade: FacadeTarget) -> None:
    """Jacobi-style relaxation y <- y + a * x, launched many times in a stream, timed with
    events, checked against numpy."""
    module = _compile(KERNELS)
    axpy = hip_check(hip.hipModuleGetFunction(module, b"axpy_f32"))
    n, iterations, a = 1 << 14, 200, 0.01
    x_h = np.random.default_rng(1).random(n, dtype=np.float32)
    y_h = np.zeros(n, np.float32)
    x_d = hip_check(hip.hipMalloc(x_h.nbytes))
    y_d = hip_check(hip.hipMalloc(y_h.nbytes))
    stream = hip_check(hip.hipStreamCreate())
    start, stop = hip_check(hip.hipEventCreate()), hip_check(hip.hipEventCreate())
    hip_check(hip.hipMemcpyHtoDAsync(x_d, x_h, x_h.nbytes, stream))
    hip_check(hip.hipMemsetAsync(y_d, 0, y_h.nbytes, stream))
    hip_check(hip.hipEventRecord(start, stream))
    args = (y_d, x_d, ctypes.c_float(a), ctypes.c_uint64(n))
    for _ in range(iterations):
        hip_check(hip.hipModuleLaunchKernel(axpy, 64, 1, 1, 256, 1, 1, 0, stream, None, args))
    hip_check(hip.hipEventRecord(stop, stream))
    hip_check(hip.hipEventSynchronize(stop))
    ms = hip_check(hip.hipEventElapsedTime(start, stop))
    assert isinstance(ms, float) and ms >= 0.0
    hip_check(hip.hipMemcpyDtoHAsync(y_h, y_d, y_h.nbytes, stream))
    hip_check(hip.hipStreamSynchronize(stream))
    expected = np.zeros(n, np.float32)
    for _ in range(iterations):
        expected += np.float32(a) * x_h
    np.testing.assert_allclose(y_h, expected, rtol=1e-4)
    for event in (start, stop):
        hip_check(hip.hipEventDestroy(event))
    hip_check(hip.hipStreamDestroy(stream))
    for ptr in (x_d, y_d):
        hip_check(hip.hipFree(ptr))
    hip_check(hip.hipModuleUnload(module))


def test_compile_error_carries_its_log(facade: FacadeTarget) -> None:
    source = b'#include <hip/hip_runtime.h>\n#error "hipr facade test"\n'
    prog = hip_check(hiprtc.hiprtcCreateProgram(source, b"broken.hip", 0, [], []))
    (err,) = hiprtc.hiprtcCompileProgram(prog, 0, [])
    assert err == hiprtc.hiprtcResult.HIPRTC_ERROR_COMPILATION
    assert isinstance(err, hiprtc.hiprtcResult)
    size = hip_check(hiprtc.hiprtcGetProgramLogSize(prog))
    log = bytearray(size)  # type: ignore[call-overload]
    hip_check(hiprtc.hiprtcGetProgramLog(prog, log))
    assert log.endswith(b"\0") and b"hipr facade test" in log
    assert hiprtc.hiprtcGetCodeSize(prog)[0] != hiprtc.HIPRTC_SUCCESS
    hip_check(hiprtc.hiprtcDestroyProgram(prog.createRef()))  # type: ignore[attr-defined]
    assert hiprtc.hiprtcGetProgramLogSize(prog)[0] == (
        hiprtc.hiprtcResult.HIPRTC_ERROR_INVALID_PROGRAM
    )


def test_headers_travel_to_the_worker(facade: FacadeTarget) -> None:
    header = b"#define SCALE_ARG float a\n"
    source = KERNELS.replace(
        b"float a, unsigned long long n) {\n  for", b"SCALE_ARG, unsigned long long n) {\n  for", 1
    )
    source = b'#include "scale.h"\n' + source
    prog = hip_check(hiprtc.hiprtcCreateProgram(source, b"h.hip", 1, [header], [b"scale.h"]))
    hip_check(hiprtc.hiprtcCompileProgram(prog, 0, []))
    assert hip_check(hiprtc.hiprtcGetCodeSize(prog)) > 0  # type: ignore[operator]
    # Without the header the worker's compiler cannot find it.
    bare = hip_check(hiprtc.hiprtcCreateProgram(source, b"h.hip", 0, [], []))
    failed = hiprtc.hiprtcCompileProgram(bare, 0, [])[0]
    assert failed == hiprtc.hiprtcResult.HIPRTC_ERROR_COMPILATION


def test_unsupported_call_inside_a_program_fails_with_its_name(facade: FacadeTarget) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="hipErrorNotSupported|801"):
            hip_check(hip.hipMallocManaged(1024, 1))
    assert "hipMallocManaged" in hip.last_error_message()


def test_real_compiler_round_trip(facade: FacadeTarget, gpu_only: None) -> None:
    """A kernel that is no built-in compiles, loads from hiprtcGetCode's bytes and runs;
    the code object is the backend's own (ELF: CUBIN or HSACO; or PTX text)."""
    source = rb"""
    #include <hip/hip_runtime.h>
    extern "C" __global__ void iota_plus(int* out, int base, unsigned int n) {
      unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = base + (int)i;
    }
    """
    module = _compile(source, b"iota.hip")
    kernel = hip_check(hip.hipModuleGetFunction(module, b"iota_plus"))
    n = 1000
    out_d = hip_check(hip.hipMalloc(n * 4))
    hip_check(
        hip.hipModuleLaunchKernel(
            kernel, 8, 1, 1, 128, 1, 1, 0, None, None, (out_d, ctypes.c_int(5), ctypes.c_uint(n))
        )
    )
    out = np.zeros(n, np.int32)
    hip_check(hip.hipMemcpy(out, out_d, n * 4, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
    assert (out == 5 + np.arange(n)).all()
    prog = hip_check(hiprtc.hiprtcCreateProgram(source, b"iota.hip", 0, [], []))
    hip_check(hiprtc.hiprtcCompileProgram(prog, 0, []))
    code = bytearray(hip_check(hiprtc.hiprtcGetCodeSize(prog)))  # type: ignore[call-overload]
    hip_check(hiprtc.hiprtcGetCode(prog, code))
    assert code.startswith(b"\x7fELF") or b".entry iota_plus" in code
    hip_check(hip.hipFree(out_d))
    hip_check(hip.hipModuleUnload(module))


def test_real_compile_error_log(facade: FacadeTarget, gpu_only: None) -> None:
    prog = hip_check(
        hiprtc.hiprtcCreateProgram(
            b"__global__ void k() { undeclared_thing(); }", b"e.hip", 0, [], []
        )
    )
    (err,) = hiprtc.hiprtcCompileProgram(prog, 0, [])
    assert err == hiprtc.hiprtcResult.HIPRTC_ERROR_COMPILATION
    log = bytearray(hip_check(hiprtc.hiprtcGetProgramLogSize(prog)))  # type: ignore[call-overload]
    hip_check(hiprtc.hiprtcGetProgramLog(prog, log))
    assert b"undeclared_thing" in log


def test_amd_arch_option_is_dropped_on_nvidia(facade: FacadeTarget, gpu_only: None) -> None:
    """A program written for AMD names its target; an NVIDIA worker compiles for itself."""
    if facade.backend != "cuda":
        pytest.skip("the translation is for NVIDIA workers")
    prog = hip_check(hiprtc.hiprtcCreateProgram(KERNELS, b"k.hip", 0, [], []))
    hip_check(hiprtc.hiprtcCompileProgram(prog, 1, [b"--offload-arch=gfx942"]))
