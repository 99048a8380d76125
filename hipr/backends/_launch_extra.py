"""The ``extra`` block a driver-API launch passes its packed argument bytes in, and the
launch geometry check that runs before it: free of either vendor's library."""

from __future__ import annotations

import ctypes

from hipr.backends.interface import Dim3
from hipr.errors import HipError, HipErrorCode

E = HipErrorCode


def _extra_array(
    args: ctypes.Array[ctypes.c_char],
    size: ctypes.c_size_t,
    buffer_pointer: int,
    buffer_size: int,
    end: int,
) -> ctypes.Array[ctypes.c_void_p]:
    """``{BUFFER_POINTER, &args, BUFFER_SIZE, &size, END}``."""
    return (ctypes.c_void_p * 5)(
        buffer_pointer, ctypes.addressof(args), buffer_size, ctypes.addressof(size), end
    )


class LaunchExtra:
    """The ``extra`` array of a driver-API launch: ``{BUFFER_POINTER, &args,
    BUFFER_SIZE, &size, END}``. ``args`` is passed as packed, never re-laid out, so any
    argument width and alignment reaches the kernel as the client packed it.

    HIP spells END as ``(void*)3`` and CUDA as ``(void*)0``; the caller says which.
    Keep this object alive until the launch call (or node creation) has returned.
    """

    __slots__ = ("_args", "_array", "_size")

    def __init__(self, args: bytes, *, buffer_pointer: int, buffer_size: int, end: int) -> None:
        # A one-byte buffer for empty args keeps the address valid; the size says 0.
        self._args = ctypes.create_string_buffer(bytes(args), max(len(args), 1))
        self._size = ctypes.c_size_t(len(args))
        self._array = _extra_array(self._args, self._size, buffer_pointer, buffer_size, end)

    @property
    def address(self) -> int:
        """The ``void**`` to pass as ``extra``."""
        return ctypes.addressof(self._array)

    @property
    def entries(self) -> list[int]:
        """The five pointer-sized words, for tests."""
        return [int(v or 0) for v in self._array]

    def packed(self) -> bytes:
        """The argument bytes the runtime will read."""
        return ctypes.string_at(ctypes.addressof(self._args), self._size.value)


class ReusedLaunchExtra:
    """One thread's ``extra`` array for its launches, refilled for each one.

    A runtime copies the argument bytes when a launch (or a captured launch) is issued,
    so one buffer can carry every launch a thread makes. That saves the three ctypes
    objects a :class:`LaunchExtra` builds, a measurable part of an inline launch. Not
    for graph kernel nodes, which keep :class:`LaunchExtra`."""

    __slots__ = ("_args", "_array", "_filled", "_size", "address", "capacity")

    def __init__(self, capacity: int, *, buffer_pointer: int, buffer_size: int, end: int) -> None:
        self.capacity = capacity
        self._args = ctypes.create_string_buffer(capacity)
        self._size = ctypes.c_size_t(0)
        self._array = _extra_array(self._args, self._size, buffer_pointer, buffer_size, end)
        #: The ``void**`` to pass as ``extra``.
        self.address = ctypes.addressof(self._array)
        self._filled = b""

    def fill(self, args: bytes) -> int:
        """Put ``args`` (at most ``capacity`` bytes) in the buffer; the ``extra`` address.
        The same bytes as the last launch's (a loop over one kernel) are already there:
        comparing them costs less than the two ctypes calls of a refill."""
        if args != self._filled:
            size = len(args)
            ctypes.memmove(self._args, args, size)
            self._size.value = size
            self._filled = args
        return self.address

    def packed(self) -> bytes:
        """The argument bytes the runtime will read."""
        return ctypes.string_at(ctypes.addressof(self._args), self._size.value)


def check_dims(grid: Dim3, block: Dim3) -> None:
    """Refuse launch geometry that is not three positive ints before the runtime sees it."""
    try:
        # The usual case in one expression: it runs on every launch.
        if len(grid) == 3 and len(block) == 3 and min(grid) >= 1 and min(block) >= 1:
            return
    except TypeError:
        pass
    for what, dims in (("grid", grid), ("block", block)):
        if len(dims) != 3 or any(int(d) < 1 for d in dims):
            raise HipError(
                E.hipErrorInvalidConfiguration, f"{what} must be 3 positive ints: {dims}"
            )
