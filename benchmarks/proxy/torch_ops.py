"""PyTorch's per-op and copy figures, run by benchmarks/proxy/torch_compare.py through the
CUDA proxy and locally (a JSON object a line on stdout, each figure as it is measured, so
that a process that dies later keeps them). ``--steps N`` runs each workload N times
between ``== step`` lines on stderr instead, for a traced run (HIPR_PROXY_TRACE=1) whose
driver calls torch_compare counts per op (the 4096^2 matmul's steady state included).
``--only a,b`` measures only the figures whose names start with a or b. Needs only PyTorch
and a CUDA device (real or through the proxy); a figure that fails says why and the others
still run."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

MIB = 1 << 20


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


#: The 4096^2 matmul: warm-up runs (cuBLAS's first call loads and tunes), then timed ones.
MATMUL_WARMUP = 5
MATMUL_REPEATS = 30


def figures(mib: int, only: set[str] | None = None) -> dict[str, object]:
    """Each figure a median of its timed repeats, after a warm-up (which also faults the
    host pages in: the first write of a fresh 256 MiB buffer costs as much as the copy).
    ``only``: the figures whose names start with one of these (all when None)."""
    out: dict[str, object] = {}
    sync = torch.cuda.synchronize

    def wanted(name: str) -> bool:
        return only is None or any(name.startswith(o) for o in only)

    def timed(name: str, fn: Callable[[], object]) -> None:
        if not wanted(name):
            return
        try:
            out[name] = fn()
        except Exception as exc:
            out[name] = f"FAILED {type(exc).__name__}: {exc}"[:300]
        # Each figure on its own line at once: a process that dies later keeps it.
        print(json.dumps({name: out[name]}), flush=True)

    t = torch.zeros(1, device="cuda")

    def tiny() -> float:
        for _ in range(50):
            t.add_(1)
            sync()
        each = []
        for _ in range(400):
            start = time.perf_counter()
            t.add_(1)
            sync()
            each.append(time.perf_counter() - start)
        return statistics.median(each) * 1e6

    def many() -> float:
        def run() -> None:
            for _ in range(1000):
                t.add_(1)
            sync()

        run()
        return _median_time(run, 5) / 1000 * 1e6

    def item() -> float:
        for _ in range(20):
            t.item()
        return _median_time(t.item, 400) * 1e6

    timed("tiny_op_sync_us", tiny)
    timed("op_of_1000_us", many)
    timed("item_us", item)
    size = mib * MIB
    if not any(wanted(k) for k in ("h2d_", "d2h_")):
        size = 0
    try:
        if not size:
            raise LookupError("copies not asked for")
        host = torch.full((size,), 7, dtype=torch.uint8)
        back = torch.zeros(size, dtype=torch.uint8)
        pinned = torch.full((size,), 9, dtype=torch.uint8).pin_memory()
        pinned_back = torch.zeros(size, dtype=torch.uint8).pin_memory()
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    except LookupError:
        pass
    except Exception as exc:
        out["copies"] = f"FAILED {type(exc).__name__}: {exc}"[:300]
    else:

        def rate(fn: Callable[[], object]) -> float:
            fn()
            sync()
            return size / _median_time(lambda: (fn(), sync()), 3) / 1e9

        timed("h2d_pageable_GBps", lambda: rate(lambda: dev.copy_(host)))
        timed("d2h_pageable_GBps", lambda: rate(lambda: back.copy_(dev)))
        timed("h2d_pinned_GBps", lambda: rate(lambda: dev.copy_(pinned, non_blocking=True)))
        timed("d2h_pinned_GBps", lambda: rate(lambda: pinned_back.copy_(dev, non_blocking=True)))
        if not bool((back[:4096] == 7).all()) or not bool((pinned_back[-4096:] == 9).all()):
            out["copies"] = "FAILED: a copy came back wrong"
        del host, back, pinned, pinned_back, dev

    matmul_times: list[float] = []

    def matmul() -> float:
        a = torch.randn(4096, 4096, device="cuda")
        (a @ a).sum().item()
        for _ in range(MATMUL_WARMUP):
            a @ a
            sync()
        for _ in range(MATMUL_REPEATS):
            start = time.perf_counter()
            a @ a
            sync()
            matmul_times.append(time.perf_counter() - start)
        return statistics.median(matmul_times) * 1e3

    timed("matmul_4096_ms", matmul)
    if matmul_times:
        # The spread of the same repeats: tenth and ninetieth percentiles (ms).
        deciles = statistics.quantiles(matmul_times, n=10)
        timed(
            "matmul_4096_p10_p90_ms",
            lambda: [round(deciles[0] * 1e3, 3), round(deciles[-1] * 1e3, 3)],
        )
    return out


def steps(n: int, mib: int) -> None:
    """Each workload n times between "== step" lines (stderr), for a traced run."""
    sync = torch.cuda.synchronize
    t = torch.zeros(1, device="cuda")
    t.add_(1)
    sync()
    t.item()
    size = mib * MIB
    host = torch.full((size,), 7, dtype=torch.uint8)
    pinned = torch.full((size,), 9, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev.copy_(host)
    host.copy_(dev)
    dev.copy_(pinned, non_blocking=True)
    pinned.copy_(dev, non_blocking=True)
    sync()
    a = torch.randn(512, 512, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")

    def mark(name: str, reps: int) -> None:
        print(f"== {name} x{reps}", file=sys.stderr, flush=True)

    def ops() -> None:
        for _ in range(n):
            t.add_(1)
        sync()

    # (name, calls, how many ops they make): the trace's counts divided by the ops.
    work: list[tuple[str, Callable[[], object], int, int]] = [
        ("tiny op + synchronize", lambda: (t.add_(1), sync()), n, n),
        ("ops in a row, then one synchronize", ops, 1, n),
        ("item()", t.item, n, n),
        ("h2d pageable copy_ + synchronize", lambda: (dev.copy_(host), sync()), 2, 2),
        ("d2h pageable copy_", lambda: host.copy_(dev), 2, 2),
        ("h2d pinned copy_ non_blocking + synchronize",
         lambda: (dev.copy_(pinned, non_blocking=True), sync()), 2, 2),
        ("d2h pinned copy_ non_blocking + synchronize",
         lambda: (pinned.copy_(dev, non_blocking=True), sync()), 2, 2),
        # Last, and cold: cuBLAS's first use may end the process.
        ("matmul 512 + synchronize", lambda: (a @ a, sync()), 2, 2),
        # Steady state: a 4096^2 matmul after warm-up runs (cuBLAS made its handle,
        # workspace and choices), as torch_compare's timed matmul repeats it.
        ("matmul 4096 warm-up", lambda: (big @ big, sync()), 3, 3),
        ("matmul 4096 + synchronize, steady", lambda: (big @ big, sync()), n, n),
    ]  # fmt: skip
    for name, fn, calls, per in work:
        mark(name, per)
        try:
            for _ in range(calls):
                fn()
        except Exception as exc:
            print(f"{name}: FAILED {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
    mark("end", 1)


def main() -> None:
    mib = 256
    if "--mib" in sys.argv:
        mib = int(sys.argv[sys.argv.index("--mib") + 1])
    if "--steps" in sys.argv:
        steps(int(sys.argv[sys.argv.index("--steps") + 1]), min(mib, 64))
        return
    with open("/proc/self/maps") as f:
        libcuda = sorted({ln.split()[-1] for ln in f if "libcuda.so" in ln})
    print(json.dumps({"device": torch.cuda.get_device_name(0), "libcuda": libcuda}), flush=True)
    only = None
    if "--only" in sys.argv:
        only = set(sys.argv[sys.argv.index("--only") + 1].split(","))
    figures(mib, only)


if __name__ == "__main__":
    main()
