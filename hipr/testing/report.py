"""Command lines behind ``scripts/fuzz`` and ``scripts/reliability-report``.

``scripts/reliability-report`` runs the three campaigns (fuzz, faults, load) and prints
one Markdown table; ``--long`` is the mode whose figures the reliability claims quote
(at least 1,000,000 fuzzed frames, 1,000 injected faults, 256 sessions from several
client processes). ``scripts/fuzz --minutes N`` fuzzes alone, for as long as asked.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import shlex
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio

from hipr.backends import load_backend
from hipr.backends.interface import Backend
from hipr.testing.faults import FaultOptions, FaultReport, run_fault_campaign
from hipr.testing.fuzz_campaign import FuzzOptions, FuzzReport, run_fuzz_campaign
from hipr.testing.load import LoadOptions, LoadReport, run_load


@dataclass(frozen=True)
class Plan:
    """What one report runs."""

    fuzz: FuzzOptions
    faults: FaultOptions
    load: LoadOptions
    loop: str


def _processes(wanted: int) -> int:
    """Client processes: ``wanted``, but leave the worker a core of its own."""
    return max(1, min(wanted, (os.cpu_count() or 2) - 1))


def plan_for(long: bool, seed: int, loop: str, fuzz_minutes: float | None = None) -> Plan:
    """The bounded plan (a couple of minutes) or the long one (the published figures)."""
    if long:
        return Plan(
            fuzz=FuzzOptions(
                seed=seed,
                frames=1_000_000,
                seconds=None if fuzz_minutes is None else fuzz_minutes * 60,
                concurrency=8,
                processes=_processes(4),
                progress=60.0,
            ),
            faults=FaultOptions(seed=seed, sessions=32, seconds=60.0, probability=0.05),
            load=LoadOptions(
                sessions=256, processes=_processes(4), seconds=20.0, rounds=3, seed=seed
            ),
            loop=loop,
        )
    return Plan(
        fuzz=FuzzOptions(
            seed=seed,
            frames=20_000,
            seconds=None if fuzz_minutes is None else fuzz_minutes * 60,
            concurrency=8,
        ),
        faults=FaultOptions(seed=seed, sessions=8, seconds=5.0, probability=0.05),
        load=LoadOptions(sessions=64, processes=_processes(2), seconds=2.5, rounds=2, seed=seed),
        loop=loop,
    )


def _n(value: int) -> str:
    return f"{value:,}"


def render(
    fuzz: FuzzReport,
    faults: FaultReport,
    load: LoadReport | None,
    *,
    title: str,
) -> str:
    """The one table of the report, in Markdown (``load`` None: the load run was not
    asked for, and its rows say so)."""
    ran_load = load is not None
    load = load or LoadReport()
    crashes = len(fuzz.crashes) + len(faults.crashes) + len(load.crashes)
    hangs = len(fuzz.hangs) + len(faults.hangs)
    leak_count = len(fuzz.leaks) + len(faults.leaks) + len(load.leaks)
    errors = len(load.errors) + len(fuzz.violations) + len(fuzz.good_errors) + len(faults.wrong)
    stages = ", ".join(f"{stage} {_n(count)}" for stage, count in sorted(fuzz.by_stage.items()))
    verdict = "PASS" if fuzz.ok and faults.ok and load.ok else "FAIL"
    rows = [
        ("frames fuzzed", f"{_n(fuzz.frames)} ({stages}) on {_n(fuzz.connections)} connections"),
        ("crashes", f"{crashes} (worker serve task and logged exceptions)"),
        ("hangs", f"{hangs} (no answer nor close within the bound)"),
        (
            "faults injected",
            f"{_n(faults.injected)} ({_n(faults.injected_crashes)} GPU-thread crashes) "
            f"on {len(faults.by_method)} backend methods",
        ),
        ("leaks found", f"{leak_count} (backend resources and sessions after each run)"),
        ("sessions held", f"{load.sessions_held} at once ({load.sessions} asked)"),
        (
            "requests verified",
            f"{_n(load.verified)} checks over {_n(load.requests)} load requests; "
            f"{_n(fuzz.good_verified)} beside the fuzzer; {_n(faults.verified)} under faults",
        ),
        ("errors", f"{errors} (wrong results, unanswered requests, failed load calls)"),
        (
            "worker RSS start/end",
            f"{load.rss_start >> 20} / {load.rss_end >> 20} MiB (load run; after each of its "
            f"{len(load.rss_rounds)} rounds: "
            f"{', '.join(str(r >> 20) for r in load.rss_rounds)} MiB)",
        ),
        ("p50/p99 latency", f"{load.p50_ms:.2f} / {load.p99_ms:.2f} ms per call (load run)"),
        ("verdict", verdict),
    ]
    if not ran_load:
        rows = [
            (name, "not run (--no-load)")
            if name in ("sessions held", "worker RSS start/end", "p50/p99 latency")
            else (name, value)
            for name, value in rows
        ]
    width = max(len(name) for name, _ in rows)
    lines = [title, "", f"| {'metric'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    details = [
        f"fuzz: {fuzz.summary()}",
        f"fuzz placement: {fuzz.devices} device(s), the good client on device "
        f"{fuzz.good_device}, fuzz sessions "
        f"{'beside it' if fuzz.devices == 1 else 'on the others'}; fuzzed kernels "
        f"{'may' if fuzz.kernel_faults else 'may not'} stray out of their allocation",
        *(f"fuzz memory: {line}" for line in fuzz.memory.lines()),
        *(f"fuzz trace: {line}" for line in fuzz.trace),
        f"faults: {faults.summary()}",
        *(f"faults memory: {line}" for line in faults.memory.lines()),
        *(f"faults trace: {line}" for line in faults.trace),
    ]
    if ran_load:
        details.append(f"load: {load.summary()}")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {d}" for d in details) + "\n"


def fresh_backend(name: str) -> Backend | None:
    """A new backend of ``name`` for one campaign (a worker closes its backend when it
    stops); None for the emulator, which each campaign makes to its own measure."""
    if name == "emulator":
        return None
    return load_backend(name)


def describe_backend(name: str) -> str:
    """``name``, with its devices for a GPU backend ("cuda backend, 1 x NVIDIA H200")."""
    backend = fresh_backend(name)
    if backend is None:
        return "emulator backend"
    try:
        names = [backend.device_properties(d).name for d in range(backend.device_count())]
    finally:
        backend.close()
    kinds = ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))
    return f"{name} backend, {kinds}"


@asynccontextmanager
async def _backend_of(name: str) -> AsyncIterator[Backend | None]:
    """A fresh backend for one campaign, closed after it (a worker leaves that to its
    owner): the next campaign starts from what the runtime holds without it."""
    backend = fresh_backend(name)
    try:
        yield backend
    finally:
        if backend is not None:
            backend.close()


async def _run_all(
    plan: Plan, backend: str = "emulator", trace: bool = False, load: bool = True, rounds: int = 1
) -> tuple[FuzzReport, FaultReport, LoadReport | None]:
    """Each campaign ``rounds`` times in this process: device memory that grows in the
    first round and not in the later ones is the runtime's one-time growth (its pools,
    lazily loaded code), memory that grows every round a leak. The reports returned are
    the first round's, with the later rounds' failures added to them."""
    fuzz: FuzzReport | None = None
    faults: FaultReport | None = None
    for round_ in range(1, rounds + 1):
        tag = f" (round {round_} of {rounds})" if rounds > 1 else ""
        say(
            f"fuzz{tag}: {plan.fuzz.frames:,} frames, {plan.fuzz.processes or 'in-process'} fuzzers"
        )
        async with _backend_of(backend) as chosen:
            fuzzed = await run_fuzz_campaign(plan.fuzz, chosen, trace=trace)
        say(f"fuzz done{tag}: {fuzzed.summary()}")
        for line in [*fuzzed.memory.lines(), *fuzzed.trace]:
            say(f"fuzz{tag}: {line}")
        if fuzz is None:
            fuzz = fuzzed
        else:
            _carry_failures(fuzz, fuzzed, round_)
        say(f"faults{tag}: {plan.faults.sessions} sessions for {plan.faults.seconds:g} s")
        async with _backend_of(backend) as chosen:
            faulted = await run_fault_campaign(plan.faults, inner=chosen, trace=trace)
        say(f"faults done{tag}: {faulted.summary()}")
        for line in [*faulted.memory.lines(), *faulted.trace]:
            say(f"faults{tag}: {line}")
        if faults is None:
            faults = faulted
        else:
            _carry_failures(faults, faulted, round_)
    assert fuzz is not None and faults is not None  # rounds >= 1
    if not load:
        return fuzz, faults, None
    say(
        f"load: {plan.load.sessions} sessions from {plan.load.processes or 'this'} "
        f"process(es) for {plan.load.seconds:g} s"
    )
    async with _backend_of(backend) as chosen:
        loaded = await run_load(plan.load, backend=chosen)
    say(f"load done: {loaded.summary()}")
    return fuzz, faults, loaded


def _carry_failures(
    first: FuzzReport | FaultReport, later: FuzzReport | FaultReport, round_: int
) -> None:
    """A later round's crashes, hangs, violations and leaks, named by round, in the
    first round's report (whose figures the table shows)."""
    for name in ("crashes", "hangs", "violations", "leaks"):
        found = getattr(later, name, None)
        if found:
            getattr(first, name).extend(f"round {round_}: {item}" for item in found)


