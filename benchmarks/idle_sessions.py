"""A client's small calls on a worker that also holds many idle sessions: what each
session costs the others when the worker busy-polls (``spin_wait``).

    python -m benchmarks.idle_sessions [--backend emulator] [--loop uvloop]
        [--sessions 0,64,512] [--count 2000] [--rounds 2] [--tree LABEL=DIR] ...

Per round and per worker (this tree, then each ``--tree``: another checkout's ``hipr``,
run from its folder; ``torch_compare.worker_process``), one worker on a unix socket
with ``spin_wait`` = 200 µs (its busy polling, on whatever machine). For each session
count in turn, a helper process opens that many sessions (raw connections through
HELLO) and holds them silent, and this process times ``--count`` null synchronizes of
its own ``hipr.connect()`` session. Prints the p50 and p90 per worker and session count.
A benchmark: it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hipr
from benchmarks.proxy.torch_compare import worker_process

HOLDER = """
import sys, anyio
from hipr.testing.harness import RawClient

async def main(url, count):
    clients = [await RawClient.open(url) for _ in range(count)]
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.read)
    for client in clients:
        await client.stream.aclose()

anyio.run(main, sys.argv[1], int(sys.argv[2]))
"""


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))] * 1e6


def _synchronizes(url: str, count: int) -> list[float]:
    with hipr.connect(url) as gpu:
        for _ in range(200):
            gpu.synchronize()
        times = []
        for _ in range(count):
            start = time.perf_counter()
            gpu.synchronize()
            times.append(time.perf_counter() - start)
    return times


def one_worker(args: argparse.Namespace, label: str, tree: Path | None) -> list[str]:
    """The figures of one worker, one line per session count."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="his-") as folder:
        config = Path(folder) / "worker.toml"
        config.write_text("spin_wait = 0.0002\n")
        with worker_process(
            args.backend, tree=tree, args=["--loop", args.loop, "--config", str(config)]
        ) as (url, _):
            lines += _rounds(args, label, url)
    return lines


def _rounds(args: argparse.Namespace, label: str, url: str) -> list[str]:
    """One line per session count, on the worker at ``url``."""
    lines = []
    for count in args.sessions:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url, str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdin is not None
        if holder.stdout.readline().strip() != "ready":
            raise SystemExit(f"{label}: the idle sessions could not be opened")
        times = _synchronizes(url, args.count)
        holder.stdin.close()
        holder.wait(timeout=60)
        lines.append(
            f"{label:8} {count:5d} idle sessions: null synchronize p50 "
            f"{_percentile(times, 0.5):7.1f} µs, p90 {_percentile(times, 0.9):7.1f} µs, "
            f"mean {statistics.fmean(times) * 1e6:7.1f} µs"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--loop", default="uvloop", choices=("asyncio", "uvloop"))
    parser.add_argument("--sessions", default="0,64,512", help="idle session counts")
    parser.add_argument("--count", type=int, default=2000, help="timed synchronizes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR")
    args = parser.parse_args(argv)
    args.sessions = [int(n) for n in args.sessions.split(",")]
    workers: list[tuple[str, Path | None]] = [("this", None)]
    for spec in args.tree:
        label, _, folder = spec.partition("=")
        workers.append((label, Path(folder).resolve()))
    for _ in range(args.rounds):
        for label, tree in workers:
            for line in one_worker(args, label, tree):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
