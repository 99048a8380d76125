"""The six benchmarks of issue 7, each figure beside a baseline measured in the same run.

1. ``rtt``: null-request round trips (PING, answered by the worker's reader; GET_DEVICE,
   through the executor) vs a bare anyio echo of the same sizes. Goal ≤ 1.5x (median).
2. ``copy``: ``memcpy_htod`` / ``memcpy_dtoh`` vs a bare byte stream of the same bytes in
   the same chunk size. Goal ≥ 85 % of it at 64 MiB and up.
3. ``ff``: fire-and-forget requests/s (4-byte async copies, kernel launches) vs
   synchronous round trips. Goal ≥ 100,000/s on unix and ≥ 20x the synchronous rate.
4. ``malloc``: 1,000 malloc/free pairs, total time, vs as many bare echo round trips.
5. ``concurrent``: 64 clients at once on a mixed load: aggregate requests/s and p99.
6. ``local``: on the worker's machine, each copy (and malloc/free) vs the same call made
   locally through the runtime: what remote costs over local.

A benchmark here measures and reports; nothing in it asserts a time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import anyio
import numpy as np

from hipr.bench import baselines
from hipr.bench.baselines import LocalCopies, Pair
from hipr.client.api import AsyncGpu, aconnect
from hipr.protocol.codec import encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode

MiB = 1 << 20
GiB = 1 << 30
BENCHMARKS = ("floor", "sync", "rtt", "copy", "ff", "malloc", "concurrent", "local", "facade")
#: Benchmarks run through the synchronous client, once per transport (not per event loop):
#: hipr/bench/floors.py and hipr/bench/syncbench.py (issue 13).
BLOCKING_BENCHMARKS = ("floor", "sync")
#: A plausible device address, for sizing frames that carry one.
_ADDRESS = 0x7F00_0000_0000


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of each benchmark to run."""

    rtt_count: int = 2000
    warmup: int = 200
    copy_sizes: tuple[int, ...] = (MiB, 64 * MiB, 256 * MiB)
    copy_repeats: int = 5
    #: Small copies repeat until about this many bytes moved (steadier figures).
    copy_min_bytes: int = 128 * MiB
    ff_count: int = 20000
    sync_count: int = 2000
    malloc_pairs: int = 1000
    clients: int = 64
    client_ops: int = 60
    local_repeats: int = 5
    #: Issue 13's sync-client workloads (and the floors' stream of the same size).
    sync_copy_size: int = 256 * MiB
    sync_copy_repeats: int = 6
    launch_batch: int = 1000
    batch_repeats: int = 10
    sgemm_n: int = 2048
    sgemm_runs: int = 10
    only: tuple[str, ...] = BENCHMARKS

    @classmethod
    def quick(cls) -> Plan:
        """Tiny counts: checks that every benchmark runs (tests), measures nothing."""
        return cls(
            rtt_count=20,
            warmup=2,
            copy_sizes=(4096, 3 * MiB + 5),
            copy_repeats=1,
            copy_min_bytes=0,
            ff_count=50,
            sync_count=10,
            malloc_pairs=10,
            clients=4,
            client_ops=12,
            local_repeats=1,
            sync_copy_size=MiB + 3,
            sync_copy_repeats=1,
            launch_batch=20,
            batch_repeats=1,
            sgemm_n=64,
            sgemm_runs=1,
        )

    def with_only(self, names: Sequence[str]) -> Plan:
        """This plan restricted to the named benchmarks."""
        unknown = sorted(set(names) - set(BENCHMARKS))
        if unknown:
            raise ValueError(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
        return replace(self, only=tuple(n for n in BENCHMARKS if n in names))


@dataclass(slots=True)
class Row:
    """One figure beside its same-run baseline.

    ``ratio`` is ``value / baseline_value``; ``ratio_style`` says how to show it (``x``:
    a time or rate multiple, ``%``: a share of the baseline's throughput).
    """

    bench: str
    name: str
    value: float
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    ratio_style: str = "x"
    goal: str = ""
    met: bool | None = None
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    #: The same work done by the local runtime in-process (issue 13), and what it took.
    local: str = ""
    local_value: float | None = None

    @property
    def ratio(self) -> float | None:
        """``value / baseline_value``, or None without a baseline."""
        if self.baseline_value is None or self.baseline_value == 0:
            return None
        return self.value / self.baseline_value

    @property
    def local_ratio(self) -> float | None:
        """``value / local_value``, or None without a local figure."""
        if self.local_value is None or self.local_value == 0:
            return None
        return self.value / self.local_value

    def to_json(self) -> dict[str, Any]:
        """The row as plain data, the ratios included."""
        data = asdict(self)
        data["ratio"] = self.ratio
        data["local_ratio"] = self.local_ratio
        return data


@dataclass(frozen=True, slots=True)
class Target:
    """Where one run of the suite goes, and what it is compared with."""

    url: str
    baseline_url: str
    transport: str
    loop: str
    worker_loop: str | None = None
    token: str | None = None
    #: Local runtime figures (benchmark 6), measured once on the worker's machine.
    local_copies: tuple[LocalCopies, ...] = ()
    local_malloc_seconds: float | None = None


class ProgressLike(Protocol):
    """The part of ``rich.progress.Progress`` the copy benchmark uses."""

    def add_task(self, description: str, total: float | None = ...) -> Any: ...

    def advance(self, task_id: Any, advance: float = ...) -> None: ...

    def remove_task(self, task_id: Any) -> None: ...


# --- helpers --------------------------------------------------------------------------


def frame_size(opcode: Opcode, args: Any = None, bulk: int = 0, reply: bool = False) -> int:
    """Bytes one frame of hipr's takes on the wire (for same-size baselines)."""
    flags = Flags.REPLY if reply else Flags.NONE
    return len(encode_frame(opcode, 1, flags, args, b"\0" * bulk))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def _us(seconds: float) -> float:
    return seconds * 1e6


def _gbs(size: int, seconds: float) -> float:
    return size / seconds / 1e9


def size_text(n: int) -> str:
    """``64 MiB``, ``4 KiB``, ``3.0 MiB+5``: a copy size for a row's name."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= scale:
            return f"{n // scale} {unit}" if n % scale == 0 else f"{n / scale:.1f} {unit}"
    return f"{n} B"


async def _timed(fn: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    clock = time.perf_counter
    times: list[float] = []
    for _ in range(count):
        start = clock()
        await fn()
        times.append(clock() - start)
    return times


# --- 1. round trips -------------------------------------------------------------------


async def bench_rtt(gpu: AsyncGpu, target: Target, plan: Plan) -> list[Row]:
    """Null requests vs a bare echo of the same request and reply sizes."""
    rows: list[Row] = []
    cases: list[tuple[str, Callable[[], Awaitable[Any]], Pair]] = [
        (
            "PING",
            gpu.ping,
            (frame_size(Opcode.PING), frame_size(Opcode.PING, {}, reply=True)),
        ),
        (
            "get_device",
            gpu.get_device,
            (frame_size(Opcode.GET_DEVICE), frame_size(Opcode.GET_DEVICE, {"device": 0}, True)),
        ),
    ]
    for label, call, pair in cases:
        await _timed(call, plan.warmup)
        hipr_times = await _timed(call, plan.rtt_count)
        base_times = await baselines.echo_round_trips(
            target.baseline_url, [pair], plan.rtt_count, plan.warmup
        )
        baseline = f"bare echo {pair[0]}/{pair[1]} B"
        median = _us(statistics.median(hipr_times))
        base_median = _us(statistics.median(base_times))
        rows.append(
            Row(
                "rtt",
                f"{label} round trip, median",
                median,
                "µs",
                baseline,
                base_median,
                goal="≤ 1.5x",
                met=median <= 1.5 * base_median,
            )
        )
        rows.append(
            Row(
                "rtt",
                f"{label} round trip, p99",
                _us(percentile(hipr_times, 99)),
                "µs",
                baseline,
                _us(percentile(base_times, 99)),
            )
        )
    return rows


# --- 2 and 6. copies ------------------------------------------------------------------


def _repeats(plan: Plan, size: int) -> int:
    return max(plan.copy_repeats, min(100, plan.copy_min_bytes // max(size, 1)))


async def bench_copies(
    gpu: AsyncGpu, target: Target, plan: Plan, progress: ProgressLike | None = None
) -> list[Row]:
    """memcpy_htod/dtoh vs a bare byte stream of the same bytes (and vs local copies)."""
    sizes = plan.copy_sizes
    largest = max(sizes)
    chunk = int(gpu.worker_info().get("chunk_bytes", MiB))
    ptr = await gpu.malloc(largest)
    host = np.full(largest, 7, np.uint8).data
    out = np.ones(largest, np.uint8).data
    local = {c.size: c for c in target.local_copies}
    rows: list[Row] = []
    stream = await baselines.StreamClient.open(target.baseline_url)
    try:
        for size in sizes:
            src = host[:size]
            dst = out[:size]
            repeats = _repeats(plan, size)
            task = None
            if progress is not None:
                task = progress.add_task(
                    f"copies {size_text(size)} ({target.transport}, {target.loop})",
                    total=4 * size * (repeats + 1),
                )
            times: dict[str, list[float]] = {"htod": [], "dtoh": [], "push": [], "pull": []}
            for rep in range(repeats + 1):  # the first round warms up
                start = time.perf_counter()
                await gpu.memcpy_htod(ptr, src)
                htod = time.perf_counter() - start
                push = await stream.push(src, chunk)
                start = time.perf_counter()
                await gpu.memcpy_dtoh(ptr, size, out=dst)
                dtoh = time.perf_counter() - start
                pull = await stream.pull(size, chunk)
                if rep:
                    for key, value in (("htod", htod), ("push", push), ("dtoh", dtoh)):
                        times[key].append(value)
                    times["pull"].append(pull)
                if progress is not None:
                    progress.advance(task, 4 * size)
            if progress is not None:
                progress.remove_task(task)
            gate = size >= 64 * MiB
            directions = (("htod", "push", "send"), ("dtoh", "pull", "receive"))
            for direction, base_key, verb in directions:
                value = _gbs(size, statistics.median(times[direction]))
                base = _gbs(size, statistics.median(times[base_key]))
                rows.append(
                    Row(
                        "copy",
                        f"memcpy_{direction} {size_text(size)}",
                        value,
                        "GB/s",
                        f"bare stream {verb}, {size_text(chunk)} pieces",
                        base,
                        ratio_style="%",
                        goal="≥ 85 %" if gate else "",
                        met=(value >= 0.85 * base) if gate else None,
                        extra={"repeats": float(repeats)},
                    )
                )
                if size in local and "local" in plan.only:
                    mine = getattr(local[size], direction)
                    rows.append(
                        Row(
                            "local",
                            f"memcpy_{direction} {size_text(size)} vs local",
                            value,
                            "GB/s",
                            "same copy through the runtime, locally",
                            _gbs(size, statistics.median(mine)),
                            ratio_style="%",
                        )
                    )
    finally:
        await stream.aclose()
        await gpu.free(ptr)
    return rows


# --- 3. fire-and-forget ---------------------------------------------------------------


async def _ff_rate(
    gpu: AsyncGpu, post: Callable[[], Awaitable[None]], count: int
) -> tuple[float, float]:
    """(requests/s to the end of the closing synchronize, requests/s the client posted)."""
    await gpu.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        await post()
    posted = time.perf_counter()
    await gpu.synchronize()
    done = time.perf_counter()
    return count / (done - start), count / (posted - start)


async def bench_fire_and_forget(gpu: AsyncGpu, target: Target, plan: Plan) -> list[Row]:
    """Asynchronous requests/s vs synchronous round trips of the same work."""
    ptr = await gpu.malloc(4096)
    word = bytes(4)
    fill = await gpu.builtin("fill_f32")
    launch_args = [ptr, np.float32(1.0), np.uint64(1)]
    sync_copy = lambda: gpu.memcpy_htod(ptr, word)  # noqa: E731
    await _timed(sync_copy, plan.warmup)
    sync_times = await _timed(sync_copy, plan.sync_count)
    sync_rate = len(sync_times) / sum(sync_times)
    memset_times = await _timed(lambda: gpu.memset(ptr, 0, 4), plan.sync_count)
    cases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("memcpy_htod_async 4 B", lambda: gpu.memcpy_htod_async(ptr, word)),
        ("launch fill_f32 (1 element)", lambda: fill.launch(1, 1, launch_args)),
    ]
    rows = [
        Row(
            "ff",
            "memset 4 B, synchronous",
            len(memset_times) / sum(memset_times),
            "req/s",
            "sync memcpy_htod 4 B",
            sync_rate,
            note="the client API has no fire-and-forget memset",
        )
    ]
    goal = "≥ 100k/s, ≥ 20x" if target.transport == "unix" else "≥ 20x"
    for label, post in cases:
        await _ff_rate(gpu, post, min(plan.warmup, plan.ff_count))
        rate, posted = await _ff_rate(gpu, post, plan.ff_count)
        met = rate >= 20 * sync_rate and (target.transport != "unix" or rate >= 100_000)
        rows.append(
            Row(
                "ff",
                f"{label}, fire-and-forget",
                rate,
                "req/s",
                "sync memcpy_htod 4 B",
                sync_rate,
                goal=goal,
                met=met,
                note=f"client posted at {posted:,.0f}/s",
                extra={"posted_per_s": posted},
            )
        )
    await gpu.free(ptr)
    return rows


# --- 4. malloc/free -------------------------------------------------------------------


async def bench_malloc(gpu: AsyncGpu, target: Target, plan: Plan) -> list[Row]:
    """``malloc_pairs`` malloc/free pairs, total time, vs as many bare echo round trips."""
    for _ in range(min(plan.warmup, plan.malloc_pairs)):
        await gpu.free(await gpu.malloc(4096))
    start = time.perf_counter()
    for _ in range(plan.malloc_pairs):
        await gpu.free(await gpu.malloc(4096))
    seconds = time.perf_counter() - start
    pairs = [
        (
            frame_size(Opcode.MALLOC, {"size": 4096}),
            frame_size(Opcode.MALLOC, {"ptr": _ADDRESS}, 0, True),
        ),
        (frame_size(Opcode.FREE, {"ptr": _ADDRESS}), frame_size(Opcode.FREE, {}, 0, True)),
    ]
    base = await baselines.echo_round_trips(
        target.baseline_url, pairs, 2 * plan.malloc_pairs, plan.warmup
    )
    rows = [
        Row(
            "malloc",
            f"{plan.malloc_pairs} malloc/free pairs (4 KiB)",
            seconds * 1e3,
            "ms",
            f"{2 * plan.malloc_pairs} bare echo round trips",
            sum(base) * 1e3,
        )
    ]
    if target.local_malloc_seconds is not None and "local" in plan.only:
        rows.append(
            Row(
                "local",
                f"{plan.malloc_pairs} malloc/free pairs vs local",
                seconds * 1e3,
                "ms",
                "same calls through the runtime, locally",
                target.local_malloc_seconds * 1e3,
            )
        )
    return rows


# --- 5. many clients ------------------------------------------------------------------


def _mixed_pairs() -> list[Pair]:
    """Request and reply sizes of the mixed load's six requests, in order."""
    stream = {"stream": None}
    return [
        (frame_size(Opcode.GET_DEVICE), frame_size(Opcode.GET_DEVICE, {"device": 0}, 0, True)),
        (
            frame_size(Opcode.MEMSET, {"ptr": _ADDRESS, "value": 0, "size": 64, **stream}),
            frame_size(Opcode.MEMSET, {}, 0, True),
        ),
        (
            frame_size(Opcode.MEMCPY_HTOD, {"dst": _ADDRESS, "size": 4096}, 4096),
            frame_size(Opcode.MEMCPY_HTOD, {}, 0, True),
        ),
        (
            frame_size(Opcode.MEMCPY_DTOH, {"src": _ADDRESS, "size": 4096, **stream}),
            frame_size(Opcode.MEMCPY_DTOH, {"size": 4096}, 4096, True),
        ),
        (
            frame_size(Opcode.MALLOC, {"size": 4096}),
            frame_size(Opcode.MALLOC, {"ptr": _ADDRESS}, 0, True),
        ),
        (frame_size(Opcode.FREE, {"ptr": _ADDRESS}), frame_size(Opcode.FREE, {}, 0, True)),
    ]


async def bench_concurrent(target: Target, plan: Plan) -> list[Row]:
    """``clients`` sessions at once, each cycling get_device, memset 64 B, 4 KiB htod and
    dtoh, malloc and free; aggregate requests/s and p99 vs as many bare echo clients."""
    clients = plan.clients
    ready = 0
    all_ready = anyio.Event()
    go = anyio.Event()
    latencies: list[float] = []
    finished: list[float] = []

    async def client(index: int) -> None:
        nonlocal ready
        async with aconnect(target.url, token=target.token) as gpu:
            buf = await gpu.malloc(4096)
            src = bytes([index % 256]) * 4096
            out = bytearray(4096)
            held: list[Any] = []

            async def malloc() -> None:
                held.append(await gpu.malloc(4096))

            async def free() -> None:
                await gpu.free(held.pop())

            ops: list[Callable[[], Awaitable[Any]]] = [
                gpu.get_device,
                lambda: gpu.memset(buf, 0, 64),
                lambda: gpu.memcpy_htod(buf, src),
                lambda: gpu.memcpy_dtoh(buf, 4096, out=out),
                malloc,
                free,
            ]
            ready += 1
            if ready == clients:
                all_ready.set()
            await go.wait()
            clock = time.perf_counter
            mine: list[float] = []
            for k in range(plan.client_ops):
                start = clock()
                await ops[k % len(ops)]()
                mine.append(clock() - start)
            finished.append(clock())
            latencies.extend(mine)
            for ptr in held:
                await gpu.free(ptr)
            await gpu.free(buf)

    async with anyio.create_task_group() as tg:
        for i in range(clients):
            tg.start_soon(client, i)
        await all_ready.wait()
        start = time.perf_counter()
        go.set()
    seconds = max(finished) - start
    total = clients * plan.client_ops
    base = await baselines.echo_concurrent(
        target.baseline_url, clients, _mixed_pairs(), plan.client_ops
    )
    baseline = f"{clients} bare echo clients, same sizes"
    return [
        Row(
            "concurrent",
            f"{clients} clients mixed load, aggregate",
            total / seconds,
            "req/s",
            baseline,
            len(base.latencies) / base.seconds,
            ratio_style="%",
        ),
        Row(
            "concurrent",
            f"{clients} clients mixed load, p99",
            _us(percentile(latencies, 99)),
            "µs",
            baseline,
            _us(percentile(base.latencies, 99)),
        ),
    ]


# --- 7. the hip-python facade (issue 14) ------------------------------------------------


def _facade_rows(target: Target, plan: Plan) -> list[Row]:
    """Blocking: the same calls through ``hipr.hip`` and through ``hipr.connect()``,
    interleaved in blocks so that drift on a shared machine hits both alike."""
    import hipr
    from hipr import hip

    host = np.zeros(4096, np.uint8)
    rows: list[Row] = []
    with hipr.connect(target.url, token=target.token) as gpu:
        hip.connect(target.url, token=target.token)
        try:
            dev = gpu.malloc(host.nbytes)
            err, ptr = hip.hipMalloc(host.nbytes)
            if int(err) != 0:
                raise RuntimeError(f"hipMalloc: {hip.last_error_message()}")
            kind = hip.hipMemcpyKind.hipMemcpyHostToDevice
            cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
                ("hipGetDevice", hip.hipGetDevice, gpu.get_device),
                ("hipMemGetInfo", hip.hipMemGetInfo, gpu.mem_get_info),
                (
                    "hipMemcpy 4 KiB H2D",
                    lambda: hip.hipMemcpy(ptr, host, host.nbytes, kind),
                    lambda: gpu.memcpy_htod(dev, host),
                ),
            ]
            block = max(1, plan.rtt_count // 10)
            for label, facade_call, client_call in cases:
                facade_times: list[float] = []
                client_times: list[float] = []
                for _ in range(plan.warmup):
                    facade_call()
                    client_call()
                for _ in range(max(1, plan.rtt_count // block)):
                    for fn, times in ((facade_call, facade_times), (client_call, client_times)):
                        for _ in range(block):
                            start = time.perf_counter()
                            fn()
                            times.append(time.perf_counter() - start)
                value = _us(statistics.median(facade_times))
                base = _us(statistics.median(client_times))
                rows.append(
                    Row(
                        "facade",
                        f"{label} via hipr.hip, median",
                        value,
                        "µs",
                        "the same call via hipr.connect()",
                        base,
                        goal="≤ 1.10x",
                        met=value <= 1.10 * base,
                    )
                )
            hip.hipFree(ptr)
            gpu.free(dev)
        finally:
            hip.disconnect()
    return rows


async def bench_facade(target: Target, plan: Plan) -> list[Row]:
    """``from hipr import hip`` vs ``hipr.connect()``: what hip-python's calling convention
    costs on top of the client (both blocking, so they run on a worker thread here)."""
    return await anyio.to_thread.run_sync(_facade_rows, target, plan)


# --- the whole suite ------------------------------------------------------------------


async def run_suite(target: Target, plan: Plan, progress: ProgressLike | None = None) -> list[Row]:
    """Every benchmark the plan names, against one worker URL; the rows in order."""
    rows: list[Row] = []
    async with aconnect(target.url, token=target.token) as gpu:
        if "rtt" in plan.only:
            rows += await bench_rtt(gpu, target, plan)
        if "copy" in plan.only or ("local" in plan.only and target.local_copies):
            copy_rows = await bench_copies(gpu, target, plan, progress)
            rows += [r for r in copy_rows if r.bench in plan.only]
        if "ff" in plan.only:
            rows += await bench_fire_and_forget(gpu, target, plan)
        if "malloc" in plan.only:
            rows += await bench_malloc(gpu, target, plan)
    if "concurrent" in plan.only:
        rows += await bench_concurrent(target, plan)
    if "facade" in plan.only:
        rows += await bench_facade(target, plan)
    return rows
