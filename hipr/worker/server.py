"""The worker: listeners, one task per connection, the registry of live sessions."""

from __future__ import annotations

import dataclasses
import gc
import hmac
import ipaddress
import os
import signal
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

import hipr.handlers  # noqa: F401  (registers every handler)
from hipr.backends.interface import Backend
from hipr.errors import AuthError, HipError, QuotaError, SessionLostError
from hipr.handlers.admin import session_status, worker_status
from hipr.handlers.args import Args
from hipr.observability.log import set_levels
from hipr.observability.observer import NullObserver, WorkerObserver
from hipr.protocol import messages as m
from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.module_store import StoreFigures
from hipr.sessions.quotas import QuotaGate, TenantState
from hipr.sessions.state import Session
from hipr.transports import listen as transport_listen
from hipr.transports import peer_certificate_subject, peer_description, peer_uid
from hipr.transports.base import TransportConfig
from hipr.worker.admission import (
    Admission,
    AuthBackoff,
    PendingCaps,
    open_file_limit,
    source_of,
)
from hipr.worker.client_link import WorkerConnection
from hipr.worker.config import ConfigError, WorkerConfig, load_config, spin_seconds
from hipr.worker.fairness import FairScheduler
from hipr.worker.heap_trim import trim_heap
from hipr.worker.isolation import (
    ChildLink,
    ChildStatus,
    TenantProcesses,
    fetch_json,
    serve_json,
)
from hipr.worker.recovery import ContextRecovery
from hipr.worker.retirement import RUNAWAY, Retirement, retire_listeners
from hipr.worker.runaway import RunawayLedger, RunawayWatch, StoppedWork, stopped_from_wire
from hipr.worker.sharing import resolve_isolation, warn_if_shared
from hipr.worker.tenants import Quotas, Tenant, load_tenants

log = structlog.get_logger("hipr.worker")

#: Copy chunk size announced to clients: large enough to amortise per-frame costs,
#: small enough that a copy can be refused or cancelled between chunks.
DEFAULT_CHUNK_BYTES = 4 << 20
#: Room in a frame beside its chunk of bulk bytes: the header and the CBOR arguments.
FRAME_HEADROOM = 64 << 10
#: Seconds without a session before freed memory goes back to the OS: long enough that
#: a client reconnecting at once does not pay for it, short enough to follow a burst.
IDLE_TRIM_DELAY = 1.0
#: Seconds a stop waits for detached sessions to be freed once the drain is over.
CLOSE_WAIT = 2.0
#: Connections ended before their handshake was over after which the worker trims its
#: heap once none is left under way (a flood's buffers, back to the OS).
TRIM_AFTER_HANDSHAKES = 256


