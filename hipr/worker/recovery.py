"""Recovery from a fault that poisons the GPU context (see ``hipr.backends.sticky``).

An illegal address, a failed launch or a hardware exception in one kernel leaves the
context of its process unusable: every later call of every session in it fails. The
worker therefore, on the first such error:

1. answers the request that found it with :class:`~hipr.errors.ContextLostError`
   (naming the cause), and tells every other session of the context the same, once,
   through a worker-initiated error frame; each of those sessions then ends;
2. rebuilds the context once they have all gone (``backend.reset_context()``, on a
   worker thread), so that the next session works; or, in a tenant's child worker
   (``isolation = "process"`` or ``"session"``), retires the process
   (``hipr.worker.retirement``, reason "context lost"): it stops listening at once, so
   the parent starts a fresh child for the next connection (and counts the reset), and
   exits with status 75 once its sessions have been told.

New sessions wait for the rebuild (a fraction of a second); a child that retires refuses
them, and its parent sends them to the fresh child instead.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import structlog

from hipr.backends.sticky import poisons_context
from hipr.errors import ContextLostError, HipError, HipErrorCode
from hipr.worker.retirement import (
    CONTEXT_LOST,
    RETIRE_EXIT_STATUS,
    Retirement,
    retire_listeners,
)

log = structlog.get_logger("hipr.recovery")

#: Longest wait for the sessions of a poisoned context to end before it is rebuilt
#: anyway (a session stuck in a call of the dead context must not block everyone).
DRAIN_TIMEOUT = 5.0
#: The worker's exit status when it ends to get a fresh context (EX_TEMPFAIL), as a
#: retiring tenant child's.
RESTART_EXIT_STATUS = RETIRE_EXIT_STATUS


class LosingSession(Protocol):
    """What recovery needs of a worker session."""

    @property
    def id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def closed(self) -> bool: ...

    connection: object | None


class ContextHost(Protocol):
    """What recovery needs of the worker (``hipr.worker.server.Worker``)."""

    backend: Any
    sessions: dict[str, Any]
    #: Set to exit with this status (run_worker) when the context cannot be rebuilt.
    exit_status: int

    @property
    def retires_on_fault(self) -> bool: ...
    def spawn(self, fn: Any, *args: Any) -> bool: ...
    async def end_session(self, session: Any) -> None: ...


@dataclass(slots=True)
class Incident:
    """One poisoned context, from its first error to its rebuild."""

    tenant: str
    session: str
    cause: HipError
    started: float
    #: The sessions told, with the error each was given.
    lost: dict[str, ContextLostError]
    done: anyio.Event


def context_lost_error(cause: HipError, own: bool) -> ContextLostError:
    """The error a session of a poisoned context gets: the cause's code, and a message
    that says what happened and what to do."""
    whose = "a kernel of this session" if own else "a kernel of another session on the device"
    return ContextLostError(
        cause.code,
        f"the GPU context was lost: {whose} failed ({cause.name}: {cause.message}); "
        "every allocation, stream, module and graph of this session is gone. "
        "Open a new session.",
        cause=cause.message,
        cause_code=cause.code,
        own_fault=own,
    )


class ContextRecovery:
    """Notices context-poisoning errors and brings the worker back to a working context."""

    def __init__(self, host: ContextHost) -> None:
        self._host = host
        #: The fault being recovered from, if any.
        self.incident: Incident | None = None
        #: Resets (or retirements) of the context, by the tenant whose kernel faulted.
        self.resets: Counter[str] = Counter()
        #: Seconds the last recovery took, from the fault to a usable context.
        self.last_recovery_seconds: float | None = None
        #: Set when the context could not be rebuilt: the worker keeps refusing sessions.
        self.broken: HipError | None = None
        #: A child worker that retires no longer takes sessions.
        self.retiring = False

    def check(self, session: LosingSession, error: HipError) -> HipError:
        """``error`` as ``session``'s request should report it: a ContextLostError when
        it poisoned the context (recovery starts then), else unchanged."""
        if not poisons_context(error) and not isinstance(error, ContextLostError):
            return error
        incident = self.incident
        if incident is None:
            if isinstance(error, ContextLostError):
                return error
            incident = self._begin(session, error)
        lost = incident.lost.get(session.id)
        if lost is None:
            lost = incident.lost[session.id] = context_lost_error(incident.cause, own=False)
        return lost

    def session_lost(self, session_id: str) -> ContextLostError | None:
        """The error a session was given, while the incident lasts."""
        incident = self.incident
        return None if incident is None else incident.lost.get(session_id)

    async def admit(self) -> None:
        """Before a new session opens: wait for a rebuild under way; refuse when the
        context cannot be used (this child retires, or the rebuild failed)."""
        if self.retiring:
            raise HipError(
                HipErrorCode.hipErrorNotInitialized,
                "this tenant worker is restarting after a kernel fault; connect again",
            )
        incident = self.incident
        if incident is not None:
            with anyio.fail_after(DRAIN_TIMEOUT + 30):
                await incident.done.wait()
        if self.broken is not None:
            raise HipError(
                self.broken.code,
                f"the GPU context could not be rebuilt after a kernel fault ({self.broken}); "
                "the worker must be restarted",
            )

    def _begin(self, session: LosingSession, cause: HipError) -> Incident:
        incident = Incident(
            tenant=session.tenant,
            session=session.id,
            cause=cause,
            started=time.monotonic(),
            lost={session.id: context_lost_error(cause, own=True)},
            done=anyio.Event(),
        )
        self.incident = incident
        log.error(
            "a kernel fault poisoned the GPU context; every session on it is lost",
            tenant=session.tenant,
            session=session.id,
            error=str(cause),
            sessions=len(self._host.sessions),
        )
        if self._host.retires_on_fault:
            self.retiring = True
            self._stop_listening(incident)
        if not self._host.spawn(self._recover, incident):
            incident.done.set()  # no task group (a worker not serving): nothing to wait on
        return incident

    def _stop_listening(self, incident: Incident) -> None:
        """A retiring child: leave the parent its record and remove its socket, which
        tells the parent to start another (``hipr.worker.retirement``)."""
        listen = getattr(getattr(self._host, "config", None), "listen", ())
        details = {"session": incident.session, "cause": incident.cause.message}
        retire_listeners(listen, Retirement(incident.tenant, CONTEXT_LOST, details))

    async def _recover(self, incident: Incident) -> None:
        host = self._host
        try:
            sessions = list(host.sessions.values())
            finishing: list[anyio.Event] = []
            for session in sessions:
                error = incident.lost.get(session.id)
                if error is None:
                    error = incident.lost[session.id] = context_lost_error(
                        incident.cause, own=False
                    )
                connection = session.connection
                lose = getattr(connection, "lose_context", None)
                if lose is not None:
                    lose(error)
                    finishing.append(connection.finished)  # type: ignore[union-attr]
                else:
                    await host.end_session(session)  # detached: nobody to tell
            with anyio.move_on_after(DRAIN_TIMEOUT):
                for finished in finishing:
                    await finished.wait()
            if not _all_closed(sessions):
                log.warning("sessions still open after the context was lost; rebuilding anyway")
            self.resets[incident.tenant] += 1
            if self.retiring:
                log.warning(
                    "tenant worker retiring after a kernel fault",
                    tenant=incident.tenant,
                    exit_status=RETIRE_EXIT_STATUS,
                )
                host.exit_status = RETIRE_EXIT_STATUS
                os.kill(os.getpid(), signal.SIGTERM)
                return
            await self._reset()
            self.last_recovery_seconds = time.monotonic() - incident.started
            log.info(
                "GPU context rebuilt after a kernel fault",
                tenant=incident.tenant,
                seconds=round(self.last_recovery_seconds, 3),
                sessions_lost=len(incident.lost),
            )
        finally:
            self.incident = None
            incident.done.set()

    async def _reset(self) -> None:
        host = self._host
        reset = getattr(host.backend, "reset_context", None)
        if reset is None:
            # CUDA's driver documents sticky errors as needing the process to end, and
            # so it proved on an H200 (cuDevicePrimaryCtxReset, then the retain of a
            # fresh context failed with CUDA_ERROR_ILLEGAL_ADDRESS): GPU backends have
            # no reset_context, and their worker restarts instead.
            self.broken = HipError(
                HipErrorCode.hipErrorNotSupported,
                f"the {host.backend.name} runtime cannot rebuild a context in this process",
            )
        else:
            try:
                await anyio.to_thread.run_sync(reset)
            except HipError as exc:
                self.broken = exc
        if self.broken is None:
            return
        if getattr(host, "restart_on_failure", False):
            # Every session has been told; a service manager restarts the worker
            # (the units say Restart=on-failure) with a fresh process and context.
            log.critical(
                "the GPU context cannot be rebuilt in this process; exiting to be restarted",
                error=str(self.broken),
                exit_status=RESTART_EXIT_STATUS,
            )
            host.exit_status = RESTART_EXIT_STATUS
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            log.critical("the GPU context could not be rebuilt", error=str(self.broken))


def _all_closed(sessions: Iterable[LosingSession]) -> bool:
    return all(s.closed for s in sessions)
