"""The GPU backend's memory: allocation, copies (staged, carved, batched) and memset."""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Sequence
from functools import partial
from itertools import pairwise
from typing import Any

from hipr.backends._gpu_core import GpuCore
from hipr.backends._gpu_handles import GpuStream
from hipr.backends._pinned import PinnedStaging, host_address
from hipr.backends.interface import Handle
from hipr.errors import HipError, HipErrorCode

E = HipErrorCode
#: The largest copy back :meth:`GpuMemory.memcpy_dtoh_if_quick` makes: a few µs of DMA.
QUICK_DTOH_BYTES = 64 * 1024


#: Answers to a batch of copies that mean "not here" rather than "these copies are
#: wrong": the driver lacks the call (older than its binding), or does not support it.
_BATCH_UNSUPPORTED = frozenset({int(E.hipErrorNotSupported), int(E.hipErrorNotFound)})


def _packed(pieces: Sequence[tuple[int, memoryview]], base: int) -> list[tuple[int, int, int]]:
    """(destination, source, bytes) of each non-empty piece, the pieces' bytes lying side
    by side from ``base`` in their order."""
    copies = []
    offset = base
    for dst, src in pieces:
        nbytes = src.nbytes
        if nbytes:
            copies.append((dst, offset, nbytes))
            offset += nbytes
    return copies


