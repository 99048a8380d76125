"""Issue 13's workloads through the synchronous client, beside the machine's floors.

``floor`` rows are the floors themselves (blocking echo and stream, one-way messages, the
uvloop echo, the local runtime and CuPy); ``sync`` rows are the same work through
``hipr.connect(url)``, each with its ratio to its floor (``baseline``) and to the local
runtime (``local``):

==========================================  ====================  ==================
sync row                                    floor                 goal
==========================================  ====================  ==================
synchronize() on an idle device             blocking echo         ≤ 3x the echo
1-thread launch + synchronize               blocking echo         ≤ 50 µs
1,000 launches then one synchronize         one-way messages      ≤ 10 µs per launch
256 MiB memcpy_htod / memcpy_dtoh (numpy)   blocking stream       ≥ 85 %
4 B memcpy_htod_async, fire-and-forget      one-way messages      ≥ 100,000/s
2048³ SGEMM launch + synchronize            local runtime         ≤ 1.05x local
==========================================  ====================  ==================

A benchmark: goals missed are reported, never raised.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hipr.bench import floors as fl
from hipr.bench.suite import Plan, Row, percentile, size_text
from hipr.errors import HipError
from hipr.protocol.codec import encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode

_ADDRESS = 0x7F00_0000_0000
Log = Callable[[str], None]


def _us(seconds: float) -> float:
    return seconds * 1e6


def _median_us(times: list[float]) -> float:
    return _us(statistics.median(times))


class _Ptr:
    is_device_pointer = True

    def __index__(self) -> int:
        return _ADDRESS


def ff_copy_frame() -> int:
    """Bytes of one fire-and-forget 4-byte ``memcpy_htod_async`` frame on the wire."""
    args = {"dst": _ADDRESS, "size": 4, "stream": None}
    return len(encode_frame(Opcode.MEMCPY_HTOD, 1, Flags.NO_REPLY, args, b"\0" * 4))


def launch_frame() -> int:
    """Bytes of one ``fill_f32`` 1-thread launch frame on the wire."""
    from hipr.kernels.kernel_args import pack_args

    packed = pack_args([_Ptr(), np.float32(1.0), np.uint64(1)])
    args = {"function": 1, "grid": [1], "block": [1], "shared_mem": 0, **packed.to_wire()}
    args["stream"] = None
    return len(encode_frame(Opcode.LAUNCH_KERNEL, 1, Flags.NO_REPLY, args))


def message_sizes() -> tuple[int, int]:
    """The one-way message sizes the floors measure: a launch and a 4 B async copy."""
    return launch_frame(), ff_copy_frame()


# --- the floors as rows ---------------------------------------------------------------


def floor_rows(floors: fl.Floors, local: fl.LocalWork | None) -> list[Row]:
    """The floors themselves, and the local runtime's figures."""
    echo = f"blocking echo {fl.ECHO_REQUEST}/{fl.ECHO_REPLY} B"
    size = size_text(floors.stream_size)
    rows = [
        Row("floor", f"{echo}, median", _median_us(floors.echo), "µs"),
        Row("floor", f"{echo}, p99", _us(percentile(floors.echo, 99)), "µs"),
        Row("floor", f"blocking stream send {size}", floors.gbs("push"), "GB/s"),
        Row(
            "floor", f"blocking stream receive {size} (into the array)", floors.gbs("pull"), "GB/s"
        ),
    ]
    for nbytes, seconds in floors.message_seconds.items():
        rows.append(Row("floor", f"blocking one-way {nbytes} B messages", 1 / seconds, "req/s"))
    if floors.uvloop_echo:
        for label, fn in (("median", statistics.median), ("p99", lambda t: percentile(t, 99))):
            rows.append(
                Row(
                    "floor",
                    f"uvloop echo {fl.ECHO_REQUEST}/{fl.ECHO_REPLY} B, {label}",
                    _us(fn(floors.uvloop_echo)),
                    "µs",
                    f"{echo}, {label}",
                    _us(fn(floors.echo)),
                )
            )
    if local is None:
        return rows
    name = f"local {local.backend}"
    launch = _median_us(local.launch_sync)
    rows += [
        Row("floor", f"{name}: synchronize(), median", _median_us(local.sync), "µs"),
        Row("floor", f"{name}: 1-thread launch + synchronize, median", launch, "µs"),
        Row(
            "floor",
            f"{name}: 1,000 launches then synchronize, per launch",
            _median_us(local.per_launch),
            "µs",
        ),
    ]
    cs = size_text(local.copy_size)
    for direction, times in (("htod", local.htod), ("dtoh", local.dtoh)):
        rows.append(
            Row(
                "floor",
                f"{name}: memcpy_{direction} {cs} (pageable numpy)",
                local.copy_size / statistics.median(times) / 1e9,
                "GB/s",
            )
        )
    if local.sgemm:
        rows.append(
            Row(
                "floor",
                f"{name}: SGEMM {local.sgemm_n}³ launch + synchronize, median",
                statistics.median(local.sgemm) * 1e3,
                "ms",
            )
        )
    if local.cupy_launch_sync:
        same = f"{name} (hipr's backend in-process)"
        rows += [
            Row(
                "floor",
                "CuPy RawKernel: 1-thread launch + synchronize, median",
                _median_us(local.cupy_launch_sync),
                "µs",
                same,
                launch,
            ),
            Row(
                "floor",
                "CuPy RawKernel: 1,000 launches then synchronize, per launch",
                _median_us(local.cupy_per_launch),
                "µs",
                same,
                _median_us(local.per_launch),
            ),
        ]
    return rows


