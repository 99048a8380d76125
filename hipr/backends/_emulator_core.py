"""The emulator's core: device memory in host memory at stable fake addresses, streams
and events, pending and sticky faults, accounting. :class:`~hipr.backends.emulator.
EmulatorBackend` adds modules, kernels and graphs on top of :class:`EmulatorCore`.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import numpy as np

from hipr.backends._emulator_objects import (
    Allocation,
    Arena,
    CopyOp,
    Event,
    Function,
    Graph,
    GraphExec,
    MemsetOp,
    Module,
    Stream,
    UploadOp,
    align_up,
    check_size,
    fail,
)
from hipr.backends.interface import BackendStats, DeviceProperties, Handle
from hipr.backends.sticky import mark_sticky
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins_numpy import (
    KernelFault,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "ARENA_BASE",
    "ARENA_SPAN",
    "MAX_DEVICES",
    "PAGE_SIZE",
    "EmulatorCore",
]

#: Allocations start on page boundaries, as hipMalloc's do.
PAGE_SIZE: Final = 4096
#: Device ``d``'s addresses lie in ``[ARENA_BASE + d * ARENA_SPAN, ... + ARENA_SPAN)``: high
#: enough that a small integer is never mistaken for a device address, and disjoint per
#: device so that an address alone names its device.
ARENA_BASE: Final = 0x7F00_0000_0000
ARENA_SPAN: Final = 1 << 40
#: Keeps every arena below 2**48, the canonical user address range.
MAX_DEVICES: Final = 64

MAX_THREADS_PER_BLOCK: Final = 1024
MAX_BLOCK_DIM: Final = (1024, 1024, 1024)
MAX_GRID_DIM: Final = (2**31 - 1, 2**31 - 1, 2**31 - 1)
MAX_SHARED_MEMORY_PER_BLOCK: Final = 64 * 1024
DEFAULT_TOTAL_MEMORY: Final = 8 * 1024**3
#: CUDA device attributes (CUdevice_attribute -> value) the emulated device answers beyond
#: its named properties, as a cuda worker reports its driver's (``cudaAttributeIds`` /
#: ``cudaAttributeValues``): what the proxy's libcuda.so.1 needs to serve the CUDA runtime.
_CUDA_ATTRIBUTES: Final = {
    11: 2**31 - 1, 14: 512, 17: 0, 18: 0, 20: 0, 31: 1, 32: 0, 35: 0, 40: 2, 41: 1,
    78: 0, 79: 1, 80: 1, 81: MAX_SHARED_MEMORY_PER_BLOCK, 82: 65536, 84: 0, 85: 0, 90: 1,
    95: 0, 97: MAX_SHARED_MEMORY_PER_BLOCK, 99: 1, 106: 32, 108: 0, 111: 0, 126: 1,
    130: 0, 131: -1, 133: 0, 134: -1, 139: 0, 140: 0,
}  # fmt: skip

_E = HipErrorCode


class EmulatorCore:
    """What every part of the emulator stands on (see module doc)."""

    def work_done(self, streams: Sequence[Handle]) -> bool:
        """Every call here finishes before it returns: once the session's GPU thread is
        idle, its work is done; a pending kernel fault is raised, as synchronize does."""
        self._raise_pending(self._current())
        return True

    def __init__(
        self,
        device_count: int = 1,
        total_memory: int = DEFAULT_TOTAL_MEMORY,
        name: str = "hipr emulator",
        arch: str = "emu",
    ) -> None:
        if not 1 <= device_count <= MAX_DEVICES:
            raise ValueError(f"device_count must be between 1 and {MAX_DEVICES}")
        # Read at construction, not import, so that tests can shrink the address space.
        span = ARENA_SPAN
        if not 0 < total_memory <= span:
            raise ValueError(f"total_memory must be between 1 and {span} bytes")
        #: The backend's kind, as the worker reports it; the device name is separate.
        self.name = "emulator"
        self._device_name = name
        self._arch = arch
        self._device_count = device_count
        self._total_memory = total_memory
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._closed = False
        self._arenas = [
            Arena(start, start + span, start)
            for start in (ARENA_BASE + d * span for d in range(device_count))
        ]
        # Sorted bases of all live allocations, for the containing-allocation search.
        self._bases: list[int] = []
        self._allocations: dict[int, Allocation] = {}
        self._allocated_bytes = 0
        self._streams: set[Stream] = set()
        self._events: set[Event] = set()
        self._modules: set[Module] = set()
        self._graphs: set[Graph] = set()
        self._graph_execs: set[GraphExec] = set()
        self._pending: dict[int, HipError] = {}
        #: Set by a sticky fault: every later call fails with it until reset_context().
        self._poisoned: HipError | None = None
        #: One built-in module per device, shared by every session as on a GPU backend.
        self._builtin: dict[int, Module] = {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(device_count={self._device_count}, "
            f"total_memory={self._total_memory}, name={self._device_name!r}, "
            f"arch={self._arch!r})"
        )

    # --- internals: devices, handles, memory -------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise fail(_E.hipErrorDeinitialized, "the emulator backend has been closed")
        self._check_poisoned()

    def _check_poisoned(self) -> None:
        poisoned = self._poisoned
        if poisoned is not None:
            raise mark_sticky(HipError(poisoned.code, poisoned.message))

    def _check_device(self, device: int) -> int:
        if isinstance(device, bool) or not isinstance(device, int):
            raise fail(_E.hipErrorInvalidDevice, f"device must be an int, got {device!r}")
        if not 0 <= device < self._device_count:
            raise fail(
                _E.hipErrorInvalidDevice,
                f"device {device} does not exist (the emulator has {self._device_count})",
            )
        return device

    def _current(self) -> int:
        device: int = getattr(self._tls, "device", 0)
        return device

    def _stream(self, stream: Handle) -> Stream:
        if not isinstance(stream, Stream) or stream not in self._streams:
            raise fail(_E.hipErrorInvalidHandle, f"{stream!r} is not a live stream")
        return stream

    def _stream_or_null(self, stream: Handle | None) -> tuple[Stream | None, int]:
        """The stream (None for the null stream) and the device its work runs on."""
        if stream is None:
            return None, self._current()
        s = self._stream(stream)
        return s, s.device

    def _event(self, event: Handle) -> Event:
        if not isinstance(event, Event) or event not in self._events:
            raise fail(_E.hipErrorInvalidHandle, f"{event!r} is not a live event")
        return event

    def _module(self, module: Handle) -> Module:
        if not isinstance(module, Module) or module not in self._modules:
            raise fail(_E.hipErrorInvalidHandle, f"{module!r} is not a loaded module")
        return module

    def _function(self, function: Handle) -> Function:
        if not isinstance(function, Function) or function.module not in self._modules:
            raise fail(
                _E.hipErrorInvalidHandle,
                f"{function!r} is not a function of a loaded module",
            )
        return function

    def _graph(self, graph: Handle) -> Graph:
        if not isinstance(graph, Graph) or graph not in self._graphs:
            raise fail(_E.hipErrorInvalidHandle, f"{graph!r} is not a live graph")
        return graph

    def _graph_exec(self, graph_exec: Handle) -> GraphExec:
        if not isinstance(graph_exec, GraphExec) or graph_exec not in self._graph_execs:
            raise fail(_E.hipErrorInvalidHandle, f"{graph_exec!r} is not a live graph exec")
        return graph_exec

    def _find(self, ptr: int, size: int, device: int | None = None) -> tuple[Allocation, int]:
        """The live allocation holding all of ``[ptr, ptr + size)`` and the offset of
        ``ptr`` in it; with ``device``, the allocation must belong to it. Raises KernelFault."""
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise KernelFault(f"a device address must be an int, got {type(ptr).__name__}")
        with self._lock:
            i = bisect.bisect_right(self._bases, ptr) - 1
            alloc = self._allocations[self._bases[i]] if i >= 0 else None
        if alloc is None or not alloc.base <= ptr < alloc.base + alloc.size:
            raise KernelFault(f"address {ptr:#x} is not inside a live allocation")
        offset = ptr - alloc.base
        if offset + size > alloc.size:
            raise KernelFault(
                f"{size} bytes at {ptr:#x} run past the end of the {alloc.size}-byte "
                f"allocation at {alloc.base:#x} (by {offset + size - alloc.size} bytes)"
            )
        if device is not None and alloc.device != device:
            raise KernelFault(
                f"address {ptr:#x} is memory of device {alloc.device}; the kernel runs on "
                f"device {device}"
            )
        return alloc, offset

    def _range(self, ptr: int, size: int, what: str) -> tuple[Allocation, int]:
        """:meth:`_find` for a call checked at submission: hipErrorInvalidValue."""
        try:
            return self._find(ptr, size)
        except KernelFault as fault:
            raise fail(_E.hipErrorInvalidValue, f"{what}: {fault}") from None

    def _set_pending(self, device: int, error: HipError) -> None:
        with self._lock:
            # Like HIP, the first fault is the one reported.
            self._pending.setdefault(device, error)

    def _raise_pending(self, device: int) -> None:
        self._check_poisoned()
        with self._lock:
            error = self._pending.pop(device, None)
        if error is not None:
            raise error

    def _capture_unsupported(self, stream: Stream, what: str) -> HipError:
        # As in HIP, an illegal call during capture also invalidates the capture, so the
        # graph that end_capture would return can never silently miss the operation.
        stream.capture_invalidated = True
        return fail(
            _E.hipErrorStreamCaptureUnsupported,
            f"{what} is not allowed on a capturing stream; the capture is invalidated",
        )

    def _place(self, arena: Arena, size: int) -> int:
        """An address for ``size`` bytes in ``arena``; called with the lock held."""
        span = align_up(size, PAGE_SIZE)
        if not arena.wrapped:
            if arena.next + span <= arena.end:
                base = arena.next
                arena.next += span
                return base
            arena.wrapped = True
        # Bumping never reuses a freed address soon (stale pointers then fault instead of
        # hitting new data); once the arena's addresses are spent, first fit among gaps.
        lo = bisect.bisect_left(self._bases, arena.start)
        hi = bisect.bisect_left(self._bases, arena.end)
        cursor = arena.start
        for base in self._bases[lo:hi]:
            if base - cursor >= span:
                return cursor
            cursor = align_up(base + self._allocations[base].size, PAGE_SIZE)
        if arena.end - cursor >= span:
            return cursor
        raise fail(_E.hipErrorOutOfMemory, f"no free address range of {size} bytes is left")

    # --- devices -----------------------------------------------------------------------

    def device_count(self) -> int:
        """Visible devices."""
        return self._device_count

    def device_properties(self, device: int) -> DeviceProperties:
        """Fixed, plausible properties; hipErrorInvalidDevice when out of range."""
        self._check_device(device)
        return DeviceProperties(
            name=self._device_name,
            arch=self._arch,
            total_memory=self._total_memory,
            multiprocessor_count=8,
            # HIP's production target is AMD, whose wavefronts are 64 wide.
            warp_size=64,
            max_threads_per_block=MAX_THREADS_PER_BLOCK,
            clock_rate_khz=1_500_000,
            pci_bus_id=f"0000:{device:02x}:00.0",
            major=1,
            minor=0,
            max_shared_memory_per_block=MAX_SHARED_MEMORY_PER_BLOCK,
            hip_props={
                "maxThreadsDim": list(MAX_BLOCK_DIM),
                "maxGridSize": list(MAX_GRID_DIM),
                "totalConstMem": 64 << 10,
                "l2CacheSize": 4 << 20,
                "maxThreadsPerMultiProcessor": 2048,
                "regsPerBlock": 65536,
                "memoryClockRate": 1_000_000,
                "memoryBusWidth": 4096,
                "concurrentKernels": 1,
                "integrated": 0,
                "ECCEnabled": 0,
                "cudaAttributeIds": list(_CUDA_ATTRIBUTES),
                "cudaAttributeValues": list(_CUDA_ATTRIBUTES.values()),
            },
        )

    def bind_thread(self, device: int) -> None:
        """Make ``device`` current on the calling thread."""
        self._tls.device = self._check_device(device)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the calling thread's current device."""
        with self._lock:
            used = self._arenas[self._current()].used
        return self._total_memory - used, self._total_memory

    def synchronize(self) -> None:
        """Work ran at submission; raise (and clear) the device's pending kernel fault."""
        self._raise_pending(self._current())

    # --- memory ------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """Allocate ``size`` bytes (zeroed) on the current device.

        hipErrorOutOfMemory past the device's capacity; hipErrorInvalidValue for 0 bytes
        (HIP returns a null pointer then, which no caller of this interface can use) and
        for negative sizes.
        """
        check_size(size, "malloc size")
        if size == 0:
            raise fail(
                _E.hipErrorInvalidValue,
                "malloc of 0 bytes: HIP would return a null pointer; allocate at least 1 byte",
            )
        device = self._current()
        with self._lock:
            self._check_open()
            arena = self._arenas[device]
            free = self._total_memory - arena.used
            if size > free:
                raise fail(
                    _E.hipErrorOutOfMemory,
                    f"malloc of {size} bytes on device {device}: only {free} of "
                    f"{self._total_memory} bytes are free",
                )
            base = self._insert(device, size)
            arena.used += size
            self._allocated_bytes += size
        return base

    def _insert(self, device: int, size: int, *, at_top: bool = False) -> int:
        """A zeroed allocation of ``size`` bytes on ``device``, placed and indexed (not
        counted against the device's memory); called with the lock held. ``at_top``:
        taken off the top of the device's address range, which then ends below it, so
        that the addresses allocations get are the same with it as without."""
        arena = self._arenas[device]
        if at_top:
            span = align_up(size, PAGE_SIZE)
            if arena.end - span < max(arena.next, arena.start + span):
                raise fail(_E.hipErrorOutOfMemory, "no address range is left for a variable")
            arena.end -= span
            base = arena.end
        else:
            base = self._place(arena, size)
        try:
            # calloc underneath: untouched pages of a large allocation cost no RAM.
            buf = np.zeros(size, dtype=np.uint8)
        except MemoryError:
            raise fail(_E.hipErrorOutOfMemory, f"the host cannot back {size} more bytes") from None
        self._allocations[base] = Allocation(device, base, size, buf)
        bisect.insort(self._bases, base)
        return base

    def _module_variables(self, module: Module, variables: dict[str, tuple[int, str]]) -> None:
        """Place a module's variables in its device's memory, zeroed, as a loader does;
        called with the lock held. They belong to the module (not counted as allocations)."""
        for name, (size, _) in variables.items():
            module.globals[name] = (self._insert(module.device, size, at_top=True), size)

    def _drop_module_variables(self, module: Module) -> None:
        """Free what :meth:`_module_variables` placed; called with the lock held."""
        for base, _ in module.globals.values():
            if self._allocations.pop(base, None) is not None:
                del self._bases[bisect.bisect_left(self._bases, base)]
        module.globals.clear()

    def free(self, ptr: int) -> None:
        """Free an allocation by its base address; hipErrorInvalidValue for any other
        address. ``free(0)`` does nothing, as ``hipFree(nullptr)`` does."""
        if ptr == 0:
            return
        with self._lock:
            alloc = self._allocations.pop(ptr, None)
            if alloc is None:
                raise fail(
                    _E.hipErrorInvalidValue,
                    f"free of {ptr:#x}: not the base address of a live allocation"
                    if isinstance(ptr, int)
                    else f"free of {ptr!r}: not a device address",
                )
            del self._bases[bisect.bisect_left(self._bases, ptr)]
            self._arenas[alloc.device].used -= alloc.size
            self._allocated_bytes -= alloc.size

    def memcpy_htod(self, dst: int, src: memoryview, stream: Handle | None = None) -> None:
        """Copy host bytes to the device; on a capturing stream the bytes are copied into
        the captured node."""
        s, _device = self._stream_or_null(stream)
        view = memoryview(src)
        if not view.contiguous:
            raise fail(_E.hipErrorInvalidValue, "memcpy_htod: the host buffer is not contiguous")
        alloc, offset = self._range(dst, view.nbytes, "memcpy_htod destination")
        if s is not None and s.capture is not None:
            s.capture.append(UploadOp(dst, view.tobytes()))
            return
        alloc.buf[offset : offset + view.nbytes] = np.frombuffer(view, dtype=np.uint8)

    def host_window(self, dst: int, size: int) -> memoryview:
        """The device bytes ``[dst, dst + size)`` as a writable host view: the emulator's
        device memory is host memory, so the worker may receive an upload's bytes
        straight into it (see ``hipr.backends.interface``). The view keeps the memory alive
        even if the allocation is freed meanwhile."""
        alloc, offset = self._range(dst, size, "host_window")
        return alloc.buf.data[offset : offset + size]

    def memcpy_htod_many(
        self, pieces: Sequence[tuple[int, memoryview]], stream: Handle | None = None
    ) -> None:
        """Small host-to-device copies, in order, as :meth:`memcpy_htod` of each (one
        backend call for a batch: the worker can run a small one inline)."""
        for dst, src in pieces:
            self.memcpy_htod(dst, src, stream)

    def memcpy_dtoh(self, dst: memoryview, src: int, stream: Handle | None = None) -> None:
        """Copy ``dst.nbytes`` device bytes into the writable host buffer ``dst``. It waits
        for the device, so it raises (and clears) a pending kernel fault, as HIP does."""
        s, device = self._stream_or_null(stream)
        view = memoryview(dst)
        if view.readonly or not view.contiguous:
            raise fail(
                _E.hipErrorInvalidValue,
                "memcpy_dtoh: the host buffer must be writable and contiguous",
            )
        if s is not None and s.capture is not None:
            raise self._capture_unsupported(s, "memcpy_dtoh (a synchronous copy to the host)")
        self._raise_pending(device)
        alloc, offset = self._range(src, view.nbytes, "memcpy_dtoh source")
        np.frombuffer(view, dtype=np.uint8)[...] = alloc.buf[offset : offset + view.nbytes]

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Handle | None = None) -> None:
        """Copy between device ranges, on any devices; overlapping ranges copy as memmove."""
        s, _device = self._stream_or_null(stream)
        check_size(size, "memcpy_dtod size")
        op = CopyOp(dst, src, size)
        self._check_copy(op)
        if s is not None and s.capture is not None:
            s.capture.append(op)
            return
        self._copy(op)

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """Set ``size`` bytes to ``value & 0xFF``, as hipMemset takes its value."""
        s, _device = self._stream_or_null(stream)
        check_size(size, "memset size")
        op = MemsetOp(ptr, int(value) & 0xFF, size)
        self._range(ptr, size, "memset")
        if s is not None and s.capture is not None:
            s.capture.append(op)
            return
        self._memset(op)

    def _check_copy(self, op: CopyOp) -> None:
        self._range(op.src, op.size, "memcpy_dtod source")
        self._range(op.dst, op.size, "memcpy_dtod destination")

    def _copy(self, op: CopyOp) -> None:
        # Both ranges are resolved before anything is written: a bad one writes nothing.
        src, s_off = self._find(op.src, op.size)
        dst, d_off = self._find(op.dst, op.size)
        # numpy detects overlapping source and destination and buffers: memmove semantics.
        dst.buf[d_off : d_off + op.size] = src.buf[s_off : s_off + op.size]

    def _memset(self, op: MemsetOp) -> None:
        alloc, offset = self._find(op.ptr, op.size)
        alloc.buf[offset : offset + op.size] = op.value

    def _upload(self, op: UploadOp) -> None:
        alloc, offset = self._find(op.dst, len(op.data))
        alloc.buf[offset : offset + len(op.data)] = np.frombuffer(op.data, dtype=np.uint8)

    # --- streams and events --------------------------------------------------------------

    def stream_create(self) -> Stream:
        """A new stream on the current device."""
        stream = Stream(self._current())
        with self._lock:
            self._check_open()
            self._streams.add(stream)
        return stream

    def stream_destroy(self, stream: Handle) -> None:
        """Destroy a stream; a capture in progress on it is discarded."""
        s = self._stream(stream)
        with self._lock:
            self._streams.discard(s)
        s.capture = None

    def stream_synchronize(self, stream: Handle | None) -> None:
        """Raise (and clear) the pending kernel fault of the stream's device."""
        s, device = self._stream_or_null(stream)
        if s is not None and s.capture is not None:
            raise self._capture_unsupported(s, "stream_synchronize")
        self._raise_pending(device)

    def stream_query(self, stream: Handle | None) -> bool:
        """Always True: work completes at submission."""
        s, _device = self._stream_or_null(stream)
        if s is not None and s.capture is not None:
            raise self._capture_unsupported(s, "stream_query")
        return True

    def stream_wait_event(self, stream: Handle | None, event: Handle) -> None:
        """Nothing to wait for: the event's work completed when it was submitted."""
        self._stream_or_null(stream)
        self._event(event)

    def event_create(self) -> Event:
        """A new event on the current device, with timing."""
        event = Event(self._current())
        with self._lock:
            self._check_open()
            self._events.add(event)
        return event

    def event_destroy(self, event: Handle) -> None:
        """Destroy an event."""
        e = self._event(event)
        with self._lock:
            self._events.discard(e)

    def event_record(self, event: Handle, stream: Handle | None) -> None:
        """Record the time now: all earlier work on the stream has already run."""
        e = self._event(event)
        s, device = self._stream_or_null(stream)
        if e.device != device:
            raise fail(
                _E.hipErrorInvalidHandle,
                f"event of device {e.device} recorded on a stream of device {device}",
            )
        if s is not None and s.capture is not None:
            # Events in captures serve cross-stream fork/join, which the emulator's
            # single-stream capture does not model.
            raise self._capture_unsupported(s, "event_record")
        e.recorded_at = time.perf_counter()

    def event_synchronize(self, event: Handle) -> None:
        """Raise (and clear) the pending kernel fault of the event's device."""
        e = self._event(event)
        self._raise_pending(e.device)

    def event_query(self, event: Handle) -> bool:
        """Always True: recorded work has completed."""
        self._event(event)
        return True

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """Milliseconds between the host times at which the two events were recorded;
        hipErrorInvalidHandle when either was never recorded, as HIP does."""
        s, e = self._event(start), self._event(end)
        if s.recorded_at is None or e.recorded_at is None:
            raise fail(_E.hipErrorInvalidHandle, "event_elapsed_ms: an event was never recorded")
        if s.device != e.device:
            raise fail(_E.hipErrorInvalidHandle, "event_elapsed_ms: events of different devices")
        return (e.recorded_at - s.recorded_at) * 1000.0

    # --- accounting -----------------------------------------------------------------------

    def stats(self) -> BackendStats:
        """Live resources across all devices and sessions."""
        with self._lock:
            # Module variables are the modules', not allocations of a session.
            variables = sum(len(m.globals) for m in self._modules)
            return BackendStats(
                allocations=len(self._allocations) - variables,
                allocated_bytes=self._allocated_bytes,
                streams=len(self._streams),
                events=len(self._events),
                # The shared built-in modules belong to the backend, not to a session,
                # as on cuda and hip: counting them would read as a leak.
                modules=len(self._modules)
                - sum(m in self._modules for m in self._builtin.values()),
                graphs=len(self._graphs),
                graph_execs=len(self._graph_execs),
            )

    def _poison(self, message: str) -> None:
        with self._lock:
            if self._poisoned is None:
                self._poisoned = mark_sticky(
                    fail(
                        _E.hipErrorIllegalAddress,
                        f"{message}; the context is unusable until it is reset",
                    )
                )

    def reset_context(self) -> None:
        """Destroy everything every session held and clear a sticky fault, as
        ``cuDevicePrimaryCtxReset`` / ``hipDeviceReset`` do on a GPU. Addresses keep
        advancing, so a stale pointer of the old context faults instead of reaching the
        new one's data."""
        with self._lock:
            self._clear()
            self._poisoned = None

    def _clear(self) -> None:
        self._allocations.clear()
        self._bases.clear()
        self._allocated_bytes = 0
        for arena in self._arenas:
            arena.used = 0
        self._streams.clear()
        self._events.clear()
        self._modules.clear()
        self._graphs.clear()
        self._graph_execs.clear()
        self._pending.clear()
        self._builtin.clear()

    def close(self) -> None:
        """Free everything; later calls that create resources raise hipErrorDeinitialized."""
        with self._lock:
            self._closed = True
            self._clear()