class GpuMemory(GpuCore):
    """The GPU backend's memory: allocation, copies (staged, carved, batched) and memset."""

    #: The largest copy :meth:`memcpy_dtoh_if_quick` makes (the worker's handlers ask).
    quick_dtoh_bytes = QUICK_DTOH_BYTES

    def malloc(self, size: int) -> int:
        """Device memory; hipErrorOutOfMemory when the device is full."""
        if size < 0:
            raise HipError(E.hipErrorInvalidValue, f"negative size {size}")
        self._current()
        if size == 0:
            return 0
        ptr = int(self._call(self._calls.malloc, size))
        with self._ledger.lock:
            self._ledger.allocations[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        """Free a :meth:`malloc` allocation (blocks until the device is done with it)."""
        if ptr == 0:
            return
        self._current()
        self._call(self._calls.free, ptr)
        with self._ledger.lock:
            self._ledger.allocations.pop(ptr, None)

    def memcpy_htod(self, dst: int, src: memoryview, stream: Handle | None = None) -> None:
        """Host to device. Without a stream it returns once the copy is done; with one,
        ``src`` is staged through pinned memory and the copy runs asynchronously."""
        self._current()
        raw = self._stream(stream)
        addr, nbytes, keep = host_address(src, writable=False)
        if nbytes == 0:
            return
        copy = self._calls.memcpy_htod_async
        self._staging.reclaim()
        if stream is None and getattr(self._tls, "ptds_capture", None) is None:
            self._call(copy, dst, addr, nbytes, raw)
            self._call(self._calls.stream_synchronize, raw)
            return
        refs = self._capture_refs(stream, raw)
        if refs is None and nbytes <= PinnedStaging.MAX_CARVED and isinstance(stream, GpuStream):
            pinned = self._staging.carve(stream, nbytes, partial(self.fence_after, raw))
            ctypes.memmove(pinned, addr, nbytes)
            del keep
            # A failed copy leaves its piece unused: the block still retires in order.
            self._call(copy, dst, pinned, nbytes, raw)
            return
        if refs is None and nbytes > PinnedStaging.MAX_STAGED:
            self._call(copy, dst, addr, nbytes, raw)
            self._call(self._calls.stream_synchronize, raw)
            return
        if refs is None and self._payloads.owns(addr, nbytes):
            # Already page-locked (a payload buffer the worker received the bytes into):
            # a DMA straight from it, the buffer kept lent until a fence behind the copy
            # has passed. Staged, each 4 MiB chunk of an upload on a stream cost the GPU
            # thread another copy on the CPU (0.14 against 0.03 s per GiB on the H200,
            # docs/gpu-runs/2026-11-26-ring-floor.txt, call 11).
            self._call(copy, dst, addr, nbytes, raw)
            try:
                fence = self.fence_after(raw)
            except HipError:
                # No fence (a failed context): wait instead, so the buffer is not lent
                # out again while the copy may still read it.
                with contextlib.suppress(HipError):
                    self._call(self._calls.stream_synchronize, raw)
                raise
            self._staging.hold([fence], [keep])
            return
        block = self._staging.take(nbytes)
        ctypes.memmove(block.ptr, addr, nbytes)
        del keep
        try:
            self._call(copy, dst, block.ptr, nbytes, raw)
        except HipError:
            self._staging.give_back([block])
            raise
        if refs is not None:
            with self._ledger.lock:
                refs.append(block)
        else:
            self._staging.retire([self.fence_after(raw)], [block])

    def memcpy_htod_many(
        self, pieces: Sequence[tuple[int, memoryview]], stream: Handle | None = None
    ) -> None:
        """Small host-to-device copies, in order, as :meth:`memcpy_htod` of each. On a
        stream they are carved side by side from the stream's pinned block, the device,
        stream and capture state looked up once for all; on the default stream all are
        issued and one synchronise covers them, where one copy after another would wait
        for each (the pieces' bytes must stay valid only until this returns). Either
        way the copies go to the runtime as one batch where it can (:meth:`_batchable`)."""
        if stream is not None or getattr(self._tls, "ptds_capture", None) is not None:
            self._carve_many(pieces, stream)
            return
        self._current()
        raw = self._stream(None)
        self._staging.reclaim()
        # The pieces side by side in one buffer: one address to look up, not one each.
        joined = b"".join(src for _, src in pieces)
        base, _, keep = host_address(joined, writable=False)
        copies = _packed(pieces, base)
        try:
            if self._batchable(pieces):
                self._issue_batch(copies, raw)
            else:
                copy = self._calls.memcpy_htod_async
                for dst, addr, nbytes in copies:
                    self._call(copy, dst, addr, nbytes, raw)
        except HipError:
            # The copies already issued still read their bytes: wait for them first.
            with contextlib.suppress(HipError):
                self._call(self._calls.stream_synchronize, raw)
            raise
        self._call(self._calls.stream_synchronize, raw)
        del keep

    def _carve_many(self, pieces: Sequence[tuple[int, memoryview]], stream: Handle | None) -> None:
        """:meth:`memcpy_htod_many`'s pieces on a stream that is not being captured, side by
        side in one region of the stream's carve block (a batch up to a block's size, as
        hipr's client sends), with one look-up of the device, the stream and its capture
        state for the whole batch (one capture query, a driver call, instead of one per
        copy). A larger batch is carved piece by piece; anything else (a capture, a piece
        too large to carve) goes through :meth:`memcpy_htod` one by one."""
        self._current()
        raw = self._stream(stream)
        self._staging.reclaim()
        if not isinstance(stream, GpuStream) or self._capture_refs(stream, raw) is not None:
            for dst, src in pieces:
                self.memcpy_htod(dst, src, stream)
            return
        fence = partial(self.fence_after, raw)
        staging = self._staging
        total = sum(src.nbytes for _, src in pieces)
        if 0 < total <= PinnedStaging.MIN_BLOCK:
            # The pieces side by side in one carved region: one carve and one copy into
            # pinned memory for the batch, not one of each per piece.
            base = staging.carve(stream, total, fence)
            ctypes.memmove(base, b"".join(src for _, src in pieces), total)
            copies = _packed(pieces, base)
            if self._batchable(pieces):
                self._issue_batch(copies, raw)
                return
            copy = self._calls.memcpy_htod_async
            for dst, pinned, nbytes in copies:
                # A failed copy leaves its piece unused: the block still retires in order.
                self._call(copy, dst, pinned, nbytes, raw)
            return
        copy = self._calls.memcpy_htod_async
        for dst, src in pieces:  # a batch larger than a carve block (not from hipr's client)
            nbytes = src.nbytes
            if not nbytes:
                continue
            if nbytes > PinnedStaging.MAX_CARVED:
                self.memcpy_htod(dst, src, stream)
                continue
            pinned = staging.carve(stream, nbytes, fence)
            ctypes.memmove(pinned, src.tobytes(), nbytes)
            self._call(copy, dst, pinned, nbytes, raw)

    def _batchable(self, pieces: Sequence[tuple[int, memoryview]]) -> bool:
        """True when ``pieces`` (destination, bytes) may go to the runtime as batches: it
        has the call, and no two pieces write a byte in common (a batch keeps no order
        among its copies, so only then does it end as the copies one after another)."""
        if not self._batch_copies or len(pieces) < 2:
            return False
        # The same start twice (one word written again and again) is the common overlap,
        # found without sorting.
        if len({dst for dst, _ in pieces}) < len(pieces):
            return False
        spans = sorted((dst, src.nbytes) for dst, src in pieces)
        return all(a + n <= b for (a, n), (b, _) in pairwise(spans))

    def _issue_batch(self, copies: list[tuple[int, int, int]], raw: Any) -> None:
        """Issue host-to-device copies (destination, source, bytes) that write no byte in
        common: one batch call, or one call each for a single copy and where the runtime
        turns batches down as unsupported (a driver older than its binding: one call each
        from then on). The sources stay valid until a fence or synchronise behind the
        copies (a carved region's block retires in order, failed or not)."""
        if len(copies) > 1 and self._batch_copies:
            dsts, srcs, sizes = zip(*copies, strict=True)
            try:
                self._rt.copy_batch(dsts, srcs, sizes, raw)
            except HipError as exc:
                if exc.code not in _BATCH_UNSUPPORTED:
                    raise
                self._batch_copies = False
            except RuntimeError:  # the binding could not find the driver's function
                self._batch_copies = False
            else:
                return
        copy = self._calls.memcpy_htod_async
        for dst, pinned, nbytes in copies:
            self._call(copy, dst, pinned, nbytes, raw)

    def memcpy_dtoh(self, dst: memoryview, src: int, stream: Handle | None = None) -> None:
        """Device to host; returns once the bytes are in ``dst``."""
        self._current()
        raw = self._stream(stream)
        addr, nbytes, keep = host_address(dst, writable=True)
        if nbytes == 0:
            return
        self._call(self._calls.memcpy_dtoh_async, addr, src, nbytes, raw)
        self._call(self._calls.stream_synchronize, raw)
        del keep

    def memcpy_dtoh_if_quick(
        self, dst: memoryview, src: int, stream: Handle | None, spin_seconds: float
    ) -> bool:
        """A small device-to-host copy (at most :data:`QUICK_DTOH_BYTES`) made without
        waiting for the GPU, for the worker's event loop (PyTorch's ``item()``): queued
        on the stream into a pinned block, its end polled for up to ``spin_seconds``.
        True once the bytes are in ``dst``. False, with ``dst`` untouched, when the copy
        is larger, the stream is being captured, or the copy had not ended by then (the
        block goes back once a fence behind it passes): the caller then makes the usual,
        waiting copy, which reads the same bytes. A failed query (a faulted kernel) raises
        as :meth:`memcpy_dtoh` would."""
        nbytes = memoryview(dst).nbytes
        if nbytes > QUICK_DTOH_BYTES:
            return False
        self._current()
        raw = self._stream(stream)
        if nbytes == 0:
            return True
        if self._capture_refs(stream, raw) is not None:
            return False  # a captured copy is recorded, not run: the usual way refuses it
        addr, _, keep = host_address(dst, writable=True)
        block = self._staging.take(nbytes)
        try:
            self._call(self._calls.memcpy_dtoh_async, block.ptr, src, nbytes, raw)
        except BaseException:
            self._staging.give_back([block])  # nothing was queued to write it
            raise
        query = self._calls.stream_query
        deadline = time.perf_counter() + spin_seconds
        try:
            done = self._query(query, raw)
            while not done and time.perf_counter() < deadline:
                done = self._query(query, raw)
        except HipError:
            self._staging.give_back([block])  # the stream failed: the copy will not write
            raise
        if done:
            ctypes.memmove(addr, block.ptr, nbytes)
            del keep
            self._staging.give_back([block])
            return True
        try:
            fence = self.fence_after(raw)
        except HipError:
            # Nothing to tell when the copy has written the block: wait for it here.
            with contextlib.suppress(HipError):
                self._call(self._calls.stream_synchronize, raw)
            self._staging.give_back([block])
            return False
        self._staging.retire([fence], [block])
        return False

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Handle | None = None) -> None:
        """Device to device; without a stream it returns once done."""
        self._current()
        raw = self._stream(stream)
        if size == 0:
            return
        self._call(self._calls.memcpy_dtod_async, dst, src, size, raw)
        if stream is None:
            self._sync_default(raw)

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """Set bytes; without a stream it returns once done."""
        self._current()
        raw = self._stream(stream)
        if size == 0:
            return
        self._call(self._calls.memset_d8_async, ptr, value & 0xFF, size, raw)
        if stream is None:
            self._sync_default(raw)

    def _sync_default(self, raw: Any) -> None:
        # A "synchronous" call on the default stream while it is being captured is
        # recorded into the graph, not run; synchronising then would break the capture.
        if getattr(self._tls, "ptds_capture", None) is None:
            self._call(self._calls.stream_synchronize, raw)
