"""``hipr info`` and ``hipr status`` over several workers: one table for all of them.

Each worker gets a session of its own, one after the other, so an unreachable worker
is a row saying so rather than the end of the command (the exit code still tells:
3 when any worker could not be reached). Device numbers are those a multi-worker
client (``hipr.connect([...])``) gives: the workers' devices in the order of the URLs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from hipr.cli.common import (
    EXIT_CONNECTION,
    EXIT_OK,
    as_dict,
    connect_from_args,
    dump_json,
    human_duration,
    human_size,
)
from hipr.client.multi import split_urls
from hipr.errors import HipConnectionError, HipError


def urls_of(args: argparse.Namespace) -> list[str]:
    """The worker URLs of ``args.url`` (one or more arguments, each maybe with commas)."""
    return split_urls(args.url)


@dataclass
class WorkerReport:
    """What one worker told (or why it could not be asked)."""

    url: str
    first_device: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


def _connect_one(args: argparse.Namespace, url: str) -> Any:
    one = argparse.Namespace(**{**vars(args), "url": url})
    return connect_from_args(one)


def _exit(reports: list[WorkerReport]) -> int:
    return EXIT_CONNECTION if any(r.error for r in reports) else EXIT_OK


def _number(reports: list[WorkerReport]) -> None:
    """Give each worker its first client-wide ordinal (unreachable ones count none)."""
    first = 0
    for r in reports:
        r.first_device = first
        for d in r.devices:
            d["device"] = first + int(d.get("index", 0))
        first += len(r.devices)


def _gather(
    args: argparse.Namespace,
    urls: list[str],
    read: Callable[[Any, WorkerReport], None],
    errors: tuple[type[Exception], ...],
) -> list[WorkerReport]:
    """Each worker's report, numbered: ``read`` fills it in over a session of its own;
    one of ``errors`` becomes the report's error instead of the command's end."""
    reports = []
    for url in urls:
        report = WorkerReport(url)
        try:
            with _connect_one(args, url) as gpu:
                read(gpu, report)
        except errors as exc:
            report.error = str(exc)
        reports.append(report)
    _number(reports)
    return reports


def _printed_as_json(
    args: argparse.Namespace, urls: list[str], reports: list[WorkerReport]
) -> bool:
    """With ``--json``, the reports printed as one document (True); else nothing."""
    if args.json:
        dump_json({"urls": urls, "workers": [vars(r) for r in reports]})
    return bool(args.json)


def _table() -> Table:
    """The table of devices, its first columns (the client-wide device number, the
    worker, the worker's own device number) given."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("worker", overflow="fold")
    table.add_column("dev", justify="right")
    return table


# --- info ---------------------------------------------------------------------------


def info_many(args: argparse.Namespace, urls: list[str]) -> int:
    """``hipr info URL URL ...``: every worker's devices in one table."""

    def read(gpu: Any, report: WorkerReport) -> None:
        report.info = as_dict(gpu.worker_info())
        for index in range(gpu.device_count()):
            props = as_dict(gpu.device_properties(index))
            gpu.set_device(index)
            free, total = gpu.mem_get_info()
            report.devices.append(
                {"index": index, **props, "memory_free": free, "memory_total": total}
            )

    reports = _gather(args, urls, read, (HipConnectionError, OSError))
    if _printed_as_json(args, urls, reports):
        return _exit(reports)
    console = Console(highlight=False)
    table = _table()
    table.add_column("backend")
    table.add_column("name", overflow="fold")
    table.add_column("arch", overflow="fold")
    table.add_column("memory free / total", justify="right")
    for r in reports:
        if r.error:
            table.add_row("-", r.url, "-", "-", f"unreachable: {r.error}", "", "")
            continue
        for d in r.devices:
            table.add_row(
                str(d["device"]),
                r.url,
                str(d["index"]),
                str(r.info.get("backend", "?")),
                str(d.get("name", "")),
                str(d.get("arch", "")),
                f"{human_size(d['memory_free'])} / {human_size(d['memory_total'])}",
            )
    console.print(table)
    devices = sum(len(r.devices) for r in reports)
    reachable = sum(1 for r in reports if not r.error)
    console.print(f"{devices} devices on {reachable} of {len(reports)} workers")
    return _exit(reports)


# --- status -------------------------------------------------------------------------


def status_many(args: argparse.Namespace, urls: list[str], token: str) -> int:
    """``hipr status URL URL ...``: every worker's sessions and devices in one table."""

    def read(gpu: Any, report: WorkerReport) -> None:
        report.info = dict(gpu.admin_status(token))
        report.devices = [dict(d) for d in report.info.get("devices") or []]

    # A HipError too (e.g. a wrong admin token on one worker) is that worker's row.
    reports = _gather(args, urls, read, (HipError, OSError))
    if _printed_as_json(args, urls, reports):
        return _exit(reports)
    console = Console(highlight=False)
    table = _table()
    table.add_column("name", overflow="fold")
    table.add_column("util", justify="right")
    table.add_column("memory used / total", justify="right")
    table.add_column("sessions", justify="right")
    table.add_column("backend / uptime")
    for r in reports:
        if r.error:
            table.add_row("-", r.url, "-", f"unreachable: {r.error}", "", "", "", "")
            continue
        sessions = list(r.info.get("sessions") or [])
        per_device: dict[Any, int] = {}
        for s in sessions:
            per_device[s.get("device")] = per_device.get(s.get("device"), 0) + 1
        uptime = r.info.get("uptime_s")
        up = human_duration(uptime) if isinstance(uptime, int | float) else "?"
        about = f"{r.info.get('backend', '?')}, up {up}"
        for d in r.devices:
            used, total = d.get("memory_used"), d.get("memory_total")
            util = d.get("utilization")
            table.add_row(
                str(d["device"]),
                r.url,
                str(d.get("index", "")),
                str(d.get("name", "")),
                "-" if util is None else f"{float(util):.0f}%",
                "-"
                if used is None or total is None
                else f"{human_size(used)} / {human_size(total)}",
                str(per_device.get(d.get("index"), 0)),
                about,
            )
    console.print(table)
    total = sum(len(r.info.get("sessions") or []) for r in reports if not r.error)
    reachable = sum(1 for r in reports if not r.error)
    console.print(f"{total} sessions on {reachable} of {len(reports)} workers")
    return _exit(reports)
