"""Running the suite as ``hipr bench``'s options say: the worker, baseline and floor
servers it needs, the passes per loop and transport, the local runtime's references."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hipr.bench import floors as fl
from hipr.bench import suite, syncbench
from hipr.bench.results import BLOCKING, LOOPS, TRANSPORTS, Run, machine_description
from hipr.bench.servers import baseline_server, default_worker_loop, local_worker, spawn_server
from hipr.bench.suite import size_text
from hipr.client.api import aconnect
from hipr.errors import UsageError


def build_plan(args: argparse.Namespace) -> suite.Plan:
    """The suite's Plan from the command's options."""
    plan = suite.Plan.quick() if args.quick else suite.Plan()
    changes: dict[str, Any] = {}
    if args.full:
        changes["copy_sizes"] = (1 << 20, 64 << 20, 1 << 30)
    if args.sizes:
        changes["copy_sizes"] = args.sizes
    if args.rtt_count:
        changes["rtt_count"] = args.rtt_count
    if args.ff_count:
        changes["ff_count"] = args.ff_count
    if args.clients:
        changes["clients"] = args.clients
    plan = dataclasses.replace(plan, **changes)
    if args.only:
        plan = plan.with_only([n.strip() for n in args.only.split(",") if n.strip()])
    return plan


def _transport_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "tcp"


def _progress(args: argparse.Namespace) -> Any:
    """A rich progress display for long copies, only on a terminal and without --json."""
    if args.json:
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
        return None
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def _describe(url: str, token: str | None, loop: str) -> dict[str, Any]:
    import anyio

    async def ask() -> dict[str, Any]:
        async with aconnect(url, token=token) as gpu:
            info = gpu.worker_info()
            props = await gpu.device_properties(0)
            return {"backend": info.get("backend"), "device": props.name}

    result: dict[str, Any] = anyio.run(ask, backend=loop)
    return result


def _log(message: str) -> None:
    """Progress, one line at a time on stderr (tables and JSON go to stdout)."""
    print(f"hipr bench: {message}", file=sys.stderr, flush=True)


def _measure_local(backend_name: str, plan: Any) -> dict[str, Any]:
    """Benchmark 6's reference: the same copies and malloc/free pairs, made here."""
    from hipr.backends import load_backend
    from hipr.bench import baselines

    options: dict[str, Any] = {}
    if backend_name == "emulator":
        options["total_memory"] = max(plan.copy_sizes) + (64 << 20)
    backend = load_backend(backend_name, **options)
    try:
        copies = baselines.local_runtime_copies(backend, plan.copy_sizes, plan.local_repeats)
        malloc = baselines.local_malloc_free(backend, plan.malloc_pairs)
    finally:
        backend.close()
    return {"local_copies": tuple(copies), "local_malloc_seconds": malloc}


def run_bench(args: argparse.Namespace) -> tuple[list[Run], dict[str, Any]]:
    """Run the suite as ``args`` say; the runs and what they were taken on."""
    import anyio

    plan = build_plan(args)
    loops = LOOPS if args.loop == "both" else (args.loop,)
    if not args.local and not args.urls:
        raise UsageError(message="hipr bench needs a worker URL, or --local to start one")
    if args.local and args.urls:
        raise UsageError(message="give worker URLs or --local, not both")
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(),
        "hipr_version": _version(),
        "command": _command_line(),
        "quick": bool(args.quick),
    }
    meta["plan"] = dataclasses.asdict(plan)
    runs: list[Run] = []
    progress = _progress(args)
    backend_name = args.backend or "emulator"
    blocking = [name for name in plan.only if name in suite.BLOCKING_BENCHMARKS]
    asynchronous = [name for name in plan.only if name not in suite.BLOCKING_BENCHMARKS]
    with contextlib.ExitStack() as stack:
        if progress is not None:
            stack.enter_context(progress)
        tmp = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="hipr-bench-", dir="/tmp"))
        )
        if blocking:
            with contextlib.ExitStack() as per_pass:
                runs += _run_blocking(args, plan, meta, per_pass, tmp)
        if not asynchronous:
            return runs, meta
        local: dict[str, Any] = {}
        if args.local and "local" in plan.only:
            _log(f"local {backend_name}: copies and malloc/free in-process")
            local = _measure_local(backend_name, plan)
        for loop in loops:
            worker_loop = args.worker_loop or loop
            with contextlib.ExitStack() as per_loop:
                if args.local:
                    transports = TRANSPORTS if args.transport == "both" else (args.transport,)
                    wanted = {
                        "tcp": "tcp://127.0.0.1:0",
                        "unix": f"unix://{tmp}/worker-{worker_loop}.sock",
                    }
                    started = per_loop.enter_context(
                        local_worker(
                            worker_loop,
                            backend_name,
                            [wanted[t] for t in transports],
                            args.worker_spin_wait,
                        )
                    )
                    urls = list(started["urls"])
                else:
                    urls = list(args.urls)
                    worker_loop = None
                base_urls = _baseline_urls(args, per_loop, loop, urls, tmp)
                if "device" not in meta:
                    meta.update(_describe(urls[0], args.token, loop))
                for url in urls:
                    transport = _transport_of(url)
                    _log(f"{', '.join(asynchronous)} over {transport}, client {loop}")
                    target = suite.Target(
                        url=url,
                        baseline_url=base_urls[transport],
                        transport=transport,
                        loop=loop,
                        worker_loop=worker_loop,
                        token=args.token,
                        **local,
                    )
                    rows = anyio.run(suite.run_suite, target, plan, progress, backend=loop)
                    runs.append(Run(transport, loop, worker_loop, url, target.baseline_url, rows))
    return runs, meta


