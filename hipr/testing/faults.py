"""A fault campaign: sessions of mixed operations against a worker whose backend fails at
random (HipErrors and simulated GPU-thread crashes, on every method).

Oracles: no call hangs (each is bounded), the worker logs no exception other than the
injected crashes, every result that the worker reports as a success is correct, and once
injection stops and the sessions close, the backend holds nothing and no session is left.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend
from hipr.errors import HipError
from hipr.testing.fault_backend import FaultBackend, InjectedCrash
from hipr.testing.harness import (
    DeviceMemory,
    LogWatch,
    device_memory_used,
    leaks,
    wait_for_no_sessions,
    warm_up,
)
from hipr.testing.leak_trace import LeakTrace
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker


@dataclass
class FaultOptions:
    """How many sessions, for how long, and how often the backend fails."""

    seed: int = 0
    sessions: int = 8
    seconds: float = 2.0
    #: Chance that any backend call fails ...
    probability: float = 0.05
    #: ... and the share of those failures that are crashes (not HipErrors).
    crash_share: float = 0.25
    #: Seconds within which each call must return: longer is a hang.
    bound: float = 10.0
    listen: str = "tcp://127.0.0.1:0"


@dataclass
class FaultReport:
    """What the fault campaign saw."""

    injected: int = 0
    injected_crashes: int = 0
    #: Injected crashes the worker logged as handler failures (expected).
    logged_crashes: int = 0
    by_method: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    failed_requests: int = 0
    verified: int = 0
    wrong: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    memory: DeviceMemory = field(default_factory=DeviceMemory)
    #: The leak trace's findings (``trace=True``): who made what is still held.
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every oracle held."""
        return not (self.wrong or self.hangs or self.crashes or self.leaks)

    def summary(self) -> str:
        """One line for logs and assertion messages."""
        return (
            f"{self.injected} faults injected ({self.injected_crashes} crashes, "
            f"{self.logged_crashes} logged) over {len(self.by_method)} methods; "
            f"{self.requests} requests, {self.failed_requests} failed, {self.verified} "
            f"verified in {self.seconds:.1f} s; wrong {self.wrong[:3]}, hangs {self.hangs[:3]}, "
            f"crashes {self.crashes[:3]}, leaks {self.leaks}"
        )


