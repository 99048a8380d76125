"""The native proxy's figures beside the floors and the Python sync client, one run.

``python -m benchmarks.proxy.compare --worker unix:///tmp/w.sock --bench ./proxy_bench``
measures, against the same worker and in this order: the machine's floors (a blocking-
socket server in a process of its own, ``hipr.bench.floors``: echo and 256 MiB stream
each way over a unix socket), the Python sync client (``hipr.connect``: the same tiny
launch + synchronize, 1,000 launches then synchronize, 256 MiB copies each way) and the
proxy (``benchmarks/proxy/proxy_bench.c``, built against the proxy), then prints one
table with issue 31's goals. A benchmark: goals missed are reported, never raised.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import hipr
from hipr.bench import floors as fl

MIB = 1 << 20


def floors(size: int) -> fl.Floors:
    """Blocking echo and stream over a unix socket, server in its own process."""
    directory = tempfile.mkdtemp(prefix="hf-")
    server = subprocess.Popen(
        [sys.executable, "-m", "hipr.bench.floors", "--listen", f"unix://{directory}/f.sock"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["urls"][0]
        return fl.measure_floors(
            "unix", url, echo_count=2000, warmup=200, stream_size=size, stream_repeats=3
        )
    finally:
        server.terminate()
        server.wait()


def python_client(url: str, size: int) -> dict[str, float]:
    """The proxy's workloads through the Python sync client."""
    out: dict[str, float] = {}
    with hipr.connect(url) as gpu:
        word = gpu.malloc(4096)
        fill = gpu.builtin("fill_f32")
        args = [word, np.float32(1.0), np.uint64(1)]
        for _ in range(200):
            fill.launch(1, 1, args)
            gpu.synchronize()
        idle = []
        for _ in range(2000):
            start = time.perf_counter()
            gpu.synchronize()
            idle.append(time.perf_counter() - start)
        out["sync_us"] = statistics.median(idle) * 1e6
        each = []
        for _ in range(2000):
            start = time.perf_counter()
            fill.launch(1, 1, args)
            gpu.synchronize()
            each.append(time.perf_counter() - start)
        out["launch_sync_us"] = statistics.median(each) * 1e6
        per = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(1000):
                fill.launch(1, 1, args)
            gpu.synchronize()
            per.append((time.perf_counter() - start) / 1000)
        out["launch_in_stream_us"] = statistics.median(per) * 1e6
        host = np.full(size, 7, np.uint8)
        back = np.ones(size, np.uint8)
        ptr = gpu.malloc(size)
        up, down = [], []
        for rep in range(4):  # the first round warms up
            gpu.synchronize()
            start = time.perf_counter()
            gpu.memcpy_htod(ptr, host)
            gpu.synchronize()
            middle = time.perf_counter()
            gpu.memcpy_dtoh(ptr, size, out=back)
            end = time.perf_counter()
            if rep:
                up.append(middle - start)
                down.append(end - middle)
        gpu.free(ptr)
        gpu.free(word)
        out["memcpy_h2d_GBps"] = size / statistics.median(up) / 1e9
        out["memcpy_d2h_GBps"] = size / statistics.median(down) / 1e9
    return out


def proxy(bench: Path, url: str, size: int) -> dict[str, float]:
    """proxy_bench's figures ("name value" lines; the last of a name counts)."""
    env = dict(os.environ, HIPR_URL=url)
    result = subprocess.run(
        [str(bench), str(size // MIB)], env=env, capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise RuntimeError(f"proxy_bench failed: {result.stderr}")
    figures: dict[str, float] = {}
    for line in result.stdout.splitlines():
        name, _, value = line.partition(" ")
        figures[name] = float(value)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy.compare")
    parser.add_argument("--worker", required=True, help="the worker's URL (unix://...)")
    parser.add_argument("--bench", required=True, type=Path, help="proxy_bench, built")
    parser.add_argument("--mib", type=int, default=256, help="copy size (MiB)")
    args = parser.parse_args(argv)
    size = args.mib * MIB
    floor = floors(size)
    py = python_client(args.worker, size)
    px = proxy(args.bench, args.worker, size)
    echo_us = floor.echo_median * 1e6
    push, pull = floor.gbs("push"), floor.gbs("pull")
    print(
        f"floors (blocking sockets, unix): echo {echo_us:.1f} us, {args.mib} MiB stream "
        f"push {push:.2f} GB/s, pull {pull:.2f} GB/s"
    )
    print(f"{'figure':40} {'proxy':>9} {'python':>9}  goal")
    rows: list[tuple[str, str, str | None, str, Callable[[float], bool]]] = [
        ("hipGetDevice, us", "hipGetDevice_us", None, "<= 1 us", lambda v: v <= 1),
        ("hipGetDeviceProperties, us", "hipGetDeviceProperties_us", None, "<= 1 us",
         lambda v: v <= 1),
        ("synchronize, idle device, median us", "sync_us", "sync_us",
         f"(the worker's floor for a request; echo {echo_us:.1f} us)", lambda v: True),
        ("tiny launch + synchronize, median us", "launch_sync_us", "launch_sync_us",
         f"<= 50 us and <= python (echo floor {echo_us:.1f} us)",
         lambda v: v <= 50 and v <= py["launch_sync_us"]),
        ("1,000 launches then sync, per launch us", "launch_in_stream_us",
         "launch_in_stream_us", "<= 8 us", lambda v: v <= 8),
        (f"{args.mib} MiB hipMemcpy H2D (+sync), GB/s", "memcpy_h2d_GBps", "memcpy_h2d_GBps",
         f">= 90 % of push {push:.2f} GB/s", lambda v: v >= 0.9 * push),
        (f"{args.mib} MiB hipMemcpy D2H, GB/s", "memcpy_d2h_GBps", "memcpy_d2h_GBps",
         f">= 90 % of pull {pull:.2f} GB/s", lambda v: v >= 0.9 * pull),
    ]  # fmt: skip
    for label, key, py_key, goal, met in rows:
        value = px.get(key, float("nan"))
        theirs = f"{py[py_key]:9.2f}" if py_key else f"{'':>9}"
        ratio = ""
        if key.endswith("GBps"):
            ratio = f" ({100 * value / (push if 'h2d' in key else pull):.0f} % of floor)"
        verdict = "" if goal.startswith("(") else (": met" if met(value) else ": NOT met")
        print(f"{label:40} {value:9.2f} {theirs}  {goal}{verdict}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