# --- the workloads through hipr.connect() ---------------------------------------------


def sync_rows(
    url: str,
    token: str | None,
    floors: fl.Floors,
    local: fl.LocalWork | None,
    plan: Plan,
    log: Log = lambda _: None,
    notes: list[str] | None = None,
    spin_wait: float | None = None,
) -> list[Row]:
    """(a)-(f) of issue 13 through ``hipr.connect(url)``, each beside its floor and the
    local runtime. ``spin_wait``: the client's :attr:`LinkOptions.spin_wait` (None: its
    automatic choice), noted with the results."""
    import hipr
    from hipr.client.link import LinkOptions

    notes = notes if notes is not None else []
    link = LinkOptions(spin_wait=spin_wait)
    how = "automatic" if spin_wait is None else "--spin-wait"
    notes.append(f"sync client spin-wait: {link.spin_seconds() * 1e6:.0f} µs ({how})")
    echo_name = f"blocking echo {fl.ECHO_REQUEST}/{fl.ECHO_REPLY} B"
    echo_med = _median_us(floors.echo)
    echo_p99 = _us(percentile(floors.echo, 99))
    local_name = f"local {local.backend}" if local else ""
    rows: list[Row] = []

    def local_us(times: list[float] | None) -> float | None:
        return _median_us(times) if local and times else None

    with hipr.connect(url, token=token, link=link) as gpu:
        backend = str(gpu.worker_info().get("backend", "?"))
        word = gpu.malloc(4096)
        try:
            # (a) a synchronizing null call
            log("sync: synchronize() on an idle device")
            gpu.synchronize()
            fl.timed(gpu.synchronize, plan.warmup)
            times = fl.timed(gpu.synchronize, plan.rtt_count)
            median = _median_us(times)
            rows += [
                Row(
                    "sync",
                    "synchronize() on an idle device, median",
                    median,
                    "µs",
                    f"{echo_name}, median",
                    echo_med,
                    goal="≤ 3x echo",
                    met=median <= 3 * echo_med,
                    local=local_name,
                    local_value=local_us(local.sync if local else None),
                ),
                Row(
                    "sync",
                    "synchronize() on an idle device, p99",
                    _us(percentile(times, 99)),
                    "µs",
                    f"{echo_name}, p99",
                    echo_p99,
                ),
            ]

            # (b) 1-thread launch + synchronize
            log("sync: 1-thread launch + synchronize")
            fill = gpu.builtin("fill_f32")
            args = [word, np.float32(1.0), np.uint64(1)]

            def launch() -> None:
                fill.launch(1, 1, args)

            def launch_sync() -> None:
                fill.launch(1, 1, args)
                gpu.synchronize()

            fl.timed(launch_sync, plan.warmup)
            times = fl.timed(launch_sync, plan.rtt_count)
            median = _median_us(times)
            rows += [
                Row(
                    "sync",
                    "1-thread launch + synchronize, median",
                    median,
                    "µs",
                    f"{echo_name}, median",
                    echo_med,
                    goal="≤ 50 µs",
                    met=median <= 50,
                    local=local_name,
                    local_value=local_us(local.launch_sync if local else None),
                ),
                Row(
                    "sync",
                    "1-thread launch + synchronize, p99",
                    _us(percentile(times, 99)),
                    "µs",
                    f"{echo_name}, p99",
                    echo_p99,
                ),
            ]

            # (c) 1,000 launches then one synchronize
            batch = plan.launch_batch
            log(f"sync: {batch:,} launches then one synchronize, x{plan.batch_repeats}")
            per: list[float] = []
            posting: list[float] = []
            for rep in range(plan.batch_repeats + 1):  # the first batch warms up
                gpu.synchronize()
                start = time.perf_counter()
                for _ in range(batch):
                    launch()
                posted = time.perf_counter()
                gpu.synchronize()
                if rep:
                    per.append((time.perf_counter() - start) / batch)
                    posting.append((posted - start) / batch)
            median = _median_us(per)
            posted_us = _median_us(posting)
            launch_bytes = launch_frame()
            rows.append(
                Row(
                    "sync",
                    f"{batch:,} launches then synchronize, per launch",
                    median,
                    "µs",
                    f"blocking one-way {launch_bytes} B messages, per message",
                    _optional_us(floors.message_seconds.get(launch_bytes)),
                    goal="≤ 10 µs",
                    met=median <= 10,
                    local=local_name,
                    local_value=local_us(local.per_launch if local else None),
                    note=f"the client posted a launch in {posted_us:.1f} µs",
                    extra={"posted_us": posted_us},
                )
            )

            # (e) fire-and-forget 4-byte async copies
            count = plan.ff_count
            ff_bytes = ff_copy_frame()
            ff_floor = floors.message_seconds.get(ff_bytes)
            stream = gpu.stream_create()
            # One word written over and over (each copy overwrites the last, so no two
            # may run in one unordered batch), and the allocation's words in turn.
            words = [word + 4 * i for i in range(FF_WORDS)]
            try:
                for where, on, targets in (
                    ("", None, [word]),
                    (" on a stream", stream, [word]),
                    (f" to {FF_WORDS:,} words in turn", None, words),
                    (f" on a stream to {FF_WORDS:,} words in turn", stream, words),
                ):
                    log(f"sync: {count:,} fire-and-forget 4 B copies{where}")
                    rate, posted = _ff_copies(gpu, targets, on, count, plan.warmup)
                    rows.append(
                        Row(
                            "sync",
                            f"memcpy_htod_async 4 B{where}, fire-and-forget, then synchronize",
                            rate,
                            "req/s",
                            f"blocking one-way {ff_bytes} B messages",
                            1 / ff_floor if ff_floor else None,
                            ratio_style="%",
                            goal="≥ 100k/s",
                            met=rate >= 100_000,
                            note=f"the client posted at {posted:,.0f}/s",
                            extra={"posted_per_s": posted},
                        )
                    )
            finally:
                stream.destroy()
        finally:
            gpu.free(word)

        # (d) 256 MiB copies from and into numpy
        rows += _copy_rows(gpu, floors, local, local_name, plan, log)

        # (f) SGEMM compiled at run time
        if backend == "emulator":
            notes.append(
                f"SGEMM {plan.sgemm_n}³: not measured, the emulator cannot compile kernels"
            )
        else:
            try:
                rows += _sgemm_rows(gpu, local, local_name, plan, log, notes)
            except HipError as exc:  # a compiler or launch refusal: a note, not a crash
                notes.append(f"SGEMM {plan.sgemm_n}³: not measured ({exc})")
    return rows


