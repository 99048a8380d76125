"""Interleaved A/B: the same small workloads against several workers, round by round.

    python -m benchmarks.interleaved --backend cuda --transport unix \\
        --worker base:tree=/tmp/hipr-old --worker new --worker spin:spin_wait=0.005

On a shared or virtual machine speed drifts by tens of percent within minutes (on the
H100 host the blocking tcp echo read 16.5 µs in one ``hipr bench`` run and 20.1 µs in
the next), so two runs of the suite cannot show a 10 % change. This tool starts every
worker named (each from its own source tree if asked, with its own ``spin_wait``) and a
blocking-socket echo server, then runs rounds: in each round every worker, and the echo
floor, get the same workload back to back, in an order that rotates from round to
round. Drift then hits all alike. It prints, per workload, each worker's median over
the rounds, its ratio to the first worker and to the echo floor of the same rounds.

A worker is ``NAME[:key=value,...]`` with keys ``tree`` (a checkout whose ``hipr``
runs that worker, e.g. ``git worktree add /tmp/hipr-old HEAD~3``; it must know
``python -m hipr.cli.bench --serve-worker``), ``spin_wait`` (seconds or ``auto``;
unset: that worker's own default) and ``loop`` (trio, asyncio, uvloop). The client is
this checkout's synchronous client.

Workloads (each round): null ``synchronize()``; 1-thread ``fill_f32`` launch +
``synchronize()``; 1,000 launches then one ``synchronize()`` (per launch); 1,000
fire-and-forget 4-byte ``memcpy_htod_async`` on a stream, then ``synchronize()`` (per
copy); a synchronous 4 KiB ``memcpy_htod`` (its reply comes once the copy is done); a
4-byte ``memcpy_dtoh`` (a result read back); a kernel of ~2 ms launched and
synchronized (``benchmarks.stages.long_kernel``: the 2048³ SGEMM on GPU backends, a fill
of 4 Mi elements on the emulator), whose synchronize waits on the session's GPU thread;
and the blocking echo floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hipr.bench.servers import spawn_server, spin_setting

_ROOT = Path(__file__).resolve().parent.parent

#: Round trips timed per round for the one-call workloads; items per round for the others.
CALLS_PER_ROUND = 200
ITEMS_PER_ROUND = 1000
#: Long-kernel pairs timed per round (each ~2 ms).
LONG_CALLS_PER_ROUND = 40
WORKLOADS = (
    "null synchronize",
    "launch + synchronize",
    "1,000 launches",
    "1,000 ff 4 B copies",
    "4 KiB memcpy_htod",
    "4 B memcpy_dtoh",
    "long kernel + sync",
)


@dataclass(frozen=True)
class WorkerSpec:
    """One worker of the comparison."""

    name: str
    tree: Path = _ROOT
    #: None: the worker's own default (from its tree; "auto" since the worker had it).
    spin_wait: float | None = None
    loop: str = "uvloop"

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        """``NAME[:key=value,...]`` (see the module doc)."""
        name, _, rest = text.partition(":")
        if not name:
            raise ValueError(f"worker {text!r} has no name")
        options: dict[str, Any] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"worker {name}: {item!r} is not key=value")
            if key == "tree":
                options["tree"] = Path(value).resolve()
                if not (options["tree"] / "hipr").is_dir():
                    raise ValueError(f"worker {name}: {value} holds no hipr package")
            elif key == "spin_wait":
                options["spin_wait"] = spin_setting(value)
            elif key == "loop":
                options["loop"] = value
            else:
                raise ValueError(f"worker {name}: unknown key {key!r}")
        return cls(name, **options)


@dataclass
class Timings:
    """Per-round medians of each workload, by worker (and ``floor`` for the echo)."""

    rounds: int = 0
    seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add(self, workload: str, who: str, value: float) -> None:
        """One round's figure (seconds per call or item)."""
        self.seconds.setdefault(workload, {}).setdefault(who, []).append(value)

    def median(self, workload: str, who: str) -> float:
        """The median over rounds."""
        return statistics.median(self.seconds[workload][who])


def _listen_url(transport: str, directory: str, name: str) -> str:
    return f"unix://{directory}/{name}.sock" if transport == "unix" else "tcp://127.0.0.1:0"


def _worker(spec: WorkerSpec, backend: str, url: str) -> contextlib.AbstractContextManager[Any]:
    argv = [sys.executable, "-m", "hipr.cli.bench", "--serve-worker", "--loop", spec.loop]
    argv += ["--backend", backend, "--listen", url]
    if spec.spin_wait is not None:
        argv += ["--spin-wait", repr(spec.spin_wait)]
    return spawn_server(argv, f"worker {spec.name}", spec.tree)


