"""Unmodified PyTorch, run twice by scripts/cuda-gpu-check: through the proxy
(`hipr run --api cuda`) and locally. Prints one JSON line: is_available, tensors to and
from the device, elementwise, x @ x, the losses of a 100-step MLP with fixed seeds, which
libcuda the process mapped, and (with --bench) per-op figures."""

import json
import sys
import time

import torch

out = {}


def guarded(name, fn):
    try:
        out[name] = fn()
    except Exception as exc:  # a row that fails is reported, the others still run
        out[name] = f"FAILED {type(exc).__name__}: {exc}"[:400]


guarded("available", torch.cuda.is_available)
guarded("device", lambda: torch.cuda.get_device_name(0))
guarded("to_from", lambda: torch.arange(12.0).cuda().reshape(3, 4).cpu().tolist())
guarded("elementwise", lambda: ((torch.arange(8.0).cuda() * 2 + 1).sin()).cpu().tolist())


def matmul():
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    got = (x.cuda() @ x.cuda()).cpu()
    return bool(torch.allclose(got, x @ x, rtol=1e-3, atol=1e-3))


guarded("matmul", matmul)


def large_copy():
    """100 MiB and a few bytes each way (an upload the proxy stripes over its data links),
    pageable and pinned, onto the default stream and a stream of its own."""
    g = torch.Generator().manual_seed(7)
    host = torch.randint(0, 256, ((100 << 20) + 12345,), dtype=torch.uint8, generator=g)
    pinned = host.pin_memory()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = pinned.to("cuda", non_blocking=True)
    side.synchronize()
    return bool(torch.equal(host.cuda().cpu(), host) and torch.equal(on_side.cpu(), host))


guarded("large_copy", large_copy)


def mlp():
    torch.manual_seed(0)
    xs, ys = torch.randn(512, 32), torch.randn(512, 1)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = xs.cuda(), ys.cuda()
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


guarded("losses", mlp)
# PyTorch's own NVML query (libnvidia-ml.so.1 through ctypes: nvmlInit_v2,
# nvmlDeviceGetCount_v2), as PYTORCH_NVML_BASED_CUDA_CHECK makes it count devices.
guarded("nvml_count", torch.cuda._raw_device_count_nvml)


def bench():
    """Each figure on its own: one that fails says which."""
    figures = {}

    def timed(name, fn):
        try:
            figures[name] = fn()
        except Exception as exc:
            figures[name] = f"FAILED {type(exc).__name__}: {exc}"[:300]

    t = torch.zeros(1, device="cuda")

    def tiny():
        for _ in range(50):
            t.add_(1)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            t.add_(1)
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / 200 * 1e6

    def many():
        start = time.perf_counter()
        for _ in range(1000):
            t.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / 1000 * 1e6

    host = torch.empty(256 << 20, dtype=torch.uint8)
    dev = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def h2d():
        dev.copy_(host)
        torch.cuda.synchronize()
        start = time.perf_counter()
        dev.copy_(host)
        torch.cuda.synchronize()
        return 0.268435456 / (time.perf_counter() - start)

    def d2h():
        host.copy_(dev)  # the first write of a fresh buffer faults its pages in: not timed
        start = time.perf_counter()
        host.copy_(dev)
        return 0.268435456 / (time.perf_counter() - start)

    def matmul():
        a = torch.randn(4096, 4096, device="cuda")
        (a @ a).sum().item()
        start = time.perf_counter()
        for _ in range(5):
            c = a @ a
        torch.cuda.synchronize()
        del c
        return (time.perf_counter() - start) / 5 * 1e3

    for name, fn in [
        ("tiny_op_sync_us", tiny),
        ("op_of_1000_us", many),
        ("h2d_256MiB_GBps", h2d),
        ("d2h_256MiB_GBps", d2h),
        ("matmul_4096_ms", matmul),
    ]:
        timed(name, fn)
    return figures


if "--bench" in sys.argv:
    guarded("bench", bench)
with open("/proc/self/maps") as f:
    maps = f.read().splitlines()
out["libcuda"] = sorted({line.split()[-1] for line in maps if "libcuda.so" in line})
out["libnvidia_ml"] = sorted({line.split()[-1] for line in maps if "libnvidia-ml" in line})
print(json.dumps(out), flush=True)
