"""Fair service: how one connection's flood is kept from stretching everyone else's calls.

The worker serves every connection from one event loop, so a connection that finds
requests queued could run them all before any other connection's got a look in (a
million fire-and-forget MEMSETs read ahead kept the loop for seconds). Three bounds
keep a flood to its share:

- **Slices.** A connection's executor runs at most :data:`SLICE_FRAMES` queued requests
  or :data:`SLICE_SECONDS` of loop time back to back (times its tenant's ``weight``),
  then yields; in push mode the I/O callback decodes and answers at most
  :data:`PUMP_FRAMES` frames or :data:`PUMP_SECONDS` per pass, and the reader task
  (trio, TLS) checks in every :data:`READER_FRAMES` frames.
- **Turns between tenants.** A connection whose slice ran out is *heavy* until its queue
  is empty. While more than one connection is heavy, :class:`FairScheduler` starts one
  heavy slice per pass of the event loop, taking the tenants round-robin (and a tenant's
  connections round-robin), so a tenant with ten flooding connections gets the share of a
  tenant with one, and a light request (one that finds its connection's queue empty, the
  normal case) waits for at most a slice or so, never for a whole flood. While light
  requests arrive, a heavy connection also leaves the loop idle between its slices for
  as long as the slice took: an event-loop thread that never sleeps loses its core to
  the machine's other work for whole scheduler ticks, and the light requests with it.
- **Charges.** Every frame costs at least :data:`FRAME_COST` bytes against the read-ahead
  and the tenant's ``max_inflight_bytes``: a decoded frame costs the worker ~600 B of
  Python objects whatever its payload, so frames with empty or tiny payloads can no
  longer queue by the million.

A request refused by ``max_request_rate`` is refused as before (counted, and its error
reported), and then its connection is throttled
(``hipr.sessions.quotas.throttle_seconds``): its executor waits until the tenant's
bucket holds tokens again, so the flood backs up into the read-ahead and then into the
peer's socket instead of being read and refused at line rate (refusing costs the loop
as much as running).

A connection served by a request that needs none of this pays for it an attribute test
per request: the fast path (one request in flight) never finds a queue to slice.
"""

from __future__ import annotations

import time
from collections import deque

import anyio
import anyio.lowlevel

#: Least bytes a frame counts for against read-ahead and in-flight bounds (see module doc).
FRAME_COST = 1 << 10
#: Queued requests an executor runs back to back before it yields (times the weight).
SLICE_FRAMES = 32
#: Loop time an executor may run queued requests back to back (times the weight).
SLICE_SECONDS = 0.5e-3
#: Frames the push-mode I/O callback decodes or answers in one pass of the loop.
PUMP_FRAMES = 32
#: Loop time the push-mode I/O callback may spend in one pass.
PUMP_SECONDS = 0.25e-3
#: Frames a reader task hands over before it lets other tasks run.
READER_FRAMES = 64
#: How long after a light request's bytes arrived heavy slices still leave the loop
#: idle between them (see :meth:`TurnMember.next_turn`).
SHARE_SECONDS = 0.1


def frame_charge(payload_length: int) -> int:
    """What a frame with ``payload_length`` payload bytes counts for (see :data:`FRAME_COST`)."""
    return payload_length if payload_length > FRAME_COST else FRAME_COST


class _Waiter:
    """One heavy connection waiting for its turn."""

    __slots__ = ("event", "member")

    def __init__(self, member: TurnMember) -> None:
        self.member = member
        self.event = anyio.Event()


