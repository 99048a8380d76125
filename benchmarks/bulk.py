"""Where a bulk copy's CPU goes: throughput and the worker's CPU per GiB moved.

    python -m benchmarks.bulk [--backend cuda] [--transport unix|tcp|both] [--size 256M]
        [--rounds 6] [--worker NAME[:KEY=VALUE,...]] ...

Starts one worker subprocess per ``--worker`` (each with its own config: ``KEY=VALUE``
pairs are top-level keys of the worker's TOML, e.g. ``pinned:pinned_payload_bytes=64MiB``
against ``pageable:pinned_payload_bytes=0``) and one ``hipr.connect()`` to each, warmed
by an untimed copy each way; then, round after round, in rotating order so that the
host's drift hits every worker alike, copies ``--size`` bytes each way (``memcpy_htod``
from a numpy array, ``memcpy_dtoh`` into a numpy ``out``) and reads the worker's CPU
time from ``/proc`` around each copy:

- GB/s of each copy (median over rounds),
- the worker's CPU seconds per GiB moved, from each thread's ``/proc`` schedstat (ns):
  the event-loop thread (the socket copies and the Python that drives them) and the
  other threads (the sessions' GPU threads: the runtime's copy calls, which on a GPU
  backend stage pageable bytes through a pinned buffer of its own on the CPU, where
  from page-locked memory the copy is a DMA that costs no CPU).

The blocking-socket stream of ``hipr bench`` (its floor) is not repeated here: this
tool compares workers with each other, in the same run; ``hipr bench`` gives the ratio
to the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hipr.bench.servers import default_worker_loop, spawn_server, worker_setting
from hipr.worker.config import parse_size


@dataclass
class _Worker:
    """A worker subprocess with its own config keys, on a fresh socket (``hipr bench``'s
    ``--serve-worker``, on the loop ``hipr worker`` runs by default)."""

    name: str
    settings: dict[str, str]
    backend: str
    transport: str
    url: str = ""
    pid: int = 0
    results: dict[str, list[float]] = field(default_factory=dict)

    def start(self, stack: contextlib.ExitStack) -> None:
        """Start it; ``stack`` stops it (and removes its socket's directory)."""
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="hipr-bulk-"))
        listen = f"unix://{directory}/w.sock" if self.transport == "unix" else "tcp://127.0.0.1:0"
        argv = [sys.executable, "-m", "hipr.cli.bench", "--serve-worker"]
        argv += ["--loop", default_worker_loop(), "--backend", self.backend, "--listen", listen]
        for key, value in self.settings.items():
            argv += ["--set", f"{key}={value}"]
        ready = stack.enter_context(spawn_server(argv, f"worker {self.name}"))
        self.url, self.pid = ready["urls"][0], ready["pid"]

    def cpu(self) -> tuple[float, float]:
        """CPU seconds the worker's event-loop thread and its other threads have used
        (threads that ended meanwhile are not counted: a session's GPU thread lives as
        long as its session, which outlives the copies)."""
        loop = others = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                ns = int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended between the listing and the read
            if task.name == str(self.pid):
                loop += ns
            else:
                others += ns
        return loop / 1e9, others / 1e9


class _Copier:
    """A ``hipr.connect()`` to one worker with a device buffer and host arrays of the
    copy's size, warmed by one untimed copy each way: the link, the worker's payload
    buffers and the client's pages are then as they are in steady use (a connection's
    first copy also pays for faulting in its pageable buffers)."""

    def __init__(self, worker: _Worker, size: int) -> None:
        import numpy as np

        import hipr

        self.worker = worker
        self.size = size
        self.data = np.full(size, 7, dtype=np.uint8)
        self.out = np.empty_like(self.data)
        self.gpu = hipr.connect(worker.url)
        self.ptr = self.gpu.malloc(size)
        self.gpu.memcpy_htod(self.ptr, self.data)
        self.gpu.memcpy_dtoh(self.ptr, out=self.out)

    def round(self) -> None:
        """One timed copy each way; results appended to the worker's."""
        import numpy as np

        worker, size, gpu = self.worker, self.size, self.gpu
        self.out[:] = 0
        for direction in ("htod", "dtoh"):
            loop, others = worker.cpu()
            began = time.perf_counter()
            if direction == "htod":
                gpu.memcpy_htod(self.ptr, self.data)
            else:
                gpu.memcpy_dtoh(self.ptr, out=self.out)
            took = time.perf_counter() - began
            loop_after, others_after = worker.cpu()
            gib = size / (1 << 30)
            worker.results.setdefault(f"{direction} GB/s", []).append(size / took / 1e9)
            worker.results.setdefault(f"{direction} loop thread CPU s/GiB", []).append(
                (loop_after - loop) / gib
            )
            worker.results.setdefault(f"{direction} other threads CPU s/GiB", []).append(
                (others_after - others) / gib
            )
        if not np.array_equal(self.out[:: 1 << 16], self.data[:: 1 << 16]):
            raise RuntimeError(f"worker {worker.name}: the download differs from the upload")

    def close(self) -> None:
        self.gpu.free(self.ptr)
        self.gpu.close()


def measure(
    backend: str,
    transport: str,
    size: int,
    rounds: int,
    workers: Sequence[tuple[str, dict[str, str]]],
    out: Callable[[str], None] = print,
) -> dict[str, dict[str, float]]:
    """Medians per worker (see the module doc), printed through ``out``."""
    started = [_Worker(name, settings, backend, transport) for name, settings in workers]
    with contextlib.ExitStack() as stack:
        copiers: list[_Copier] = []
        for worker in started:
            worker.start(stack)
            copiers.append(_Copier(worker, size))
            stack.callback(copiers[-1].close)  # before its worker stops
        for index in range(rounds):
            # Rotating order: no worker always runs first after the others' copies.
            shift = index % len(copiers)
            for copier in itertools.chain(copiers[shift:], copiers[:shift]):
                copier.round()
    medians = {
        worker.name: {key: statistics.median(values) for key, values in worker.results.items()}
        for worker in started
    }
    out(f"{backend}, {transport}, {size / (1 << 20):g} MiB each way, {rounds} rounds (medians)")
    keys = list(next(iter(medians.values())))
    out(f"  {'':30s}" + "".join(f"{name:>14s}" for name in medians))
    for key in keys:
        out(f"  {key:30s}" + "".join(f"{medians[name][key]:14.3f}" for name in medians))
    return medians


def _worker_arg(text: str) -> tuple[str, dict[str, str]]:
    """``NAME[:KEY=VALUE,...]``: each pair as written, for ``--serve-worker --set``
    (which reads its value as TOML would); a pair without ``=`` is refused here."""
    name, _, rest = text.partition(":")
    pairs = [pair.strip() for pair in rest.split(",") if pair.strip()]
    return name, {worker_setting(pair)[0]: pair.partition("=")[2].strip() for pair in pairs}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.bulk``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bulk", description=__doc__)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--transport", default="both", choices=("unix", "tcp", "both"))
    parser.add_argument("--size", default="256MiB", type=parse_size)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--worker", action="append", type=_worker_arg, default=[])
    options = parser.parse_args(argv)
    workers: list[tuple[str, dict[str, str]]] = options.worker or [("default", {})]
    transports = ("unix", "tcp") if options.transport == "both" else (options.transport,)
    for transport in transports:
        measure(options.backend, transport, options.size, options.rounds, workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
