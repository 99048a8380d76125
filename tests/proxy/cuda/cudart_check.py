"""NVIDIA's CUDA runtime (libcudart, given as argv[1]) through the proxy's libcuda.so.1:
device count, memory, copies, memsets, streams, events; prints what it saw and which
libcuda.so files the process mapped. Run by tests/proxy/test_cudart.py and on the GPU
host; needs nothing but ctypes."""

import ctypes, sys
rt = ctypes.CDLL(sys.argv[1])
def ok(e, what):
    if e != 0:
        name = rt.cudaGetErrorName; name.restype = ctypes.c_char_p
        raise SystemExit(f"{what}: {name(e).decode()}")
n = ctypes.c_int(-1); ok(rt.cudaGetDeviceCount(ctypes.byref(n)), "count"); print("count", n.value)
ok(rt.cudaSetDevice(0), "setdevice")
p = ctypes.c_void_p(); ok(rt.cudaMalloc(ctypes.byref(p), 4096), "malloc")
src = (ctypes.c_uint8 * 4096)(*[i % 251 for i in range(4096)]); dst = (ctypes.c_uint8 * 4096)()
ok(rt.cudaMemcpy(p, src, 4096, 1), "h2d"); ok(rt.cudaMemcpy(dst, p, 4096, 2), "d2h")
print("copy", bytes(src) == bytes(dst))
s = ctypes.c_void_p(); ok(rt.cudaStreamCreate(ctypes.byref(s)), "stream")
e0, e1 = ctypes.c_void_p(), ctypes.c_void_p()
ok(rt.cudaEventCreate(ctypes.byref(e0)), "ev"); ok(rt.cudaEventCreate(ctypes.byref(e1)), "ev")
ok(rt.cudaEventRecord(e0, s), "rec"); ok(rt.cudaMemsetAsync(p, 7, 4096, s), "memset")
ok(rt.cudaMemcpyAsync(dst, p, 4096, 2, s), "d2h async"); ok(rt.cudaEventRecord(e1, s), "rec")
ok(rt.cudaEventSynchronize(e1), "evsync"); ms = ctypes.c_float(-1)
ok(rt.cudaEventElapsedTime(ctypes.byref(ms), e0, e1), "elapsed"); ok(rt.cudaStreamSynchronize(s), "ssync")
print("memset", all(b == 7 for b in dst), "elapsed", ms.value >= 0)
ok(rt.cudaFree(p), "free"); ok(rt.cudaStreamDestroy(s), "sdestroy"); ok(rt.cudaDeviceSynchronize(), "sync")
maps = open("/proc/self/maps").read()
print("libcuda", sorted({l.split()[-1] for l in maps.splitlines() if "libcuda.so" in l}))
