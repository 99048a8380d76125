"""``hipr bench``: the benchmark suite of ``benchmarks/``, with same-run baselines.

``hipr bench URL`` measures a running worker and starts no worker; the baselines it
compares with run in a baseline server it starts on this machine, over the same kind of
transport (or at ``--baseline URL``, started with ``python -m benchmarks.baselines`` on
the worker's machine). ``hipr bench --local`` starts its own worker in a subprocess, on
the emulator or ``--backend cuda|hip``, listening over tcp and unix, plus a baseline
server beside it, and also times the same copies made locally through the runtime.

The ``floor`` and ``sync`` groups (issue 13) run once per transport through the
synchronous client ``hipr.connect()``, beside the machine's floors measured in the same
run: a blocking-socket echo and stream and a uvloop echo, served from processes of their
own (``benchmarks/floors.py``), and the local runtime doing the same GPU work in this
process (``--local``, or ``--backend`` with a worker URL on this machine).

Each figure is printed beside its baseline and the ratio: a rich table on a terminal,
JSON with ``--json``, Markdown with ``--markdown FILE``. A benchmark, not a test: goals
missed are reported, never an error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hipr.cli.common import positive_int
from hipr.errors import UsageError

LOOPS = ("trio", "asyncio")
#: What the --local worker may run on: the client loops, and uvloop (hipr worker's default).
WORKER_LOOPS = (*LOOPS, "uvloop")
#: The client "loop" of the floor and sync runs: blocking sockets, no event loop.
BLOCKING = "blocking"
TRANSPORTS = ("tcp", "unix")
_ROOT = Path(__file__).resolve().parents[2]
_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


# --- the command line -------------------------------------------------------------------


def parse_size(text: str) -> int:
    """``64M`` -> 67108864; ``4096``, ``1G``, ``512K`` (binary units)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = value[-1:] if value[-1:] in _SIZE_SUFFIXES else ""
    try:
        n = int(float(value[: len(value) - len(suffix)]) * _SIZE_SUFFIXES[suffix])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 64M, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"a copy size must be positive, got {text!r}")
    return n


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(parse_size(part) for part in text.split(",") if part.strip())


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``hipr bench`` on the ``hipr`` command's subparsers."""
    b: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="benchmark a worker against same-run baselines",
        description="Round trips, copies, fire-and-forget throughput, malloc/free, many "
        "clients: each figure beside a baseline measured in the same run, and the ratio. "
        "Given URLs, measures those workers (starting none); with --local, starts its own.",
    )
    b.add_argument("urls", nargs="*", metavar="URL", help="worker URL(s) to measure")
    b.add_argument(
        "--local",
        action="store_true",
        help="start a worker in a subprocess (over tcp and unix) and measure it",
    )
    b.add_argument(
        "--backend",
        choices=("emulator", "cuda", "hip"),
        help="the --local worker's backend (default emulator), and the local runtime the "
        "sync figures are compared with (with a URL: only when given)",
    )
    b.add_argument(
        "--loop",
        choices=(*LOOPS, "both"),
        default="both",
        help="client event loop, and the --local worker's (default both, one after the other)",
    )
    b.add_argument(
        "--worker-loop",
        choices=WORKER_LOOPS,
        help="the --local worker's loop, if not the client's (floor/sync: default uvloop "
        "where installed, as hipr worker)",
    )
    b.add_argument(
        "--transport",
        choices=(*TRANSPORTS, "both"),
        default="both",
        help="--local transports (default both)",
    )
    b.add_argument(
        "--baseline",
        metavar="URL",
        help="a running baseline server (python -m benchmarks.baselines) instead of one "
        "started here",
    )
    b.add_argument(
        "--floor",
        metavar="URL",
        help="a running floor server (python -m benchmarks.floors) instead of the ones "
        "started here (then no uvloop echo)",
    )
    b.add_argument(
        "--sizes",
        type=_sizes,
        metavar="LIST",
        help="copy sizes, e.g. 1M,64M,256M (the default; --full adds 1G)",
    )
    b.add_argument("--full", action="store_true", help="copy sizes 1M, 64M and 1G")
    b.add_argument(
        "--only",
        metavar="LIST",
        help="benchmarks to run (default all): floor,sync,rtt,copy,ff,malloc,concurrent,"
        "local,facade",
    )
    b.add_argument("--quick", action="store_true", help="tiny counts: checks, measures nothing")
    b.add_argument("--rtt-count", type=positive_int, metavar="N", help="round trips (default 2000)")
    b.add_argument("--ff-count", type=positive_int, metavar="N", help="fire-and-forget requests")
    b.add_argument(
        "--clients", type=positive_int, metavar="N", help="concurrent clients (default 64)"
    )
    b.add_argument(
        "--spin-wait",
        type=float,
        metavar="SECONDS",
        help="the sync client's spin before it blocks for a reply (default: automatic, "
        "200 µs on 4 or more CPUs, else 0; see LinkOptions.spin_wait)",
    )
    b.add_argument(
        "--worker-spin-wait",
        type=spin_setting,
        metavar="SECONDS",
        help="the --local worker's spin_wait, seconds or \"auto\" (default: the worker's "
        'own, "auto": 200 µs on 4 or more CPUs, else 0)',
    )
    b.add_argument("--token", help="tenant token (prefer HIPR_TOKEN)")
    b.add_argument("--json", action="store_true", help="print JSON instead of tables")
    b.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the results as Markdown; {transport} in FILE splits them by transport",
    )
    b.add_argument(
        "--save-json", metavar="FILE", help="also write the JSON to FILE ({transport} as above)"
    )
    b.set_defaults(func=cmd_bench, client=True)
    return b


