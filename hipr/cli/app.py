"""The ``hipr`` command: run a worker, look at one, measure the link to it.

Exit codes scripts can rely on are :class:`hipr.cli.common.ExitCode` (tabled in
``docs/cli.md``, generated from it).

Every failure prints one line, ``hipr: <what went wrong>``, on stderr; no traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hipr.cli.bench import add_bench_parser
from hipr.cli.common import (
    EXIT_ADDRESS_IN_USE,
    EXIT_AUTH,
    EXIT_CONNECTION,
    EXIT_HIP_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    add_client_options,
    as_dict,
    connect_from_args,
    dump_json,
    event_loop,
    human_size,
    json_default,
    positive_int,
    version_string,
)
from hipr.cli.completion import add_completion_parser
from hipr.cli.fleet import info_many, urls_of
from hipr.cli.proxy import add_proxy_parser
from hipr.cli.run import add_run_parser
from hipr.cli.status_view import add_status_parser
from hipr.cli.workers import add_workers_parser
from hipr.errors import AuthError, HipConnectionError, HipError, UsageError
from hipr.protocol import version_text
from hipr.worker.config import BACKENDS, LOG_FORMATS, LOG_LEVELS, ConfigError, load_config

# --- parser -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hipr`` command."""
    parser = argparse.ArgumentParser(
        prog="hipr",
        description="Use a remote GPU over HIP: run a worker on the GPU node, "
        "inspect it from anywhere.",
        epilog="Exit codes: 0 ok, 1 HIP error from the worker, 2 usage or configuration "
        "error, 3 connection error, 4 token missing or refused, 5 address already in use "
        "(docs/cli.md).",
    )
    parser.add_argument("--version", action="version", version=version_string())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    w = sub.add_parser(
        "worker",
        help="serve this machine's GPUs",
        description="Serve this machine's GPUs until SIGTERM or SIGINT. Flags override the "
        "config file; HIPR_LOG_LEVEL and HIPR_LOG_FORMAT override the file too.",
    )
    w.add_argument(
        "--listen",
        action="append",
        metavar="URL",
        help="listen URL (repeatable): tcp://HOST:PORT, unix:///PATH, tls://HOST:PORT; "
        "replaces the config file's list (default tcp://127.0.0.1:18515)",
    )
    w.add_argument("--backend", choices=BACKENDS, help="GPU runtime (default auto)")
    w.add_argument(
        "--no-emulator-fallback",
        action="store_true",
        default=None,
        help="with --backend auto, refuse to start when neither hip nor cuda loads, instead "
        "of serving the emulator (config: emulator_fallback = false)",
    )
    w.add_argument("--config", metavar="FILE", help="worker TOML file (see config/worker.toml)")
    w.add_argument("--log-level", choices=LOG_LEVELS, help="default info, or HIPR_LOG_LEVEL")
    w.add_argument("--log-format", choices=LOG_FORMATS, help="default auto")
    w.add_argument(
        "--loop",
        choices=("asyncio", "uvloop", "trio"),
        default=None,
        help="event loop (default: uvloop where installed, as with the hipr[fast] extra, "
        "else asyncio; asyncio means the standard library's loop)",
    )
    w.set_defaults(func=cmd_worker, client=False)

    i = sub.add_parser(
        "info",
        help="show a worker's devices",
        description="Show the worker, its backend and each device's properties and memory; "
        "with several URLs, one table of all their devices, numbered as a multi-worker "
        "client numbers them.",
    )
    add_client_options(i, several=True)
    i.set_defaults(func=cmd_info, client=True)

    p = sub.add_parser(
        "ping",
        help="measure round-trip times to a worker",
        description="Send null requests and report each round-trip time and min/median/max.",
    )
    add_client_options(p)
    p.add_argument(
        "-n", "--count", type=positive_int, default=5, help="requests to send (default 5)"
    )
    p.set_defaults(func=cmd_ping, client=True)

    t = sub.add_parser(
        "token",
        help="make tenant tokens",
        description="Tokens for the tenants file: a token is printed once; only its hash is kept.",
    )
    token_sub = t.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    new = token_sub.add_parser(
        "new",
        help="print a fresh token and the line for the tenants file",
        description="Print a fresh random token (256 bits, URL-safe) once, and the SHA-256 "
        "line to paste into the tenant's table of the tenants file.",
    )
    new.add_argument("tenant", help="tenant name, as in [tenants.NAME]")
    new.add_argument("--json", action="store_true", help="print JSON instead of text")
    new.set_defaults(func=cmd_token_new, client=False)

    tr = sub.add_parser(
        "transports",
        help="list the installed transports",
        description="URL schemes this installation can listen on and connect to, with the "
        "class behind each (built-ins and third-party plugins of the hipr.transports "
        "entry-point group alike).",
    )
    tr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tr.set_defaults(func=cmd_transports, client=False)

    add_status_parser(sub)
    add_workers_parser(sub)
    add_completion_parser(sub, parser)

    add_bench_parser(sub)
    add_proxy_parser(sub)
    add_run_parser(sub)
    return parser


