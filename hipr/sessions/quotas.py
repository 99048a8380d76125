"""Quota enforcement: what a tenant may still take, looked up afresh on every request.

Usage is never kept in a counter of its own: it is summed over the tenant's live
sessions (their allocation and handle tables), so it cannot drift and returns to zero
exactly when the sessions' resources are freed. Only what a table cannot show, memory
reserved by a malloc still on its way to the GPU, is tracked, for the duration of the call.
Quotas are read from the current tenant registry each time, so a reload (SIGHUP)
applies to the next request without touching live sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from hipr.errors import HipError, HipErrorCode, QuotaError
from hipr.sessions.limits import Quotas, TokenBucket
from hipr.sessions.module_store import ModuleStore
from hipr.sessions.resources import AllocationTable, HandleTable

#: A throttled connection waits for this much of its tenant's rate to refill (and at
#: least one request's worth), so that it wakes tens of times a second, not per token.
THROTTLE_REFILL_SECONDS = 0.01
#: Longest single throttle wait (a very low rate still gets its requests looked at).
THROTTLE_MAX_SECONDS = 1.0


def throttle_seconds(rate: float, missing_tokens: float) -> float:
    """How long a connection refused by a ``rate`` requests/s bucket waits before it runs
    requests again, when the bucket lacks ``missing_tokens`` of one request's worth."""
    if rate <= 0:
        return THROTTLE_MAX_SECONDS
    wanted = max(missing_tokens, rate * THROTTLE_REFILL_SECONDS)
    return min(THROTTLE_MAX_SECONDS, wanted / rate)


class Session(Protocol):
    """What quotas read of a session: its allocation and handle tables (the session
    module implements it; quotas never import the session)."""

    @property
    def allocations(self) -> AllocationTable: ...
    @property
    def streams(self) -> HandleTable[Any]: ...
    @property
    def events(self) -> HandleTable[Any]: ...
    @property
    def modules(self) -> HandleTable[Any]: ...
    @property
    def graphs(self) -> HandleTable[Any]: ...
    @property
    def capturing_streams(self) -> Any: ...


#: Resource kinds with a count quota, and how a session's count is read.
COUNTED: dict[str, Callable[[Session], int]] = {
    "max_streams": lambda s: len(s.streams),
    "max_events": lambda s: len(s.events),
    "max_modules": lambda s: sum(1 for _, m in s.modules.items() if not m.shared),
    # A stream being captured becomes a graph at end_capture: it counts from the start.
    "max_graphs": lambda s: len(s.graphs) + len(s.capturing_streams),
}


@dataclass(slots=True)
class TenantState:
    """Per-tenant state that is not derivable from sessions: the request bucket, memory
    reserved by mallocs in flight, and request bytes read ahead of execution."""

    bucket: TokenBucket | None = None
    bucket_for: tuple[float | None, float | None] = (None, None)
    #: The quotas object the bucket was last checked against (a cheap identity test
    #: per request; the values are compared only when it changes, after a reload).
    bucket_quotas: Quotas | None = None
    reserved_memory: int = 0
    inflight_bytes: int = 0
    inflight_freed: anyio.Event = field(default_factory=anyio.Event)
    #: Readers waiting for in-flight room (no event churn per frame when none waits).
    inflight_waiters: int = 0
    #: Code objects the tenant's sessions loaded by hash, for its later sessions.
    module_store: ModuleStore = field(default_factory=ModuleStore)