def _run_blocking(
    args: argparse.Namespace,
    plan: Any,
    meta: dict[str, Any],
    stack: contextlib.ExitStack,
    tmp: Path,
) -> list[Run]:
    """The floor and sync groups: once per transport, through the synchronous client,
    beside floors measured now (and the local runtime's figures, measured first, before
    a worker shares the GPU)."""

    local = None
    if args.local or args.backend:
        local = _measure_local_work(args.backend or "emulator", plan)
    worker_loop: str | None = None
    #: The --local worker's spin window in force, as it reported it.
    worker_spin: float | None = None
    if args.local:
        worker_loop = args.worker_loop or default_worker_loop()
        transports = TRANSPORTS if args.transport == "both" else (args.transport,)
        wanted = {"tcp": "tcp://127.0.0.1:0", "unix": f"unix://{tmp}/worker-blocking.sock"}
        _log(f"starting the {args.backend or 'emulator'} worker (loop {worker_loop})")
        started = stack.enter_context(
            local_worker(
                worker_loop,
                args.backend or "emulator",
                [wanted[t] for t in transports],
                args.worker_spin_wait,
            )
        )
        urls = list(started["urls"])
        worker_spin = started.get("spin_wait")
    else:
        urls = list(args.urls)
    if "backend" not in meta:
        meta.update(_describe_blocking(urls[0], args.token))
    floor_urls, uvloop_urls = _floor_urls(args, stack, urls, tmp)
    launch_bytes, ff_bytes = syncbench.message_sizes()
    runs: list[Run] = []
    for url in urls:
        transport = _transport_of(url)
        _log(f"floors over {transport}: echoes, {size_text(plan.sync_copy_size)} streams")
        floors = fl.measure_floors(
            transport,
            floor_urls[transport],
            echo_count=plan.rtt_count,
            warmup=plan.warmup,
            stream_size=plan.sync_copy_size,
            stream_repeats=plan.sync_copy_repeats,
            message_sizes=(launch_bytes, ff_bytes),
            message_count=plan.ff_count,
            uvloop_url=uvloop_urls.get(transport, ""),
        )
        notes = list(local.notes) if local else []
        if args.local:
            how = "automatic" if args.worker_spin_wait is None else "--worker-spin-wait"
            spin = f"{worker_spin * 1e6:.0f} µs" if worker_spin is not None else "not reported"
            notes.append(f"--local worker spin_wait: {spin} ({how})")
        if transport not in TRANSPORTS:
            notes.append(f"{transport} is compared with floors over plain tcp on loopback")
        if not uvloop_urls:
            notes.append("uvloop echo: not measured (uvloop not installed, or --floor given)")
        rows: list[Any] = []
        if "floor" in plan.only:
            rows += syncbench.floor_rows(floors, local)
        if "sync" in plan.only:
            rows += syncbench.sync_rows(
                url, args.token, floors, local, plan, _log, notes, args.spin_wait
            )
        runs.append(Run(transport, BLOCKING, worker_loop, url, floors.url, rows, notes))
    return runs


