"""Giving freed memory back to the operating system once the worker goes idle.

A worker's transient buffers (frames received, copy chunks, the emulator's device
memory) are freed when a session ends, but glibc keeps what it freed in its heap: after
a burst of load the process stays at its high-water mark, and as the holes between
long-lived blocks shift from burst to burst that mark creeps up (the soak in
docs/reliability/ saw the main heap at 760 MiB with every session closed).
``malloc_trim(0)`` hands every free page in every arena back (``MADV_DONTNEED``), so an
idle worker shrinks to what it really holds.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
if sys.platform.startswith("linux"):
    try:
        _trim = ctypes.CDLL(None).malloc_trim  # glibc; musl has none
        _trim.argtypes = [ctypes.c_size_t]  # type: ignore[union-attr]
        _trim.restype = ctypes.c_int  # type: ignore[union-attr]
    except (OSError, AttributeError):
        _trim = None


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS; False where the libc cannot.

    Blocking (it walks the heap under the allocator's locks): call it from a thread.
    """
    if _trim is None:
        return False
    _trim(0)
    return True