class QuotaGate:
    """One session's view of its tenant's quotas."""

    def __init__(
        self,
        tenant: str,
        quotas: Callable[[], Quotas],
        sessions: Callable[[], Iterable[Session]],
        state: TenantState,
    ) -> None:
        self.tenant = tenant
        self._quotas = quotas
        self._sessions = sessions
        self._state = state
        # Read once and again at each reload (refresh): every request reads them.
        self._current = quotas()

    @property
    def quotas(self) -> Quotas:
        """The tenant's quotas as configured now (as of the last :meth:`refresh`)."""
        return self._current

    @property
    def module_store(self) -> ModuleStore:
        """The tenant's module store (shared by its sessions, never by other tenants)."""
        return self._state.module_store

    def refresh(self) -> None:
        """Read the tenant's quotas again (the worker reloaded its tenants)."""
        self._current = self._quotas()

    def memory_in_use(self) -> int:
        """Device bytes the tenant holds or is allocating, across its sessions."""
        held = sum(s.allocations.total_bytes for s in self._sessions())
        return held + self._state.reserved_memory

    def count(self, quota: str) -> int:
        """The tenant's live resources of the kind ``quota`` limits."""
        reader = COUNTED[quota]
        return sum(reader(s) for s in self._sessions())

    def check_count(self, quota: str) -> None:
        """Refuse creating one more resource of ``quota``'s kind when at the limit."""
        limit = getattr(self.quotas, quota)
        if limit is not None and self.count(quota) + 1 > limit:
            raise QuotaError(
                message=f"tenant {self.tenant!r} is at its {quota} quota of {limit}",
                quota=quota,
                limit=limit,
            )

    @contextmanager
    def reserve_memory(self, size: int) -> Iterator[None]:
        """Hold ``size`` bytes against max_device_memory while the allocation is made."""
        limit = self.quotas.max_device_memory
        if limit is not None and self.memory_in_use() + size > limit:
            raise HipError(
                HipErrorCode.hipErrorOutOfMemory,
                f"allocating {size} bytes would take tenant {self.tenant!r} over its "
                f"max_device_memory quota of {limit} bytes ({self.memory_in_use()} in use)",
                quota="max_device_memory",
                limit=limit,
            )
        self._state.reserved_memory += size
        try:
            yield
        finally:
            self._state.reserved_memory -= size

    def _bucket(self) -> TokenBucket | None:
        """The tenant's max_request_rate bucket; None when its rate is unlimited."""
        quotas = self._current
        state = self._state
        if state.bucket_quotas is not quotas:
            rate = quotas.max_request_rate
            wanted = (rate, quotas.max_request_burst)
            if rate is None or rate == float("inf"):
                state.bucket = None
            elif state.bucket is None or state.bucket_for != wanted:
                state.bucket = TokenBucket(rate, quotas.max_request_burst)
            state.bucket_for = wanted
            state.bucket_quotas = quotas
        return state.bucket

    def admit_request(self) -> None:
        """Spend one request of max_request_rate; QuotaError when the bucket is empty."""
        if not self.try_admit():
            raise self.over_rate()

    def try_admit(self) -> bool:
        """Spend one request of max_request_rate: True when the bucket allowed it."""
        bucket = self._bucket()
        return bucket is None or bucket.take()

    def try_admit_all(self, count: int) -> bool:
        """Spend ``count`` requests of max_request_rate at once, or none: True when the
        bucket allowed them all (a fused request counts as the requests it stands for)."""
        bucket = self._bucket()
        return bucket is None or bucket.take_all(count)

    def refund(self, count: int = 1) -> None:
        """Give back ``count`` requests taken by :meth:`try_admit` or
        :meth:`try_admit_all` (they did not run after all)."""
        bucket = self._bucket()
        if bucket is not None:
            bucket.give_back(count)

    def admit_requests(self, count: int) -> int:
        """Spend up to ``count`` requests of max_request_rate (the launches of a batch,
        each counted as the request it stands for); how many the bucket allowed."""
        bucket = self._bucket()
        return count if bucket is None else bucket.take_up_to(count)

    def refill_seconds(self) -> float:
        """How long a connection refused by max_request_rate waits before it runs
        requests again (:func:`throttle_seconds`); 0 when unlimited."""
        bucket = self._bucket()
        if bucket is None:
            return 0.0
        return throttle_seconds(bucket.rate, 1.0 - bucket.tokens())

    def over_rate(self, what: str = "") -> QuotaError:
        """The max_request_rate refusal (``what``: which part of a request it refused)."""
        rate = self.quotas.max_request_rate
        return QuotaError(
            message=f"tenant {self.tenant!r} is over its max_request_rate quota of "
            f"{rate or 0:g} requests/s{what}",
            quota="max_request_rate",
            limit=rate,
        )

    async def hold_inflight(self, size: int, own_inflight: int) -> None:
        """Wait until ``size`` more request bytes fit in max_inflight_bytes, then count
        them. A connection with nothing of its own in flight always proceeds, so one
        large frame can never wait forever."""
        state = self._state
        while True:
            if self.try_hold_inflight(size, own_inflight):
                return
            state.inflight_waiters += 1
            try:
                await state.inflight_freed.wait()
            finally:
                state.inflight_waiters -= 1

    def try_hold_inflight(self, size: int, own_inflight: int) -> bool:
        """:meth:`hold_inflight` without waiting: True when the bytes were counted."""
        limit = self.quotas.max_inflight_bytes
        state = self._state
        if limit is None or own_inflight == 0 or state.inflight_bytes + size <= limit:
            state.inflight_bytes += size
            return True
        return False

    def release_inflight(self, size: int) -> None:
        """The executor took ``size`` bytes of requests off the queue."""
        state = self._state
        state.inflight_bytes -= size
        if state.inflight_waiters:
            state.inflight_freed.set()
            state.inflight_freed = anyio.Event()