# --- results ----------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """One pass of the suite: one URL, one client loop."""

    transport: str
    loop: str
    worker_loop: str | None
    url: str
    baseline_url: str
    rows: list[Any] = field(default_factory=list)
    #: What the run could not measure, and checks worth reading beside the figures.
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The run as plain data."""
        return {
            "transport": self.transport,
            "loop": self.loop,
            "worker_loop": self.worker_loop,
            "url": self.url,
            "baseline_url": self.baseline_url,
            "rows": [row.to_json() for row in self.rows],
            "notes": list(self.notes),
        }


def load_suite() -> ModuleType:
    """``benchmarks.suite``, from a source checkout (the suite is not installed)."""
    try:
        from benchmarks import suite
    except ImportError:
        if not (_ROOT / "benchmarks" / "suite.py").is_file():
            raise RuntimeError(
                "hipr bench needs the benchmarks/ folder of a hipr source checkout"
            ) from None
        sys.path.insert(0, str(_ROOT))
        from benchmarks import suite
    return suite


def machine_description() -> dict[str, Any]:
    """Host name, CPU model and count, OS and Python: what the figures were taken on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _ratio_text(row: Any, ratio: float | None = None, local: bool = False) -> str:
    ratio = (row.local_ratio if local else row.ratio) if ratio is None else ratio
    if ratio is None:
        return ""
    return f"{ratio * 100:.0f} %" if row.ratio_style == "%" else f"{ratio:.2f}x"


def _has_local(run: Run) -> bool:
    return any(getattr(row, "local_value", None) is not None for row in run.rows)


