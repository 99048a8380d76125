"""A hiprtc program that links two ``-fgpu-rdc`` compiles (one with a header given to
hiprtcCreateProgram) and runs the result, written against hip-python's API with its import
left as ``IMPORT``: run once with ``from hip import hip, hiprtc`` through the proxy and once
with ``from hipr import hip, hiprtc``, the two print the same lines (scripts/proxy-gpu-front
on a cuda worker; tests/proxy/test_link_program.py on the emulator, where the compile and
the link are refused and both say so alike)."""

#: The two sources linked: ``apply`` calls ``helper`` from the other compile and adds
#: OFFSET from a header given to hiprtcCreateProgram (tests/facade/test_rtc_link.py too).
APPLY = b"""
#include <hip/hip_runtime.h>
#include "offset.h"
extern __device__ float helper(float v);
extern "C" __global__ void apply(float *x, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] = helper(x[i]) + OFFSET;
}
"""
HELPER = b"""
#include <hip/hip_runtime.h>
__device__ float helper(float v) { return 2.0f * v; }
"""

_PROGRAM = r"""
IMPORT
import ctypes
import numpy as np

APPLY = APPLY_SOURCE
HELPER = HELPER_SOURCE
BITCODE = hiprtc.hiprtcJITInputType.hipJitInputLLVMBitcode


def name(result):
    return result[0].name


def bitcode(src, headers, names):
    err, prog = hiprtc.hiprtcCreateProgram(src, b"p.hip", len(headers), headers, names)
    print("create", err.name)
    err = hiprtc.hiprtcCompileProgram(prog, 1, [b"-fgpu-rdc"])[0]
    print("compile", err.name)
    if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
        size = hiprtc.hiprtcGetProgramLogSize(prog)[1]
        print("log", size > 1)
        return None
    err, size = hiprtc.hiprtcGetBitcodeSize(prog)
    code = bytearray(size)
    print("bitcode", err.name, size > 0, name(hiprtc.hiprtcGetBitcode(prog, code)))
    print("destroy", name(hiprtc.hiprtcDestroyProgram(prog.createRef())))
    return code


def link(inputs):
    err, state = hiprtc.hiprtcLinkCreate(0, None, None)
    print("link create", err.name)
    for code, label in inputs:
        r = hiprtc.hiprtcLinkAddData(state, BITCODE, code, len(code), label, 0, None, None)
        print("link add", label.decode(), name(r))
    err, image, size = hiprtc.hiprtcLinkComplete(state)
    print("link complete", err.name, size > 0 if err == hiprtc.hiprtcResult.HIPRTC_SUCCESS else "-")
    return state, (image if err == hiprtc.hiprtcResult.HIPRTC_SUCCESS else None)


a = bitcode(APPLY, [b"#define OFFSET 0.25f\n"], [b"offset.h"])
b = bitcode(HELPER, [], [])
if a is None:  # a worker without a compiler: the link is refused too
    a = b = bytearray(b"//\n.version 8.0\n.target sm_90\n\0")
state, image = link([(a, b"apply"), (b, b"helper")])
if image is not None:
    err, module = hip.hipModuleLoadData(image)
    print("load", err.name)
    err, apply = hip.hipModuleGetFunction(module, b"apply")
    x = np.array([1, 2, 3, 4], np.float32)
    err, d = hip.hipMalloc(x.nbytes)
    hip.hipMemcpy(d, x, x.nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice)
    err = hip.hipModuleLaunchKernel(apply, 1, 1, 1, 4, 1, 1, 0, None, None,
                                    (d, ctypes.c_ulonglong(4)))[0]
    print("launch", err.name)
    hip.hipMemcpy(x, d, x.nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost)
    print("apply", x.tolist())
    hip.hipFree(d)
    hip.hipModuleUnload(module)
print("link destroy", name(hiprtc.hiprtcLinkDestroy(state)))
state, image = link([(a, b"apply")])
print("without helper", image is None)
hiprtc.hiprtcLinkDestroy(state)
"""
PROGRAM = _PROGRAM.replace("APPLY_SOURCE", repr(APPLY)).replace("HELPER_SOURCE", repr(HELPER))
