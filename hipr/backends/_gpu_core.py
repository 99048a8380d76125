"""The GPU backend's core: the runtime it drives, each session's lane (device, default
streams, capture), devices, payload buffers and the staging hooks, accounting and
close. :class:`~hipr.backends.gpu.GpuBackend` adds memory, streams and events,
kernels and graphs, each in a module of its own, on top of :class:`GpuCore`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hipr.backends._code_cache import CodeCache
from hipr.backends._gpu_handles import GpuModule, GpuStream, Ledger, PinnedBlock, live
from hipr.backends._launch_wait import LaunchWait, load_launch_wait
from hipr.backends._pinned import PinnedPayloads, PinnedStaging
from hipr.backends._runtime import SUCCESS, Runtime
from hipr.backends.interface import BackendStats, DeviceProperties, Handle
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.amdhsa import Layouts as AmdhsaLayouts

E = HipErrorCode
_T = TypeVar("_T")


class _LaneState:
    """One lane: a session thread's device, its default streams and a capture on them.
    Attributes appear as they are first set (``device``, ``default_streams``,
    ``ptds_capture``); readers use ``getattr`` with a default."""


class _ThreadLanes(threading.local):
    """Each thread's current lane: its own, or one it borrows in ``run_in_lane``."""

    def __init__(self) -> None:
        self.state = _LaneState()


def _quick_htod(dst: int, src: Any, stream: Handle | None = None) -> bool:
    """A host-to-device copy that cannot wait for the GPU: on a stream, small enough to
    be staged in the stream's carve block (no synchronise; an allocation only when the
    pool has no block to carve from)."""
    return isinstance(stream, GpuStream) and memoryview(src).nbytes <= PinnedStaging.MAX_CARVED


def _quick_htod_many(pieces: Sequence[tuple[int, Any]], stream: Handle | None = None) -> bool:
    """:func:`_quick_htod` for every piece of a :meth:`GpuBackend.memcpy_htod_many`."""
    limit = PinnedStaging.MAX_CARVED
    return isinstance(stream, GpuStream) and all(
        memoryview(src).nbytes <= limit for _, src in pieces
    )


