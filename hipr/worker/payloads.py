"""Buffers that large request payloads are received into (push mode).

An upload arrives as a stream of equal chunks (4 MiB DATA frames, a few in flight). Each
chunk's bytes go from the socket straight into a buffer of its own, and the buffer must
come from somewhere:

- a fresh anonymous mapping per chunk costs a page fault per page on every chunk (an
  upload measured 30 % slower);
- the C heap (``numpy.empty``) is fast once warm, but the chunk-sized blocks stay in
  the heap after use: a worker that had served 48 copying clients kept ~40 MiB more
  resident memory once idle.

So the buffers are anonymous mappings, reused while a stream of chunks runs: one is
taken again once nothing refers to it any more (its views gone), and all are let go when
the connection has nothing queued, so an idle connection holds none and the memory goes
back to the system at once.

On a GPU backend the buffers come first from its page-locked ones (``pinned``, a
backend's ``payload_buffer``), shared by the whole worker: the runtime then copies
straight from or into them, where from pageable memory it first copies through a
pinned buffer of its own on the CPU. When none is free, a mapping as above.
"""

from __future__ import annotations

import mmap
import sys
import time
from collections.abc import Callable

from hipr.protocol.codec import ARGS_LENGTH, Frame
from hipr.protocol.header import Flags, Header
from hipr.protocol.opcodes import Opcode
from hipr.refcount import free_refcount

__all__ = ["PayloadBuffers", "Placements"]


#: The reference count of a kept buffer that no view refers to, seen from take's loop.
_FREE = free_refcount()


class PayloadBuffers:
    """A connection's payload buffers (see the module doc). ``keep`` covers the chunks
    an upload can have outstanding: four read ahead of the executor (16 MiB), four in
    the copy pipeline, the one arriving, and spares; with fewer, a tcp upload outruns
    the list and falls back to fresh mappings (benchmarks/README.md, "Worker")."""

    def __init__(
        self, keep: int = 12, pinned: Callable[[int], memoryview | None] | None = None
    ) -> None:
        """``pinned(size)``: a page-locked buffer of ``size`` bytes, or None if none is
        free (the backend's ``payload_buffer``)."""
        self._keep = keep
        self._buffers: list[mmap.mmap] = []
        self._pinned = pinned
        #: ``time.monotonic()`` of the last :meth:`take`: an idle connection lets its
        #: buffers go a while after it.
        self.last_taken = 0.0

    def take(self, size: int) -> memoryview:
        """A writable buffer of exactly ``size`` bytes (its contents undefined)."""
        self.last_taken = time.monotonic()
        if self._pinned is not None:
            view = self._pinned(size)
            if view is not None:
                return view
        for buffer in self._buffers:
            if len(buffer) == size and sys.getrefcount(buffer) == _FREE:
                return memoryview(buffer)
        fresh = mmap.mmap(-1, size)
        if len(self._buffers) >= self._keep:
            del self._buffers[0]  # still in use or not, it lives as long as its views
        self._buffers.append(fresh)
        return memoryview(fresh)

    def release(self) -> None:
        """Let every buffer go; those still in use are unmapped once their views go."""
        self._buffers.clear()

    def __len__(self) -> int:
        return len(self._buffers)


class Placements:
    """Where a streamed upload's DATA payloads land (push mode): straight at their
    destination, where the request's handler offered one (:meth:`place`, a view of the
    device bytes of a backend whose device memory is host memory), saving the copy out
    of a payload buffer.

    A payload's place is its offset in the request's bulk data, which is the bulk that
    arrived for the request before it: every frame of a streamed request is counted as
    it is decoded (:meth:`note`), and the frames of one request arrive in order. Only a
    DATA frame whose arguments are empty (the 4-byte length prefix reads 0) and whose
    bytes fit the window is placed; any other goes to a payload buffer as before, and
    the handler copies it.
    """

    def __init__(self) -> None:
        #: The streamed request being counted, and its bulk bytes so far.
        self._request_id = -1
        self._arrived = 0
        self._window: memoryview | None = None

    def note(self, frame: Frame) -> None:
        """A decoded frame that starts (MORE) or continues (DATA) a streamed request."""
        if frame.header.opcode == Opcode.DATA:
            if frame.header.request_id == self._request_id:
                self._arrived += frame.bulk.nbytes
        elif frame.header.flags & Flags.MORE:
            self._request_id = frame.header.request_id
            self._arrived = frame.bulk.nbytes
            self._window = None

    def place(self, request_id: int, window: memoryview) -> bool:
        """Put the rest of ``request_id``'s bulk straight into ``window`` (its whole
        destination, offset 0 for the request's first byte); False, with nothing
        changed, when that request is not the one streaming."""
        if request_id != self._request_id:
            return False
        self._window = window
        return True

    def stop(self) -> None:
        """No more placing (the handler is done, or gave up)."""
        self._window = None

    def target(self, header: Header, head: bytes) -> memoryview | None:
        """The place of a DATA frame's bulk, whose payload starts with ``head``
        (``head``'s bulk bytes are copied there), or None: not the placed request, an
        unexpected shape, or more bytes than the window holds."""
        window = self._window
        prefix = ARGS_LENGTH.size
        if (
            window is None
            or header.opcode != Opcode.DATA
            or header.request_id != self._request_id
            or len(head) < prefix
            or ARGS_LENGTH.unpack_from(head)[0] != 0
        ):
            return None
        start = self._arrived
        size = header.payload_length - prefix
        if start + size > window.nbytes:
            return None
        view = window[start : start + size]
        view[: len(head) - prefix] = head[prefix:]
        return view
