"""hip-python programs the proxy tests run: written against hip-python's API with its
import left as a placeholder, so that one text runs through the real hip-python over the
proxy (``from hip import hip``) and through ``from hipr import hip``, and their printed
outputs are compared."""

from __future__ import annotations

HIP_PYTHON = "from hip import hip"
HIPR = "from hipr import hip"

#: Device facts, memory, copies of every kind, memsets, streams, events, errors, versions.
#: Prints one JSON object.
BASICS = r"""
import array, json
IMPORT

def check(result):
    err, rest = result[0], result[1:]
    if err != hip.hipError_t.hipSuccess:
        raise RuntimeError(str(err))
    return rest[0] if len(rest) == 1 else rest

out = {}
out["count"] = check(hip.hipGetDeviceCount())
check(hip.hipSetDevice(0))
out["device"] = check(hip.hipGetDevice())
props = check(hip.hipGetDeviceProperties(0))
for field in ("name", "gcnArchName", "totalGlobalMem", "warpSize", "maxThreadsPerBlock",
              "multiProcessorCount", "clockRate", "major", "minor", "sharedMemPerBlock",
              "maxThreadsDim", "maxGridSize", "pciBusID", "pciDeviceID", "pciDomainID",
              "l2CacheSize", "regsPerBlock", "totalConstMem"):
    value = getattr(props, field)
    out[field] = repr(value) if isinstance(value, (bytes, str, int)) else [int(v) for v in value]
# hip-python 10 decodes C character arrays to str (6.x gave bytes): both runs must agree.
out["name_type"] = type(props.name).__name__
A = hip.hipDeviceAttribute_t
for attr in ("hipDeviceAttributeWarpSize", "hipDeviceAttributeMaxThreadsPerBlock",
             "hipDeviceAttributeMultiprocessorCount", "hipDeviceAttributeMaxBlockDimX",
             "hipDeviceAttributeMaxGridDimY", "hipDeviceAttributeComputeCapabilityMajor"):
    out[attr] = check(hip.hipDeviceGetAttribute(getattr(A, attr), 0))
free, total = check(hip.hipMemGetInfo())
out["total"] = total
out["free_le_total"] = free <= total

n = 1000
x_h = array.array("f", [i * 0.5 for i in range(n)])
nbytes = x_h.itemsize * n
a = check(hip.hipMalloc(nbytes))
b = check(hip.hipMalloc(nbytes))
check(hip.hipMemcpy(a, x_h, nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice))
check(hip.hipMemcpy(b, a, nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToDevice))
check(hip.hipMemset(b, 0, 8))
y_h = array.array("f", [0.0] * n)
check(hip.hipMemcpy(y_h, b, nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
out["roundtrip"] = [y_h[0], y_h[1], y_h[2], y_h[n - 1], sum(y_h)]

# hip-python's own stream example
stream = check(hip.hipStreamCreate())
start = check(hip.hipEventCreate())
stop = check(hip.hipEventCreate())
check(hip.hipEventRecord(start, stream))
check(hip.hipMemcpyAsync(a, x_h, nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice, stream))
check(hip.hipMemsetAsync(a, 0, nbytes, stream))
check(hip.hipMemcpyAsync(x_h, a, nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost, stream))
check(hip.hipEventRecord(stop, stream))
check(hip.hipStreamSynchronize(stream))
check(hip.hipEventSynchronize(stop))
out["elapsed_ok"] = check(hip.hipEventElapsedTime(start, stop)) >= 0
out["zeroed"] = all(v == 0 for v in x_h)
check(hip.hipEventDestroy(start))
check(hip.hipEventDestroy(stop))
check(hip.hipStreamDestroy(stream))
check(hip.hipFree(a))
check(hip.hipFree(b))
check(hip.hipDeviceSynchronize())

bad = hip.hipSetDevice(99)[0]
out["bad_device"] = int(bad)
out["last"] = int(hip.hipGetLastError()[0])
out["last_again"] = int(hip.hipGetLastError()[0])
out["error_name"] = hip.hipGetErrorName(hip.hipError_t.hipErrorInvalidValue)[1].decode()
out["error_string"] = hip.hipGetErrorString(hip.hipError_t.hipErrorInvalidValue)[1].decode()
out["runtime_version"] = check(hip.hipRuntimeGetVersion())
out["driver_version"] = check(hip.hipDriverGetVersion())
print(json.dumps(out, sort_keys=True))
"""