#: The words the "in turn" fire-and-forget rows write, one after another (the rows'
#: 4 KiB allocation): more than a batch frame's 64 copies, so a batch never repeats one.
FF_WORDS = 1024


def _optional_us(seconds: float | None) -> float | None:
    return None if seconds is None else _us(seconds)


def _ff_copies(
    gpu: Any, targets: list[Any], stream: Any, count: int, warmup: int
) -> tuple[float, float]:
    """``count`` fire-and-forget 4-byte copies to ``targets`` in turn on ``stream`` (None:
    the default stream), then a synchronize: (copies per second in all, per second as
    posted)."""
    four = np.zeros(1, np.float32)
    post = gpu.memcpy_htod_async
    turn = len(targets)
    gpu.synchronize()
    for i in range(min(warmup, count)):
        post(targets[i % turn], four, stream=stream)
    gpu.synchronize()
    start = time.perf_counter()
    for i in range(count):
        post(targets[i % turn], four, stream=stream)
    posted = time.perf_counter()
    gpu.synchronize()
    return count / (time.perf_counter() - start), count / (posted - start)


def _copy_rows(
    gpu: Any, floors: fl.Floors, local: fl.LocalWork | None, local_name: str, plan: Plan, log: Log
) -> list[Row]:
    size = plan.sync_copy_size
    log(f"sync: {size_text(size)} copies each way, x{plan.sync_copy_repeats}")
    host = np.full(size, 7, np.uint8)
    out = np.ones(size, np.uint8)
    ptr = gpu.malloc(size)
    htod: list[float] = []
    dtoh: list[float] = []
    try:
        for rep in range(plan.sync_copy_repeats + 1):  # the first round warms up
            start = time.perf_counter()
            gpu.memcpy_htod(ptr, host)
            middle = time.perf_counter()
            gpu.memcpy_dtoh(ptr, size, out=out)
            end = time.perf_counter()
            if rep:
                htod.append(middle - start)
                dtoh.append(end - middle)
    finally:
        gpu.free(ptr)
    if out[0] != 7 or out[-1] != 7:
        raise RuntimeError("memcpy_dtoh returned bytes other than those copied in")
    same_size = floors.stream_size == size
    rows: list[Row] = []
    for direction, times, floor_key, verb, loc in (
        ("htod", htod, "push", "send", local.htod if local else []),
        ("dtoh", dtoh, "pull", "receive", local.dtoh if local else []),
    ):
        value = size / statistics.median(times) / 1e9
        base = floors.gbs(floor_key)
        local_value = local.copy_size / statistics.median(loc) / 1e9 if local and loc else None
        rows.append(
            Row(
                "sync",
                f"memcpy_{direction} {size_text(size)} "
                + ("from a numpy array" if direction == "htod" else "into a numpy out"),
                value,
                "GB/s",
                f"blocking stream {verb} {size_text(floors.stream_size)}",
                base,
                ratio_style="%",
                goal="≥ 85 %",
                met=value >= 0.85 * base,
                note="" if same_size else "the floor streamed another size",
                local=local_name,
                local_value=local_value,
            )
        )
    return rows


