"""Load: many concurrent sessions of mixed, verified operations against one worker.

Each session connects, waits until every session of its process is connected (so the
worker really holds them all at once), then loops until the deadline over malloc,
host-to-device, device-to-host, memset, device-to-device, a built-in kernel and free,
checking every result. Sessions run in this process or spread over client processes
(``processes``), which is how a worker is loaded in production: by many programs.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import threading
import time
import tracemalloc
from array import array
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import numpy as np

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend
from hipr.errors import HipError
from hipr.testing.harness import (
    LogWatch,
    leaks,
    percentile,
    rss_bytes,
    wait_for_no_sessions,
    warm_up,
)
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker


@dataclass
class LoadOptions:
    """How much load and for how long."""

    sessions: int = 64
    #: Client processes; 0 runs the sessions in the worker's own process and loop.
    processes: int = 0
    #: Seconds of mixed operations once every session is connected.
    seconds: float = 3.0
    seed: int = 0
    #: Largest buffer a session allocates.
    max_bytes: int = 64 << 10
    listen: str = "tcp://127.0.0.1:0"
    #: Event loop of the client processes.
    client_loop: str = "asyncio"
    #: Runs of ``seconds`` each, every session reconnecting between them; the worker's
    #: RSS after each run shows whether it settles or keeps growing.
    rounds: int = 1
    #: Soak: repeat rounds until this many seconds have passed (``rounds`` is then a
    #: minimum), sampling RSS, open descriptors and threads after each.
    soak_seconds: float | None = None
    #: Soak: tracemalloc snapshots at half time and at the end, their top differences in
    #: the report (slows the worker; for hunting what grows, not for the figures).
    trace: bool = False
    #: Seconds to wait once a round's sessions have ended before sampling: the worker
    #: gives freed memory back after a second idle (hipr/worker/heap_trim.py).
    settle_seconds: float = 0.0
    #: Called with each round's sample as it is taken (progress of a long soak).
    on_sample: Callable[[Sample], None] | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """The worker process after one round, its sessions closed."""

    #: Seconds since the first round began.
    t: float
    rss: int
    fds: int
    threads: int
    #: Objects the garbage collector tracks (a Python-level leak shows here first).
    gc_objects: int
    p50_ms: float
    p99_ms: float
    #: The largest RSS seen while the round ran (sampled every 0.2 s).
    rss_peak: int = 0


@dataclass
class ClientStats:
    """What one group of sessions saw (picklable: it crosses process boundaries)."""

    requests: int = 0
    verified: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: array[float] = field(default_factory=lambda: array("d"))
    connected: int = 0

    def merge(self, other: ClientStats) -> None:
        """Add ``other``'s figures to these."""
        self.requests += other.requests
        self.verified += other.verified
        self.errors += other.errors
        self.latencies.extend(other.latencies)
        self.connected += other.connected