def _value_text(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    if unit == "req/s":
        return f"{value:,.0f} {unit}"
    if unit == "GB/s":
        return f"{value:.2f} {unit}"
    return f"{value:,.1f} {unit}"


def _met_text(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "MISSED")


#: What ``--quick`` output says first: its counts are too small to mean anything.
QUICK_NOTE = (
    "quick run (--quick): tiny counts that check every benchmark runs; the figures "
    "measure nothing, so no goal is judged"
)


def _run_title(run: Run) -> str:
    worker = f", worker {run.worker_loop}" if run.worker_loop else ""
    client = "sync client (blocking sockets)" if run.loop == BLOCKING else f"client {run.loop}"
    return f"{run.transport}, {client}{worker}: {run.url}"


def print_tables(runs: Sequence[Run], meta: dict[str, Any]) -> None:
    """The results as rich tables on the terminal."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=200)
    console.print(
        f"[bold]hipr bench[/] {meta['date']} on {meta['machine']['host']} "
        f"({meta['machine']['cpus']} CPUs), backend {meta.get('backend', '?')}"
        f"{' / ' + meta['device'] if meta.get('device') else ''}"
    )
    quick = bool(meta.get("quick"))
    if quick:
        console.print(QUICK_NOTE)
    for run in runs:
        table = Table(title=_run_title(run), box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("benchmark", overflow="fold")
        table.add_column("hipr", justify="right", no_wrap=True)
        table.add_column("baseline (same run)", overflow="fold")
        table.add_column("baseline", justify="right", no_wrap=True)
        table.add_column("ratio", justify="right", no_wrap=True)
        local = _has_local(run)
        if local:
            table.add_column("local (same run)", justify="right", no_wrap=True)
            table.add_column("vs local", justify="right", no_wrap=True)
        table.add_column("goal", no_wrap=True)
        table.add_column("", no_wrap=True)
        for row in run.rows:
            met = "" if quick else _met_text(row.met)
            style = "" if quick else ("red" if row.met is False else ("green" if row.met else ""))
            cells = [
                row.name,
                _value_text(row.value, row.unit),
                row.baseline,
                _value_text(row.baseline_value, row.unit),
                _ratio_text(row),
            ]
            if local:
                cells += [_value_text(row.local_value, row.unit), _ratio_text(row, local=True)]
            cells += [row.goal, f"[{style}]{met}[/]" if style else met]
            table.add_row(*cells)
        console.print(table)
        for note in run.notes:
            console.print(f"  note: {note}")
    goals = [row.met for run in runs for row in run.rows if row.met is not None]
    if goals and not quick:
        console.print(f"goals met: {sum(goals)} of {len(goals)}")


def markdown(runs: Sequence[Run], meta: dict[str, Any]) -> str:
    """The results as a Markdown document (for ``benchmarks/results/``)."""
    m = meta["machine"]
    lines = [
        f"# hipr bench: {meta.get('backend', '?')}, "
        f"{', '.join(sorted({r.transport for r in runs}))}",
        "",
        f"- date: {meta['date']}",
        f"- machine: {m['host']}: {m['cpu']}, {m['cpus']} CPUs, {m['os']}, Python {m['python']}"
        f"; load average at start {m.get('load_average', '?')}",
        f"- backend: {meta.get('backend', '?')}"
        + (f" ({meta['device']})" if meta.get("device") else ""),
        f"- transports: {', '.join(sorted({r.transport for r in runs}))}",
        "- event loops (client / worker): "
        + ", ".join(sorted({f"{r.loop} / {r.worker_loop or '?'}" for r in runs})),
        f"- hipr {meta['hipr_version']}; command: `{meta['command']}`",
        "",
        "Each figure beside its baseline measured in the same run; ratio = hipr / baseline "
        "(x for times and rates, % for a share of the baseline's throughput). In the sync "
        "client's runs the baseline is the machine's floor (blocking sockets, or the local "
        "runtime for GPU-bound work), and `vs local` compares with the same work done by "
        "the runtime in-process.",
    ]
    if meta.get("quick"):
        lines += ["", f"**{QUICK_NOTE}.**"]
    for run in runs:
        local = _has_local(run)
        head = "| benchmark | hipr | baseline (same run) | baseline | ratio |"
        rule = "|---|--:|---|--:|--:|"
        if local:
            head += " local | vs local |"
            rule += "--:|--:|"
        lines += ["", f"## {_run_title(run)}", "", head + " goal | |", rule + "---|---|"]
        for row in run.rows:
            line = (
                f"| {row.name} | {_value_text(row.value, row.unit)} | {row.baseline} | "
                f"{_value_text(row.baseline_value, row.unit)} | {_ratio_text(row)} |"
            )
            if local:
                line += (
                    f" {_value_text(row.local_value, row.unit)} | {_ratio_text(row, local=True)} |"
                )
            verdict = "" if meta.get("quick") else _met_text(row.met)
            lines.append(line + f" {row.goal} | {verdict} |")
        notes = [f"{row.name}: {row.note}" for row in run.rows if row.note] + run.notes
        if notes:
            lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def results_json(runs: Sequence[Run], meta: dict[str, Any]) -> dict[str, Any]:
    """The results as one JSON-able document."""
    return {"meta": meta, "runs": [run.to_json() for run in runs]}


def _write_split(path: str, runs: Sequence[Run], render: Any) -> list[Path]:
    """Write ``render(runs)`` to ``path``, one file per transport when it has {transport}."""
    written: list[Path] = []
    groups = (
        {t: [r for r in runs if r.transport == t] for t in dict.fromkeys(r.transport for r in runs)}
        if "{transport}" in path
        else {"": list(runs)}
    )
    for transport, group in groups.items():
        target = Path(path.replace("{transport}", transport))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(group))
        written.append(target)
    return written


# --- processes this command starts ------------------------------------------------------


def _child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def spawn_server(argv: Sequence[str], what: str, tree: Path = _ROOT) -> Iterator[dict[str, Any]]:
    """Start a server process that prints one JSON line once it listens; stop it after.
    It runs in ``tree`` (a checkout), whose ``hipr`` and ``benchmarks`` it imports."""
    proc = subprocess.Popen(
        list(argv),
        cwd=tree,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=_child_env(tree),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {what} exited before listening (status {proc.wait()})")
        yield json.loads(line)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _baseline_server(loop: str, urls: Sequence[str]) -> contextlib.AbstractContextManager[Any]:
    argv = [sys.executable, "-m", "benchmarks.baselines", "--loop", loop]
    for url in urls:
        argv += ["--listen", url]
    return spawn_server(argv, "baseline server")


def _local_worker(
    loop: str, backend: str, urls: Sequence[str], spin_wait: float | None = None
) -> contextlib.AbstractContextManager[Any]:
    argv = [sys.executable, "-m", "hipr.cli.bench", "--serve-worker", "--loop", loop]
    argv += ["--backend", backend]
    if spin_wait is not None:
        argv += ["--spin-wait", repr(spin_wait)]
    for url in urls:
        argv += ["--listen", url]
    return spawn_server(argv, f"{backend} worker")


async def _serve_worker(
    backend_name: str, urls: Sequence[str], spin_wait: float | None, settings: Mapping[str, Any]
) -> None:
    import signal

    import anyio

    from hipr.worker.config import load_config
    from hipr.worker.server import Worker, load_configured_backend

    overrides: dict[str, Any] = {"listen": list(urls), "backend": backend_name}
    if spin_wait is not None:
        overrides["spin_wait"] = spin_wait
    config = load_config(None, {**overrides, **settings})
    backend = load_configured_backend(config)
    try:
        async with anyio.create_task_group() as tg:
            worker = Worker(config, backend)
            bound = await tg.start(worker.serve)
            # The pid: a caller may read the worker's CPU time from /proc; spin_wait:
            # the window in force, "auto" resolved.
            line = {
                "urls": bound,
                "backend": backend.name,
                "pid": os.getpid(),
                "spin_wait": worker.busy_poll.seconds,
            }
            print(json.dumps(line), flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break
    finally:
        backend.close()


def spin_setting(text: str) -> float | None:
    """A ``spin_wait`` on the command line: seconds, or ``auto`` (None: the worker's
    automatic choice)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r}: expected seconds or "auto"') from None


