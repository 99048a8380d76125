"""Which allocations a session's graphs may write, so that a FREE cannot take memory
from under a graph that is launched afterwards.

A graph's nodes name device memory; the worker checks those addresses when a node is
added or a capture records work, not when the graph is launched. If the client frees
an allocation that a graph or executable graph still names, and launches the graph
later, the runtime writes memory that is no longer the session's: memory of another
tenant that was given the same addresses, or memory the runtime has unmapped, whose
fault is sticky and breaks the context for every session on the device (and with it
every release, which is how issue 34's GPU leaks came about). So the free is deferred:
the allocation is *retired* (unnameable, still held and counted against the tenant's
quota) and freed once no graph or executable graph of the session may write it, or
when the session ends.

What a graph may write is kept conservatively: the exact ranges of memset and copy
nodes; for a kernel node, every allocation the session had when it was added (a
kernel's arguments may carry pointers that were never declared as such); for a
captured graph, every allocation the session had or had retired when the capture
ended (any of them may have been recorded). While a capture runs, every free is
deferred, since the capture may be recording work on the allocation.
"""

from __future__ import annotations

from collections.abc import Iterable

#: A graph (``("graph", id)``) or an executable graph (``("exec", id)``) of a session.
GraphKey = tuple[str, int]


class GraphMemory:
    """The allocation bases each graph and executable graph of one session may write.

    Used on the event loop only, except :meth:`restore`, which the session's GPU thread
    may call when a destroy that was queued there fails: it replaces whole entries."""

    def __init__(self) -> None:
        self._uses: dict[GraphKey, frozenset[int]] = {}

    def add(self, key: GraphKey, bases: Iterable[int]) -> None:
        """``key`` may write the allocations at ``bases`` too."""
        self._uses[key] = self._uses.get(key, frozenset()) | frozenset(bases)

    def instantiate(self, graph_id: int, exec_id: int) -> None:
        """An executable graph writes what its graph wrote when it was instantiated."""
        self._uses[("exec", exec_id)] = self._uses.get(("graph", graph_id), frozenset())

    def forget(self, key: GraphKey) -> frozenset[int]:
        """``key`` is destroyed: what it wrote (for :meth:`restore` should the destroy fail)."""
        return self._uses.pop(key, frozenset())

    def restore(self, key: GraphKey, bases: frozenset[int]) -> None:
        """Undo :meth:`forget` (the runtime refused the destroy: the graph lives on)."""
        if bases:
            self._uses[key] = bases

    def in_use(self, bases: Iterable[int]) -> set[int]:
        """Those of ``bases`` that some graph or executable graph may write."""
        wanted = set(bases)
        if not wanted or not self._uses:
            return set()
        used: set[int] = set()
        for uses in list(self._uses.values()):
            used |= wanted & uses
        return used

    def __len__(self) -> int:
        return len(self._uses)
