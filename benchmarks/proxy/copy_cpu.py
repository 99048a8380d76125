"""Bulk copies through the CUDA proxy, and where the worker's CPU goes while they run.

    python -m benchmarks.proxy.copy_cpu [--backend cuda] [--mib 256] [--reps 9]
        [--rounds 2] [--directions h,a,d] [--source malloc]
        [--worker LABEL[:VAR=VALUE,...][@TREE]] ...

Builds ``copy_loop.c`` against the proxy's libcuda.so.1. Per round, for each ``--worker``
in turn (default one worker of this tree), starts a worker on a unix socket
(``torch_compare.worker_process``: its ``VAR=VALUE`` settings added to the environment
of both the worker and the copying program, so ``HIPR_DATA_LINKS=0`` turns the proxy's
data links off; ``@TREE``: the ``hipr`` package of another checkout),
and times ``--reps`` copies of ``--mib`` MiB in each direction: ``h`` cuMemcpyHtoD, ``a``
cuMemcpyHtoDAsync on a stream of the program's own then cuStreamSynchronize, ``d``
cuMemcpyDtoH, from each ``--source`` host buffer (malloc, posix_memalign, hugepages).
Prints the median GB/s (the first copy left out) and the worker's CPU seconds per GiB
moved by thread (the event loop's, then the busiest others: the sessions' GPU threads),
read from /proc around the copies. First, the floors of the same size: the
blocking-socket stream and the ring floor (``hipr.bench.floors``). A benchmark: it
reports, it asserts nothing; compare workers within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.proxy.compare import floors
from benchmarks.proxy.torch_compare import proxy_dir, worker_process

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process ``pid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def copies(
    program: Path,
    url: str,
    mib: int,
    reps: int,
    direction: str,
    source: str,
    client_env: dict[str, str] | None = None,
) -> list[float]:
    """GB/s of each copy but the first (``copy_loop``'s lines)."""
    env = dict(os.environ, **(client_env or {}), HIPR_URL=url, LD_LIBRARY_PATH=str(proxy_dir()))
    out = subprocess.run(
        [str(program), str(mib), str(reps), direction, source],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"copy_loop failed: {out.stderr.strip()[-300:]}")
    return [float(line.split()[1]) for line in out.stdout.splitlines()][1:]


def parse_worker(spec: str) -> tuple[str, dict[str, str], Path | None]:
    """``LABEL[:VAR=VALUE,...][@TREE]`` as (label, environment, tree)."""
    spec, _, tree = spec.partition("@")
    label, _, settings = spec.partition(":")
    env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
    return label, env, Path(tree).resolve() if tree else None


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=9, help="copies per direction")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--directions", default="h,a,d")
    parser.add_argument("--source", default="malloc", help="host buffers, comma-separated")
    parser.add_argument("--worker", action="append", default=[], metavar="LABEL[:VAR=V][@TREE]")
    parser.add_argument("--no-floors", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hcc-") as tmp:
        program = Path(tmp) / "copy_loop"
        cc = shutil.which("cc") or shutil.which("gcc") or "cc"
        subprocess.run(
            [cc, "-std=c11", "-O2", str(HERE / "copy_loop.c"), "-o", str(program),
             f"-L{proxy_dir()}", "-l:libcuda.so.1"],
            check=True,
        )  # fmt: skip
        if not args.no_floors:
            f = floors(args.mib * MIB)
            push, pull = f.gbs("push"), f.gbs("pull")
            ring_push, ring_pull = f.gbs("push_ring"), f.gbs("pull_ring")
            print(f"floors (blocking sockets, unix): push {push:.2f}, pull {pull:.2f} GB/s; "
                  f"ring floor push {ring_push:.2f}, pull {ring_pull:.2f} GB/s")  # fmt: skip
        variants = [parse_worker(spec) for spec in args.worker] or [("worker", {}, None)]
        gib = (args.reps - 1) * args.mib / 1024
        for round_ in range(args.rounds):
            for label, env, tree in variants:
                with worker_process(args.backend, env, None, tree) as (url, pid):
                    copies(program, url, args.mib, 2, "h", "malloc", env)  # warm-up
                    for source in args.source.split(","):
                        for direction in args.directions.split(","):
                            before = thread_cpu(pid)
                            rates = copies(
                                program, url, args.mib, args.reps, direction, source, env
                            )
                            after = thread_cpu(pid)
                            spent = sorted(
                                ((after[t] - before.get(t, 0.0), t) for t in after), reverse=True
                            )
                            by_thread = ", ".join(
                                f"{'loop' if t == pid else 'thread'} {s / gib:.3f}"
                                for s, t in spent[:3] if s > 0
                            )  # fmt: skip
                            print(f"round {round_} {label:10} {source:14} {direction}: median "
                                  f"{statistics.median(rates):.2f} GB/s (min {min(rates):.2f}, "
                                  f"max {max(rates):.2f}); worker CPU s/GiB: {by_thread}",
                                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
