"""Admin requests (0x07xx): the worker's status, for ``hipr status`` and dashboards.

Admin calls travel inside an ordinary session (the tenant token opens it) and carry a
second credential, the admin token, checked against the worker config's
``admin_token_sha256`` by hash, in constant time. A worker without an admin token
refuses every admin call: status shows every tenant's sessions and peers.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Any, Protocol

import anyio.to_thread
import structlog

from hipr._version import __version__
from hipr.errors import AuthError, HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.observability.isolation_figures import isolation_figures
from hipr.observability.metrics import (
    HANDLE_KINDS,
    ChildFigures,
    add_child_usage,
    child_figures,
    pinned_payload_figures,
    tenant_usage,
)
from hipr.observability.metrics import Worker as MetricsWorker
from hipr.observability.telemetry import device_telemetry
from hipr.protocol import messages as m
from hipr.protocol.header import PROTOCOL_VERSION
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.state import Session


class AdminConfig(Protocol):
    """What admin calls read of the worker's configuration (``hipr.worker.config``'s
    ``WorkerConfig`` has it; handlers never import the worker)."""

    @property
    def max_clients(self) -> int | None: ...
    @property
    def admin_token_sha256(self) -> str | None: ...


class Worker(MetricsWorker, Protocol):
    """What the status call reads of the worker behind a connection (the server
    implements it; handlers never import the server)."""

    @property
    def config(self) -> AdminConfig: ...

    started_at: float
    bound_urls: list[str]
    #: The event loop's busy polling (its ``seconds``: ``spin_wait`` in force).
    busy_poll: BusyPoll


OPCODE_RANGE = OpcodeRange.ADMIN

#: How to turn admin calls on, for the refusal a worker without an admin token sends.
HOW_TO_CONFIGURE = (
    "admin calls are disabled on this worker: make a token with `hipr token new admin`, "
    'put its sha256 in the worker config as admin_token_sha256 = "..." and restart the '
    "worker; then pass the token with --admin-token or HIPR_ADMIN_TOKEN"
)


def check_admin_token(expected_sha256: str | None, token: str) -> None:
    """Refuse (AuthError) unless ``token`` hashes to ``expected_sha256``."""
    if not expected_sha256:
        raise AuthError(message=HOW_TO_CONFIGURE, admin=True)
    digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
    if not token or not hmac.compare_digest(digest, expected_sha256):
        raise AuthError(
            message="the admin token is missing or wrong: check the admin token "
            "(HIPR_ADMIN_TOKEN or --admin-token)",
            admin=True,
        )


def _worker_of(request: Request) -> Worker:
    worker = getattr(request.link, "worker", None)
    if worker is None:
        raise HipError(HipErrorCode.hipErrorNotSupported, "no worker behind this connection")
    return worker  # type: ignore[no-any-return]


def session_status(session: Session, caller: Session | None) -> dict[str, Any]:
    """One session's row of the status reply."""
    return {
        "id": session.id,
        "tenant": session.tenant,
        "peer": session.peer,
        "device": session.device,
        "memory": session.allocations.total_bytes,
        "allocations": len(session.allocations),
        "handles": {kind: len(getattr(session, kind)) for kind in HANDLE_KINDS},
        "current": session is caller,
        # Further connections carrying its striped copies (protocol 1.4).
        "data_links": session.stripes.links,
        # Work running past its rules (hipr/worker/runaway.py), else None.
        "runaway": session.runaway,
    }


def child_row(child: ChildFigures) -> dict[str, Any]:
    """One tenant child worker's row of the status reply."""
    return {
        "tenant": child.tenant,
        "pid": child.pid,
        "rss": child.rss,
        "sessions": len(child.sessions),
        "memory": sum(int(s.get("memory", 0)) for s in child.sessions),
        "error": child.error,
    }


