"""How a tenant's child worker retires itself, and how its parent learns why.

Under ``isolation = "process"`` (or ``"session"``) a child worker ends its own process
when that is the only way back to a usable GPU: a kernel fault poisoned its context
(``hipr.worker.recovery``), or GPU work runs that nothing short of tearing the context
down stops (``hipr.worker.runaway``). Whatever the reason, a child retires one way:

1. it leaves a :class:`Retirement` record beside its listening socket
   (``<socket>`` + :data:`RECORD_SUFFIX`, written whole and renamed into place): the
   tenant, the reason, and the reason's details;
2. it removes the socket: the parent (``TenantProcesses``) sends no more connections
   there and starts a fresh child for the tenant's next one;
3. it tells its sessions, then exits with :data:`RETIRE_EXIT_STATUS`.

The parent takes the record when it drops the child (:func:`take_record`) and counts
it by reason: a context reset, or runaway work stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("hipr.retirement")

#: The exit status of a child that retired (EX_TEMPFAIL: a fresh process works).
RETIRE_EXIT_STATUS = 75
#: The record sits at ``<listening socket><RECORD_SUFFIX>``.
RECORD_SUFFIX = ".retired.json"
#: A kernel fault poisoned the child's GPU context.
CONTEXT_LOST = "context lost"
#: The child ended to stop runaway GPU work.
RUNAWAY = "runaway"


@dataclass(frozen=True, slots=True)
class Retirement:
    """Why a child retired: :data:`CONTEXT_LOST` or :data:`RUNAWAY`, with details (for a
    runaway, the stopped work's status row)."""

    tenant: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


def record_path(socket_path: str | Path) -> Path:
    """Where the child listening on ``socket_path`` leaves its record."""
    return Path(f"{socket_path}{RECORD_SUFFIX}")


def unix_paths(listen: Iterable[str]) -> list[Path]:
    """The Unix socket paths among ``listen`` URLs (a child listens on one)."""
    return [Path(url[len("unix://") :]) for url in listen if url.startswith("unix://")]


def retire_listeners(listen: Iterable[str], retirement: Retirement) -> None:
    """In a retiring child: leave ``retirement`` beside each Unix listening socket, then
    remove the socket (the listener itself stays until exit; nobody can reach it)."""
    for path in unix_paths(listen):
        if not path.exists():
            continue  # retired already, for another reason: the first one stands
        # The record first: a parent that finds the socket gone reads why at once.
        record = record_path(path)
        partial = record.with_name(record.name + ".partial")
        try:
            partial.write_text(
                json.dumps(
                    {
                        "tenant": retirement.tenant,
                        "reason": retirement.reason,
                        "details": retirement.details,
                    }
                )
            )
            os.replace(partial, record)
        except OSError as exc:
            log.warning("could not leave the retirement record", error=str(exc))
        with contextlib.suppress(OSError):
            path.unlink()


def take_record(socket_path: str | Path) -> Retirement | None:
    """In the parent: the record the child on ``socket_path`` left (removed once read),
    or None when it left none (it crashed, or was killed)."""
    record = record_path(socket_path)
    try:
        row = json.loads(record.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("unreadable retirement record", path=str(record), error=str(exc))
        row = None
    with contextlib.suppress(OSError):
        record.unlink()
    if not isinstance(row, dict):
        return None
    details = row.get("details")
    return Retirement(
        str(row.get("tenant", "")),
        str(row.get("reason", "")),
        details if isinstance(details, dict) else {},
    )