def _sgemm_rows(
    gpu: Any,
    local: fl.LocalWork | None,
    local_name: str,
    plan: Plan,
    log: Log,
    notes: list[str],
) -> list[Row]:
    n = plan.sgemm_n
    log(f"sync: SGEMM {n}³ compiled on the worker, x{plan.sgemm_runs}")
    module = gpu.compile(fl.SGEMM_SOURCE, "sgemm.hip")
    fn = module.function("sgemm")
    a, b = fl.sgemm_inputs(n)
    c = np.zeros_like(a)
    ptrs = [gpu.malloc(a.nbytes) for _ in range(3)]
    try:
        gpu.memcpy_htod(ptrs[0], a)
        gpu.memcpy_htod(ptrs[1], b)
        grid = (n // fl.SGEMM_TILE, n // fl.SGEMM_TILE)
        block = (fl.SGEMM_TILE, fl.SGEMM_TILE)
        args = [*ptrs, np.int32(n)]

        def run() -> None:
            fn.launch(grid, block, args)
            gpu.synchronize()

        run()
        times = fl.timed(run, plan.sgemm_runs)
        gpu.memcpy_dtoh(ptrs[2], out=c)
        notes.append(
            f"SGEMM {n}³ through hipr: largest relative error of sampled entries "
            f"{fl.sgemm_check(a, b, c):.1e}"
        )
    finally:
        for p in ptrs:
            gpu.free(p)
        module.unload()
    value = statistics.median(times) * 1e3
    local_ms = statistics.median(local.sgemm) * 1e3 if local and local.sgemm else None
    return [
        Row(
            "sync",
            f"SGEMM {n}³ (16x16 tiles, compiled at run time) launch + synchronize, median",
            value,
            "ms",
            f"{local_name}, same kernel" if local_ms is not None else "",
            local_ms,
            goal="≤ 1.05x local" if local_ms is not None else "",
            met=(value <= 1.05 * local_ms) if local_ms is not None else None,
            local=local_name if local_ms is not None else "",
            local_value=local_ms,
        )
    ]
