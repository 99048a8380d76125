"""Page-locked host memory of the GPU backend, free of either vendor's library: the
staging pool that carries asynchronous host-to-device copies, the worker's pinned
payload buffers, and the address of a host buffer handed to a runtime call. None of
them calls a runtime itself; the backend supplies what they need (:class:`StagingOps`).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from hipr.backends._gpu_handles import Carve, GpuStream, HostRefs, PinnedBlock
from hipr.errors import HipError, HipErrorCode
from hipr.refcount import free_refcount

E = HipErrorCode


def host_address(buf: memoryview | bytes | bytearray, *, writable: bool) -> tuple[int, int, Any]:
    """(address, nbytes, keepalive) of a host buffer for a runtime call.

    ``keepalive`` must outlive the call. A read-only buffer (``bytes``) has no ctypes
    address, so numpy reads it; a non-contiguous source is copied once, a
    non-contiguous destination is refused because the runtime writes bytes in a row.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if not mv.contiguous:
        if writable:
            raise HipError(E.hipErrorInvalidValue, "destination host buffer is not contiguous")
        mv = memoryview(mv.tobytes())
    if writable and mv.readonly:
        raise HipError(E.hipErrorInvalidValue, "destination host buffer is read-only")
    arr = np.frombuffer(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv, np.uint8)
    return int(arr.ctypes.data), int(arr.nbytes), arr


class StagingOps(Protocol):
    """Runtime calls the staging pool needs, supplied by the backend."""

    def host_alloc(self, size: int) -> int:
        """Allocate page-locked, portable host memory."""
        ...

    def host_free(self, ptr: int) -> None:
        """Free what :meth:`host_alloc` returned."""
        ...

    def fence_after(self, stream: Any) -> Any:
        """A timing-free event recorded now on the raw stream ``stream``."""
        ...

    def fence_done(self, fence: Any) -> bool:
        """True once the fence completed (or can never complete: a failed context)."""
        ...

    def fence_destroy(self, fence: Any) -> None:
        """Destroy a fence."""
        ...


