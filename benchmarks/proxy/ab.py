"""The native proxy's figures against several workers, round by round.

``python -m benchmarks.proxy.ab --bench ./proxy_bench --worker base:/tmp/hipr-old --worker new:.``

Starts one worker per source tree named (``NAME:TREE``: that checkout's ``hipr`` runs
it, on a unix socket, with ``--backend``; ``NAME:TREE:BENCH`` runs that worker's rounds
with its own ``proxy_bench``, e.g. one linked to that tree's proxy libraries, where the
trees' proxies differ too), then runs rounds: in each round the
blocking-socket floors (echo, and the copy size streamed each way, in a server process
of its own: ``hipr.bench.floors``) and ``proxy_bench`` against every worker, in an order
that rotates from round to round, so that a shared host's drift hits all alike (on the
H200 hosts the floors moved by 30 % from one minute to the next). It prints, per
figure, each worker's median over the rounds, and for the copies the median of each
round's ratio to that round's stream floor; beside them the worker process's CPU
seconds per ``proxy_bench`` run (the CPU of its loop and GPU threads together).
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
from pathlib import Path

from benchmarks.proxy.compare import proxy
from hipr.bench import floors as fl

MIB = 1 << 20
#: proxy_bench's figures shown, with their labels.
FIGURES = (
    ("sync_us", "synchronize, idle device, us"),
    ("launch_sync_us", "tiny launch + synchronize, us"),
    ("launch_in_stream_us", "1,000 launches then sync, per launch us"),
    ("memcpy_h2d_GBps", "hipMemcpy H2D (+sync), GB/s"),
    ("memcpy_d2h_GBps", "hipMemcpy D2H, GB/s"),
)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_worker(tree: Path, sock: Path, backend: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    )
    command = [sys.executable, "-m", "hipr", "worker", "--backend", backend, "--listen",
               f"unix://{sock}", "--log-level", "warning"]  # fmt: skip
    worker = subprocess.Popen(
        command, cwd=tree, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker of {tree} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return worker


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.proxy.ab``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy.ab", description=__doc__)
    parser.add_argument("--bench", type=Path, help="proxy_bench, built (for every worker)")
    parser.add_argument("--worker", action="append", required=True, metavar="NAME:TREE[:BENCH]")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--mib", type=int, default=256, help="copy size (MiB)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    options = parser.parse_args(argv)
    size = options.mib * MIB
    directory = Path(tempfile.mkdtemp(prefix="hab-"))
    named = [spec.split(":", 2)[:2] for spec in options.worker]
    benches = {
        parts[0]: Path(parts[2]) if len(parts) > 2 else options.bench
        for parts in (spec.split(":", 2) for spec in options.worker)
    }
    if None in benches.values():
        parser.error("name a --bench, or one per worker (NAME:TREE:BENCH)")
    workers = {
        name: _start_worker(Path(tree).resolve(), directory / f"{name}.sock", options.backend,
                            directory / f"{name}.log")
        for name, tree in named
    }  # fmt: skip
    floor_server = subprocess.Popen(
        [sys.executable, "-m", "hipr.bench.floors", "--listen", f"unix://{directory}/f.sock"],
        stdout=subprocess.PIPE,
        text=True,
    )
    rounds: list[dict[str, object]] = []
    try:
        assert floor_server.stdout is not None
        floor_url = json.loads(floor_server.stdout.readline())["urls"][0]
        names = list(workers)
        for index in range(options.rounds):
            floor = fl.measure_floors(
                "unix", floor_url, echo_count=1000, warmup=100, stream_size=size, stream_repeats=2
            )
            record: dict[str, object] = {
                "echo_us": floor.echo_median * 1e6,
                "push": floor.gbs("push"),
                "pull": floor.gbs("pull"),
            }
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                pid = workers[name].pid
                cpu = _cpu_seconds(pid)
                figures = proxy(benches[name], f"unix://{directory / f'{name}.sock'}", size)
                figures["worker_cpu_s"] = _cpu_seconds(pid) - cpu
                record[name] = figures
            rounds.append(record)
            print(f"round {index + 1}: " + json.dumps(record), flush=True)
    finally:
        floor_server.terminate()
        floor_server.wait()
        for worker in workers.values():
            worker.terminate()
            worker.wait()
    if options.json is not None:
        options.json.write_text(json.dumps(rounds, indent=1))
    med = statistics.median
    echo = med(float(r["echo_us"]) for r in rounds)  # type: ignore[arg-type]
    push = med(float(r["push"]) for r in rounds)  # type: ignore[arg-type]
    pull = med(float(r["pull"]) for r in rounds)  # type: ignore[arg-type]
    print(
        f"\n{options.rounds} rounds, medians; floors: echo {echo:.1f} us, "
        f"push {push:.2f} GB/s, pull {pull:.2f} GB/s"
    )
    names = [name for name, _ in named]
    print(f"{'figure':42}" + "".join(f"{name:>16}" for name in names))
    for key, label in (*FIGURES, ("worker_cpu_s", "worker CPU per proxy_bench run, s")):
        cells = []
        for name in names:
            values = [r[name][key] for r in rounds]  # type: ignore[index]
            cell = f"{med(values):.2f}"
            if key.endswith("GBps"):
                floor_key = "push" if "h2d" in key else "pull"
                ratios = [r[name][key] / r[floor_key] for r in rounds]  # type: ignore[index, operator]
                cell += f" ({100 * med(ratios):.0f} %)"
            cells.append(f"{cell:>16}")
        print(f"{label:42}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
