"""``isolation = "process"``: each tenant's sessions run in a worker process of its own.

A kernel is code: inside one process it can address any device memory of that process,
whatever the worker checks on the wire. With process isolation the worker that
listens only authenticates; it then relays each connection, byte for byte, to a child
worker that serves that tenant alone (its own GPU context, its own address space), so
one tenant's kernels can neither read another's memory nor crash another's sessions.

The child is an ordinary ``hipr worker`` on a private Unix socket, configured with only
its tenant (same quotas) and a token known to the parent alone; quotas, resume and
exactly-once all work there unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import anyio
import anyio.abc
import structlog

from hipr.errors import HipError, HipErrorCode
from hipr.worker.config import WorkerConfig
from hipr.worker.tenants import Quotas, Tenant, new_token, token_hash

log = structlog.get_logger("hipr.isolation")

#: How long a tenant's worker may take to start listening.
START_TIMEOUT = 60.0


@dataclass(slots=True)
class TenantProcess:
    """A running child worker of one tenant."""

    tenant: str
    process: anyio.abc.Process
    url: str
    token: str


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _quota_lines(quotas: Quotas) -> list[str]:
    return [
        f"{f.name} = {_toml_value(getattr(quotas, f.name))}"
        for f in fields(quotas)
        if getattr(quotas, f.name) is not None
    ]


class TenantProcesses:
    """Starts, finds and stops the per-tenant child workers."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._dir = Path(tempfile.mkdtemp(prefix="hipr-tenants-"))
        os.chmod(self._dir, 0o700)
        self._children: dict[str, TenantProcess] = {}
        self._lock = anyio.Lock()
        #: Which tenant's process holds each session, for routing RESUME.
        self.session_tenants: dict[str, str] = {}

    def child_pid(self, tenant: str) -> int | None:
        """The pid of ``tenant``'s worker process, if one runs."""
        child = self._children.get(tenant)
        return None if child is None or child.process.returncode is not None else child.process.pid

    async def child_for(self, tenant: Tenant) -> TenantProcess:
        """``tenant``'s worker process, started if it is not running."""
        async with self._lock:
            child = self._children.get(tenant.name)
            if child is None or child.process.returncode is not None:
                if child is not None:
                    log.warning("tenant worker exited; starting a new one", tenant=tenant.name)
                    self.session_tenants = {
                        s: t for s, t in self.session_tenants.items() if t != tenant.name
                    }
                child = await self._start(tenant)
                self._children[tenant.name] = child
            return child

    def _write_config(self, tenant: Tenant, token: str, socket_path: Path) -> Path:
        config = self.config
        tenants_path = self._dir / f"{tenant.name}.tenants.toml"
        tenants_path.write_text(
            "\n".join(
                [
                    f"[tenants.{json.dumps(tenant.name)}]",
                    f'tokens = ["{token_hash(token)}"]',
                    *_quota_lines(tenant.quotas),
                ]
            )
            + "\n"
        )
        worker_path = self._dir / f"{tenant.name}.worker.toml"
        lines = [
            f"listen = [{_toml_value('unix://' + str(socket_path))}]",
            f"backend = {_toml_value(config.backend)}",
            f"max_frame_bytes = {config.max_frame_bytes}",
            f"heartbeat_interval = {config.heartbeat_interval!r}",
            f"heartbeat_timeout = {config.heartbeat_timeout!r}",
            f"resume_grace = {config.resume_grace!r}",
            f"shutdown_timeout = {config.shutdown_timeout!r}",
            f"tenants_file = {_toml_value(tenants_path)}",
            f"log_level = {_toml_value(config.log_level)}",
            f"log_format = {_toml_value(config.log_format)}",
            "[emulator]",
            f"device_count = {config.emulator.device_count}",
            f"total_memory = {config.emulator.total_memory}",
            f"device_name = {_toml_value(config.emulator.device_name)}",
        ]
        worker_path.write_text("\n".join(lines) + "\n")
        return worker_path

    async def _start(self, tenant: Tenant) -> TenantProcess:
        token = new_token()
        socket_path = self._dir / f"{tenant.name}.sock"
        socket_path.unlink(missing_ok=True)
        config_path = self._write_config(tenant, token, socket_path)
        process = await anyio.open_process(
            [sys.executable, "-m", "hipr", "worker", "--config", str(config_path)],
            stdin=None,
            stdout=None,
            stderr=None,
        )
        with anyio.move_on_after(START_TIMEOUT):
            # Polled: a socket file appearing has no event to wait on.
            while not socket_path.exists() and process.returncode is None:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        if not socket_path.exists():
            if process.returncode is None:
                process.kill()
            await process.wait()
            raise HipError(
                HipErrorCode.hipErrorNotInitialized,
                f"the worker process of tenant {tenant.name!r} did not start "
                f"(exit status {process.returncode}); see the worker's log",
            )
        log.info("tenant worker started", tenant=tenant.name, pid=process.pid)
        return TenantProcess(tenant.name, process, f"unix://{socket_path}", token)

    async def aclose(self) -> None:
        """Stop every child (SIGTERM: they drain and tell their clients), then clean up."""
        children = list(self._children.values())
        self._children.clear()
        for child in children:
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(self.config.shutdown_timeout + 5):
            for child in children:
                await child.process.wait()
        for child in children:
            if child.process.returncode is None:
                child.process.kill()
                await child.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
