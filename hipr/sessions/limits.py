"""A tenant's limits as a session applies them: the quotas a tenant's table sets, and
the token bucket its request rate is spent from (the tenants file that names them is
read by ``hipr.worker.tenants``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

ANONYMOUS = "anonymous"
#: Requests per second a tenant may send when its table sets no max_request_rate: a
#: backstop against a runaway client, not a pace any client reaches (the fastest
#: measured, fire-and-forget 4 B copies batched by the client, run at ~100-260k/s, each
#: piece counted as a request). Fair service between tenants comes from the worker's
#: turns (``hipr.worker.fairness``), not from this rate.
DEFAULT_MAX_REQUEST_RATE = 1_000_000.0

#: A tenant's module store when its table sets no ``module_store_bytes``: room for the fat
#: binaries a CUDA program's libraries load at start (cuBLAS's run to hundreds of MiB).
DEFAULT_MODULE_STORE_BYTES = 1 << 30
#: ... and no ``module_store_count``.
DEFAULT_MODULE_STORE_COUNT = 4096


@dataclass(frozen=True, slots=True)
class Quotas:
    """A tenant's limits; None means unlimited."""

    max_sessions: int | None = None
    max_device_memory: int | None = None
    max_streams: int | None = None
    max_events: int | None = None
    max_modules: int | None = None
    max_graphs: int | None = None
    #: Requests per second (token bucket); None or ``inf``: unlimited.
    max_request_rate: float | None = DEFAULT_MAX_REQUEST_RATE
    max_request_burst: float | None = None
    max_inflight_bytes: int | None = None
    max_frame_bytes: int | None = None
    #: Longest a session's GPU work may run without its device queue draining (one
    #: kernel, or kernels queued back to back): past it the work is stopped by tearing
    #: down its context, and the session ends with a RunawayKernelError naming this quota.
    max_kernel_seconds: float | None = None
    #: The tenant's share of the event loop against other busy tenants (its slice's
    #: length, relative to a tenant of weight 1). Not a limit: alone, a tenant gets it all.
    weight: float = 1.0
    #: Bytes and count of the code objects the worker keeps for the tenant's sessions to
    #: load by hash (MODULE_LOAD's ``sha256``; ``hipr.sessions.module_store``), least
    #: recently used out first. Host memory of the worker, not device memory.
    module_store_bytes: int = DEFAULT_MODULE_STORE_BYTES
    module_store_count: int = DEFAULT_MODULE_STORE_COUNT


class TokenBucket:
    """Requests per second with a burst; refills continuously."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, 2 * rate)
        self._tokens = self.burst
        self._stamp = time.monotonic()

    def take(self) -> bool:
        """Spend one token; False when the bucket is empty. (:meth:`take_up_to` for one,
        written out: every request of a tenant with a rate pays it.)"""
        now = time.monotonic()
        tokens = self._tokens + (now - self._stamp) * self.rate
        if tokens > self.burst:
            tokens = self.burst
        self._stamp = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        return False

    def take_all(self, count: int) -> bool:
        """Spend ``count`` tokens, or none when the bucket holds fewer."""
        now = time.monotonic()
        tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if tokens >= count:
            self._tokens = tokens - count
            return True
        self._tokens = tokens
        return False

    def give_back(self, count: int) -> None:
        """Return ``count`` tokens taken for requests that did not run after all."""
        self._tokens = min(self.burst, self._tokens + count)

    def tokens(self) -> float:
        """The tokens in the bucket now."""
        return min(self.burst, self._tokens + (time.monotonic() - self._stamp) * self.rate)

    def take_up_to(self, count: int) -> int:
        """Spend as many of ``count`` whole tokens as the bucket holds; how many."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        taken = max(0, min(count, int(self._tokens)))
        self._tokens -= taken
        return taken
