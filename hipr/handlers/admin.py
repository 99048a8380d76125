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
from typing import Any, Protocol

import anyio.to_thread

from hipr._version import __version__
from hipr.errors import AuthError, HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.observability.metrics import HANDLE_KINDS, tenant_usage
from hipr.observability.metrics import Worker as MetricsWorker
from hipr.observability.telemetry import device_telemetry
from hipr.protocol.header import PROTOCOL_VERSION
from hipr.protocol.opcodes import Opcode, OpcodeRange
from hipr.worker.config import WorkerConfig
from hipr.worker.session import Session


class Worker(MetricsWorker, Protocol):
    """What the status call reads of the worker behind a connection (the server
    implements it; handlers never import the server)."""

    config: WorkerConfig
    started_at: float
    bound_urls: list[str]


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


def session_status(session: Session, caller: Session) -> dict[str, Any]:
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
    }


def worker_status(worker: Worker, caller: Session) -> dict[str, Any]:
    """Sessions, tenants, uptime and identity of ``worker``: the status reply less devices."""
    sessions = list(worker.sessions.values())
    usage = tenant_usage(sessions)
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
        "sessions": [session_status(s, caller) for s in sessions],
        "tenants": tenants,
    }


@handler(Opcode.ADMIN_STATUS)
async def admin_status(session: Session, request: Request) -> Any:
    """``{admin_token}`` -> ``{worker_version, protocol, backend, started_at, uptime_s,
    listen, max_clients, sessions, tenants, devices}``.

    ``sessions``: one map per live session, ``{id, tenant, peer, device, memory,
    allocations, handles: {streams, events, modules, functions, graphs, graph_execs},
    current}`` (``current`` marks the caller's own). ``tenants``: ``{name, sessions,
    memory, max_sessions, max_device_memory}``, quotas null when unlimited. ``devices``:
    ``{index, name, pci_bus_id, memory_used, memory_total, utilization, temperature_c,
    power_w, source}``, null where the runtime does not tell (``source``: nvml, amdsmi,
    emulator or runtime). Needs the admin token: AuthError without it, or when the
    worker has no ``admin_token_sha256``.
    """
    worker = _worker_of(request)
    token = request.args.text("admin_token", default="", max_length=4096)
    check_admin_token(worker.config.admin_token_sha256, token)
    status = worker_status(worker, session)
    devices = await anyio.to_thread.run_sync(device_telemetry, worker.backend)
    status["devices"] = [d.to_wire() for d in devices]
    return status