def _measure_local_work(backend_name: str, plan: Any) -> Any:
    """The sync workloads' GPU work through the runtime in this process (and CuPy's
    launches on the cuda backend, where CuPy imports)."""
    from hipr.backends import load_backend

    sgemm = "" if backend_name == "emulator" else f", SGEMM {plan.sgemm_n}³"
    _log(f"local {backend_name}: launches, {size_text(plan.sync_copy_size)} copies{sgemm}")
    options: dict[str, Any] = {}
    if backend_name == "emulator":
        options["total_memory"] = plan.sync_copy_size + (64 << 20)
    backend = load_backend(backend_name, **options)
    try:
        work = fl.local_work(
            backend,
            count=plan.rtt_count,
            warmup=plan.warmup,
            batch=plan.launch_batch,
            batch_repeats=plan.batch_repeats,
            copy_size=plan.sync_copy_size,
            copy_repeats=plan.sync_copy_repeats,
            sgemm_n=plan.sgemm_n,
            sgemm_runs=plan.sgemm_runs,
        )
    finally:
        backend.close()
    if backend_name == "cuda":
        try:
            _log("local CuPy: RawKernel launches")
            work.cupy_launch_sync, work.cupy_per_launch = fl.cupy_launches(
                plan.rtt_count, plan.warmup, plan.launch_batch, plan.batch_repeats
            )
        except Exception as exc:  # no CuPy, or one that cannot run here: a note, no figure
            work.notes.append(f"CuPy: not measured ({type(exc).__name__}: {exc})")
    return work


def _describe_blocking(url: str, token: str | None) -> dict[str, Any]:
    import hipr

    with hipr.connect(url, token=token) as gpu:
        return {
            "backend": gpu.worker_info().get("backend"),
            "device": gpu.device_properties(0).name,
        }


def _floor_urls(
    args: argparse.Namespace, stack: contextlib.ExitStack, urls: Sequence[str], tmp: Path
) -> tuple[dict[str, str], dict[str, str]]:
    """transport -> floor URL, and transport -> uvloop echo URL (none without uvloop):
    --floor, or servers started here in processes of their own."""
    transports = sorted({_transport_of(u) for u in urls})
    if args.floor:
        return {t: args.floor for t in transports}, {}
    kinds = sorted({t if t in TRANSPORTS else "tcp" for t in transports})
    found: list[dict[str, str]] = []
    for flag in ("", "--uvloop"):
        if flag:
            try:
                import uvloop  # noqa: F401
            except ImportError:
                found.append({})
                continue
        wanted = {"tcp": "tcp://127.0.0.1:0", "unix": f"unix://{tmp}/floor{flag}.sock"}
        argv = [sys.executable, "-m", "hipr.bench.floors", *([flag] if flag else [])]
        for kind in kinds:
            argv += ["--listen", wanted[kind]]
        started = stack.enter_context(spawn_server(argv, f"floor server {flag}".strip()))
        bound = dict(zip(kinds, started["urls"], strict=True))
        found.append({t: bound[t if t in TRANSPORTS else "tcp"] for t in transports})
    return found[0], found[1]


def _baseline_urls(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    loop: str,
    urls: Sequence[str],
    tmp: Path,
) -> dict[str, str]:
    """transport -> baseline URL: --baseline, or a server started here for this loop."""
    transports = sorted({_transport_of(u) for u in urls})
    if args.baseline:
        return {t: args.baseline for t in transports}
    # Links without a bare form here (tls, ssh) are compared with plain tcp on loopback.
    kinds = sorted({t if t in TRANSPORTS else "tcp" for t in transports})
    wanted = {"tcp": "tcp://127.0.0.1:0", "unix": f"unix://{tmp}/baseline-{loop}.sock"}
    started = stack.enter_context(baseline_server(loop, [wanted[k] for k in kinds]))
    bound = dict(zip(kinds, started["urls"], strict=True))
    return {t: bound[t if t in TRANSPORTS else "tcp"] for t in transports}


def _command_line() -> str:
    words = sys.argv[1:]
    if words[:1] == ["bench"]:
        words = words[1:]
    return " ".join(["hipr bench", *words])


def _version() -> str:
    from hipr._version import __version__

    return __version__
