"""A neighbour's round trips while another client uploads: how long a tenant's small
calls wait behind another's bulk copies on one worker.

    python -m benchmarks.upload_neighbour [--backend emulator] [--loop uvloop]
        [--rounds 2] [--mib 256] [--count 20] [--worker LABEL[:VAR=VALUE,...]] ...

Per round, one worker per ``--worker`` (its environment added; default one worker of
this tree), in turn. In each, a neighbour (``hipr.connect()``, this
process) times null synchronizes, first with the worker quiet, then while an uploader
(``hipr.connect()``, its own process) copies ``--mib`` MiB host-to-device ``--count``
times. Prints the neighbour's percentiles quiet and during the uploads, how many
synchronizes it got in, and the uploads' median GB/s; and, once, the blocking-socket
stream of the same size (``hipr.bench.floors``, server in its own process). A benchmark:
it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import hipr
from benchmarks.proxy.compare import floors
from benchmarks.proxy.torch_compare import worker_process

UPLOADER = """
import sys, time, numpy as np, hipr
url, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with hipr.connect(url) as gpu:
    data = np.full(size, 7, np.uint8)
    ptr = gpu.malloc(size)
    gpu.memcpy_htod(ptr, data)
    print("ready", flush=True)
    for _ in range(count):
        start = time.perf_counter()
        gpu.memcpy_htod(ptr, data)
        print(size / (time.perf_counter() - start) / 1e9, flush=True)
"""


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))] * 1e6


def one_worker(args: argparse.Namespace, label: str, env: dict[str, str]) -> str:
    with worker_process(args.backend, env, args=["--loop", args.loop]) as (url, _):
        with hipr.connect(url) as gpu:

            def syncs(count: int) -> list[float]:
                out = []
                for _ in range(count):
                    start = time.perf_counter()
                    gpu.synchronize()
                    out.append(time.perf_counter() - start)
                return out

            syncs(300)
            quiet = syncs(2000)
            uploader = subprocess.Popen(
                [sys.executable, "-c", UPLOADER, url, str(args.mib << 20), str(args.count)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert uploader.stdout is not None
            uploader.stdout.readline()  # "ready": its allocation and warm-up are done
            busy: list[float] = []
            while uploader.poll() is None:
                busy += syncs(50)
            rates = [float(line) for line in uploader.stdout.read().split()]
        if not rates or not busy:
            return f"{label}: no figures (uploader exit {uploader.returncode})"
        return (
            f"{label:8} quiet p50 {percentile(quiet, 0.5):6.0f} us | during uploads "
            f"p50 {percentile(busy, 0.5):6.0f} p90 {percentile(busy, 0.9):6.0f} "
            f"p99 {percentile(busy, 0.99):7.0f} max {max(busy) * 1e6:7.0f} us, "
            f"{len(busy):6d} syncs | upload {statistics.median(rates):.2f} GB/s"
        )


def _variant(spec: str) -> tuple[str, dict[str, str]]:
    """``LABEL[:VAR=VALUE,...]`` as (label, environment)."""
    label, _, settings = spec.partition(":")
    env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
    return label, env


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--loop", default="uvloop", choices=("asyncio", "uvloop"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--count", type=int, default=20, help="uploads per worker")
    parser.add_argument(
        "--worker", action="append", default=[], metavar="LABEL[:VAR=VALUE,...]",
        help="a worker with this environment added (repeat to compare; default: this tree)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    floor = floors(args.mib << 20)
    push = floor.gbs("push")
    echo = floor.echo_median * 1e6
    print(f"floor (blocking sockets, unix): {args.mib} MiB push {push:.2f} GB/s, "
          f"echo {echo:.1f} us; backend {args.backend}, loop {args.loop}")  # fmt: skip
    variants = [_variant(spec) for spec in args.worker] or [("worker", {})]
    for _ in range(args.rounds):
        for label, env in variants:
            print(one_worker(args, label, env), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