@dataclass
class LoadReport:
    """The load run's figures."""

    sessions: int = 0
    sessions_held: int = 0
    requests: int = 0
    verified: int = 0
    errors: list[str] = field(default_factory=list)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    rss_start: int = 0
    rss_end: int = 0
    #: RSS after each round, its sessions closed.
    rss_rounds: list[int] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: One per round (soak mode fills them; a plain run has one per round too).
    samples: list[Sample] = field(default_factory=list)
    #: Soak with ``trace``: the allocation sites that grew most over the last half.
    trace_top: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True with no error, crash or leak, and every session held at once."""
        return (
            not (self.errors or self.leaks or self.crashes) and self.sessions_held >= self.sessions
        )

    def summary(self) -> str:
        """One line for logs and assertion messages."""
        return (
            f"{self.sessions} sessions ({self.sessions_held} held at once), "
            f"{self.requests} requests ({self.verified} verified) in {self.seconds:.1f} s, "
            f"p50 {self.p50_ms:.2f} ms p99 {self.p99_ms:.2f} ms, errors {self.errors[:3]}, "
            f"RSS {self.rss_start >> 20} -> {'/'.join(str(r >> 20) for r in self.rss_rounds)} "
            f"MiB, leaks {self.leaks}, "
            f"crashes {self.crashes[:3]}"
        )


class _Timed:
    """Times each awaited client call into ``stats``."""

    def __init__(self, stats: ClientStats) -> None:
        self.stats = stats

    async def __call__(self, awaitable: Any) -> Any:
        started = time.perf_counter()
        result = await awaitable
        self.stats.latencies.append(time.perf_counter() - started)
        self.stats.requests += 1
        return result


async def _one_session(
    url: str,
    token: str | None,
    rng: random.Random,
    max_bytes: int,
    seconds: float,
    connected: anyio.Event,
    everyone_in: anyio.Event,
    arrived: list[int],
    total: int,
    stats: ClientStats,
) -> None:
    timed = _Timed(stats)

    def check(ok: bool, what: str) -> None:
        if ok:
            stats.verified += 1
        else:
            stats.errors.append(f"wrong result: {what}")

    try:
        async with hipr.aconnect(url, token=token, timeout=60) as gpu:
            stats.connected += 1
            arrived[0] += 1
            if arrived[0] >= total:
                connected.set()
            await everyone_in.wait()
            fill = await timed(gpu.builtin("fill_f32"))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                n = rng.randrange(1, max_bytes // 4 + 1) * 4
                data = rng.randbytes(n)
                a = await timed(gpu.malloc(n))
                b = await timed(gpu.malloc(n))
                await timed(gpu.memcpy_htod(a, data))
                check(await timed(gpu.memcpy_dtoh(a, n)) == data, "htod/dtoh")
                value = rng.randrange(256)
                await timed(gpu.memset(b, value, n))
                check(await timed(gpu.memcpy_dtoh(b, n)) == bytes([value]) * n, "memset")
                await timed(gpu.memcpy_dtod(b, a, n))
                check(await timed(gpu.memcpy_dtoh(b, n)) == data, "dtod")
                x = np.float32(rng.uniform(-1e6, 1e6))
                await timed(fill.launch(max(1, n // 1024), 256, [a, x, np.uint64(n // 4)]))
                got = np.frombuffer(await timed(gpu.memcpy_dtoh(a, n)), dtype=np.float32)
                check(bool(np.all(got == x)), "fill_f32")
                await timed(gpu.free(a))
                await timed(gpu.free(b))
    except HipError as exc:
        stats.errors.append(repr(exc))
        connected.set()
        everyone_in.set()


async def run_sessions(
    url: str,
    token: str | None,
    sessions: int,
    seconds: float,
    seed: int,
    max_bytes: int,
    other_processes_in: Callable[[], object] | None = None,
) -> ClientStats:
    """Run ``sessions`` verified sessions concurrently in the current event loop. With
    ``other_processes_in`` (a blocking wait, e.g. a barrier's), the sessions start their
    work only once it returns as well, so that sessions of several processes are all
    held at once however slowly the processes started."""
    stats = ClientStats()
    connected = anyio.Event()
    everyone_in = anyio.Event()
    arrived = [0]
    async with anyio.create_task_group() as tg:
        if other_processes_in is None:
            everyone_in = connected
        else:
            tg.start_soon(_after_other_processes, connected, other_processes_in, everyone_in)
        for i in range(sessions):
            rng = random.Random(f"{seed}:{i}")
            tg.start_soon(
                _one_session,
                url,
                token,
                rng,
                max_bytes,
                seconds,
                connected,
                everyone_in,
                arrived,
                sessions,
                stats,
            )
    return stats


async def _after_other_processes(
    connected: anyio.Event, wait: Callable[[], object], everyone_in: anyio.Event
) -> None:
    await connected.wait()
    try:
        await anyio.to_thread.run_sync(wait)
    finally:  # a broken or timed-out barrier must not hold the sessions forever
        everyone_in.set()


#: How long a client process waits for the others to connect before it starts anyway.
_BARRIER_SECONDS = 120.0


def _client_process(
    url: str,
    token: str | None,
    sessions: int,
    seconds: float,
    seed: int,
    max_bytes: int,
    loop: str,
    all_in: Any = None,
) -> ClientStats:
    """Entry point of a client process; ``all_in``: a barrier of every client process."""
    wait = None if all_in is None else partial(all_in.wait, _BARRIER_SECONDS)
    return anyio.run(
        run_sessions, url, token, sessions, seconds, seed, max_bytes, wait, backend=loop
    )


async def run_load(
    options: LoadOptions, watch: LogWatch | None = None, backend: Backend | None = None
) -> LoadReport:
    """Start a worker over ``backend`` (by default an emulator) and load it per
    ``options``; the figures and the oracles' verdicts."""
    report = LoadReport(sessions=options.sessions)
    backend = backend or EmulatorBackend(device_count=1, total_memory=4 << 30)
    watch = watch or LogWatch()
    started = time.monotonic()
    # No tenants file: one anonymous tenant without quotas.
    config = WorkerConfig(max_frame_bytes=8 << 20, resume_grace=0.0, listen=(options.listen,))
    totals = ClientStats()
    # A soak runs for hours of requests: every round's latencies would pile up in this
    # process (the worker's) and read as the worker growing. Keep them per round only.
    p50s: list[float] = []
    p99s: list[float] = []
    with watch.installed():
        try:
            async with running_worker(config, backend, [options.listen]) as worker:
                url = worker.bound_urls[0]
                await warm_up(url)
                await wait_for_no_sessions(worker)
                baseline = backend.stats()
                report.rss_start = rss_bytes()
                soak_started = time.monotonic()
                half_snapshot: tracemalloc.Snapshot | None = None
                if options.trace:
                    tracemalloc.start(8)
                round_index = 0
                while True:
                    peak = [0]
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_sample_sessions, worker, report, peak)
                        try:
                            stats = await _clients(url, options, round_index)
                        except Exception as exc:  # the clients' fault, not the worker's
                            report.errors.append(f"client side failed: {exc!r}")
                            stats = ClientStats()
                        tg.cancel_scope.cancel()
                    if not await wait_for_no_sessions(worker, timeout=30):
                        report.errors.append("sessions still open 30 s after the clients left")
                    report.leaks += leaks(backend, worker, baseline)
                    if options.settle_seconds > 0:
                        await anyio.sleep(options.settle_seconds)
                    latencies = sorted(stats.latencies)
                    stats.latencies = array("d")
                    totals.merge(stats)
                    p50s.append(percentile(latencies, 0.50) * 1000)
                    p99s.append(percentile(latencies, 0.99) * 1000)
                    del latencies
                    report.samples.append(
                        _sample(time.monotonic() - soak_started, p50s[-1], p99s[-1], peak[0])
                    )
                    report.rss_rounds.append(report.samples[-1].rss)
                    if options.on_sample is not None:
                        options.on_sample(report.samples[-1])
                    round_index += 1
                    elapsed = report.samples[-1].t  # the soak lasts until a sample past its end
                    if (
                        options.trace
                        and half_snapshot is None
                        and options.soak_seconds
                        and elapsed >= options.soak_seconds / 2
                    ):
                        half_snapshot = tracemalloc.take_snapshot()
                    if round_index >= max(1, options.rounds) and (
                        options.soak_seconds is None or elapsed >= options.soak_seconds
                    ):
                        break
                    if report.crashes or len(report.errors) > 100:
                        break  # a broken worker is not worth soaking further
                if options.trace:
                    if half_snapshot is not None:
                        report.trace_top = _trace_diff(half_snapshot, tracemalloc.take_snapshot())
                    tracemalloc.stop()
                report.rss_end = report.rss_rounds[-1]
        except Exception as exc:
            report.crashes.append(f"worker serve task died: {exc!r}")
    report.crashes += [f"{c.event}: {c.error}" for c in watch.crashes]
    report.requests = totals.requests
    report.verified = totals.verified
    report.errors += totals.errors
    rounds = max(1, len(p50s))
    if totals.connected < options.sessions * rounds:
        report.errors.append(
            f"only {totals.connected} of {options.sessions * rounds} sessions connected"
        )
    # One round: its own percentiles. Several: the median round's p50 and the worst p99.
    report.p50_ms = sorted(p50s)[len(p50s) // 2] if p50s else 0.0
    report.p99_ms = max(p99s, default=0.0)
    report.seconds = time.monotonic() - started
    return report


def _sample(t: float, p50_ms: float, p99_ms: float, rss_peak: int = 0) -> Sample:
    gc.collect()
    return Sample(
        rss_peak=rss_peak,
        t=t,
        rss=rss_bytes(),
        fds=open_fds(),
        threads=thread_count(),
        gc_objects=len(gc.get_objects()),
        p50_ms=p50_ms,
        p99_ms=p99_ms,
    )


def open_fds() -> int:
    """File descriptors this process has open (-1 where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    except OSError:
        return -1


def thread_count() -> int:
    """OS threads of this process, native ones included (Python's count where /proc is
    missing)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return threading.active_count()


def _trace_diff(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> list[str]:
    """The allocation sites (8 frames deep) that grew most between two snapshots."""
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "traceback")
    top: list[str] = []
    for stat in stats[:15]:
        if stat.size_diff <= 0:
            break
        frames = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in stat.traceback)
        top.append(f"{stat.size_diff / 1024:+.1f} KiB in {stat.count_diff:+d} blocks: {frames}")
    return top


