"""Runaway GPU work: found, stopped where it can be, and reported.

Work is *runaway* when it outlives its session by more than ``runaway_grace`` (the
session ended, by GOODBYE or a dropped link past ``resume_grace``, and its close still
waits for a kernel), or when it runs past its tenant's ``max_kernel_seconds`` quota.
A kernel cannot be stopped on its own: only tearing down the context that runs it stops
it. So:

* In a tenant's child worker (``isolation = "process"``, the default with several
  tenants once issue 35 lands) the child holds that tenant's sessions alone: it tells
  them why (the quota's session a :class:`~hipr.errors.RunawayKernelError` naming the
  quota, the others a :class:`~hipr.errors.SessionLostError`) and retires the way every
  tenant child does (``hipr.worker.retirement``, reason "runaway": a record for the
  parent, its socket removed, exit status :data:`EXIT_RUNAWAY`). The driver frees the
  context; the parent starts a fresh child for the tenant's next connection.
* In a shared process (``isolation = "none"``) nothing short of ending every tenant's
  work stops it: the worker says in its log, ``/metrics`` and ``hipr status`` which
  tenant's work holds the device and for how long; a quota's session is told.

The parent of tenant children reads each runaway retirement's record into its own
ledger (:func:`stopped_from_wire`), so that status and metrics show what was stopped,
whose, after how long and why.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import structlog

from hipr.errors import HipError, RunawayKernelError, SessionLostError
from hipr.sessions.state import Session
from hipr.worker.retirement import RETIRE_EXIT_STATUS
from hipr.worker.tenants import Quotas

log = structlog.get_logger("hipr.runaway")

#: Exit status of a tenant's child worker that ended itself to stop runaway work.
EXIT_RUNAWAY = RETIRE_EXIT_STATUS
#: How often sessions are looked at.
TICK = 0.1
#: How long a retiring child gives its goodbyes to leave before it exits.
FAREWELL_SECONDS = 1.0
#: A runaway that cannot be stopped is logged again this often.
REMIND_SECONDS = 60.0
#: Stopped work kept for status.
KEEP_STOPPED = 32

SESSION_ENDED = "session ended"
MAX_KERNEL_SECONDS = "max_kernel_seconds"


@dataclass(slots=True)
class RunawayWork:
    """Runaway work running now."""

    tenant: str
    session: str
    #: :data:`SESSION_ENDED` or :data:`MAX_KERNEL_SECONDS`.
    reason: str
    #: Unix time the work began to count (its session's end, or its busy stretch's start).
    started: float
    #: What the worker does about it.
    action: str
    #: ``time.monotonic()`` of the last log line about it.
    logged: float = 0.0

    def to_wire(self, now: float | None = None) -> dict[str, Any]:
        """Its row in status (``seconds``: how long so far)."""
        now = time.time() if now is None else now
        return {
            "tenant": self.tenant,
            "session": self.session,
            "reason": self.reason,
            "started": self.started,
            "seconds": max(0.0, now - self.started),
            "action": self.action,
        }


@dataclass(frozen=True, slots=True)
class StoppedWork:
    """Runaway work that is over: stopped by the worker, or finished on its own."""

    tenant: str
    session: str
    reason: str
    #: How long it had run past its rule's start when it ended.
    seconds: float
    #: Unix time it ended.
    ended: float
    #: "tenant process ended" or "finished on its own".
    how: str

    def to_wire(self) -> dict[str, Any]:
        """Its row in status."""
        return asdict(self)


@dataclass(slots=True)
class RunawayLedger:
    """What runaway work runs now and what is over (status and ``/metrics`` read it,
    the latter from another thread: entries are replaced whole, never edited)."""

    active: dict[str, RunawayWork] = field(default_factory=dict)
    stopped: deque[StoppedWork] = field(default_factory=lambda: deque(maxlen=KEEP_STOPPED))
    #: (tenant, reason, how) -> how many.
    counts: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def record(self, done: StoppedWork) -> None:
        """Note work that is over."""
        self.active.pop(done.session, None)
        self.stopped.append(done)
        key = (done.tenant, done.reason, done.how)
        self.counts = {**self.counts, key: self.counts.get(key, 0) + 1}

    def to_wire(self) -> dict[str, Any]:
        """Status's ``runaway`` section."""
        now = time.time()
        return {
            "active": [w.to_wire(now) for w in list(self.active.values())],
            "stopped": [s.to_wire() for s in list(self.stopped)],
            "stopped_total": [
                {"tenant": t, "reason": r, "how": h, "count": n}
                for (t, r, h), n in sorted(self.counts.items())
            ],
        }