class Worker:
    """Serves connections on behalf of one backend."""

    def __init__(self, config: WorkerConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.sessions: dict[str, Session] = {}
        self.tenants = load_tenants(config.tenants_file)
        self._tenant_state: dict[str, TenantState] = {}
        #: Turns between connections that flood the loop (``hipr.worker.fairness``).
        self.fair = FairScheduler()
        self.handshake_timeout = config.handshake_timeout
        #: Unfinished handshakes, capped in all and per source (hipr.worker.admission).
        self.admission = Admission(
            PendingCaps.derive(
                config.max_pending_handshakes,
                config.max_pending_handshakes_per_peer,
                open_file_limit(),
            )
        )
        self.auth_backoff = AuthBackoff(config.auth_failure_delay, config.auth_failure_max_delay)
        self.chunk_bytes = max(
            4096, min(DEFAULT_CHUNK_BYTES, config.max_frame_bytes - FRAME_HEADROOM)
        )
        self.bound_urls: list[str] = []
        self.observer: WorkerObserver = NullObserver()
        self.connections: set[WorkerConnection] = set()
        #: Set by :meth:`shutdown`: sessions then end instead of waiting for a resume.
        self.draining = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._listen_scope: anyio.CancelScope | None = None
        #: ``process`` or ``session`` (child workers), or ``none``: ``auto`` resolved.
        self.isolation_mode = resolve_isolation(config.isolation, len(self.tenants.tenants))
        #: Per-tenant (or per-session) child workers unless ``isolation_mode`` is none.
        self.isolation = (
            TenantProcesses(
                config,
                per_session=self.isolation_mode == "session",
                on_retired=self._child_retired,
            )
            if self.isolation_mode != "none"
            else None
        )
        #: Notices kernel faults that poison the GPU context, and rebuilds it.
        self.recovery = ContextRecovery(self)
        #: Exit (to be restarted) when a poisoned context cannot be rebuilt here: set by
        #: run_worker, so that tests' in-process workers only refuse new sessions.
        self.restart_on_failure = False
        #: The process's exit status that run_worker ends with (0: a normal stop).
        self.exit_status = 0
        #: Unix time the worker was made (uptime on status pages and metrics).
        self.started_at = time.time()
        #: Set when this worker is a tenant's child (``isolation = "process"`` above it).
        self.child_link: ChildLink | None = None
        self._trim_pending = False
        #: Busy polling of the event loop (``spin_wait``, "auto" resolved); disabled at 0.
        self.busy_poll = BusyPoll(spin_seconds(config))
        #: Runaway GPU work seen and stopped (hipr/worker/runaway.py).
        self.runaways = RunawayLedger()
        #: Each tenant process's exit status once a stop has ended them.
        self.children_exits: dict[str, int | None] = {}

    def runaway_watch(self) -> RunawayWatch:
        """The watch that applies ``runaway_grace`` and ``max_kernel_seconds`` here: it
        ends the process to stop work only in a tenant's child worker."""
        return RunawayWatch(
            sessions=lambda: self.sessions.values(),
            quotas_of=self.quotas_of,
            grace=lambda: self.config.runaway_grace,
            ledger=self.runaways,
            retire=self.child_link is not None,
            on_retire=self._retire_for_runaway,
        )

    def _retire_for_runaway(self, done: StoppedWork) -> None:
        """A tenant's child about to exit to stop runaway work: its record for the
        parent, and its socket removed (``hipr.worker.retirement``)."""
        retire_listeners(self.config.listen, Retirement(done.tenant, RUNAWAY, done.to_wire()))

    def _child_retired(self, retirement: Retirement) -> None:
        """The parent: a tenant's child retired (``TenantProcesses`` counted it); runaway
        work it stopped goes into this worker's ledger, for status and metrics."""
        if retirement.reason != RUNAWAY:
            return
        try:
            done = stopped_from_wire(retirement.details)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("unreadable runaway retirement", tenant=retirement.tenant, error=str(exc))
            return
        self.runaways.record(done)
        log.warning(
            "a tenant's worker process ended to stop runaway GPU work",
            tenant=done.tenant,
            session=done.session,
            reason=done.reason,
            seconds=round(done.seconds, 1),
        )

    def runaway_status(self) -> dict[str, Any]:
        """Status's ``runaway`` section: work running past its rules, and what ended."""
        return self.runaways.to_wire()

    def module_store_figures(self) -> dict[str, StoreFigures]:
        """Each tenant's module store (code objects kept to load by hash), as now: this
        process's, and those of the tenant child workers as last polled."""
        figures = self._own_module_store_figures()
        for child in self.child_statuses():
            for tenant, row in child.module_stores.items():
                mine = figures.get(tenant)
                figures[tenant] = row if mine is None else mine + row
        return figures

    def _bound_module_stores(self) -> None:
        """After a reload: a removed tenant's code objects are dropped, and the others'
        stores are trimmed to their bounds now (lowered ones would otherwise apply at the
        next code object kept)."""
        for name, state in self._tenant_state.items():
            quotas = self.quotas_of(name)
            removed = self.tenants.get(name) is None
            state.module_store.trim(
                max_bytes=0 if removed else quotas.module_store_bytes,
                max_images=0 if removed else quotas.module_store_count,
            )

    def _own_module_store_figures(self) -> dict[str, StoreFigures]:
        return {name: state.module_store.figures() for name, state in self._tenant_state.items()}

    def under_way(self) -> dict[str, Any]:
        """What a stop now would cut short (read only: the shutdown deadline's thread
        calls it)."""
        now = time.monotonic()
        rows = [
            {
                "tenant": s.tenant,
                "session": s.id,
                "closing_for_s": None
                if s.closing_since is None
                else round(now - s.closing_since, 1),
                "gpu_busy": s.gpu_busy,
            }
            for s in list(self.sessions.values())
        ]
        return {"sessions": rows, "runaway": self.runaways.to_wire()["active"]}

    async def _reserve_payload_buffers(self) -> None:
        """Pin the ``pinned_payload_bytes`` buffers, in chunks, on a GPU backend (see
        ``hipr.worker.payloads``); off the event loop, since pinning takes milliseconds.
        A runtime that grants fewer (or none) costs speed, never service: the rest of the
        payloads go to pageable memory."""
        reserve = getattr(self.backend, "reserve_payload_buffers", None)
        # A chunk's frame carries its arguments too; a download's chunk is the bare bytes.
        block_bytes = self.chunk_bytes + FRAME_HEADROOM
        count = self.config.pinned_payload_bytes // block_bytes
        if reserve is None or count <= 0 or self.isolation is not None:
            return  # an isolating parent relays bytes; its tenants' children copy them
        try:
            held = await anyio.to_thread.run_sync(reserve, count, block_bytes)
        except (HipError, ValueError) as exc:
            # ValueError: the backend already pins buffers of another size (a second
            # worker on it with another max_frame_bytes); payloads then go pageable.
            log.warning("no pinned payload buffers", error=str(exc))
            return
        log.info("pinned payload buffers", buffers=held, bytes=held * block_bytes)
        if held < count:
            log.warning("fewer pinned payload buffers than configured", wanted=count, held=held)

    @property
    def retires_on_fault(self) -> bool:
        """A tenant's child worker exits after a context-poisoning fault (its parent
        starts a fresh one); a worker of its own rebuilds the context instead."""
        return self.child_link is not None

    @property
    def shared_tenants(self) -> int:
        """How many tenants share this process's GPU context: 0 when tenants are apart
        (process isolation, or at most one tenant)."""
        count = 0 if self.tenants.anonymous else len(self.tenants.tenants)
        return count if self.isolation is None and count > 1 else 0

    def context_resets(self) -> dict[str, int]:
        """GPU contexts rebuilt here, and tenant processes retired, after kernel faults,
        by the tenant whose kernel faulted."""
        resets = dict(self.recovery.resets)
        if self.isolation is not None:
            for tenant, count in self.isolation.resets.items():
                resets[tenant] = resets.get(tenant, 0) + count
        return resets

    def spawn(self, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` as a task of the worker; False when it is not serving."""
        if self._task_group is None:
            return False
        self._task_group.start_soon(fn, *args)
        return True

    async def end_session(self, session: Session) -> None:
        """Close a session and drop it from the registry."""
        await self._close_session(session)

    def authenticate(self, hello: Args, stream: anyio.abc.ByteStream) -> Tenant:
        """The tenant a HELLO's credentials name, or AuthError."""
        return self.tenants.authenticate(
            hello.text(m.Hello.token, default="", max_length=4096) or None,
            unix_uid=peer_uid(stream),
            cert_subject=_common_name(peer_certificate_subject(stream)),
        )

    async def handshake_refused(self, peer: str, error: HipError) -> None:
        """Count a refused HELLO or RESUME; a wrong credential waits its source's
        backoff delay (``auth_failure_delay``) before the answer goes, so a guesser is
        slowed to its pending-handshake cap over that delay; other sources are not."""
        source = source_of(peer)
        if isinstance(error, AuthError):
            self.observer.refused("auth", str(error.details.get("tenant") or source))
            delay = self.auth_backoff.failed(source)
            if delay > 0:
                await anyio.sleep(delay)
        elif isinstance(error, QuotaError):
            quota = str(error.details.get("quota", ""))
            if quota in ("max_clients", "max_sessions"):
                self.observer.refused(quota, source)

    def check_max_clients(self) -> None:
        """Refuse one more client over the worker-wide max_clients."""
        # Isolated, the parent holds no sessions: count the connections it relays.
        served = len(self.connections) - 1 if self.isolation else len(self.sessions)
        if self.config.max_clients is not None and served >= self.config.max_clients:
            raise QuotaError(
                message=f"the worker serves at most {self.config.max_clients} clients at once "
                "(max_clients)",
                quota="max_clients",
                limit=self.config.max_clients,
            )

    def open_session(self, tenant: Tenant, peer: str) -> Session:
        """A new session for an authenticated client, or a QuotaError refusing it."""
        self.check_max_clients()
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
            self.backend,
            tenant=tenant.name,
            peer=peer,
            gate=gate,
            observer=self.observer,
            busy_poll=self.busy_poll,
            other_tenants_share_context=self.shared_tenants > 0,
        )
        session.stripes.chunk_bytes = self.chunk_bytes
        session.stripes.stall_seconds = self.config.frame_timeout
        self.sessions[session.id] = session
        self.observer.session_opened(tenant.name)
        return session

    async def poll_children(self) -> list[ChildStatus]:
        """The tenant child workers' figures, asked now (none without isolation)."""
        return [] if self.isolation is None else await self.isolation.poll()

    async def status_from_parent(self) -> dict[str, Any] | None:
        """In a tenant's child worker: the whole worker's status, from the parent (an
        admin call lands in a child but must show every tenant); None elsewhere."""
        if self.child_link is None:
            return None
        status = await fetch_json(self.child_link.parent_status)
        return status if isinstance(status, dict) else None

    async def whole_status(self) -> dict[str, Any]:
        """This worker's status with its children's sessions, asked now (what the
        parent's status socket serves to its children)."""
        return worker_status(self, None, await self.poll_children())

    async def local_sessions(self) -> dict[str, Any]:
        """This worker's own sessions (what a child's status socket serves)."""
        return {
            "sessions": [session_status(s, None) for s in list(self.sessions.values())],
            "module_stores": {
                tenant: dataclasses.asdict(row)
                for tenant, row in self._own_module_store_figures().items()
            },
        }

    def child_statuses(self) -> list[ChildStatus]:
        """The tenant child workers' figures as last polled (safe from another thread:
        a copy of the list, each entry replaced whole or updated field by field)."""
        return [] if self.isolation is None else list(self.isolation.statuses.values())

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
        for session in self.sessions.values():
            session.gate.refresh()
        self._bound_module_stores()
        log.info("tenants reloaded", tenants=sorted(self.tenants.tenants))
        warn_if_shared(self.shared_tenants)

    def detach(self, session: Session) -> None:
        """The session's link dropped: keep it ``resume_grace`` seconds for a RESUME."""
        grace = self.config.resume_grace
        if self._task_group is None or grace <= 0:
            self._spawn_close(session)
            return
        session.detach_epoch += 1
        self._task_group.start_soon(self._expire, session, session.detach_epoch)

    async def _expire(self, session: Session, epoch: int) -> None:
        await anyio.sleep(self.config.resume_grace)
        if session.connection is None and session.detach_epoch == epoch and not session.closed:
            log.info("resume grace passed; freeing the session", session=session.id)
            await self._close_session(session)

    def _spawn_close(self, session: Session) -> None:
        if self._task_group is not None:
            self._task_group.start_soon(self._close_session, session)

    async def _close_session(self, session: Session) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await session.close()
            finally:
                self.forget(session)

    def session_named(self, args: Args) -> Session:
        """The live session a RESUME's or DATA_LINK's ``{session_id, resume_token}``
        names: SessionLostError if there is none, AuthError for a wrong token."""
        session_id = args.text(m.Resume.session_id, max_length=64)
        token = args.text(m.Resume.resume_token, max_length=256)
        session = self.sessions.get(session_id)
        if session is None or session.closed or self.draining:
            raise SessionLostError(
                message=f"session {session_id} no longer exists on this worker: the worker "
                f"restarted, or the resume grace of {self.config.resume_grace:g} s passed"
            )
        if not hmac.compare_digest(token.encode(), session.resume_token.encode()):
            raise AuthError(message="wrong resume token for this session")
        return session

    async def resume(self, args: Args, connection: WorkerConnection) -> Session:
        """The detached (or still attached, to a dead link) session a RESUME names."""
        session = self.session_named(args)
        previous = session.connection
        if isinstance(previous, WorkerConnection):
            # The client saw the link die before we did: take the session over.
            await previous.abandon()
        if session.closed:
            raise SessionLostError(message=f"session {session.id} ended while resuming")
        session.connection = connection
        return session

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting; let each session finish the request under way; tell clients;
        free everything. Bounded by ``timeout`` (default: the config's)."""
        self.draining = True
        if self._listen_scope is not None:
            self._listen_scope.cancel()
        if self.isolation is not None:
            # The children drain their sessions and tell their clients, through the relays.
            self.children_exits = await self.isolation.aclose()
        with anyio.move_on_after(self.config.shutdown_timeout if timeout is None else timeout):
            draining = list(self.connections)
            for connection in draining:
                connection.drain()
            for connection in draining:
                await connection.finished.wait()
        # Detached sessions are freed, in the background: a close that waits for a
        # kernel that never ends must not hold the stop (run_worker exits past it).
        # (A session whose connection is closing it already counts as attached: a second
        # close would return at once and drop it from the registry while it still runs.)
        detached = [
            s for s in self.sessions.values() if s.connection is None and s.closing_since is None
        ]
        if detached and self._task_group is not None:
            closed = anyio.Event()
            left = [len(detached)]

            async def close_one(session: Session) -> None:
                try:
                    await self._close_session(session)
                finally:
                    left[0] -= 1
                    if not left[0]:
                        closed.set()

            for session in detached:
                self._task_group.start_soon(close_one, session)
            with anyio.move_on_after(CLOSE_WAIT):
                await closed.wait()

    def reload(self, config_path: Path | None) -> None:
        """SIGHUP: re-read the tenants (and, from ``config_path``, the settings that can
        change live: tenants_file, max_clients, log level). Sessions stay."""
        if config_path is not None:
            try:
                fresh = load_config(config_path)
            except ConfigError as exc:
                log.error("config reload failed; keeping the running config", error=str(exc))
                return
            if fresh.listen != self.config.listen or fresh.backend != self.config.backend:
                log.warning("listen and backend changes need a restart; kept as they were")
            self.config = dataclasses.replace(
                self.config,
                tenants_file=fresh.tenants_file,
                max_clients=fresh.max_clients,
                log_level=fresh.log_level,
                resume_grace=fresh.resume_grace,
            )
            set_levels(fresh.log_level, fresh.log_levels)
        self.reload_tenants()

    async def serve_sockets(
        self,
        activated: Sequence[tuple[int, str]],
        *,
        task_status: anyio.abc.TaskStatus[list[str]] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve listening sockets handed over by systemd socket activation."""
        check_token_exposure(self.config, self.tenants.anonymous, [])
        listeners: list[anyio.abc.Listener[Any]] = []
        for fd, name in activated:
            listeners.append(await anyio.abc.SocketListener.from_socket(fd))
            self.bound_urls.append(f"fd://{fd} ({name})")
        await self._serve_listeners(listeners, task_status)

    def forget(self, session: Session) -> None:
        """Drop a closed session from the registry."""
        if self.sessions.pop(session.id, None) is not None:
            self.observer.session_closed(session.tenant)
        if self.child_link is not None and self.child_link.one_session and not self.sessions:
            # isolation = "session": this process served its one session.
            os.kill(os.getpid(), signal.SIGTERM)
        if not self.sessions and not self._trim_pending and self._task_group is not None:
            self._trim_pending = True
            self._task_group.start_soon(self._trim_when_idle)

    async def _trim_when_idle(self, after_handshakes: bool = False) -> None:
        """Once no session is left for IDLE_TRIM_DELAY (or, ``after_handshakes``, no
        handshake is under way), give freed memory back to the OS (see
        hipr/worker/heap_trim.py: without it RSS stays at its high-water mark)."""
        try:
            await anyio.sleep(IDLE_TRIM_DELAY)
            if not self.sessions or (after_handshakes and not self.admission.pending):
                # Ended connections leave reference cycles (tasks, cancelled scopes,
                # tracebacks) that keep their receive buffers alive until a full
                # collection, which may be long in coming: collect them first, or the
                # trim finds little free. Idle, the pause costs no one.
                gc.collect()
                await anyio.to_thread.run_sync(trim_heap)
        finally:
            self._trim_pending = False

    async def handle_stream(self, stream: anyio.abc.ByteStream) -> None:
        """Serve one accepted connection to its end."""
        try:
            peer = peer_description(stream)
        except Exception:
            peer = "unknown"
        if self.draining:
            await anyio.aclose_forcefully(stream)
            return
        source = source_of(peer)
        ticket = self.admission.admit(source)
        if isinstance(ticket, str):
            # Closed before anything is read or allocated for it.
            self.observer.refused(ticket, source)
            log.warning("connection refused before its handshake", reason=ticket, peer=peer)
            await anyio.aclose_forcefully(stream)
            return
        connection = WorkerConnection(self, stream, peer)
        connection.on_handshake_over = ticket.release
        self.connections.add(connection)
        try:
            await connection.run()
        except Exception:  # one connection's failure never reaches the listener
            log.exception("connection task failed", peer=peer)
        finally:
            ticket.release()
            self.connections.discard(connection)
            if connection.session is None:
                self.admission.ended_since_trim += 1
                self._after_handshakes()

    def _after_handshakes(self) -> None:
        """After a burst of connections that never became sessions (a scan, a flood of
        idle or refused handshakes) the last one gone: give what they freed back to the
        OS, as ``_trim_when_idle`` does when the last session ends."""
        admission = self.admission
        if admission.pending or admission.ended_since_trim < TRIM_AFTER_HANDSHAKES:
            return
        admission.ended_since_trim = 0
        if not self._trim_pending and self._task_group is not None:
            self._trim_pending = True
            self._task_group.start_soon(self._trim_when_idle, True)

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
        except BaseException:
            with anyio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
            raise
        await self._serve_listeners(listeners, task_status)

    async def _serve_listeners(
        self,
        listeners: list[anyio.abc.Listener[Any]],
        task_status: anyio.abc.TaskStatus[list[str]],
    ) -> None:
        warn_if_shared(self.shared_tenants)
        await self._reserve_payload_buffers()
        for url in self.bound_urls:
            log.info(
                "listening",
                url=url,
                backend=self.backend.name,
                spin_wait_us=round(self.busy_poll.seconds * 1e6),
            )
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                self.busy_poll.attach(tg.start_soon)
                tg.start_soon(self.runaway_watch().run)
                if self.isolation is not None:
                    tg.start_soon(self.isolation.poll_forever)
                    tg.start_soon(self.isolation.reap_forever)
                    await tg.start(serve_json, self.isolation.parent_socket, self.whole_status)
                if self.child_link is not None:
                    await tg.start(serve_json, self.child_link.status_socket, self.local_sessions)
                async with anyio.create_task_group() as listening:
                    self._listen_scope = listening.cancel_scope
                    for listener in listeners:
                        listening.start_soon(listener.serve, self.handle_stream, tg)
                    task_status.started(list(self.bound_urls))
                # Listening stopped (shutdown): connections and grace timers carry on.
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
    # Checked here as well as in serve(): raised from a task group it would come wrapped.
    check_token_exposure(config, worker.tenants.anonymous, list(urls or config.listen))
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
    return load_backend(config.backend, fallback=config.emulator_fallback, **emulator_options)