# --- commands -----------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    """``hipr worker``: load the config, set up logging, serve until told to stop."""
    import anyio

    from hipr.observability.log import configure_logging, get_logger

    overrides = {
        "listen": args.listen,
        "backend": args.backend,
        "emulator_fallback": False if args.no_emulator_fallback else None,
        "log_level": args.log_level,
        "log_format": args.log_format,
    }
    config = load_config(args.config, overrides, environ=os.environ)
    configure_logging(config.log_level, config.log_format, levels=config.log_levels)
    get_logger("hipr.cli").debug("config loaded", file=args.config, config=config)

    # Imported late: the worker pulls in backends that the client commands never need.
    from hipr.worker.service import run_worker

    backend, options = event_loop(args.loop)
    anyio.run(run_worker, config, args.config, backend=backend, backend_options=options)
    return EXIT_OK


def cmd_transports(args: argparse.Namespace) -> int:
    """``hipr transports``: the installed transport plugins."""
    from hipr.transports import available_transports

    found = available_transports()
    if args.json:
        dump_json(found)
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table("scheme", "implementation", title="hipr transports")
    for scheme, target in sorted(found.items()):
        table.add_row(f"{scheme}://", target)
    Console().print(table)
    return EXIT_OK


def cmd_token_new(args: argparse.Namespace) -> int:
    """``hipr token new TENANT``: a fresh token, shown once, and its hash for the file."""
    from hipr.worker.tenants import new_token, token_hash

    token = new_token()
    digest = token_hash(token)
    if args.json:
        dump_json({"tenant": args.tenant, "token": token, "sha256": digest})
        return EXIT_OK
    print(f"token for tenant {args.tenant!r} (shown once; give it to the tenant):")
    print(f"  {token}")
    print(f"add its hash to [tenants.{args.tenant}] in the tenants file:")
    print(f'  tokens = ["{digest}"]')
    return EXIT_OK


def _protocol_text(value: Any) -> str:
    return version_text(value) if isinstance(value, int) else str(value)


def cmd_info(args: argparse.Namespace) -> int:
    """``hipr info URL``: the worker and every device, as a table or JSON."""
    urls = urls_of(args)
    if len(urls) > 1:
        return info_many(args, urls)
    args.url = urls[0]
    with connect_from_args(args) as gpu:
        worker = as_dict(gpu.worker_info())
        devices: list[dict[str, Any]] = []
        for index in range(gpu.device_count()):
            props = as_dict(gpu.device_properties(index))
            gpu.set_device(index)
            free, total = gpu.mem_get_info()
            devices.append({"index": index, **props, "memory_free": free, "memory_total": total})

    if args.json:
        dump_json({"url": args.url, "worker": worker, "devices": devices})
        return EXIT_OK

    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("worker", args.url)
    summary.add_row("backend", str(worker.get("backend", "?")))
    summary.add_row("version", str(worker.get("worker_version", "?")))
    summary.add_row("protocol", _protocol_text(worker.get("protocol", "?")))
    summary.add_row("session", str(json_default(worker.get("session_id", "?"))))
    summary.add_row("devices", str(len(devices)))
    console.print(summary)

    if devices:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("#", justify="right")
        # Folded, never cut: an arch or PCI id with an ellipsis is no use.
        table.add_column("name", overflow="fold")
        table.add_column("arch", overflow="fold")
        table.add_column("CUs", justify="right")
        table.add_column("clock", justify="right", no_wrap=True)
        table.add_column("memory free / total", justify="right")
        table.add_column("PCI bus", overflow="fold")
        for d in devices:
            clock = d.get("clock_rate_khz")
            table.add_row(
                str(d["index"]),
                str(d.get("name", "")),
                str(d.get("arch", "")),
                str(d.get("multiprocessor_count", "")),
                f"{clock / 1000:.0f} MHz" if isinstance(clock, int | float) and clock else "-",
                f"{human_size(d['memory_free'])} / {human_size(d['memory_total'])}",
                str(d.get("pci_bus_id", "")),
            )
        console.print(table)
    return EXIT_OK


