"""``hipr status``: a worker's status (the ADMIN_STATUS reply) as rich tables.

Kept apart from :mod:`hipr.cli` so that the rendering can be tested on a plain dict and
the CLI module stays about arguments and exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from hipr.cli.common import (
    EXIT_OK,
    add_client_options,
    connect_from_args,
    dump_json,
    human_duration,
    human_size,
    positive_float,
    positive_int,
)
from hipr.cli.fleet import status_many, urls_of
from hipr.cli.runaway_view import runaway_table
from hipr.errors import HipConnectionError
from hipr.protocol.header import version_text
from hipr.worker.config import ConfigError


def _of(used: int | float | None, limit: int | float | None, fmt: Callable[[Any], str]) -> str:
    """``used / limit (pct%)``, or ``used`` alone when unlimited."""
    if limit is None:
        return fmt(used)
    pct = f" ({100 * (used or 0) / limit:.0f}%)" if limit else ""
    return f"{fmt(used)} / {fmt(limit)}{pct}"


def _opt(value: Any, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{float(value):.{digits}f}{unit}"


def render_status(status: dict[str, Any], url: str, footer: str = "") -> RenderableType:
    """The whole status page: summary, devices, tenants, tenant workers, sessions."""
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("worker", url)
    summary.add_row("backend", str(status.get("backend", "?")))
    protocol = status.get("protocol")
    summary.add_row(
        "version",
        f"{status.get('worker_version', '?')} (protocol "
        f"{version_text(protocol) if isinstance(protocol, int) else '?'})",
    )
    uptime = status.get("uptime_s")
    summary.add_row("uptime", human_duration(uptime) if isinstance(uptime, int | float) else "?")
    sessions = list(status.get("sessions") or [])
    max_clients = status.get("max_clients")
    summary.add_row("sessions", _of(len(sessions), max_clients, str))
    listen = status.get("listen") or []
    if listen:
        summary.add_row("listening", ", ".join(map(str, listen)))
    pinned = status.get("pinned_payload_buffers")
    if isinstance(pinned, dict):
        summary.add_row(
            "pinned buffers",
            f"{pinned.get('in_use', '?')} / {pinned.get('held', '?')} in use "
            f"({human_size(int(pinned.get('bytes', 0)))} page-locked)",
        )
    isolation = status.get("isolation")
    if isolation:
        summary.add_row("isolation", str(isolation))
    resets = status.get("context_resets")
    if isinstance(resets, dict) and resets:
        summary.add_row("context resets", ", ".join(f"{t}: {n}" for t, n in sorted(resets.items())))
    warning = status.get("isolation_warning")
    if warning:
        summary.add_row("[bold red]WARNING[/]", f"[red]{warning}[/]")
    parts: list[RenderableType] = [summary]

    devices = list(status.get("devices") or [])
    if devices:
        table = Table(title="devices", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("#", justify="right")
        table.add_column("name", overflow="fold")
        table.add_column("util", justify="right")
        table.add_column("memory used / total", justify="right")
        table.add_column("temp", justify="right")
        table.add_column("power", justify="right")
        table.add_column("source")
        for d in devices:
            table.add_row(
                str(d.get("index", "")),
                str(d.get("name", "")),
                _opt(d.get("utilization"), "%"),
                _of(d.get("memory_used"), d.get("memory_total"), human_size),
                _opt(d.get("temperature_c"), " °C"),
                _opt(d.get("power_w"), " W"),
                str(d.get("source", "")),
            )
        parts.append(table)

    tenants = list(status.get("tenants") or [])
    if tenants:
        table = Table(title="tenants", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("tenant")
        table.add_column("sessions", justify="right")
        table.add_column("device memory / quota", justify="right")
        for t in tenants:
            table.add_row(
                str(t.get("name", "")),
                _of(t.get("sessions", 0), t.get("max_sessions"), str),
                _of(t.get("memory", 0), t.get("max_device_memory"), human_size),
            )
        parts.append(table)

    children = list(status.get("children") or [])
    if children:
        # isolation = "process": each tenant's sessions run in a worker of its own.
        table = Table(
            title="tenant workers", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
        )
        table.add_column("tenant")
        table.add_column("pid", justify="right")
        table.add_column("sessions", justify="right")
        table.add_column("device memory", justify="right")
        table.add_column("RSS", justify="right")
        table.add_column("state", overflow="fold")
        for c in children:
            table.add_row(
                str(c.get("tenant", "")),
                str(c.get("pid", "")),
                str(c.get("sessions", 0)),
                human_size(c.get("memory", 0)),
                human_size(c.get("rss", 0)),
                f"not answering: {c['error']}" if c.get("error") else "ok",
            )
        parts.append(table)

    runaway = runaway_table(status)
    if runaway is not None:
        parts.append(runaway)

    table = Table(title="sessions", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # Ids and numbers are never cut; tenant and peer fold onto a second line if need be.
    table.add_column("session", no_wrap=True)
    table.add_column("tenant", overflow="fold")
    table.add_column("peer", overflow="fold")
    table.add_column("dev", justify="right", no_wrap=True)
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("allocs", justify="right", no_wrap=True)
    table.add_column("handles", justify="right", no_wrap=True)
    for s in sessions:
        handles = s.get("handles") or {}
        marker = "*" if s.get("current") else ""
        table.add_row(
            f"{s.get('id', '')}{marker}",
            str(s.get("tenant", "")),
            str(s.get("peer", "")),
            str(s.get("device", "")),
            human_size(s.get("memory", 0)),
            str(s.get("allocations", 0)),
            str(sum(n for k, n in handles.items() if k != "functions" and isinstance(n, int))),
        )
    parts.append(table)
    if any(s.get("current") for s in sessions):
        parts.append(
            Text(
                "* this status request's own session; handles: streams, events, modules, "
                "graphs and graph execs (--json has each)",
                style="dim",
            )
        )
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def print_status(status: dict[str, Any], url: str, console: Console | None = None) -> None:
    """Print the status page once."""
    (console or Console(highlight=False)).print(render_status(status, url))


def stamp() -> str:
    """The local time, for the --watch footer."""
    return time.strftime("%H:%M:%S")


# --- the command ----------------------------------------------------------------------


def add_status_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hipr status`` to the CLI's subcommands."""

    s = sub.add_parser(
        "status",
        help="show a worker's sessions, tenants and devices (admin)",
        description="Show the worker's sessions, tenants with memory against quota, uptime, "
        "backend and devices (utilisation, memory, temperature, power where the runtime "
        "tells). Needs the worker's admin token (admin_token_sha256 in its config).",
    )
    add_client_options(s, several=True)
    s.add_argument(
        "--admin-token",
        help="the worker's admin token (prefer the HIPR_ADMIN_TOKEN environment variable)",
    )
    s.add_argument(
        "-w", "--watch", action="store_true", help="refresh as a live table until Ctrl-C"
    )
    s.add_argument(
        "--interval",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between refreshes with --watch (default 1)",
    )
    s.add_argument(
        "--count",
        type=positive_int,
        metavar="N",
        help="with --watch: stop after N refreshes (default: until Ctrl-C)",
    )
    s.set_defaults(func=cmd_status, client=True)


