"""Per-session resource tables: allocations by address range, handles by session id.

Nothing here touches the GPU. The tables answer "is this range one of mine?" and
"which backend object is handle 7 of kind stream?" so that a client can only ever name
its own memory and objects, and learns nothing about anyone else's.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hipr.errors import HipError, HipErrorCode, invalid_value

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device allocation of a session."""

    base: int
    size: int
    device: int

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.base + self.size


class AllocationTable:
    """A session's allocations, searchable by any address inside them.

    An allocation the client freed while a graph of the session may still write it is
    *retired* (:meth:`retire`): no request can name it any more, but the device memory
    stays held, and counted, until the last such graph is gone (see
    :mod:`hipr.sessions.graph_memory`)."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._by_base: dict[int, Allocation] = {}
        self._live_bytes = 0
        # Written with single dict operations only: the session's GPU thread puts back
        # an allocation whose deferred free the runtime refused.
        self._retired: dict[int, Allocation] = {}
        #: Allocations removed so far: a check that once found an address inside the
        #: table still holds while this has not moved (``hipr.worker.express``).
        self.removals = 0

    def __len__(self) -> int:
        return len(self._bases)

    def __iter__(self) -> Iterator[Allocation]:
        return iter(list(self._by_base.values()))

    @property
    def total_bytes(self) -> int:
        """Bytes the session holds on the device: its allocations and the retired ones."""
        return self._live_bytes + sum(a.size for a in list(self._retired.values()))

    def add(self, allocation: Allocation) -> None:
        """Record a fresh allocation."""
        bisect.insort(self._bases, allocation.base)
        self._by_base[allocation.base] = allocation
        self._live_bytes += allocation.size

    def remove(self, base: int) -> Allocation:
        """Forget the allocation that starts at ``base``; hipErrorInvalidValue otherwise."""
        allocation = self._by_base.pop(base, None)
        if allocation is None:
            raise invalid_value(f"0x{base:x} is not the start of an allocation of this session")
        del self._bases[bisect.bisect_left(self._bases, base)]
        self._live_bytes -= allocation.size
        self.removals += 1
        return allocation

    def retire(self, allocation: Allocation) -> None:
        """Keep ``allocation`` (already :meth:`remove` d) held and counted, out of reach
        of requests, until :meth:`unretire`. A single dict store: safe on the GPU thread."""
        self._retired[allocation.base] = allocation

    def unretire(self, base: int) -> Allocation:
        """Take a retired allocation back, to be freed now."""
        return self._retired.pop(base)

    def retired(self) -> list[Allocation]:
        """A snapshot of the retired allocations."""
        return list(self._retired.values())

    def containing(self, address: int) -> Allocation | None:
        """The allocation with ``base <= address < end``, if any."""
        index = bisect.bisect_right(self._bases, address) - 1
        if index < 0:
            return None
        allocation = self._by_base[self._bases[index]]
        return allocation if address < allocation.end else None

    def check(self, address: int, size: int, what: str = "range") -> Allocation:
        """The allocation that holds all of ``[address, address + size)``.

        The same error for "someone else's", "freed" and "never existed", so that a
        guess reveals nothing about other sessions' memory.
        """
        allocation = self.containing(address)
        if allocation is None and size == 0 and address:
            # A zero-byte range may sit exactly at the end of an allocation.
            allocation = self.containing(address - 1)
        if allocation is None:
            raise invalid_value(
                f"{what} 0x{address:x}..+{size} is not inside an allocation of this session"
            )
        if address + size > allocation.end:
            # The session's own allocation: saying how it is overrun reveals nothing of
            # anyone else's memory, and names the mistake (a size or an offset).
            offset = address - allocation.base
            raise invalid_value(
                f"{what} 0x{address:x}..+{size} overruns its allocation: the allocation at "
                f"0x{allocation.base:x} holds {allocation.size} bytes, the range starts at "
                f"offset {offset} and needs {size} ({address + size - allocation.end} bytes "
                "too many)"
            )
        return allocation


class HandleTable(Generic[T]):
    """Per-session ids for backend objects of one kind; ids are never reused."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._objects: dict[int, T] = {}
        self._next_id = 1
        #: Objects removed so far: an id once found stays valid while this has not
        #: moved (ids are never reused; ``hipr.worker.express``).
        self.removals = 0
        #: Objects added, removed or put back so far: the set of objects is the same
        #: while this has not moved (a launch prepared to wait for them all).
        self.changes = 0

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, handle_id: object) -> bool:
        return handle_id in self._objects

    def add(self, obj: T) -> int:
        """A fresh id for ``obj``."""
        handle_id = self._next_id
        self._next_id += 1
        self._objects[handle_id] = obj
        self.changes += 1
        return handle_id

    def get(self, handle_id: int) -> T:
        """The object of ``handle_id``; hipErrorInvalidHandle when unknown."""
        try:
            return self._objects[handle_id]
        except KeyError:
            raise HipError(
                HipErrorCode.hipErrorInvalidHandle,
                f"{handle_id} is not a {self.kind} of this session",
            ) from None

    def pop(self, handle_id: int) -> T:
        """Remove and return the object of ``handle_id``."""
        obj = self.get(handle_id)
        del self._objects[handle_id]
        self.removals += 1
        self.changes += 1
        return obj

    def restore(self, handle_id: int, obj: T) -> None:
        """Put back an object that :meth:`pop` removed (its destroy failed, so it still
        exists and the session's teardown must free it). A single dict store: safe to
        call from the session's GPU thread."""
        self._objects[handle_id] = obj
        self.changes += 1

    def items(self) -> list[tuple[int, T]]:
        """A snapshot of (id, object) pairs, newest last."""
        return list(self._objects.items())

    def objects(self) -> list[T]:
        """A snapshot of the objects, newest last."""
        return list(self._objects.values())


@dataclass(slots=True)
class ModuleEntry:
    """A loaded module; built-in modules are shared by the backend and never unloaded."""

    handle: Any
    shared: bool
    function_ids: list[int]
    #: MODULE_GET_GLOBAL's variables (bases in Session.module_globals), dropped on unload.
    global_bases: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FunctionEntry:
    """A kernel of a module."""

    handle: Any
    module_id: int
    name: str


@dataclass(slots=True)
class GraphEntry:
    """A graph and the nodes added to it (node ids are session-wide)."""

    handle: Any
    node_ids: list[int]


@dataclass(frozen=True, slots=True)
class GraphNodeEntry:
    """A node of one graph."""

    handle: Any
    graph_id: int