def cmd_ping(args: argparse.Namespace) -> int:
    """``hipr ping URL``: round-trip times of null requests, in milliseconds."""
    rtts_ms: list[float] = []
    with connect_from_args(args) as gpu:
        if not args.json:
            print(f"PING {args.url}: {args.count} null requests", flush=True)
        for seq in range(1, args.count + 1):
            rtt_ms = float(gpu.ping()) * 1000.0
            rtts_ms.append(rtt_ms)
            if not args.json:
                print(f"seq={seq} rtt={rtt_ms:.3f} ms", flush=True)

    lo, mid, hi = min(rtts_ms), statistics.median(rtts_ms), max(rtts_ms)
    if args.json:
        dump_json(
            {
                "url": args.url,
                "count": len(rtts_ms),
                "rtt_ms": rtts_ms,
                "min_ms": lo,
                "median_ms": mid,
                "max_ms": hi,
            }
        )
        return EXIT_OK

    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD)
    for name in ("requests", "min ms", "median ms", "max ms"):
        table.add_column(name, justify="right")
    table.add_row(str(len(rtts_ms)), f"{lo:.3f}", f"{mid:.3f}", f"{hi:.3f}")
    Console(highlight=False).print(table)
    return EXIT_OK


# --- entry point --------------------------------------------------------------------


def _single_leaf(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _fail(message: object, code: int) -> int:
    text = " ".join(str(message).split()) or "failed"
    print(f"hipr: {text}", file=sys.stderr)
    return code


#: What a user can do about a quota refusal, by quota.
_QUOTA_ACTIONS = {
    "max_clients": "the worker is full; try again later",
    "max_sessions": "close another session of this tenant, or ask the operator to raise it",
    "max_device_memory": "free device memory, or ask the operator to raise it",
    "max_request_rate": "slow down, or ask the operator to raise it",
}
_SIZE_QUOTAS = frozenset({"max_device_memory", "max_inflight_bytes", "max_frame_bytes"})


def explain(exc: HipError) -> str:
    """The error's message with what to do about it: which token to check, which side to
    upgrade, which quota refused and its limit."""
    from hipr.errors import VersionMismatchError

    text = str(exc)
    details = exc.details or {}
    if isinstance(exc, AuthError) and not details.get("admin"):
        if details.get("missing") or "requires a token" in exc.message:
            # The worker's own hint speaks to API users (token=...); this is the CLI.
            return (
                "this worker requires a token and none was given: pass --token-file FILE "
                "or --token TOKEN, or set HIPR_TOKEN (make one with `hipr token new NAME` "
                "on the worker's host)"
            )
        if "--token" not in text:
            return f"{text}; check the token (HIPR_TOKEN, --token-file or --token)"
    if isinstance(exc, VersionMismatchError):
        mine = f"this client is {version_string()}"
        if "upgrade the older side" not in text:
            return f"{text}; {mine}: upgrade the older side"
        return f"{text} ({mine})"
    quota = details.get("quota")
    if quota:
        limit = details.get("limit")
        shown = human_size(limit) if quota in _SIZE_QUOTAS and isinstance(limit, int) else limit
        what = f"quota {quota} = {shown}" if limit is not None else f"quota {quota}"
        action = _QUOTA_ACTIONS.get(str(quota), "ask the worker's operator to raise it")
        return f"{text} [{what}: {action}]"
    return text


_ADDRESS_IN_USE_FIX = (
    "stop the process listening there, or choose another address "
    "(--listen, or listen / metrics_listen in the config)"
)


def _exit_code(exc: BaseException, client: bool) -> int | None:
    """The exit code and message for a failure the user should see, or None to re-raise."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, ConfigError | UsageError):
        return _fail(exc, EXIT_USAGE)
    if isinstance(exc, AuthError):
        return _fail(explain(exc), EXIT_AUTH)
    if isinstance(exc, HipConnectionError):
        return _fail(exc, EXIT_CONNECTION)
    if isinstance(exc, HipError):
        return _fail(explain(exc), EXIT_HIP_ERROR)
    if isinstance(exc, OSError):
        # A client's raw socket error is a connection error; a worker's (address in
        # use, permission denied) is a failure to start.
        detail = exc.strerror or str(exc) or type(exc).__name__
        if exc.filename:
            detail = f"{exc.filename}: {detail}"
        if exc.errno == errno.EADDRINUSE and not client:
            return _fail(f"{detail}; {_ADDRESS_IN_USE_FIX}", EXIT_ADDRESS_IN_USE)
        return _fail(detail, EXIT_CONNECTION if client else EXIT_HIP_ERROR)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hipr`` command with ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors (argparse exits 2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return func(args)
    except BaseException as exc:
        code = _exit_code(_single_leaf(exc), bool(getattr(args, "client", False)))
        if code is None:
            raise
        return code