async def _sample_sessions(worker: Any, report: LoadReport, peak: list[int]) -> None:
    ticks = 0
    while True:
        report.sessions_held = max(report.sessions_held, len(worker.sessions))
        if ticks % 10 == 0:
            peak[0] = max(peak[0], rss_bytes())
        ticks += 1
        await anyio.sleep(0.02)


async def _clients(url: str, options: LoadOptions, round_index: int = 0) -> ClientStats:
    seed = options.seed * 1000 + round_index * 100
    if options.processes <= 0:
        return await run_sessions(
            url, None, options.sessions, options.seconds, seed, options.max_bytes
        )
    total = ClientStats()
    per = [options.sessions // options.processes] * options.processes
    for i in range(options.sessions % options.processes):
        per[i] += 1
    context = multiprocessing.get_context("spawn")
    with (
        context.Manager() as manager,
        ProcessPoolExecutor(options.processes, mp_context=context) as pool,
    ):
        # The processes start their sessions' work together: one spawned late on a
        # loaded machine must not find the others' sessions already gone.
        all_in = manager.Barrier(sum(1 for n in per if n))
        futures = [
            pool.submit(
                _client_process,
                url,
                None,
                n,
                options.seconds,
                seed + i,
                options.max_bytes,
                options.client_loop,
                all_in,
            )
            for i, n in enumerate(per)
            if n
        ]
        for future in futures:
            total.merge(await anyio.to_thread.run_sync(future.result))
    return total
