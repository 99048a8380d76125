"""Admission before authentication: what a connection may cost before it has shown a
token, and how sources that keep showing wrong ones are slowed.

Anyone who can reach the port can open connections; until a HELLO authenticates one,
it costs the worker a file descriptor, a task and its receive buffer. So:

- unfinished handshakes are capped, all sources together and per source address (a
  Unix socket's peer uid), and the excess is closed at once (:class:`Admission`);
- the caps follow the open-file limit, which the worker raises to its hard limit at
  start (:func:`raise_open_file_limit`; systemd's default soft limit is 1,024);
- a source whose HELLOs are refused waits longer for each refusal, exponentially, up to
  a cap, the count decaying while it stays quiet (:class:`AuthBackoff`): a guesser's
  rate falls to its pending cap over the delay, and other sources are never slowed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

#: The soft limit asked for when the hard limit is unlimited (Linux's nr_open default).
UNLIMITED_NOFILE = 1 << 20
#: Seconds over which a source's count of refused HELLOs halves.
BACKOFF_HALF_LIFE = 10.0
#: Sources whose refusals are remembered; the least recent are forgotten first.
BACKOFF_SOURCES = 4096


def raise_open_file_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; the soft limit
    in force afterwards (unchanged where the platform refuses)."""
    try:
        import resource
    except ImportError:  # not a POSIX platform
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = UNLIMITED_NOFILE if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return UNLIMITED_NOFILE if soft == resource.RLIM_INFINITY else int(soft)


def open_file_limit() -> int:
    """This process's soft limit of open files now."""
    try:
        import resource
    except ImportError:
        return 1024
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return UNLIMITED_NOFILE if soft == resource.RLIM_INFINITY else int(soft)


@dataclass(frozen=True, slots=True)
class PendingCaps:
    """How many unfinished handshakes the worker holds: in all, and per source."""

    total: int
    per_source: int

    @classmethod
    def derive(cls, total: int | None, per_source: int | None, open_files: int) -> PendingCaps:
        """The configured caps, or, where unset, caps derived from ``open_files``: a
        quarter of the descriptors for handshakes (the rest serve sessions, the
        listeners and the backend), and an eighth of those per source (at least 32, so
        that many clients behind one address still connect at once)."""
        total = total if total is not None else max(16, open_files // 4)
        if per_source is None:
            per_source = min(total, max(32, total // 8))
        return cls(total, min(per_source, total))


def source_of(peer: str) -> str:
    """The source address of a peer description (``hipr.transports.peer_description``):
    the host without its port (``"tcp 10.0.0.2:50212"`` -> ``"10.0.0.2"``), the uid on a
    Unix socket (``"unix uid=1000 pid=42"`` -> ``"unix uid=1000"``)."""
    if " uid=" in peer:
        return peer.split(" pid=", 1)[0]
    last = peer.rsplit(" ", 1)[-1]
    host, sep, port = last.rpartition(":")
    if sep and port.isdigit() and host:
        return host
    return peer


class Ticket:
    """One admitted, unfinished handshake; :meth:`release` (idempotent) gives its place
    back once the handshake is over, whatever its outcome."""

    __slots__ = ("_admission", "source")

    def __init__(self, admission: Admission, source: str) -> None:
        self._admission: Admission | None = admission
        self.source = source

    def release(self) -> None:
        """The handshake is over: free its place."""
        admission, self._admission = self._admission, None
        if admission is not None:
            admission._release(self.source)


class Admission:
    """Counts unfinished handshakes and refuses those over the caps."""

    def __init__(self, caps: PendingCaps) -> None:
        self.caps = caps
        self.pending = 0
        #: The most unfinished handshakes one source held at once (tests, reports).
        self.peak_per_source = 0
        #: Connections that ended without a session since the worker last trimmed its
        #: heap for them (counted by the worker).
        self.ended_since_trim = 0
        self._by_source: dict[str, int] = {}

    def admit(self, source: str) -> Ticket | str:
        """A ticket for one more handshake from ``source``, or why it is refused
        (``"pending_handshakes"``, ``"pending_handshakes_per_peer"``)."""
        if self.pending >= self.caps.total:
            return "pending_handshakes"
        held = self._by_source.get(source, 0)
        if held >= self.caps.per_source:
            return "pending_handshakes_per_peer"
        self.pending += 1
        self._by_source[source] = held + 1
        self.peak_per_source = max(self.peak_per_source, held + 1)
        return Ticket(self, source)

    def pending_from(self, source: str) -> int:
        """Unfinished handshakes from ``source`` now."""
        return self._by_source.get(source, 0)

    def _release(self, source: str) -> None:
        self.pending -= 1
        held = self._by_source.get(source, 0) - 1
        if held > 0:
            self._by_source[source] = held
        else:
            self._by_source.pop(source, None)


@dataclass(slots=True)
class _Failures:
    level: float
    at: float


class AuthBackoff:
    """Per-source delays of refused HELLOs: ``base * 2**(n-1)`` seconds for a source's
    n-th recent refusal, at most ``cap``; n halves every :data:`BACKOFF_HALF_LIFE`
    seconds without one. Bounded in memory: :data:`BACKOFF_SOURCES` sources at most."""

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_sources: int = BACKOFF_SOURCES,
    ) -> None:
        self.base = base
        self.cap = cap
        self.clock = clock
        self.max_sources = max_sources
        self._sources: dict[str, _Failures] = {}

    def _decayed(self, entry: _Failures, now: float) -> float:
        return entry.level * math.pow(0.5, max(0.0, now - entry.at) / BACKOFF_HALF_LIFE)

    def failed(self, source: str) -> float:
        """Note a refused HELLO from ``source``; the seconds its answer should wait."""
        if self.base <= 0:
            return 0.0
        now = self.clock()
        entry = self._sources.pop(source, None)
        level = 1.0 if entry is None else self._decayed(entry, now) + 1.0
        if len(self._sources) >= self.max_sources:
            del self._sources[next(iter(self._sources))]  # the least recently refused
        self._sources[source] = _Failures(level, now)  # re-inserted: most recent last
        return min(self.cap, self.base * math.pow(2.0, level - 1.0))

    def level(self, source: str) -> float:
        """``source``'s decayed count of refusals now (0 for one never refused)."""
        entry = self._sources.get(source)
        return 0.0 if entry is None else self._decayed(entry, self.clock())