class RunawayWatch:
    """Looks at every session each :data:`TICK` and applies the rules above.

    ``retire`` is true in a tenant's child worker: the watch may then end the process to
    stop work (``exit`` is :func:`os._exit`, replaced in tests), first calling
    ``on_retire`` with the work it stops (the child leaves its retirement record and
    removes its listening socket).
    """

    def __init__(
        self,
        *,
        sessions: Callable[[], Iterable[Session]],
        quotas_of: Callable[[str], Quotas],
        grace: Callable[[], float],
        ledger: RunawayLedger,
        retire: bool,
        on_retire: Callable[[StoppedWork], object] | None = None,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        self._sessions = sessions
        self._quotas_of = quotas_of
        self._grace = grace
        self.ledger = ledger
        self._retire = retire
        self._exit = exit
        #: Runs first when the process retires (the child leaves its record and removes
        #: its listening socket, so that the parent sends the tenant's next connection to
        #: a fresh process).
        self._on_retire = on_retire
        #: Session id -> ``time.monotonic()`` its current busy stretch began.
        self._busy_since: dict[str, float] = {}
        self._retiring = False

    async def run(self) -> None:
        """Watch until cancelled."""
        while True:
            await anyio.sleep(TICK)
            await self.check()

    async def check(self) -> None:
        """One look at every session."""
        if self._retiring:
            return
        now = time.monotonic()
        live = {s.id: s for s in list(self._sessions())}
        for sid in set(self._busy_since) - set(live):
            del self._busy_since[sid]
        for sid, work in list(self.ledger.active.items()):
            if sid not in live:  # its close finished: the work ended by itself
                self._finished(work, "finished on its own")
        for session in live.values():
            found = self._rule_broken(session, now)
            if found is None:
                continue
            reason, began, limit = found
            await self._runaway(session, reason, began, limit, now)
            if self._retiring:
                return

    def _rule_broken(self, session: Session, now: float) -> tuple[str, float, float] | None:
        """(reason, monotonic start, limit) of the rule ``session``'s work breaks, if any."""
        if session.closing_since is not None:
            grace = self._grace()
            if now - session.closing_since >= grace:
                return SESSION_ENDED, session.closing_since, grace
            return None
        limit = self._quotas_of(session.tenant).max_kernel_seconds
        if limit is None:
            self._busy_since.pop(session.id, None)
            return None
        if not session.device_busy():
            self._busy_since.pop(session.id, None)
            return None
        began = self._busy_since.setdefault(session.id, now)
        return (MAX_KERNEL_SECONDS, began, limit) if now - began >= limit else None

    async def _runaway(
        self, session: Session, reason: str, began: float, limit: float, now: float
    ) -> None:
        seconds = now - began
        known = self.ledger.active.get(session.id)
        if known is not None and known.reason == reason:
            if now - known.logged >= REMIND_SECONDS:
                known.logged = now
                log.warning(
                    "runaway GPU work still holds the device",
                    tenant=session.tenant,
                    session=session.id,
                    reason=reason,
                    seconds=round(seconds, 1),
                )
            return
        action = "ending the tenant's process" if self._retire else "reported (shared process)"
        work = RunawayWork(
            session.tenant, session.id, reason, time.time() - seconds, action, logged=now
        )
        self.ledger.active = {**self.ledger.active, session.id: work}
        session.runaway = {"reason": reason, "started": work.started}
        log.warning(
            "runaway GPU work",
            tenant=session.tenant,
            session=session.id,
            reason=reason,
            seconds=round(seconds, 1),
            limit=limit,
            action=action,
            **({} if self._retire else {"how_to_stop": 'isolation = "process", or a restart'}),
        )
        if reason == MAX_KERNEL_SECONDS:
            await _tell(session, self._quota_error(session, seconds, limit))
            if not self._retire:
                # The session cannot go on with its work running: it ends, and its
                # close waits for the kernel (the entry above stays until it is over).
                await _drop_link(session)
        if self._retire:
            await self._retire_process(work, seconds)

    def _quota_error(self, session: Session, seconds: float, limit: float) -> RunawayKernelError:
        stopped = (
            "the worker stopped it by ending the tenant's worker process: this session "
            "is gone; a new session works"
            if self._retire
            else 'this worker shares one process among its tenants (isolation = "none") '
            "and cannot stop it: the session is ended, and the work holds the device "
            "until it finishes or the worker restarts"
        )
        return RunawayKernelError(
            message=f"GPU work of this session ran {seconds:.1f} s, past tenant "
            f"{session.tenant!r}'s max_kernel_seconds quota of {limit:g} s; {stopped}",
            quota=MAX_KERNEL_SECONDS,
            limit=limit,
            seconds=round(seconds, 3),
        )

    async def _retire_process(self, work: RunawayWork, seconds: float) -> None:
        """End this tenant's worker process: every session of it is told, the parent
        gets a record, then the process exits (the driver frees its GPU context)."""
        self._retiring = True
        done = StoppedWork(
            work.tenant, work.session, work.reason, seconds, time.time(), "tenant process ended"
        )
        if self._on_retire is not None:
            try:
                self._on_retire(done)
            except Exception:
                log.exception("preparing to retire failed; retiring anyway")
        lost = SessionLostError(
            message=f"the tenant's worker process ended to stop runaway GPU work "
            f"(session {work.session}: {work.reason}); this session is gone, a new one works"
        )
        others = [s for s in list(self._sessions()) if s.id != work.session]
        with anyio.move_on_after(FAREWELL_SECONDS):
            async with anyio.create_task_group() as tg:
                for other in others:
                    tg.start_soon(_tell, other, lost)
        self.ledger.record(done)
        log.error(
            "ending this tenant's worker process to stop runaway GPU work",
            tenant=work.tenant,
            session=work.session,
            reason=work.reason,
            seconds=round(seconds, 1),
            sessions_ended=len(others) + 1,
            exit_status=EXIT_RUNAWAY,
        )
        with contextlib.suppress(Exception):
            sys.stderr.flush()
            sys.stdout.flush()
        self._exit(EXIT_RUNAWAY)

    def _finished(self, work: RunawayWork, how: str) -> None:
        done = StoppedWork(
            work.tenant, work.session, work.reason, time.time() - work.started, time.time(), how
        )
        self.ledger.record(done)
        log.info(
            "runaway GPU work is over",
            tenant=work.tenant,
            session=work.session,
            reason=work.reason,
            seconds=round(done.seconds, 1),
            how=how,
        )


async def _tell(session: Session, error: HipError) -> None:
    """Send ``error`` to the client of ``session`` as a worker-initiated error (the
    client fails every call waiting, and later ones, with it); nothing if detached."""
    send = getattr(session.connection, "send_error", None)
    if send is None:
        return
    with anyio.move_on_after(FAREWELL_SECONDS), contextlib.suppress(Exception):
        await send(0, 0, error)


async def _drop_link(session: Session) -> None:
    stream = getattr(session.connection, "stream", None)
    if stream is not None:
        with contextlib.suppress(Exception):
            await anyio.aclose_forcefully(stream)


def stopped_from_wire(row: dict[str, Any]) -> StoppedWork:
    """The :class:`StoppedWork` that :meth:`StoppedWork.to_wire` wrote (a retired child's
    record, read by its parent); KeyError, TypeError or ValueError when malformed."""
    return StoppedWork(
        str(row["tenant"]),
        str(row["session"]),
        str(row["reason"]),
        float(row["seconds"]),
        float(row["ended"]),
        str(row["how"]),
    )