class FairScheduler:
    """The worker-wide order of heavy turns: by tenant, the one with the fewest turns
    first (round-robin while all flood alike), then a tenant's connections in turn.

    One heavy slice starts per pass of the event loop while several connections are
    heavy: the connection woken for a turn hands the next turn on at once (so a turn's
    holder that waits for its GPU thread mid-slice holds nobody up), and the one it wakes
    runs in the loop's next pass, after the I/O and the light requests that arrived.
    Turns are counted per tenant (not by queue position) because a tenant whose only
    connection is running its slice is not queued at the moment the next turn is handed
    on; a tenant that starts flooding starts level with the least-served heavy tenant,
    not with a credit for the time it was quiet."""

    def __init__(self) -> None:
        #: Connections whose slice ran out and whose queue has not emptied since.
        self.heavy = 0
        #: Heavy connections by tenant, and the turns each heavy tenant has had.
        self._heavy_by_tenant: dict[str, int] = {}
        self._served: dict[str, int] = {}
        #: Waiting connections by tenant (insertion order breaks ties between tenants).
        self._waiting: dict[str, deque[_Waiter]] = {}
        #: When a connection that is not heavy last received bytes (``time.monotonic``):
        #: heavy connections share the loop with light requests for
        #: :data:`SHARE_SECONDS` after it.
        self.light_at = -1e9
        #: A turn was handed to a waiter that has not started it yet.
        self._turn_out = False
        #: Turns handed over, all tenants together (for tests and metrics).
        self.turns = 0

    def member(self, tenant: str) -> TurnMember:
        """A connection's place in the scheduler, for ``tenant``."""
        return TurnMember(self, tenant)

    @property
    def waiting(self) -> int:
        """Connections waiting for a turn now."""
        return sum(len(q) for q in self._waiting.values())

    def _became_heavy(self, tenant: str) -> None:
        self.heavy += 1
        count = self._heavy_by_tenant.get(tenant, 0)
        self._heavy_by_tenant[tenant] = count + 1
        if not count:
            self._served[tenant] = min(self._served.values(), default=0)

    def _became_light(self, tenant: str) -> None:
        self.heavy -= 1
        count = self._heavy_by_tenant[tenant] - 1
        if count:
            self._heavy_by_tenant[tenant] = count
        else:
            del self._heavy_by_tenant[tenant]
            del self._served[tenant]

    def _enqueue(self, waiter: _Waiter) -> None:
        tenant = waiter.member.tenant
        queue = self._waiting.get(tenant)
        if queue is None:
            queue = self._waiting[tenant] = deque()
        queue.append(waiter)

    def _remove(self, waiter: _Waiter) -> None:
        tenant = waiter.member.tenant
        queue = self._waiting.get(tenant)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[tenant]

    def _hand_on(self) -> None:
        """Wake the next waiter (it runs in the loop's next pass): of the waiting tenant
        with the fewest turns so far, its connection that has waited longest."""
        if not self._waiting:
            self._turn_out = False
            return
        served = self._served
        tenant = min(self._waiting, key=lambda t: served.get(t, 0))
        queue = self._waiting[tenant]
        waiter = queue.popleft()
        if not queue:
            del self._waiting[tenant]
        if tenant in served:
            served[tenant] += 1
        self._turn_out = True
        self.turns += 1
        waiter.event.set()


class TurnMember:
    """One connection's standing with the :class:`FairScheduler`: its executor's slice,
    whether it is heavy, and the wait for its next turn."""

    __slots__ = (
        "frames",
        "heavy",
        "limit_frames",
        "limit_seconds",
        "scheduler",
        "started",
        "tenant",
    )

    def __init__(self, scheduler: FairScheduler, tenant: str) -> None:
        self.scheduler = scheduler
        self.tenant = tenant
        #: Requests taken since the executor last waited or yielded.
        self.frames = 0
        self.started = 0.0
        self.heavy = False
        self.limit_frames = SLICE_FRAMES
        self.limit_seconds = SLICE_SECONDS

    def weigh(self, weight: float) -> None:
        """Scale the slice by the tenant's ``weight`` (its share against other tenants)."""
        self.limit_frames = max(1, round(SLICE_FRAMES * weight))
        self.limit_seconds = SLICE_SECONDS * weight

    def rested(self) -> None:
        """The executor found its queue empty and waits for a request: its slice starts
        afresh, and it is not heavy any more."""
        self.frames = 0
        if self.heavy:
            self.heavy = False
            self.scheduler._became_light(self.tenant)

    def spent(self) -> bool:
        """Count one more request taken without waiting; True when the slice is used up
        and the executor must :meth:`next_turn` before it runs the request."""
        frames = self.frames + 1
        self.frames = frames
        if frames == 1:
            self.started = time.perf_counter()
            return False
        return (
            frames > self.limit_frames or time.perf_counter() - self.started >= self.limit_seconds
        )

    async def next_turn(self) -> None:
        """Yield the loop, and while other connections are heavy too, wait for this
        tenant's next round-robin turn."""
        scheduler = self.scheduler
        if not self.heavy:
            self.heavy = True
            scheduler._became_heavy(self.tenant)
        try:
            if time.monotonic() - scheduler.light_at < SHARE_SECONDS:
                # Light requests are being served: leave the loop idle for as long as
                # the slice took, so that the event loop's thread sleeps between
                # slices. A thread that never sleeps loses its core to the machine's
                # other work for whole scheduler ticks, and then the light requests
                # wait those ticks too (2-core machine under load: the victim's median
                # call 10x its unloaded one without this, 1-3x with it).
                spent = time.perf_counter() - self.started
                await anyio.sleep(min(max(spent, 0.0), self.limit_seconds))
            if scheduler.heavy <= 1 and not scheduler._waiting:
                # Alone: a plain yield lets the I/O and every light request in.
                await anyio.lowlevel.checkpoint()
                return
            waiter = _Waiter(self)
            scheduler._enqueue(waiter)
            if not scheduler._turn_out:
                scheduler._hand_on()
            try:
                await waiter.event.wait()
            except BaseException:
                if waiter.event.is_set():
                    # Woken, then cancelled before it started: the turn goes on.
                    scheduler._hand_on()
                else:
                    scheduler._remove(waiter)
                raise
            # This connection's turn has started: the next one starts in the next pass.
            scheduler._hand_on()
        finally:
            self.frames = 0

    def leave(self) -> None:
        """The connection ends: no longer heavy."""
        self.rested()