class GpuCore:
    """What every part of the GPU backend stands on: the runtime, lanes, devices, payload
    buffers and staging hooks, accounting and close (see module doc)."""

    #: Calls that never wait for the GPU: the worker may run them on its event loop,
    #: in the session's lane (:meth:`run_in_lane`), so that they land on the session's
    #: own default stream, in order with the work its GPU thread issued.
    inline_calls: frozenset[str] = frozenset(
        {
            "device_count",
            "device_properties",
            "mem_get_info",
            "launch",
            "event_record",
            "stream_wait_event",
            "stream_query",
            "event_query",
            "event_elapsed_ms",
            "graph_launch",
            # Polls for at most the time its caller gives, then leaves the copy queued.
            "memcpy_dtoh_if_quick",
        }
    )

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        #: ``"cuda"`` or ``"hip"``: the runtime's name.
        self.name: str = runtime.name
        self._count = runtime.open()
        self._calls = runtime.calls
        self._k = runtime.constants()
        k = self._k
        # The launch ``extra`` array's marker words, converted once (every launch uses them).
        self._extra_words = (
            int(k.launch_buffer_pointer),
            int(k.launch_buffer_size),
            int(k.launch_end),
        )
        # Bound once: the hot path pays no lookup of the runtime on each call.
        self._call: Callable[..., Any] = runtime.call
        self._launch_kernel = runtime.function(self._calls.launch_kernel)
        entries = runtime.native_entries()
        #: The launch and its wait as one native call (``launch_waited``); None where
        #: the runtime gives no C entry points or the library cannot be had.
        self._launch_wait: LaunchWait | None = (
            None if entries is None else load_launch_wait(*entries, runtime.not_ready)
        )
        #: ``launch_waited``'s last arguments and what it made of them (checked geometry,
        #: the function's address, the arguments cut to its parameters); loop thread only.
        self._last_launch: tuple[Any, ...] | None = None
        #: Each OS thread's reused launch ``extra`` (the loop's and every session's).
        self._launch_extras = threading.local()
        self._props: dict[int, DeviceProperties] = {}
        self._builtin: dict[int, GpuModule] = {}
        self._builtin_lock = threading.Lock()
        self._ledger = Ledger()
        self._lanes = _ThreadLanes()
        #: The device whose context the worker's loop thread has current (run_in_lane).
        self._loop_ctx = threading.local()
        self._code_cache = CodeCache()
        # Parameter-space sizes by function address; cleared when a module goes, since
        # a later module's function may reuse the address.
        self._param_sizes: dict[int, int | None] = {}
        # Where the runtime cannot report parameter layouts (HIP), the code objects do.
        self._amdhsa = AmdhsaLayouts()
        self._staging = PinnedStaging(self)
        self._payloads = PinnedPayloads(self)
        #: Small copies of one MEMCPY_HTOD_MANY go to the runtime as one batch
        #: (:meth:`Runtime.copy_batch`); False once it turned a batch down.
        batch_call = runtime.batch_copy_call
        self._batch_copies = batch_call is not None and runtime.provides(batch_call)
        # Pinned buffers of captures on streams this backend did not start capturing
        # (joined into a capture through an event): no graph to hand them to, so they
        # live until close().
        self._orphan_refs: list[PinnedBlock] = []
        self._bound_devices: set[int] = set()
        self._closed = False
        #: Calls that are quick for some arguments (see ``Backend.inline_when``): a small
        #: async copy on a stream only stages its bytes and queues the copy.
        self.inline_when: dict[str, Callable[..., bool]] = {
            "memcpy_htod": _quick_htod,
            "memcpy_htod_many": _quick_htod_many,
        }

    @property
    def native_launch(self) -> bool:
        """True when launches waited for go through the native launch-and-wait
        (``launch_waited``): the worker's express path is worth a look then."""
        return self._launch_wait is not None

    # --- plumbing ------------------------------------------------------------------------

    @property
    def _tls(self) -> Any:
        """The calling thread's current lane state (see ``run_in_lane``)."""
        return self._lanes.state

    def _current(self) -> int:
        """The calling thread's device, binding device 0 first if it never bound."""
        device: int | None = getattr(self._tls, "device", None)
        if device is None:
            self.bind_thread(0)
            return 0
        return device

    def _stream(self, stream: Handle | None) -> Any:
        if stream is None:
            return self._default_stream()
        return live(stream, GpuStream, "stream")

    def _default_stream(self) -> Any:
        """The lane's default stream on its current device: a stream of its own rather
        than the per-thread default stream, so that the lane's work stays in order
        whichever thread issues it (the session's GPU thread or the worker's loop)."""
        device = self._current()
        streams: dict[int, Any] | None = getattr(self._tls, "default_streams", None)
        if streams is None:
            streams = self._tls.default_streams = {}
        raw = streams.get(device)
        if raw is None:
            raw = self._call(self._calls.stream_create, self._k.stream_flags)
            streams[device] = raw
        return raw

    # --- lanes: a session's thread state, borrowed by the worker's event loop -----------

    def current_lane(self) -> _LaneState:
        """The calling thread's state (device, default streams, capture): the session
        keeps it to run calls inline, on its event loop, as if on this thread."""
        self._current()
        return self._lanes.state

    def run_in_lane(self, lane: _LaneState, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the calling thread with ``lane``'s state and context (its
        owner thread must be idle). Makes the lane's device current here when needed.
        The lane object itself is borrowed, so what ``fn`` changes in it (a default
        stream made) stays with the lane; a swap of one reference keeps this cheap on
        the hot path of every inline launch and query."""
        lanes = self._lanes
        saved = lanes.state
        self._bind_loop(getattr(lane, "device", 0))
        lanes.state = lane
        try:
            return fn(*args)
        finally:
            lanes.state = saved

    def _bind_loop(self, device: int) -> None:
        """Make ``device`` current on the calling thread (the worker's loop, borrowing a
        lane) unless it already is."""
        if self._loop_ctx.__dict__.get("device") != device:
            self._rt.bind(device)
            self._loop_ctx.device = device

    def work_done(self, streams: Sequence[Handle]) -> bool:
        """True when the lane's default stream and ``streams`` have no pending work
        (asked without waiting); raises a failed kernel's error, as a query does."""
        query, fn = self._query, self._calls.stream_query
        for raw in getattr(self._tls, "default_streams", {}).values():
            if not query(fn, raw):
                return False
        return all(query(fn, live(s, GpuStream, "stream")) for s in streams)

    def release_thread(self) -> None:
        """Destroy the calling thread's default streams (its session is ending)."""
        streams: dict[int, Any] = getattr(self._tls, "default_streams", None) or {}
        for device, raw in list(streams.items()):
            self._rt.bind(device)
            self._rt.raw(self._calls.stream_destroy, raw)
        streams.clear()

    def _check_device(self, device: int) -> None:
        if not isinstance(device, int) or not 0 <= device < self._count:
            raise HipError(E.hipErrorInvalidDevice, f"device {device!r} not in [0, {self._count})")

    def _track(self, bucket: set[_T], obj: _T) -> _T:
        """Enter ``obj`` in the ledger's ``bucket``."""
        with self._ledger.lock:
            bucket.add(obj)
        return obj

    def _destroy(
        self,
        obj: Handle,
        cls: type,
        what: str,
        fn: str,
        bucket: set[Any],
        then: Callable[[Any], None] | None = None,
    ) -> None:
        """Destroy a wrapped runtime object with ``fn``. Once the runtime agreed, the
        ledger forgets it and the wrapper is refused from then on; ``then(obj)`` runs
        under the ledger's lock, to hand on what the object held."""
        raw = live(obj, cls, what)
        self._current()
        self._call(fn, raw)
        with self._ledger.lock:
            bucket.discard(obj)
            obj.handle = None
            if then is not None:
                then(obj)

    def _query(self, fn: str, handle: Any) -> bool:
        """A stream or event query: True when done, False when not ready."""
        (err,) = self._rt.raw(fn, handle)
        if int(err) == self._rt.not_ready:
            return False
        if int(err) != SUCCESS:
            raise self._rt.error(int(err), fn)
        return True

    # --- payload buffers ----------------------------------------------------------------

    def reserve_payload_buffers(self, count: int, block_bytes: int) -> int:
        """Pin ``count`` host buffers of ``block_bytes`` for the worker to receive large
        payloads into and to fill downloads from (:class:`PinnedPayloads`); the number
        held (fewer when the runtime refuses more). Portable, so every device's copies
        DMA from them directly; allocated under device 0's context, on the calling
        thread (not the event loop's: pinning takes milliseconds)."""
        self.bind_thread(0)
        return self._payloads.reserve(count, block_bytes)

    def payload_buffer(self, size: int) -> memoryview | None:
        """A free pinned payload buffer's first ``size`` bytes, or None."""
        return self._payloads.take(size)

    def payload_buffer_figures(self) -> dict[str, int]:
        """``{held, in_use, bytes}`` of the pinned payload buffers (status, metrics)."""
        return self._payloads.figures()

    # Staging hooks (StagingOps).
    def host_alloc(self, size: int) -> int:
        """Portable pinned host memory, for the staging pool."""
        return int(self._call(self._calls.host_alloc, size, self._k.host_alloc_flags))

    def host_free(self, ptr: int) -> None:
        """Free pinned host memory of the staging pool."""
        self._call(self._calls.host_free, ptr)

    def fence_after(self, stream: Any) -> Any:
        """A timing-free event recorded on ``stream`` now."""
        ev = self._call(self._calls.event_create, self._k.fence_flags)
        try:
            self._call(self._calls.event_record, ev, stream)
        except HipError:
            self._rt.raw(self._calls.event_destroy, ev)
            raise
        return ev

    def fence_done(self, fence: Any) -> bool:
        """Has the fence completed? An error (a poisoned context) counts as done: the
        work it guards will never run."""
        (err,) = self._rt.raw(self._calls.event_query, fence)
        return int(err) != self._rt.not_ready

    def fence_destroy(self, fence: Any) -> None:
        """Destroy a fence, ignoring errors (it is ours and no longer needed)."""
        self._rt.raw(self._calls.event_destroy, fence)

    def _capture_refs(self, stream: Handle | None, raw: Any) -> list[PinnedBlock] | None:
        """Where a copy's pinned block must live when ``raw`` is being captured, else None."""
        if isinstance(stream, GpuStream) and stream.capture_refs is not None:
            return stream.capture_refs
        if stream is None and getattr(self._tls, "ptds_capture", None) is not None:
            refs: list[PinnedBlock] = self._tls.ptds_capture
            return refs
        status = self._call(self._calls.stream_is_capturing, raw)
        if int(status) == int(self._k.capture_status_none):
            return None
        return self._orphan_refs

    # --- devices -----------------------------------------------------------------------

    def device_count(self) -> int:
        """Visible devices."""
        return self._count

    def device_properties(self, device: int) -> DeviceProperties:
        """Properties of ``device`` (read once, then cached: they do not change)."""
        self._check_device(device)
        cached = self._props.get(device)
        if cached is not None:
            return cached
        props = self._rt.read_properties(device)
        self._props[device] = props
        return props

    def bind_thread(self, device: int) -> None:
        """Make ``device`` current on the calling thread."""
        self._check_device(device)
        self._rt.bind(device)
        self._tls.device = device
        with self._ledger.lock:
            self._bound_devices.add(device)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        self._current()
        free, total = self._call(self._calls.mem_get_info)
        return int(free), int(total)

    def device_limit(self, limit: int) -> int:
        """A limit of the current device's context (CUlimit numbering);
        hipErrorNotSupported where the runtime adapter cannot tell (HIP for now)."""
        call = getattr(self._rt, "device_limit", None)
        if call is None:
            raise HipError(
                HipErrorCode.hipErrorNotSupported, "device limits are served on cuda workers only"
            )
        self._current()
        return int(call(limit))

    def synchronize(self) -> None:
        """Wait for all work on the current device (all sessions', as hipDeviceSynchronize
        does); reports a kernel's asynchronous failure."""
        self._current()
        self._call(self._calls.synchronize)
        self._staging.reclaim()

    def _drop_carves(self) -> None:
        """At close: the carve blocks of streams never destroyed go back to the pool once
        their devices have finished the copies that read them."""
        with self._ledger.lock:
            carved = [s for s in self._ledger.streams if s.carve is not None]
        for device in sorted({s.device for s in carved}):
            self.bind_thread(device)
            with contextlib.suppress(HipError):  # a failed context reads nothing more
                self._call(self._calls.synchronize)
        for stream in carved:
            if stream.carve is not None:
                self._staging.give_back([stream.carve.block])
                stream.carve = None

    # --- accounting ----------------------------------------------------------------------

    def stats(self) -> BackendStats:
        """Live resources created through this backend (built-in modules not counted)."""
        return self._ledger.stats()

    def close(self) -> None:
        """Free staging memory and the built-in modules, then give back what the runtime
        holds (on CUDA, the primary contexts)."""
        if self._closed:
            return
        self._closed = True
        for device, module in list(self._builtin.items()):
            try:
                self.bind_thread(device)
                self._call(self._calls.module_unload, module.handle)
            except HipError:
                pass
        self._builtin.clear()
        if self._bound_devices:
            try:
                self._drop_carves()
                self.bind_thread(min(self._bound_devices))
                self._staging.close(wait=lambda: self._call(self._calls.synchronize))
                self._payloads.close()
                for block in self._orphan_refs:
                    self.host_free(block.ptr)
                self._orphan_refs.clear()
            except HipError:
                pass
        self._rt.release()
        self._lanes = _ThreadLanes()