def say(message: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main_report(argv: list[str] | None = None) -> int:
    """``scripts/reliability-report``: 0 when every oracle held."""
    parser = argparse.ArgumentParser(
        prog="scripts/reliability-report",
        description="Fuzz, inject faults and load a worker; print one table of the figures.",
    )
    parser.add_argument("--long", action="store_true", help="the long mode (>= 1M frames)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--fuzz-minutes", type=float, help="cap the fuzzing time")
    parser.add_argument("--output", type=Path, help="also write the report to this file")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the fuzz and fault campaigns this many times in one process: growth of "
        "device memory in the first round only is the runtime's, in every round a leak",
    )
    _backend_arguments(parser)
    parser.add_argument(
        "--no-load", action="store_true", help="run the fuzz and fault campaigns only"
    )
    parser.add_argument(
        "--soak",
        type=float,
        metavar="MINUTES",
        help="soak instead: load rounds for this long, sampling RSS, fds and threads",
    )
    parser.add_argument("--sessions", type=int, default=256, help="soak: sessions per round")
    parser.add_argument("--round-seconds", type=float, default=20.0, help="soak: round length")
    parser.add_argument(
        "--trace", action="store_true", help="soak: tracemalloc diff of the last half"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="soak: seconds idle after each round before sampling (the worker trims its "
        "heap after 1 s idle)",
    )
    parser.add_argument(
        "--hostile",
        action="store_true",
        help="hostile clients instead: each attack against a fresh worker process, the "
        "other tenant's calls against its baseline, the worker's RSS",
    )
    parser.add_argument(
        "--idle-connections", type=int, default=1000, help="hostile: idle connections opened"
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=5.0,
        help="hostile: seconds after each attack before the worker's RSS is read again",
    )
    parser.add_argument(
        "--only", nargs="+", metavar="WORD", help="hostile: only attacks whose name has WORD"
    )
    args = parser.parse_args(argv)
    if args.hostile:
        from hipr.testing.hostile import main_hostile

        return main_hostile(args)
    if args.soak is not None:
        return _main_soak(args, argv)
    plan = plan_for(args.long, args.seed, args.loop, args.fuzz_minutes)
    plan = dataclasses.replace(plan, fuzz=_with_kernel_policy(plan.fuzz, args))
    started = time.monotonic()
    described = describe_backend(args.backend)
    fuzz, faults, load = anyio.run(
        _run_all,
        plan,
        args.backend,
        args.trace_leaks,
        not args.no_load,
        args.rounds,
        backend=args.loop,
    )
    command = "scripts/reliability-report " + shlex.join(sys.argv[1:] if argv is None else argv)
    title = (
        f"# hipr reliability report, {datetime.date.today().isoformat()}\n\n"
        f"Command: `{command.strip()}` ({'long' if args.long else 'bounded'} mode, seed "
        f"{args.seed}, worker loop {args.loop}); {time.monotonic() - started:.0f} s on "
        f"{platform.machine()} with {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{described}."
    )
    text = render(fuzz, faults, load, title=title)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    return 0 if fuzz.ok and faults.ok and (load is None or load.ok) else 1


