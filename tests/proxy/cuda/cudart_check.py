"""NVIDIA's CUDA runtime (libcudart, given as argv[1]) through the proxy's libcuda.so.1:
device count, memory, copies, memsets, streams, events; prints what it saw and which
libcuda.so files the process mapped. Run by tests/proxy/test_cudart.py and on the GPU
host; needs nothing but ctypes."""

import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
error_name = rt.cudaGetErrorName
error_name.restype = ctypes.c_char_p


def ok(err: int, what: str) -> None:
    if err != 0:
        raise SystemExit(f"{what}: {error_name(err).decode()}")


def handle() -> ctypes.c_void_p:
    return ctypes.c_void_p()


n = ctypes.c_int(-1)
ok(rt.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
print("count", n.value)
ok(rt.cudaSetDevice(0), "cudaSetDevice")
p = handle()
ok(rt.cudaMalloc(ctypes.byref(p), 4096), "cudaMalloc")
src = (ctypes.c_uint8 * 4096)(*[i % 251 for i in range(4096)])
dst = (ctypes.c_uint8 * 4096)()
ok(rt.cudaMemcpy(p, src, 4096, 1), "cudaMemcpy host to device")
ok(rt.cudaMemcpy(dst, p, 4096, 2), "cudaMemcpy device to host")
print("copy", bytes(src) == bytes(dst))
s, e0, e1 = handle(), handle(), handle()
ok(rt.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
ok(rt.cudaEventCreate(ctypes.byref(e0)), "cudaEventCreate")
ok(rt.cudaEventCreate(ctypes.byref(e1)), "cudaEventCreate")
ok(rt.cudaEventRecord(e0, s), "cudaEventRecord")
ok(rt.cudaMemsetAsync(p, 7, 4096, s), "cudaMemsetAsync")
ok(rt.cudaMemcpyAsync(dst, p, 4096, 2, s), "cudaMemcpyAsync")
ok(rt.cudaEventRecord(e1, s), "cudaEventRecord")
ok(rt.cudaEventSynchronize(e1), "cudaEventSynchronize")
ms = ctypes.c_float(-1)
ok(rt.cudaEventElapsedTime(ctypes.byref(ms), e0, e1), "cudaEventElapsedTime")
ok(rt.cudaStreamSynchronize(s), "cudaStreamSynchronize")
print("memset", all(b == 7 for b in dst), "elapsed", ms.value >= 0)
ok(rt.cudaFree(p), "cudaFree")
ok(rt.cudaStreamDestroy(s), "cudaStreamDestroy")
ok(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
with open("/proc/self/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if "libcuda.so" in line})
print("libcuda", mapped)
