"""A plain hip-python program (no hipr import): compile a kernel with hiprtc for the
device's architecture, load it, launch it with arguments of mixed widths through
hipModuleLaunchKernel's ``extra``, and check the result. Run it on a worker through the
native proxy:

    hipr run --url tcp://gpu-host:18515 -- python examples/proxy/hiprtc_launch.py

It needs a worker with a device compiler (cuda or hip backend); the emulator has none.
"""

import array
import ctypes
import math

from hip import hip, hiprtc

SOURCE = b"""
extern "C" __global__ void scale(float factor, int n, short pad1, double pad2, float *x) {
  int i = threadIdx.x + blockIdx.x * blockDim.x;
  if (i < n) x[i] = x[i] * factor + (float)(pad1 + pad2);
}
"""


def check(result):
    err, rest = result[0], result[1:]
    if isinstance(err, hip.hipError_t) and err != hip.hipError_t.hipSuccess:
        raise RuntimeError(str(err))
    if isinstance(err, hiprtc.hiprtcResult) and err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
        raise RuntimeError(str(err))
    return rest[0] if len(rest) == 1 else rest


props = check(hip.hipGetDeviceProperties(0))
arch = props.gcnArchName  # str with hip-python 10, bytes with 6.x
arch = arch if isinstance(arch, bytes) else arch.encode()
print(f"device 0: {props.name} ({arch.decode()})")

prog = check(hiprtc.hiprtcCreateProgram(SOURCE, b"scale", 0, [], []))
options = [b"--offload-arch=" + arch]
(err,) = hiprtc.hiprtcCompileProgram(prog, len(options), options)
if err != hiprtc.hiprtcResult.HIPRTC_SUCCESS:
    log = bytearray(check(hiprtc.hiprtcGetProgramLogSize(prog)))
    check(hiprtc.hiprtcGetProgramLog(prog, log))
    raise RuntimeError(f"{err}: {log.decode(errors='replace')}")
code = bytearray(check(hiprtc.hiprtcGetCodeSize(prog)))
check(hiprtc.hiprtcGetCode(prog, code))
check(hiprtc.hiprtcDestroyProgram(prog.createRef()))

module = check(hip.hipModuleLoadData(code))
kernel = check(hip.hipModuleGetFunction(module, b"scale"))

n = 1000
x_h = array.array("f", [i * 0.25 for i in range(n)])
nbytes = x_h.itemsize * n
x_d = check(hip.hipMalloc(nbytes))
check(hip.hipMemcpy(x_d, x_h, nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice))
block = hip.dim3(x=128)
grid = hip.dim3(x=math.ceil(n / 128))
check(
    hip.hipModuleLaunchKernel(
        kernel, *grid, *block, sharedMemBytes=0, stream=None, kernelParams=None,
        extra=(ctypes.c_float(2.0), ctypes.c_int(n), ctypes.c_short(3), ctypes.c_double(0.5), x_d),
    )
)  # fmt: skip
check(hip.hipDeviceSynchronize())
y_h = array.array("f", [0.0] * n)
check(hip.hipMemcpy(y_h, x_d, nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
for i in range(n):
    want = x_h[i] * 2.0 + 3.5
    if not math.isclose(y_h[i], want, rel_tol=1e-6):
        raise RuntimeError(f"x[{i}] = {y_h[i]}, expected {want}")
check(hip.hipFree(x_d))
check(hip.hipModuleUnload(module))
print("ok")
