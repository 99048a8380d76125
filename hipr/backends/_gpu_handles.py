"""The GPU backend's handles and its ledger of them, free of either vendor's library.

Plain wrappers rather than raw runtime handles: they are hashable by identity (the
runtime's handle objects are not all), they remember their device, a destroyed one is
refused with hipErrorInvalidHandle instead of crashing the driver, and they carry what
must live as long as they do. The :class:`Ledger` counts what a backend created and has
not released (``Backend.stats``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hipr.backends.interface import BackendStats
from hipr.errors import HipError, HipErrorCode

E = HipErrorCode


@dataclass(eq=False)
class PinnedBlock:
    """A page-locked host buffer of ``capacity`` bytes at ``ptr``."""

    ptr: int
    capacity: int


@dataclass(eq=False)
class HostRefs:
    """Pinned buffers a captured graph reads from, with the fences of its launches.

    Owned jointly by the graph and each of its instantiations; freed once all of them
    are destroyed and every launch that could read the buffers has completed."""

    blocks: list[PinnedBlock] = field(default_factory=list)
    owners: int = 0
    fences: list[Any] = field(default_factory=list)


@dataclass(eq=False)
class Carve:
    """A pinned block that small copies on one stream take their bytes from, in order:
    ``used`` bytes of it are spoken for."""

    block: PinnedBlock
    used: int = 0


@dataclass(eq=False)
class GpuStream:
    """A stream: the runtime handle, its device, and, while this backend is capturing
    it, the pinned buffers the capture's host-to-device copies read; ``carve`` is the
    block its small async copies are staged in (:meth:`PinnedStaging.carve`)."""

    handle: Any
    device: int
    capture_refs: list[PinnedBlock] | None = None
    carve: Carve | None = None


@dataclass(eq=False)
class GpuEvent:
    """An event (timing enabled)."""

    handle: Any
    device: int


@dataclass(eq=False)
class GpuModule:
    """A loaded module; ``builtin`` ones are shared by all sessions and never unloaded
    before :meth:`close`."""

    handle: Any
    device: int
    builtin: bool = False


@dataclass(eq=False)
class GpuGraph:
    """A graph and the host buffers its captured copies read."""

    handle: Any
    device: int
    refs: HostRefs = field(default_factory=HostRefs)


@dataclass(eq=False)
class GpuGraphExec:
    """An executable graph; shares its graph's :class:`HostRefs`."""

    handle: Any
    device: int
    refs: HostRefs = field(default_factory=HostRefs)


def live(handle: Any, cls: type, what: str) -> Any:
    """The runtime handle inside a wrapper, or hipErrorInvalidHandle for anything else
    (a foreign object, or one already destroyed)."""
    raw = getattr(handle, "handle", None) if isinstance(handle, cls) else None
    if raw is None:
        raise HipError(E.hipErrorInvalidHandle, f"not a live {what}: {handle!r:.80}")
    return raw


# --- accounting -----------------------------------------------------------------------


class Ledger:
    """What a backend created and has not yet released, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.allocations: dict[int, int] = {}
        self.streams: set[GpuStream] = set()
        self.events: set[GpuEvent] = set()
        self.modules: set[GpuModule] = set()
        self.graphs: set[GpuGraph] = set()
        self.execs: set[GpuGraphExec] = set()

    def stats(self) -> BackendStats:
        """A snapshot as :class:`BackendStats` (built-in modules not counted)."""
        with self.lock:
            return BackendStats(
                allocations=len(self.allocations),
                allocated_bytes=sum(self.allocations.values()),
                streams=len(self.streams),
                events=len(self.events),
                modules=sum(1 for m in self.modules if not m.builtin),
                graphs=len(self.graphs),
                graph_execs=len(self.execs),
            )
