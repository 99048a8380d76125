"""Unmodified CuPy through the proxy (run by scripts/cuda-gpu-check under
`hipr run --api cuda`): array creation, elementwise, a reduction, a RawKernel and a matmul
through cuBLAS, each compared with NumPy; then which libcuda.so the process mapped."""

import sys

import cupy as cp
import numpy as np


def step(name, fn):
    try:
        ok = fn()
        print(f"{name}: {'ok' if ok else 'WRONG'}", flush=True)
        return bool(ok)
    except Exception as exc:  # report and go on: each row is its own finding
        print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
        return False


results = []
a = None


def create():
    global a
    a = cp.arange(1024, dtype=cp.float32)
    return np.array_equal(a.get(), np.arange(1024, dtype=np.float32))


def elementwise():
    return np.allclose((a * 2 + 1).get(), np.arange(1024, dtype=np.float32) * 2 + 1)


def reduction():
    return float(a.sum()) == float(np.arange(1024, dtype=np.float32).sum())


def raw_kernel():
    k = cp.RawKernel(
        r'extern "C" __global__ void sq(float *x, int n) {'
        r" int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = x[i] * x[i]; }",
        "sq",
    )
    b = cp.arange(256, dtype=cp.float32)
    k((1,), (256,), (b, np.int32(256)))
    return np.array_equal(b.get(), np.arange(256, dtype=np.float32) ** 2)


def matmul():
    x = np.arange(128 * 128, dtype=np.float32).reshape(128, 128) / 1e4
    return np.allclose((cp.asarray(x) @ cp.asarray(x)).get(), x @ x, rtol=1e-4)


for name, fn in [
    ("create", create),
    ("elementwise", elementwise),
    ("reduction", reduction),
    ("RawKernel", raw_kernel),
    ("matmul (cuBLAS)", matmul),
]:
    results.append(step(name, fn) if a is not None or name == "create" else False)
with open("/proc/self/maps") as f:
    maps = f.read().splitlines()
print("libcuda mapped:", sorted({line.split()[-1] for line in maps if "libcuda.so" in line}))
print("libnvidia-ml mapped:", any("libnvidia-ml" in line for line in maps))
sys.exit(0 if all(results) else 1)