#: A launch of the worker's built-in scale_f32 kernel with hip-python's `extra` tuple
#: (which it packs into a HIP_LAUNCH_PARAM_BUFFER_POINTER buffer): the proxy names the
#: built-in module with the image "hipr:builtin". Prints the first values.
BUILTIN_LAUNCH = r"""
import array, ctypes
from hip import hip

def check(result):
    err, rest = result[0], result[1:]
    if err != hip.hipError_t.hipSuccess:
        raise RuntimeError(str(err))
    return rest[0] if len(rest) == 1 else rest

module = check(hip.hipModuleLoadData(b"hipr:builtin\0"))
kernel = check(hip.hipModuleGetFunction(module, b"scale_f32"))
n = 100
x_h = array.array("f", [float(i) for i in range(n)])
nbytes = x_h.itemsize * n
x_d = check(hip.hipMalloc(nbytes))
check(hip.hipMemcpy(x_d, x_h, nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice))
block = hip.dim3(x=32)
grid = hip.dim3(x=(n + 31) // 32)
check(hip.hipModuleLaunchKernel(kernel, *grid, *block, sharedMemBytes=0, stream=None,
      kernelParams=None, extra=(x_d, ctypes.c_float(1.5), ctypes.c_uint64(n))))
check(hip.hipMemcpy(x_h, x_d, nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
check(hip.hipFree(x_d))
check(hip.hipModuleUnload(module))
print(x_h[0], x_h[1], x_h[99])
"""

#: hip-python's hiprtc example up to the compile, as its examples write it (the device's
#: gcnArchName passed back). Prints the compile result, then the log's first line.
HIPRTC_COMPILE = r'''
IMPORT
from hip import hiprtc
IMPORT_RTC

source = b"""
extern "C" __global__ void scale_vector(float factor, int n, float *x) {
  int tid = threadIdx.x + blockIdx.x * blockDim.x;
  if (tid < n) x[tid] *= factor;
}
"""
err, prog = hiprtc.hiprtcCreateProgram(source, b"scale_vector", 0, [], [])
assert err == hiprtc.hiprtcResult.HIPRTC_SUCCESS, err
err, props = hip.hipGetDeviceProperties(0)
assert err == hip.hipError_t.hipSuccess, err
arch = props.gcnArchName  # str in hip-python 10, bytes in 6.x
cflags = [b"--offload-arch=" + (arch if isinstance(arch, bytes) else arch.encode())]
err, = hiprtc.hiprtcCompileProgram(prog, len(cflags), cflags)
print(int(err))
err, size = hiprtc.hiprtcGetProgramLogSize(prog)
log = bytearray(size)
hiprtc.hiprtcGetProgramLog(prog, log)
print(log.decode(errors="replace").splitlines()[0] if size > 1 else "")
print(int(hiprtc.hiprtcDestroyProgram(prog.createRef())[0]))
'''

#: Every field of hipDeviceProp_t with the type of its value, as hip-python 10's
#: ``PROPERTIES()`` lists them: through the proxy and through ``hipr.hip`` the two must
#: print the same lines. The HDP register pointers are named with their kind only:
#: hip-python gives a pointer object there, hipr.hip 0 (docs/proxy.md).
ALL_PROPS = r"""
IMPORT
err, props = hip.hipGetDeviceProperties(0)
assert err == hip.hipError_t.hipSuccess, err
for field in sorted(props.PROPERTIES()):
    value = getattr(props, field)
    if field in ("hdpMemFlushCntl", "hdpRegFlushCntl"):
        print(field, "pointer")
    elif field in ("uuid", "arch"):
        print(field, type(value).__name__,
              [(f, getattr(value, f)) for f in sorted(value.PROPERTIES())])
    else:
        print(field, type(value).__name__, repr(value))
"""