def _backend_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that pick the worker's backend, shared by both commands."""
    parser.add_argument(
        "--backend",
        choices=("emulator", "cuda", "hip"),
        default="emulator",
        help="the worker's backend (a GPU backend uses the devices it finds)",
    )
    parser.add_argument(
        "--trace-leaks",
        action="store_true",
        help="GPU backends: say which call made each object left held, which releases "
        "the runtime refused, and the runtime's own books",
    )
    parser.add_argument(
        "--kernel-faults",
        choices=("auto", "yes", "no"),
        default="auto",
        help="whether fuzzed kernels may stray out of their allocation or fault the "
        "device (auto: on the emulator only)",
    )


def _with_kernel_policy(options: FuzzOptions, args: argparse.Namespace) -> FuzzOptions:
    policy = {"auto": None, "yes": True, "no": False}[args.kernel_faults]
    return dataclasses.replace(options, kernel_faults=policy)


def _main_soak(args: argparse.Namespace, argv: list[str] | None) -> int:
    from hipr.testing.soak import render_soak, soak_ok

    options = LoadOptions(
        sessions=args.sessions,
        processes=_processes(4),
        seconds=args.round_seconds,
        seed=args.seed,
        rounds=6,
        soak_seconds=args.soak * 60,
        trace=args.trace,
        settle_seconds=args.settle,
        on_sample=lambda s: say(
            f"t {s.t:.0f} s: RSS {s.rss / 2**20:.1f} MiB (peak {s.rss_peak / 2**20:.0f}), "
            f"fds {s.fds}, threads {s.threads}, gc objects {s.gc_objects}, p50 {s.p50_ms:.1f} ms"
        ),
    )
    say(
        f"soak: {args.soak:g} min of {options.sessions} sessions from {options.processes} "
        f"process(es), rounds of {options.seconds:g} s"
    )
    started = time.monotonic()
    described = describe_backend(args.backend)
    load = anyio.run(
        partial(run_load, options, backend=fresh_backend(args.backend)), backend=args.loop
    )
    say(f"soak done: {load.summary()}")
    command = "scripts/reliability-report " + shlex.join(sys.argv[1:] if argv is None else argv)
    title = (
        f"# hipr soak report, {datetime.date.today().isoformat()}\n\n"
        f"Command: `{command.strip()}` (seed {args.seed}, worker loop {args.loop}); "
        f"{time.monotonic() - started:.0f} s on {platform.machine()} with {os.cpu_count()} "
        f"CPUs, Python {platform.python_version()}, {described}; the worker and this "
        f"harness share one process, the clients run in {options.processes} other(s)."
    )
    text = render_soak(load, title=title)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    return 0 if soak_ok(load) else 1


