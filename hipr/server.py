"""The worker: listeners, one task per connection, the registry of live sessions."""

from __future__ import annotations

import ipaddress
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.abc
import structlog

import hipr.handlers  # noqa: F401  (registers every handler)
from hipr.backends.base import Backend
from hipr.config import ConfigError, WorkerConfig
from hipr.connection import WorkerConnection
from hipr.errors import HipError, QuotaError
from hipr.handlers.args import Args
from hipr.observe import NullObserver, WorkerObserver
from hipr.quotas import QuotaGate, TenantState
from hipr.session import Session
from hipr.tenants import Quotas, load_tenants
from hipr.transports import listen as transport_listen
from hipr.transports import peer_certificate_subject, peer_description, peer_uid
from hipr.transports.base import TransportConfig

log = structlog.get_logger("hipr.worker")

#: Copy chunk size announced to clients: large enough to amortise per-frame costs,
#: small enough that a copy can be refused or cancelled between chunks.
DEFAULT_CHUNK_BYTES = 1 << 20


class Worker:
    """Serves connections on behalf of one backend."""

    def __init__(self, config: WorkerConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.sessions: dict[str, Session] = {}
        self.tenants = load_tenants(config.tenants_file)
        self._tenant_state: dict[str, TenantState] = {}
        self.handshake_timeout = 10.0
        self.chunk_bytes = max(4096, min(DEFAULT_CHUNK_BYTES, config.max_frame_bytes - 65536))
        self.bound_urls: list[str] = []
        self.observer: WorkerObserver = NullObserver()

    async def open_session(self, hello: Args, stream: anyio.abc.ByteStream, peer: str) -> Session:
        """A new session for a client that sent HELLO, or a HipError refusing it."""
        tenant = self.tenants.authenticate(
            hello.text("token", default="", max_length=4096) or None,
            unix_uid=peer_uid(stream),
            cert_subject=_common_name(peer_certificate_subject(stream)),
        )
        if self.config.max_clients is not None and len(self.sessions) >= self.config.max_clients:
            raise QuotaError(
                message=f"the worker serves at most {self.config.max_clients} clients at once "
                "(max_clients)",
                quota="max_clients",
                limit=self.config.max_clients,
            )
        limit = tenant.quotas.max_sessions
        if limit is not None and len(self.tenant_sessions(tenant.name)) >= limit:
            raise QuotaError(
                message=f"tenant {tenant.name!r} is at its max_sessions quota of {limit}",
                quota="max_sessions",
                limit=limit,
            )
        gate = QuotaGate(
            tenant.name,
            partial(self.quotas_of, tenant.name),
            partial(self.tenant_sessions, tenant.name),
            self._tenant_state.setdefault(tenant.name, TenantState()),
        )
        session = Session(
            self.backend, tenant=tenant.name, peer=peer, gate=gate, observer=self.observer
        )
        self.sessions[session.id] = session
        self.observer.session_opened(tenant.name)
        return session

    def tenant_sessions(self, tenant: str) -> list[Session]:
        """The live sessions of ``tenant``."""
        return [s for s in self.sessions.values() if s.tenant == tenant]

    def quotas_of(self, tenant: str) -> Quotas:
        """``tenant``'s quotas as configured now (a removed tenant keeps none)."""
        found = self.tenants.get(tenant)
        return found.quotas if found is not None else Quotas()

    def reload_tenants(self) -> None:
        """Re-read the tenants file: new quotas and tokens apply to the next request and
        the next HELLO; live sessions stay. A broken file keeps the old registry."""
        try:
            self.tenants = load_tenants(self.config.tenants_file)
        except ConfigError as exc:
            log.error("tenants reload failed; keeping the previous tenants", error=str(exc))
            return
        log.info("tenants reloaded", tenants=sorted(self.tenants.tenants))

    def forget(self, session: Session) -> None:
        """Drop a closed session from the registry."""
        if self.sessions.pop(session.id, None) is not None:
            self.observer.session_closed(session.tenant)

    async def handle_stream(self, stream: anyio.abc.ByteStream) -> None:
        """Serve one accepted connection to its end."""
        try:
            peer = peer_description(stream)
        except Exception:
            peer = "unknown"
        try:
            await WorkerConnection(self, stream, peer).run()
        except Exception:  # one connection's failure never reaches the listener
            log.exception("connection task failed", peer=peer)

    async def serve(
        self,
        urls: Sequence[str] | None = None,
        *,
        task_status: anyio.abc.TaskStatus[list[str]] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``urls`` (default: the config's) and serve until cancelled."""
        tls = self.config.tls
        transport_config = TransportConfig(
            certfile=_path_text(tls.certfile),
            keyfile=_path_text(tls.keyfile),
            client_ca=_path_text(tls.client_ca),
            require_client_cert=tls.require_client_cert,
        )
        listeners: list[anyio.abc.Listener[Any]] = []
        urls = list(urls or self.config.listen)
        check_token_exposure(self.config, self.tenants.anonymous, urls)
        if self.tenants.anonymous:
            log.warning("no tenants file: serving one anonymous tenant without tokens or quotas")
        try:
            for url in urls:
                listener = await transport_listen(url, transport_config)
                listeners.append(listener)
                self.bound_urls.append(_bound_url(url, listener))
            for url in self.bound_urls:
                log.info("listening", url=url, backend=self.backend.name)
            async with anyio.create_task_group() as tg:
                for listener in listeners:
                    tg.start_soon(listener.serve, self.handle_stream, tg)
                task_status.started(list(self.bound_urls))
        finally:
            with anyio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()


def _path_text(path: object) -> str | None:
    return None if path is None else str(path)


def _common_name(subject: object) -> str | None:
    """The CN of a certificate subject as ``ssl`` reports it, or None."""
    if not isinstance(subject, dict):
        return None
    cn = subject.get("commonName") or subject.get("CN")
    return str(cn) if cn else None


def check_token_exposure(config: WorkerConfig, anonymous: bool, urls: Sequence[str]) -> None:
    """Refuse bearer tokens over plain TCP beyond loopback unless the config allows it:
    anyone on the path could read them. TLS and SSH carry tokens safely."""
    if anonymous or config.allow_plaintext_tokens:
        return
    for url in urls:
        if not url.startswith("tcp://"):
            continue
        host = url[len("tcp://") :].rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise ConfigError(
                f"listen {url}: tokens would cross the network in plain text; listen on "
                "tls:// (or reach the worker over ssh://), or set allow_plaintext_tokens = true"
            )


def _bound_url(url: str, listener: anyio.abc.Listener[Any]) -> str:
    """``url`` with an ephemeral port (``:0``) replaced by the port actually bound."""
    if not url.startswith(("tcp://", "tls://")) or not url.rstrip("/").endswith(":0"):
        return url
    try:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
    except Exception:
        return url
    return url.rstrip("/")[: -len(":0")] + f":{port}"


@asynccontextmanager
async def running_worker(
    config: WorkerConfig, backend: Backend, urls: Sequence[str] | None = None
) -> AsyncIterator[Worker]:
    """A worker serving in the background for the duration of the block (tests, demos)."""
    worker = Worker(config, backend)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.serve, urls)
        try:
            yield worker
        finally:
            tg.cancel_scope.cancel()


def load_configured_backend(config: WorkerConfig) -> Backend:
    """The backend the config names (``auto`` picks hip, then cuda, then emulator)."""
    from hipr.backends import load_backend

    emulator_options: dict[str, Any] = {
        "device_count": config.emulator.device_count,
        "total_memory": config.emulator.total_memory,
        "name": config.emulator.device_name,
    }
    return load_backend(config.backend, **emulator_options)


async def run_worker(config: WorkerConfig) -> None:
    """Run the worker until SIGINT or SIGTERM."""
    try:
        backend = load_configured_backend(config)
    except HipError as exc:
        log.error("backend unavailable", error=str(exc))
        raise
    log.info("backend selected", backend=backend.name, devices=backend.device_count())
    try:
        async with anyio.create_task_group() as tg:
            worker = Worker(config, backend)
            await tg.start(worker.serve)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("stopping", signal=signal.Signals(signum).name)
                    tg.cancel_scope.cancel()
                    break
    finally:
        backend.close()
        log.info("stopped")