class _Client:
    """One tolerant session: a failed call skips the rest of its chain; a call that
    succeeded must have done exactly its job."""

    def __init__(self, gpu: Any, rng: random.Random, report: FaultReport, bound: float) -> None:
        self.gpu = gpu
        self.rng = rng
        self.report = report
        self.bound = bound

    async def call(self, awaitable: Any) -> Any:
        """The call's result, or None when the worker answered with a HipError."""
        self.report.requests += 1
        try:
            with anyio.fail_after(self.bound):
                return await awaitable
        except HipError:
            self.report.failed_requests += 1
            return None
        except TimeoutError:
            self.report.hangs.append(f"a call did not return within {self.bound} s")
            raise

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.report.verified += 1
        else:
            self.report.wrong.append(what)

    async def iteration(self) -> None:
        gpu, rng = self.gpu, self.rng
        n = rng.randrange(1, 64) * 64
        a = await self.call(gpu.malloc(n))
        if a is None:
            return
        data = rng.randbytes(n)
        if await self.call(gpu.memcpy_htod(a, data)) is not None:
            back = await self.call(gpu.memcpy_dtoh(a, n))
            if back is not None:
                self.check(back == data, "htod/dtoh")
        value = rng.randrange(256)
        if await self.call(gpu.memset(a, value, n)) is not None:
            back = await self.call(gpu.memcpy_dtoh(a, n))
            if back is not None:
                self.check(back == bytes([value]) * n, "memset")
        roll = rng.random()
        if roll < 0.3:
            await self._kernel(a, n)
        elif roll < 0.5:
            await self._stream_and_events(a, n)
        elif roll < 0.7:
            await self._graph(a, n, value)
        else:
            b = await self.call(gpu.malloc_htod(data))
            if b is not None:
                if await self.call(gpu.memcpy_dtod(a, b, n)) is not None:
                    back = await self.call(gpu.memcpy_dtoh(a, n))
                    if back is not None:
                        self.check(back == data, "malloc_htod/dtod")
                await self.call(gpu.free(b))
        await self.call(gpu.free(a))

    async def _kernel(self, a: Any, n: int) -> None:
        fill = await self.call(self.gpu.builtin("fill_f32"))
        if fill is None:
            return
        x = np.float32(self.rng.uniform(-100, 100))
        await self.call(fill.launch(1, 64, [a, x, np.uint64(n // 4)]))
        # The launch is fire-and-forget: its failure, if any, is this read's error.
        back = await self.call(self.gpu.memcpy_dtoh(a, n))
        if back is not None:
            self.check(bool(np.all(np.frombuffer(back, np.float32) == x)), "fill_f32")

    async def _stream_and_events(self, a: Any, n: int) -> None:
        gpu = self.gpu
        stream = await self.call(gpu.stream_create())
        start = await self.call(gpu.event_create())
        end = await self.call(gpu.event_create())
        if stream is not None and start is not None and end is not None:
            await self.call(start.record(stream))
            await self.call(gpu.memset(a, 7, n, stream=stream))
            await self.call(end.record(stream))
            await self.call(stream.wait_event(end))
            if await self.call(stream.synchronize()) is not None:
                await self.call(end.query())
                await self.call(start.elapsed_ms(end))
        for handle in (stream, start, end):
            if handle is not None:
                await self.call(handle.destroy())

    async def _graph(self, a: Any, n: int, value: int) -> None:
        gpu = self.gpu
        graph = await self.call(gpu.graph_create())
        if graph is None:
            return
        node = await self.call(graph.add_memset(a, value ^ 0xFF, n))
        exe = await self.call(graph.instantiate()) if node is not None else None
        if exe is not None:
            await self.call(exe.launch())
            await self.call(gpu.synchronize())
            await self.call(exe.destroy())
        await self.call(graph.destroy())


async def _session(
    url: str,
    index: int,
    options: FaultOptions,
    report: FaultReport,
    done: list[int],
    release: anyio.Event,
) -> None:
    rng = random.Random(f"{options.seed}:{index}")
    deadline = time.monotonic() + options.seconds
    counted = False
    try:
        async with hipr.aconnect(url, timeout=options.bound) as gpu:
            client = _Client(gpu, rng, report, options.bound)
            try:
                while time.monotonic() < deadline:
                    await client.iteration()
            finally:
                done[0] += 1
                counted = True
                # Sessions close once injection is off: a runtime that fails to free
                # leaks on any worker, and that is not what this campaign measures.
                await release.wait()
    except HipError as exc:
        report.wrong.append(f"session {index} failed outside a call: {exc!r}")
    finally:
        if not counted:
            done[0] += 1


async def run_fault_campaign(
    options: FaultOptions,
    watch: LogWatch | None = None,
    inner: Backend | None = None,
    *,
    trace: bool = False,
) -> FaultReport:
    """Start a worker over a failing backend (``inner``, by default an emulator, wrapped
    in a :class:`FaultBackend`), run the sessions, check the oracles. ``trace`` installs
    a :class:`~hipr.testing.leak_trace.LeakTrace` on a GPU backend."""
    report = FaultReport()
    inner = inner or EmulatorBackend(device_count=1, total_memory=1 << 30)
    tracer = LeakTrace.install(inner) if trace and hasattr(inner, "_ledger") else None
    backend = FaultBackend(
        inner,
        seed=options.seed,
        probability=options.probability,
        crash_share=options.crash_share,
    )
    backend.enabled = False
    watch = watch or LogWatch(expected_types=(InjectedCrash,))
    config = WorkerConfig(max_frame_bytes=8 << 20, resume_grace=0.0)
    started = time.monotonic()
    with watch.installed():
        try:
            async with running_worker(config, backend, [options.listen]) as worker:
                url = worker.bound_urls[0]
                report.memory.start = await device_memory_used(inner)
                await warm_up(url)
                await wait_for_no_sessions(worker)
                baseline = backend.stats()
                if tracer is not None:
                    tracer.mark_baseline()
                report.memory.baseline = await device_memory_used(inner)
                backend.enabled = True
                done = [0]
                release = anyio.Event()
                try:
                    async with anyio.create_task_group() as tg:
                        for i in range(options.sessions):
                            tg.start_soon(_session, url, i, options, report, done, release)
                        with anyio.move_on_after(options.seconds + 4 * options.bound):
                            while done[0] < options.sessions:
                                await anyio.sleep(0.02)
                        backend.enabled = False
                        release.set()
                except Exception as exc:  # a hang (TimeoutError) or a client-side failure
                    report.hangs.append(f"fault clients failed: {exc!r}")
                backend.enabled = False
                if not await wait_for_no_sessions(worker):
                    report.hangs.append("sessions still open 10 s after the clients left")
                report.leaks = leaks(backend, worker, baseline)
                report.memory.end = await device_memory_used(inner)
                if tracer is not None:
                    report.trace = tracer.report()
        except Exception as exc:
            report.crashes.append(f"worker serve task died: {exc!r}")
    report.crashes += [f"{c.event}: {c.error}" for c in watch.crashes]
    report.logged_crashes = watch.expected
    report.injected = backend.injected_count
    report.injected_crashes = backend.crash_count
    report.by_method = dict(backend.by_method)
    report.seconds = time.monotonic() - started
    return report