def worker_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, a top-level key of the worker's config: the value as TOML reads it
    (``0.005``, ``true``), else as text (``64MiB``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    try:
        parsed: Any = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.strip(), parsed


def serve_worker_main(argv: Sequence[str]) -> int:
    """``python -m hipr.cli.bench --serve-worker --loop L --backend B --listen URL...
    [--set KEY=VALUE ...]``: the ``--local`` worker, on the loop asked for (trio, asyncio
    or uvloop), with any config keys set as the worker's TOML would."""
    import anyio

    from hipr.observability.log import configure_logging

    parser = argparse.ArgumentParser(prog="python -m hipr.cli.bench --serve-worker")
    parser.add_argument("--serve-worker", action="store_true")
    parser.add_argument("--loop", choices=WORKER_LOOPS, default="trio")
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--listen", action="append", required=True)
    parser.add_argument("--spin-wait", type=spin_setting)
    parser.add_argument("--set", action="append", type=worker_setting, default=[])
    args = parser.parse_args(argv)
    configure_logging("error", "console")
    from hipr.cli.common import event_loop

    name, options = event_loop(args.loop)
    anyio.run(
        _serve_worker,
        args.backend,
        args.listen,
        args.spin_wait,
        dict(args.set),
        backend=name,
        backend_options=options,
    )
    return 0


# --- running ----------------------------------------------------------------------------


def build_plan(args: argparse.Namespace, suite: ModuleType) -> Any:
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
    import dataclasses

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


def _describe(suite: ModuleType, url: str, token: str | None, loop: str) -> dict[str, Any]:
    import anyio

    async def ask() -> dict[str, Any]:
        async with suite.aconnect(url, token=token) as gpu:
            info = gpu.worker_info()
            props = await gpu.device_properties(0)
            return {"backend": info.get("backend"), "device": props.name}

    result: dict[str, Any] = anyio.run(ask, backend=loop)
    return result


def _log(message: str) -> None:
    """Progress, one line at a time on stderr (tables and JSON go to stdout)."""
    print(f"hipr bench: {message}", file=sys.stderr, flush=True)


def default_worker_loop() -> str:
    """The loop ``hipr worker`` runs by default: uvloop where installed, else asyncio."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def _measure_local(suite: ModuleType, backend_name: str, plan: Any) -> dict[str, Any]:
    """Benchmark 6's reference: the same copies and malloc/free pairs, made here."""
    from benchmarks import baselines
    from hipr.backends import load_backend

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

    suite = load_suite()
    plan = build_plan(args, suite)
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
    import dataclasses

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
            local = _measure_local(suite, backend_name, plan)
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
                        _local_worker(
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
                    meta.update(_describe(suite, urls[0], args.token, loop))
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
    from benchmarks import floors as fl
    from benchmarks import syncbench
    from benchmarks.suite import size_text

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
            _local_worker(
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
    from benchmarks import floors as fl
    from benchmarks.suite import size_text
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
        argv = [sys.executable, "-m", "benchmarks.floors", *([flag] if flag else [])]
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
    started = stack.enter_context(_baseline_server(loop, [wanted[k] for k in kinds]))
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


def cmd_bench(args: argparse.Namespace) -> int:
    """``hipr bench``: run the suite, print tables (or JSON), write the files asked for."""
    try:
        runs, meta = run_bench(args)
    except ValueError as exc:  # usage: no URL, unknown benchmark name, bad combination
        print(f"hipr: {exc}", file=sys.stderr)
        return 2
    document = results_json(runs, meta)
    if args.json:
        print(json.dumps(document, indent=2, default=str))
    else:
        print_tables(runs, meta)
    if args.markdown:
        _write_split(args.markdown, runs, lambda group: markdown(group, meta))
    if args.save_json:
        _write_split(
            args.save_json,
            runs,
            lambda group: json.dumps(results_json(group, meta), indent=2, default=str) + "\n",
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hipr.cli.bench ...``: ``hipr bench ...``, or the --local worker itself."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve-worker" in argv:
        return serve_worker_main(argv)
    parser = argparse.ArgumentParser(prog="python -m hipr.cli.bench")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