def worker_status(
    worker: Worker, caller: Session | None, children: Sequence[ChildFigures] = ()
) -> dict[str, Any]:
    """Sessions, tenants, uptime and identity of ``worker`` and its tenant child workers
    (``children``, whose sessions count as the worker's): the status reply less devices."""
    sessions = list(worker.sessions.values())
    usage = tenant_usage(sessions)
    add_child_usage(usage, children)
    tenants = []
    for name in sorted(set(worker.tenants.tenants) | set(usage)):
        quotas = worker.quotas_of(name)
        used = usage.get(name)
        tenants.append(
            {
                "name": name,
                "sessions": used.sessions if used else 0,
                "memory": used.memory if used else 0,
                "max_sessions": quotas.max_sessions,
                "max_device_memory": quotas.max_device_memory,
            }
        )
    return {
        "worker_version": __version__,
        "protocol": PROTOCOL_VERSION,
        "backend": worker.backend.name,
        "started_at": worker.started_at,
        "uptime_s": max(0.0, time.time() - worker.started_at),
        "listen": list(worker.bound_urls),
        "max_clients": worker.config.max_clients,
        "sessions": [session_status(s, caller) for s in sessions]
        + [row for child in children for row in child.sessions],
        "tenants": tenants,
        "children": [child_row(child) for child in children],
        "pinned_payload_buffers": pinned_payload_figures(worker.backend),
        # The event loop's spin window in force ("auto" resolved for this machine).
        "spin_wait": worker.busy_poll.seconds,
        **isolation_figures(worker),
        "runaway": runaway_status(worker),
    }


def runaway_status(worker: object) -> dict[str, Any]:
    """Runaway GPU work: running past its rules now, and over (see
    hipr/worker/runaway.py); empty for a worker that does not watch."""
    status = getattr(worker, "runaway_status", None)
    return status() if status is not None else {"active": [], "stopped": [], "stopped_total": []}


async def _whole_status_from_parent(worker: Worker, caller: Session) -> dict[str, Any] | None:
    """In a tenant's child worker (process isolation), the whole worker's status as the
    parent sees it, the caller's session marked; None in any other worker, or when the
    parent cannot tell (this child's own view is then shown)."""
    ask = getattr(worker, "status_from_parent", None)
    if ask is None:
        return None
    try:
        status = await ask()
    except (OSError, TimeoutError, ValueError) as exc:
        structlog.get_logger("hipr.admin").warning("parent status unavailable", error=str(exc))
        return None
    if not isinstance(status, dict):
        return None
    for row in status.get("sessions") or []:
        if isinstance(row, dict):
            row["current"] = row.get("id") == caller.id
    return status


@handler(m.AdminStatus)
async def admin_status(session: Session, request: Request) -> Any:
    """``{admin_token}`` -> ``{worker_version, protocol, backend, started_at, uptime_s,
    listen, max_clients, sessions, tenants, children, pinned_payload_buffers, devices}``.

    ``sessions``: one map per live session, ``{id, tenant, peer, device, memory,
    allocations, handles: {streams, events, modules, functions, graphs, graph_execs},
    current, data_links}`` (``current`` marks the caller's own); with ``isolation = "process"`` the
    sessions of the tenant child workers too, each with its ``worker_pid``.
    ``children``: ``{tenant, pid, rss, sessions, memory, error}`` per tenant child
    worker (``error`` when it did not answer: its last figures are shown).
    ``tenants``: ``{name, sessions, memory, max_sessions, max_device_memory}``, quotas
    null when unlimited, child workers' sessions included. ``pinned_payload_buffers``:
    ``{held, in_use, bytes}`` of the page-locked buffers uploads and downloads go
    through (``pinned_payload_bytes``), null on a backend without them. ``devices``:
    ``{index, name, pci_bus_id, memory_used, memory_total, utilization, temperature_c,
    power_w, source}``, null where the runtime does not tell (``source``: nvml, amdsmi,
    emulator or runtime). Needs the admin token: AuthError without it, or when the
    worker has no ``admin_token_sha256``.
    """
    worker = _worker_of(request)
    token = request.args.text(m.AdminStatus.admin_token, default="", max_length=4096)
    check_admin_token(worker.config.admin_token_sha256, token)
    status = await _whole_status_from_parent(worker, session)
    if status is None:
        poll = getattr(worker, "poll_children", None)
        # Asked now rather than read from the metrics' cache: status is what an operator
        # looks at while acting, and a few child round trips are cheap.
        children = await poll() if poll is not None else child_figures(worker)
        status = worker_status(worker, session, children)
    devices = await anyio.to_thread.run_sync(device_telemetry, worker.backend)
    status["devices"] = [d.to_wire() for d in devices]
    return status