def cmd_status(args: argparse.Namespace) -> int:
    """``hipr status URL``: the status page once, or refreshed with ``--watch``;
    ``--json`` prints the reply (one JSON object a line with ``--watch``)."""

    token = (
        args.admin_token if args.admin_token is not None else os.environ.get("HIPR_ADMIN_TOKEN", "")
    )
    urls = urls_of(args)
    if len(urls) > 1:
        if args.watch:
            raise ConfigError("--watch takes one worker URL; without it, several give one table")
        return status_many(args, urls, token)
    args.url = urls[0]
    if args.watch:
        return _watch(args, token)
    with connect_from_args(args) as gpu:
        status = gpu.admin_status(token)
    if args.json:
        dump_json({"url": args.url, **status})
    else:
        print_status(status, args.url)
    return EXIT_OK


def _watch(args: argparse.Namespace, token: str) -> int:
    """Poll once per interval over one session; a lost link is shown and retried."""
    from rich.live import Live

    console = Console(highlight=False)
    refreshes = 0
    gpu: Any = None
    live = None if args.json else Live(console=console, auto_refresh=False)
    try:
        if live is not None:
            live.start()
        while True:
            try:
                if gpu is None:
                    gpu = connect_from_args(args)
                status = gpu.admin_status(token)
            except HipConnectionError as exc:
                _close(gpu)
                gpu = None
                if live is None:
                    raise
                live.update(
                    Text(f"{args.url}: {exc}\nretrying every {args.interval:g} s; Ctrl-C to stop"),
                    refresh=True,
                )
            else:
                if live is None:
                    print(json.dumps({"url": args.url, "time": time.time(), **status}), flush=True)
                else:
                    footer = f"{stamp()}: refreshing every {args.interval:g} s; Ctrl-C to stop"
                    live.update(render_status(status, args.url, footer), refresh=True)
            refreshes += 1
            if args.count is not None and refreshes >= args.count:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass  # the way to stop watching, not a failure
    finally:
        if live is not None:
            live.stop()
        _close(gpu)
    return EXIT_OK


def _close(gpu: Any) -> None:
    if gpu is None:
        return
    close = getattr(gpu, "close", None)
    if callable(close):
        close()
    else:
        gpu.__exit__(None, None, None)