class _Target:
    """One connected worker and the handles its workloads use."""

    def __init__(self, gpu: Any, backend: str) -> None:
        from benchmarks.stages import long_kernel

        self.gpu = gpu
        self.word = gpu.malloc(4)
        self.fill = gpu.builtin("fill_f32")
        self.args = [self.word, np.float32(1.0), np.uint64(1)]
        self.stream = gpu.stream_create()
        self.four = np.zeros(1, np.float32)
        self.page = np.zeros(1024, np.float32)
        self.page_ptr = gpu.malloc(self.page.nbytes)
        self.long, self.long_grid, self.long_block, self.long_args, self.clean = long_kernel(
            gpu, backend
        )

    def null_sync(self) -> None:
        self.gpu.synchronize()

    def launch_sync(self) -> None:
        self.fill.launch(1, 1, self.args)
        self.gpu.synchronize()

    def launches(self) -> None:
        for _ in range(ITEMS_PER_ROUND):
            self.fill.launch(1, 1, self.args)
        self.gpu.synchronize()

    def copies(self) -> None:
        post, word, four, stream = self.gpu.memcpy_htod_async, self.word, self.four, self.stream
        for _ in range(ITEMS_PER_ROUND):
            post(word, four, stream=stream)
        self.gpu.synchronize()

    def small_copy(self) -> None:
        self.gpu.memcpy_htod(self.page_ptr, self.page)

    def read_word(self) -> None:
        self.gpu.memcpy_dtoh(self.word, 4, out=self.four)

    def long_sync(self) -> None:
        self.long.launch(self.long_grid, self.long_block, self.long_args)
        self.gpu.synchronize()


def _per_call(fn: Callable[[], None], count: int) -> float:
    """Median seconds of ``count`` calls."""
    times = []
    clock = time.perf_counter
    for _ in range(count):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def _per_item(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / ITEMS_PER_ROUND


def measure(
    specs: Sequence[WorkerSpec],
    *,
    backend: str = "emulator",
    transport: str = "unix",
    rounds: int = 20,
    client_spin: float | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> Timings:
    """Run the rounds (the first, a warm-up, is not kept)."""
    from hipr.bench.floors import FloorClient
    from hipr.client.link import LinkOptions
    from hipr.client.sync import Gpu

    names = [s.name for s in specs]
    if len(set(names)) != len(names) or "floor" in names:
        raise ValueError("worker names must be distinct and not 'floor'")
    timings = Timings()
    with contextlib.ExitStack() as stack:
        # Short: a unix socket's path must stay under 108 bytes.
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="hipr-ab-", dir="/tmp"))
        floor_argv = [sys.executable, "-m", "hipr.bench.floors"]
        floor_argv += ["--listen", _listen_url(transport, directory, "floor")]
        floor_url = stack.enter_context(spawn_server(floor_argv, "floor server"))["urls"][0]
        floor = stack.enter_context(FloorClient(floor_url))
        targets: dict[str, _Target] = {}
        for spec in specs:
            url = _listen_url(transport, directory, spec.name)
            bound = stack.enter_context(_worker(spec, backend, url))["urls"][0]
            gpu = stack.enter_context(Gpu(bound, link=LinkOptions(spin_wait=client_spin)))
            targets[spec.name] = _Target(gpu, backend)
            spin = "default" if spec.spin_wait is None else f"{spec.spin_wait:g} s"
            log(f"worker {spec.name} at {bound} ({spec.tree}, spin_wait {spin})")
        for number in range(rounds + 1):
            order = names[number % len(names) :] + names[: number % len(names)]
            keep = number > 0
            echo = statistics.median(floor.echo(CALLS_PER_ROUND))
            for name in order:
                target = targets[name]
                figures = (
                    _per_call(target.null_sync, CALLS_PER_ROUND),
                    _per_call(target.launch_sync, CALLS_PER_ROUND),
                    _per_item(target.launches),
                    _per_item(target.copies),
                    _per_call(target.small_copy, CALLS_PER_ROUND),
                    _per_call(target.read_word, CALLS_PER_ROUND),
                    _per_call(target.long_sync, LONG_CALLS_PER_ROUND),
                )
                if keep:
                    for workload, value in zip(WORKLOADS, figures, strict=True):
                        timings.add(workload, name, value)
            if keep:
                timings.add("echo", "floor", echo)
                timings.rounds += 1
            log(f"round {number}/{rounds}{'' if keep else ' (warm-up)'} done")
        for target in targets.values():
            target.gpu.free(target.word)
            target.gpu.free(target.page_ptr)
            target.clean()
    return timings


def report(timings: Timings, names: Sequence[str]) -> list[str]:
    """The table: median µs per workload and worker, ratio to the first worker and to
    the echo floor of the same rounds."""
    echo = timings.median("echo", "floor")
    lines = [
        f"{timings.rounds} rounds; blocking echo floor median {echo * 1e6:.1f} µs",
        f"{'workload':22s} {'worker':12s} {'median µs':>10s} {'vs ' + names[0]:>10s} "
        f"{'x echo':>7s}",
    ]
    for workload in WORKLOADS:
        first = timings.median(workload, names[0])
        for name in names:
            value = timings.median(workload, name)
            lines.append(
                f"{workload:22s} {name:12s} {value * 1e6:10.1f} {value / first:10.2f} "
                f"{value / echo:7.2f}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.interleaved")
    parser.add_argument("--worker", action="append", required=True, type=WorkerSpec.parse)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--transport", choices=("unix", "tcp"), default="unix")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--client-spin", type=float, default=None, help="seconds (default: automatic)"
    )
    parser.add_argument("--json", type=Path, help="also write the per-round figures here")
    args = parser.parse_args(argv)
    specs: list[WorkerSpec] = args.worker
    timings = measure(
        specs,
        backend=args.backend,
        transport=args.transport,
        rounds=args.rounds,
        client_spin=args.client_spin,
        log=lambda text: print(text, file=sys.stderr, flush=True),
    )
    names = [s.name for s in specs]
    print("\n".join(report(timings, names)))
    if args.json is not None:
        record = {"rounds": timings.rounds, "workers": [str(s) for s in specs]}
        args.json.write_text(json.dumps({**record, "seconds": timings.seconds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
