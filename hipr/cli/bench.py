"""``hipr bench``: the benchmark suite of ``hipr.bench``, with same-run baselines.

``hipr bench URL`` measures a running worker and starts no worker; the baselines it
compares with run in a baseline server it starts on this machine, over the same kind of
transport (or at ``--baseline URL``, started with ``python -m hipr.bench.baselines`` on
the worker's machine). ``hipr bench --local`` starts its own worker in a subprocess, on
the emulator or ``--backend cuda|hip``, listening over tcp and unix, plus a baseline
server beside it, and also times the same copies made locally through the runtime.

The ``floor`` and ``sync`` groups (issue 13) run once per transport through the
synchronous client ``hipr.connect()``, beside the machine's floors measured in the same
run: a blocking-socket echo and stream and a uvloop echo, served from processes of their
own (``hipr/bench/floors.py``), and the local runtime doing the same GPU work in this
process (``--local``, or ``--backend`` with a worker URL on this machine).

Each figure is printed beside its baseline and the ratio: a rich table on a terminal,
JSON with ``--json``, Markdown with ``--markdown FILE``. A benchmark, not a test: goals
missed are reported, never an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from hipr.bench.results import (
    LOOPS,
    TRANSPORTS,
    WORKER_LOOPS,
    markdown,
    print_tables,
    results_json,
    write_split,
)
from hipr.bench.servers import serve_worker, spin_setting, worker_setting
from hipr.cli.common import positive_int

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
        help="a running baseline server (python -m hipr.bench.baselines) instead of one "
        "started here",
    )
    b.add_argument(
        "--floor",
        metavar="URL",
        help="a running floor server (python -m hipr.bench.floors) instead of the ones "
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


# --- the --local worker's process ---------------------------------------------------


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
        serve_worker,
        args.backend,
        args.listen,
        args.spin_wait,
        dict(args.set),
        backend=name,
        backend_options=options,
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``hipr bench``: run the suite, print tables (or JSON), write the files asked for."""
    from hipr.bench.runner import run_bench  # numpy, the client: only when benchmarking

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
        write_split(args.markdown, runs, lambda group: markdown(group, meta))
    if args.save_json:
        write_split(
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