class PinnedStaging:
    """Page-locked buffers that carry async host-to-device copies.

    The contract lets a caller reuse ``src`` as soon as ``memcpy_htod`` returns, while
    the runtime may read it later; so the bytes go first into a pinned block, which is
    reused only after a fence recorded behind the copy has completed. Pinned sources also
    make the copy truly asynchronous and capturable into graphs. Blocks are rounded up
    to powers of two so they are reused across copy sizes; at most ``max_cached`` idle
    bytes are kept.
    """

    MIN_BLOCK = 64 * 1024
    #: Larger copies are not staged (outside a capture): they are issued from the
    #: caller's buffer and the stream is synchronised before returning.
    MAX_STAGED = 64 * 1024 * 1024
    #: Copies up to this size share their stream's carve block (:meth:`carve`).
    MAX_CARVED = 4096
    #: Alignment of each carved piece (the DMA engines' favourite).
    CARVE_ALIGN = 64

    def __init__(self, ops: StagingOps, max_cached: int = 256 * 1024 * 1024) -> None:
        self._ops = ops
        self._max_cached = max_cached
        self._lock = threading.Lock()
        self._idle: dict[int, list[PinnedBlock]] = {}
        self._idle_bytes = 0
        #: Fences not yet passed, with the blocks they give back and the objects they
        #: let go (:meth:`hold`) once passed.
        self._pending: list[tuple[list[Any], list[PinnedBlock], list[Any]]] = []
        self._outstanding = 0

    @property
    def outstanding(self) -> int:
        """Blocks handed out and not yet back (in flight, or held by graphs)."""
        with self._lock:
            return self._outstanding

    def take(self, nbytes: int) -> PinnedBlock:
        """A block of at least ``nbytes`` (idle one if any, else freshly allocated)."""
        cap = max(self.MIN_BLOCK, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            blocks = self._idle.get(cap)
            if blocks:
                self._idle_bytes -= cap
                self._outstanding += 1
                return blocks.pop()
        # Allocation can take milliseconds; never under the lock.
        block = PinnedBlock(self._ops.host_alloc(cap), cap)
        with self._lock:
            self._outstanding += 1
        return block

    def give_back(self, blocks: Sequence[PinnedBlock]) -> None:
        """Return blocks whose last reader has finished."""
        to_free: list[PinnedBlock] = []
        with self._lock:
            for block in blocks:
                self._outstanding -= 1
                if self._idle_bytes + block.capacity <= self._max_cached:
                    self._idle.setdefault(block.capacity, []).append(block)
                    self._idle_bytes += block.capacity
                else:
                    to_free.append(block)
        for block in to_free:
            self._ops.host_free(block.ptr)

    def retire(self, fences: Sequence[Any], blocks: Sequence[PinnedBlock]) -> None:
        """Give ``blocks`` back once every fence in ``fences`` has completed."""
        with self._lock:
            self._pending.append((list(fences), list(blocks), []))
        self.reclaim()

    def hold(self, fences: Sequence[Any], objects: Sequence[Any]) -> None:
        """Keep ``objects`` alive until every fence in ``fences`` has completed: a pinned
        payload buffer a copy reads straight from stays lent (its view held) meanwhile."""
        with self._lock:
            self._pending.append((list(fences), [], list(objects)))
        self.reclaim()

    def reclaim(self) -> None:
        """Recycle the blocks whose fences completed; cheap when nothing is pending."""
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        keep: list[tuple[list[Any], list[PinnedBlock], list[Any]]] = []
        done_blocks: list[PinnedBlock] = []
        for entry in pending:
            fences, blocks, _ = entry
            if all(self._ops.fence_done(f) for f in fences):
                for f in fences:
                    self._ops.fence_destroy(f)
                done_blocks.extend(blocks)  # and the held objects go with the entry
            else:
                keep.append(entry)
        if keep:
            with self._lock:
                self._pending.extend(keep)
        if done_blocks:
            self.give_back(done_blocks)

    def carve(self, stream: GpuStream, nbytes: int, fence: Callable[[], Any]) -> int:
        """Pinned space for a small async copy (at most :data:`MAX_CARVED` bytes), or for a
        batch of them side by side (at most :data:`MIN_BLOCK`), on ``stream``: the next
        piece of the stream's carve block. Pieces are never reused while the block is
        the stream's; a full block is retired behind one fence (``fence()`` records it
        on the stream), so a copy costs an offset bump instead of a block, an event and
        its query of its own (a stream of 4-byte copies spent more time on those than on
        the copies)."""
        carve = stream.carve
        if carve is None or carve.used + nbytes > carve.block.capacity:
            if carve is not None:
                self.retire_carve(stream, fence)
            carve = stream.carve = Carve(self.take(self.MIN_BLOCK))
        ptr = carve.block.ptr + carve.used
        carve.used += -(-nbytes // self.CARVE_ALIGN) * self.CARVE_ALIGN
        return ptr

    def retire_carve(self, stream: GpuStream, fence: Callable[[], Any]) -> None:
        """Retire ``stream``'s carve block behind a fence recorded now (before the stream
        is destroyed, or when the block is full). A fence that cannot be recorded means
        a failed context, whose copies will never read the block: it is given back."""
        carve, stream.carve = stream.carve, None
        if carve is None:
            return
        try:
            marker = fence()
        except HipError:
            self.give_back([carve.block])
            raise
        self.retire([marker], [carve.block])

    def close(self, *, wait: Callable[[], None]) -> None:
        """Free everything: ``wait`` (a device synchronise) first makes every fence done."""
        if self._pending:
            # A poisoned context still lets us free host memory.
            with contextlib.suppress(HipError):
                wait()
        with self._lock:
            pending, self._pending = self._pending, []
            idle = [b for blocks in self._idle.values() for b in blocks]
            self._idle.clear()
            self._idle_bytes = 0
        for fences, blocks, _ in pending:
            for f in fences:
                self._ops.fence_destroy(f)
            idle.extend(blocks)
        for block in idle:
            self._ops.host_free(block.ptr)


class PinnedPayloads:
    """Page-locked host buffers that the worker receives large payloads into, and fills
    downloads from, so that the runtime's copy is a DMA straight from or into them.

    A copy from pageable memory makes the runtime first copy the bytes through a pinned
    buffer of its own, on the CPU, while the socket's copy runs too: a third pass over
    the memory bus for every byte of a bulk copy. The buffers are allocated once
    (:meth:`reserve`, off the event loop: pinning takes milliseconds), all of one size,
    and lent out as views; a buffer is free again once no view of it is left, which its
    reference count tells (the buffer a memoryview exports is held by the view's
    managed buffer for as long as any view of it lives).
    """

    def __init__(self, ops: StagingOps) -> None:
        self._ops = ops
        self._lock = threading.Lock()
        self._blocks: list[ctypes.Array[ctypes.c_ubyte]] = []
        #: The buffers' start addresses, sorted (:meth:`owns`).
        self._starts: list[int] = []
        self.block_bytes = 0
        self._free_refs = free_refcount()

    def reserve(self, count: int, block_bytes: int) -> int:
        """Hold ``count`` buffers of ``block_bytes`` (every buffer has the first call's
        size), allocating what is missing; the number held afterwards. Stops at the first
        refused allocation (pinned memory is a limited resource): what was allocated is
        kept."""
        with self._lock:
            if self.block_bytes and block_bytes != self.block_bytes:
                raise ValueError(f"payload buffers are {self.block_bytes} bytes, not {block_bytes}")
            self.block_bytes = block_bytes
        for _ in range(count - len(self._blocks)):
            try:
                ptr = self._ops.host_alloc(block_bytes)
            except HipError:
                break
            block = (ctypes.c_ubyte * block_bytes).from_address(ptr)
            with self._lock:
                self._blocks.append(block)
                bisect.insort(self._starts, ptr)
        return len(self._blocks)

    def owns(self, address: int, nbytes: int) -> bool:
        """True when ``nbytes`` at ``address`` lie inside one of the buffers: bytes the
        worker received into page-locked memory, which a copy can DMA from as they are."""
        starts = self._starts
        at = bisect.bisect_right(starts, address) - 1
        return at >= 0 and address + nbytes <= starts[at] + self.block_bytes

    def take(self, size: int) -> memoryview | None:
        """A writable view of ``size`` bytes at the start of a free buffer, or None (none
        free, none reserved, or ``size`` larger than a buffer)."""
        if size > self.block_bytes:
            return None
        free = self._free_refs
        with self._lock:
            for block in self._blocks:
                if sys.getrefcount(block) == free:
                    return memoryview(block).cast("B")[:size]
        return None

    def in_use(self) -> int:
        """Buffers lent out now (a view of them still alive)."""
        free = self._free_refs
        with self._lock:
            return sum(1 for block in self._blocks if sys.getrefcount(block) != free)

    def figures(self) -> dict[str, int]:
        """``{held, in_use, bytes}``: buffers pinned, lent out now, and pinned bytes."""
        held = len(self._blocks)
        return {"held": held, "in_use": self.in_use(), "bytes": held * self.block_bytes}

    def close(self) -> int:
        """Free every buffer nobody holds a view of; one still viewed is left allocated
        (freeing it would leave the view pointing at unmapped memory). The number left."""
        free = self._free_refs
        kept: list[ctypes.Array[ctypes.c_ubyte]] = []
        freed: list[int] = []
        with self._lock:
            for block in self._blocks:  # the loop shape free_refcount measured
                if sys.getrefcount(block) == free:
                    freed.append(ctypes.addressof(block))
                else:
                    kept.append(block)
            self._blocks = kept
            self._starts = sorted(ctypes.addressof(block) for block in kept)
        for ptr in freed:
            with contextlib.suppress(HipError):
                self._ops.host_free(ptr)
        return len(kept)


def release_refs(staging: PinnedStaging, refs: HostRefs) -> None:
    """Drop one owner of ``refs``; the last one hands the buffers to the staging pool,
    to be recycled when every launch that read them has completed."""
    refs.owners -= 1
    if refs.owners <= 0 and (refs.blocks or refs.fences):
        blocks, refs.blocks = refs.blocks, []
        fences, refs.fences = refs.fences, []
        staging.retire(fences, blocks)
