"""What a session's graphs may write, and the allocations their frees wait for
(hipr.sessions.graph_memory, AllocationTable.retire): the books a deferred free keeps."""

from __future__ import annotations

import pytest

from hipr.errors import HipError
from hipr.sessions.graph_memory import GraphMemory
from hipr.sessions.resources import Allocation, AllocationTable


def test_a_retired_allocation_is_unnameable_but_still_counted() -> None:
    table = AllocationTable()
    a, b = Allocation(0x1000, 256, 0), Allocation(0x2000, 64, 0)
    table.add(a)
    table.add(b)
    table.retire(table.remove(a.base))
    assert table.total_bytes == 320, "the tenant's quota still counts retired memory"
    with pytest.raises(HipError):
        table.check(a.base, 1)
    assert table.retired() == [a] and list(table) == [b]
    assert table.unretire(a.base) == a
    assert table.total_bytes == 64 and table.retired() == []


def test_graphs_and_their_instantiations_keep_what_they_write() -> None:
    memory = GraphMemory()
    memory.add(("graph", 1), [0x1000])
    memory.add(("graph", 1), [0x2000])
    memory.instantiate(1, 7)
    memory.add(("graph", 1), [0x3000])  # after the instantiation: not the exec's
    assert memory.in_use([0x1000, 0x3000, 0x4000]) == {0x1000, 0x3000}
    uses = memory.forget(("graph", 1))
    assert memory.in_use([0x1000, 0x3000]) == {0x1000}  # the exec still writes 0x1000
    memory.restore(("graph", 1), uses)  # the runtime refused the destroy
    assert memory.in_use([0x3000]) == {0x3000}
    memory.forget(("graph", 1))
    memory.forget(("exec", 7))
    assert not memory.in_use([0x1000, 0x2000, 0x3000]) and len(memory) == 0
