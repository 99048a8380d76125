"""When a pooled buffer is free again: its reference count, measured once.

Pools of large buffers (the worker's payload buffers, a GPU backend's page-locked ones)
lend views and take a buffer back once no view of it is left. A memoryview's managed
buffer holds the exporting object for as long as any view lives, so the object's
reference count tells, without bookkeeping that a forgotten view would break.
"""

from __future__ import annotations

import sys


def free_refcount() -> int:
    """``sys.getrefcount`` of an object that only a list holds, as seen from a ``for``
    loop over that list (the list, the loop variable, the call's own argument): the
    count at which a pooled buffer has no view left. Measured rather than assumed,
    since it is an interpreter detail."""
    held = [bytearray(1)]
    count = 0
    for item in held:
        count = sys.getrefcount(item)
    return count