def main_fuzz(argv: list[str] | None = None) -> int:
    """``scripts/fuzz``: fuzz a fresh worker for ``--minutes``; 0 when every oracle held."""
    parser = argparse.ArgumentParser(
        prog="scripts/fuzz",
        description="Fuzz a worker (the emulator, or a GPU backend) for a while.",
    )
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, default=10**12, help="stop after this many")
    parser.add_argument("--processes", type=int, default=_processes(4))
    parser.add_argument("--concurrency", type=int, default=8, help="connections per process")
    parser.add_argument("--loop", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--unix", action="store_true", help="listen on a Unix socket")
    _backend_arguments(parser)
    parser.add_argument(
        "--replay",
        type=int,
        nargs="+",
        metavar="INDEX",
        help="run only these connection indices of the seed (a hang or violation names one)",
    )
    args = parser.parse_args(argv)
    listen = "tcp://127.0.0.1:0"
    if args.unix:
        listen = f"unix:///tmp/hipr-fuzz-{os.getpid()}.sock"
    options = FuzzOptions(
        seed=args.seed,
        frames=args.frames,
        seconds=args.minutes * 60,
        concurrency=1 if args.replay else args.concurrency,
        processes=0 if args.replay else args.processes,
        listen=listen,
        echo=True,
        progress=30.0,
        only=tuple(args.replay or ()),
    )
    options = _with_kernel_policy(options, args)
    say(
        f"fuzzing for {args.minutes:g} min, seed {args.seed}, {options.processes} processes, "
        f"{describe_backend(args.backend)}"
    )
    report = anyio.run(
        partial(run_fuzz_campaign, options, fresh_backend(args.backend), trace=args.trace_leaks),
        backend=args.loop,
    )
    print(report.summary())
    for line in [*report.memory.lines(), *report.trace]:
        print(line)
    for label, items in (
        ("crash", report.crashes),
        ("hang", report.hangs),
        ("violation", report.violations),
        ("leak", report.leaks),
        ("good client error", report.good_errors),
    ):
        for item in items[:20]:
            print(f"{label}: {item}")
    print("PASS" if report.ok else "FAIL")
    return 0 if report.ok else 1
