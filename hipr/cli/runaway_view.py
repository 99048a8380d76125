"""The runaway part of ``hipr status``: GPU work running past its rules, and what ended."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table


def _seconds(value: Any) -> str:
    try:
        return f"{float(value):.1f} s"
    except (TypeError, ValueError):
        return "?"


def runaway_table(status: dict[str, Any]) -> Table | None:
    """A table of runaway work (now, then the last that ended), or None when there is
    none to show."""
    section = status.get("runaway") or {}
    active = list(section.get("active") or [])
    stopped = list(section.get("stopped") or [])
    if not active and not stopped:
        return None
    table = Table(title="runaway GPU work", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("tenant", overflow="fold")
    table.add_column("session", no_wrap=True)
    table.add_column("why")
    table.add_column("for", justify="right", no_wrap=True)
    table.add_column("state", overflow="fold")
    for row in active:
        table.add_row(
            str(row.get("tenant", "")),
            str(row.get("session", "")),
            str(row.get("reason", "")),
            _seconds(row.get("seconds")),
            f"running: {row.get('action', '')}",
            style="bold red",
        )
    for row in stopped[-10:]:
        table.add_row(
            str(row.get("tenant", "")),
            str(row.get("session", "")),
            str(row.get("reason", "")),
            _seconds(row.get("seconds")),
            f"over: {row.get('how', '')}",
        )
    return table
