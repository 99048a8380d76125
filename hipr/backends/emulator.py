"""The emulator backend: a HIP-like device in host memory, for CI, laptops and the demo.

Device memory is numpy ``uint8`` arrays at stable fake addresses; the built-in kernels of
:mod:`hipr.kernels.builtins` run as numpy code with the same argument lists and the same
results as their HIP sources. Work is executed synchronously at submission, which makes
every stream's ordering trivially hold, while HIP's observable rules are kept: per-thread
current device, asynchronous kernel faults reported by the next synchronising call,
stream capture into graphs, and HIP's error codes for misuse.

The emulator is deliberately strict where a real GPU would misbehave silently or later
(an overrunning copy, a stale pointer, a kernel argument buffer of the wrong size), so
that client and worker bugs surface in CI rather than on a production GPU.
"""

from __future__ import annotations

import bisect
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from hipr.backends.base import BackendStats, DeviceProperties, Dim3, Handle
from hipr.backends.sticky import mark_sticky
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTINS, BuiltinKernel
from hipr.kernels.spin import SPIN_KERNEL

if TYPE_CHECKING:
    from hipr.backends.base import Backend

__all__ = [
    "ARENA_BASE",
    "ARENA_SPAN",
    "MAX_DEVICES",
    "PAGE_SIZE",
    "ArgLayout",
    "EmulatorBackend",
    "arg_layout",
    "unpack_args",
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

_MAX_THREADS_PER_BLOCK: Final = 1024
_MAX_BLOCK_DIM: Final = (1024, 1024, 1024)
_MAX_GRID_DIM: Final = (2**31 - 1, 2**31 - 1, 2**31 - 1)
_MAX_SHARED_MEMORY_PER_BLOCK: Final = 64 * 1024
#: CUDA device attributes (CUdevice_attribute -> value) the emulated device answers beyond
#: its named properties, as a cuda worker reports its driver's (``cudaAttributeIds`` /
#: ``cudaAttributeValues``): what the proxy's libcuda.so.1 needs to serve the CUDA runtime.
_CUDA_ATTRIBUTES: Final = {
    11: 2**31 - 1, 14: 512, 17: 0, 18: 0, 20: 0, 31: 1, 32: 0, 35: 0, 40: 2, 41: 1,
    78: 0, 79: 1, 80: 1, 81: _MAX_SHARED_MEMORY_PER_BLOCK, 82: 65536, 84: 0, 85: 0, 90: 1,
    95: 0, 97: _MAX_SHARED_MEMORY_PER_BLOCK, 99: 1, 106: 32, 108: 0, 111: 0, 126: 1,
    130: 0, 131: -1, 133: 0, 134: -1, 139: 0, 140: 0,
}  # fmt: skip
_DEFAULT_TOTAL_MEMORY: Final = 8 * 1024**3

_E = HipErrorCode


def _fail(code: HipErrorCode, message: str) -> HipError:
    return HipError(code, message)


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


# --- kernel argument layout ---------------------------------------------------------------

#: Little-endian struct codes of the scalar kinds; a pointer is a 64-bit address.
_SCALAR_CODES: Final[dict[str, str]] = {
    "i8": "b",
    "u8": "B",
    "i16": "h",
    "u16": "H",
    "i32": "i",
    "u32": "I",
    "i64": "q",
    "u64": "Q",
    "f16": "e",
    "f32": "f",
    "f64": "d",
    "ptr": "Q",
}
#: ``struct ProbeStruct { signed char a; double b; short c; }``: a at 0, b at 8, c at 16,
#: 24 bytes in all, aligned to 8 (the double's alignment).
_PROBE_STRUCT: Final = struct.Struct("<b7xdh6x")
_PROBE_STRUCT_ALIGN: Final = 8


def _kind_size_align(kind: str) -> tuple[int, int]:
    if kind == "probe_struct":
        return _PROBE_STRUCT.size, _PROBE_STRUCT_ALIGN
    code = _SCALAR_CODES.get(kind)
    if code is None:
        raise _fail(_E.hipErrorInvalidValue, f"unknown kernel argument kind {kind!r}")
    size = struct.calcsize("<" + code)
    # C scalars are aligned to their own size on every ABI HIP targets.
    return size, size


@dataclass(frozen=True, slots=True)
class ArgLayout:
    """Where each argument of a kernel sits in its packed buffer, C rules."""

    kinds: tuple[str, ...]
    offsets: tuple[int, ...]
    #: The packed size: the end of the last argument, with no trailing padding, as
    #: :func:`hipr.kernels.args.pack_args` produces (CUDA refuses a padded buffer).
    size: int


def arg_layout(kinds: Sequence[str]) -> ArgLayout:
    """The C layout of arguments of ``kinds`` (``i8`` ... ``f64``, ``ptr``, ``probe_struct``)."""
    offsets: list[int] = []
    end = 0
    for kind in kinds:
        size, align = _kind_size_align(kind)
        offset = _align_up(end, align)
        offsets.append(offset)
        end = offset + size
    return ArgLayout(tuple(kinds), tuple(offsets), end)


def unpack_args(layout: ArgLayout, data: bytes) -> tuple[Any, ...]:
    """Decode a packed argument buffer: ints, floats, and ``(a, b, c)`` for a probe_struct.

    A buffer whose length is not exactly ``layout.size`` is refused with
    hipErrorInvalidValue: it means the client packed other types than the kernel takes.
    """
    if len(data) != layout.size:
        raise _fail(
            _E.hipErrorInvalidValue,
            f"kernel arguments ({', '.join(layout.kinds)}) pack into {layout.size} bytes "
            f"with C alignment, got {len(data)}",
        )
    values: list[Any] = []
    for kind, offset in zip(layout.kinds, layout.offsets, strict=True):
        if kind == "probe_struct":
            values.append(_PROBE_STRUCT.unpack_from(data, offset))
        else:
            values.append(struct.unpack_from("<" + _SCALAR_CODES[kind], data, offset)[0])
    return tuple(values)


# --- handles --------------------------------------------------------------------------------
# Each kind is its own class, so a handle of one kind can never pass for another; a handle
# is valid only while it is in its backend's live table (destroyed or foreign -> invalid).


class _Allocation:
    __slots__ = ("base", "buf", "device", "size")

    def __init__(self, device: int, base: int, size: int, buf: npt.NDArray[np.uint8]) -> None:
        self.device = device
        self.base = base
        self.size = size
        self.buf = buf


class _Stream:
    __slots__ = ("capture", "capture_invalidated", "device")

    def __init__(self, device: int) -> None:
        self.device = device
        #: The operations recorded since stream_begin_capture, or None when not capturing.
        self.capture: list[_Op] | None = None
        self.capture_invalidated = False

    def __repr__(self) -> str:
        return f"<emulator stream on device {self.device} at {id(self):#x}>"


class _Event:
    __slots__ = ("device", "recorded_at")

    def __init__(self, device: int) -> None:
        self.device = device
        self.recorded_at: float | None = None

    def __repr__(self) -> str:
        return f"<emulator event on device {self.device} at {id(self):#x}>"


class _Module:
    __slots__ = ("device", "functions", "kernels")

    def __init__(self, device: int, kernels: dict[str, BuiltinKernel]) -> None:
        self.device = device
        self.kernels = kernels
        self.functions: dict[str, _Function] = {}

    def __repr__(self) -> str:
        return f"<emulator module on device {self.device} at {id(self):#x}>"


class _Function:
    __slots__ = ("kernel", "layout", "module")

    def __init__(self, module: _Module, kernel: BuiltinKernel) -> None:
        self.module = module
        self.kernel = kernel
        self.layout = arg_layout(kernel.arg_kinds)

    def __repr__(self) -> str:
        return f"<emulator function {self.kernel.name} at {id(self):#x}>"


@dataclass(frozen=True, slots=True)
class _MemsetOp:
    ptr: int
    value: int
    size: int


@dataclass(frozen=True, slots=True)
class _CopyOp:
    dst: int
    src: int
    size: int


@dataclass(frozen=True, slots=True)
class _UploadOp:
    """A host-to-device copy captured from a stream: the bytes are owned by the op."""

    dst: int
    data: bytes


@dataclass(frozen=True, slots=True)
class _KernelOp:
    function: _Function
    grid: Dim3
    block: Dim3
    shared_mem: int
    values: tuple[Any, ...]


_Op = _MemsetOp | _CopyOp | _UploadOp | _KernelOp


class _GraphNode:
    __slots__ = ("dependencies", "graph", "op")

    def __init__(self, graph: _Graph, op: _Op, dependencies: tuple[_GraphNode, ...]) -> None:
        self.graph = graph
        self.op = op
        self.dependencies = dependencies

    def __repr__(self) -> str:
        return f"<emulator graph node {type(self.op).__name__} at {id(self):#x}>"


class _Graph:
    __slots__ = ("nodes",)

    def __init__(self) -> None:
        self.nodes: list[_GraphNode] = []

    def __repr__(self) -> str:
        return f"<emulator graph of {len(self.nodes)} nodes at {id(self):#x}>"


class _GraphExec:
    __slots__ = ("ops",)

    def __init__(self, ops: tuple[_Op, ...]) -> None:
        self.ops = ops

    def __repr__(self) -> str:
        return f"<emulator graph exec of {len(self.ops)} nodes at {id(self):#x}>"


class _Fault(Exception):
    """A device-side failure: the caller turns it into hipErrorInvalidValue (checked at
    submission) or a pending hipErrorIllegalAddress (found while executing)."""


class _StickyFault(_Fault):
    """A fault that poisons the emulated context, as an illegal address does on a GPU:
    every later call fails until :meth:`EmulatorBackend.reset_context`."""


@dataclass(slots=True)
class _Arena:
    start: int
    end: int
    next: int
    used: int = 0
    #: Once the bump pointer has reached the end, placement searches the gaps instead.
    wrapped: bool = False


# --- built-in kernels -------------------------------------------------------------------

#: Resolves (address, dtype, element count) to a view of emulated memory or raises _Fault.
_View = Callable[[int, "type[np.generic]", int], npt.NDArray[Any]]
_KernelImpl = Callable[[_View, tuple[Any, ...], Dim3, Dim3, int], None]


def _k_fill_f32(view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    out, value, n = args
    if n:
        view(out, np.float32, n)[...] = np.float32(value)


def _k_scale_f32(view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    x_ptr, a, n = args
    if n:
        x = view(x_ptr, np.float32, n)
        np.multiply(x, np.float32(a), out=x)


def _k_axpy_f32(view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    y_ptr, x_ptr, a, n = args
    if n:
        y = view(y_ptr, np.float32, n)
        x = view(x_ptr, np.float32, n)
        # Two float32 roundings, as the source reads (a compiler may fuse them into one FMA).
        np.add(y, np.multiply(x, np.float32(a)), out=y)


def _k_vector_add_f32(
    view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int
) -> None:
    c_ptr, a_ptr, b_ptr, n = args
    if n:
        c = view(c_ptr, np.float32, n)
        np.add(view(a_ptr, np.float32, n), view(b_ptr, np.float32, n), out=c)


def _k_reduce_sum_f32(
    view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int
) -> None:
    out_ptr, x_ptr, n = args
    # Thread 0 of every block adds into out[0] even when n is 0.
    out = view(out_ptr, np.float32, 1)
    bx = block[0]
    if shm < 4 * bx:
        # The HIP source keeps one float per thread in dynamic shared memory; with less,
        # a GPU reads and writes outside it (garbage on AMD, a fault on NVIDIA).
        raise _Fault(f"reduce_sum_f32 needs shared_mem >= 4 * block.x = {4 * bx} bytes, got {shm}")
    if n == 0:
        return
    x = view(x_ptr, np.float32, n)
    # Replay the kernel's arithmetic order so the float32 result matches a GPU's: each
    # thread sums its grid-stride slice in order, then each block folds its partials in a
    # shared-memory tree (which, like the source, drops values when block.x is not a
    # power of two), then blocks add atomically into out[0].
    threads = grid[0] * bx
    blocks_used = min(grid[0], -(-min(threads, n) // bx))
    width = blocks_used * bx
    if threads >= n:
        partial = np.zeros(width, dtype=np.float32)
        partial[:n] = x
    else:
        rows = -(-n // threads)
        padded = np.zeros(rows * threads, dtype=np.float32)
        padded[:n] = x
        # accumulate is strictly sequential (add.reduce may sum pairwise), matching each
        # thread's loop.
        partial = np.add.accumulate(padded.reshape(rows, threads), axis=0, dtype=np.float32)[-1]
    tree = partial[:width].reshape(blocks_used, bx).copy()
    s = bx // 2
    while s > 0:
        tree[:, :s] += tree[:, s : 2 * s]
        s >>= 1
    # accumulate is strictly sequential, like atomics landing one after another.
    sums = np.concatenate((out[:1], tree[:, 0])).astype(np.float32)
    out[0] = np.add.accumulate(sums, dtype=np.float32)[-1]


def _k_mixed_args_probe(
    view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int
) -> None:
    out_ptr, a8, a32, f, d, a16, (sa, sb, sc), n = args
    if n:
        out = view(out_ptr, np.float64, n)
        # Python floats are IEEE doubles, and this is the source's left-to-right order,
        # so the result is bit-identical to the HIP kernel's.
        base = float(a8) + float(a32) + float(f) + d + float(a16) + float(sa) + sb + float(sc)
        np.add(base, np.arange(n, dtype=np.float64), out=out)


def _k_copy_from_address_u8(
    view: _View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int
) -> None:
    out_ptr, address, n = args
    if not n:
        return
    out = view(out_ptr, np.uint8, n)
    try:
        # Any live allocation of this process, whoever made it: a kernel's raw read is
        # not bound by the worker's pointer checks (that is what this kernel shows).
        source = view(address, np.uint8, n)
    except _Fault as fault:
        raise _StickyFault(f"raw read of {n} bytes at {address:#x}: {fault}") from None
    out[...] = source


def spin_until_flag(view: _View, args: tuple[Any, ...], stopped: Callable[[], bool]) -> None:
    """The emulator's ``spin_until_flag``: polls the flag (sleeping between looks, so a
    spinning session leaves the interpreter to the others, as a GPU kernel leaves the
    host CPU) until it is set or ``stopped()`` says the context is gone."""
    while not stopped():
        if int(view(args[0], np.uint32, 1)[0]) != 0:
            return
        time.sleep(0.002)
    raise _Fault("the context was torn down while the kernel ran")


_KERNELS: Final[dict[str, _KernelImpl]] = {
    "fill_f32": _k_fill_f32,
    "scale_f32": _k_scale_f32,
    "axpy_f32": _k_axpy_f32,
    "vector_add_f32": _k_vector_add_f32,
    "reduce_sum_f32": _k_reduce_sum_f32,
    "mixed_args_probe": _k_mixed_args_probe,
    "copy_from_address_u8": _k_copy_from_address_u8,
}


def _check_size(size: int, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise _fail(_E.hipErrorInvalidValue, f"{what} must be an int, got {type(size).__name__}")
    if size < 0:
        raise _fail(_E.hipErrorInvalidValue, f"{what} must not be negative, got {size}")
    return size


def _check_dim3(dims: Dim3, what: str, limits: tuple[int, int, int]) -> Dim3:
    values: tuple[object, ...] = tuple(dims) if isinstance(dims, tuple | list) else ()
    checked = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(checked) != 3 or len(values) != 3:
        raise _fail(_E.hipErrorInvalidValue, f"{what} must be three ints (x, y, z), got {dims!r}")
    for axis, value, limit in zip("xyz", checked, limits, strict=True):
        if not 1 <= value <= limit:
            raise _fail(
                _E.hipErrorInvalidConfiguration,
                f"{what}.{axis} must be between 1 and {limit}, got {value}",
            )
    return (checked[0], checked[1], checked[2])


# --- the backend --------------------------------------------------------------------------


class EmulatorBackend:
    """A :class:`~hipr.backends.base.Backend` that emulates ``device_count`` GPUs in host
    memory, each with ``total_memory`` bytes, named ``name`` with architecture ``arch``.

    Safe to call from many threads; the current device is per thread (device 0 until
    :meth:`bind_thread`). Only the built-in kernels run: see :meth:`builtin_module`.
    """

    #: Calls that take constant time here: the worker may run them on its event loop
    #: (see ``Backend.inline_calls``). Copies, memsets and kernels scale with their size,
    #: and stay on the session's GPU thread so that one large one never stalls the loop.
    #: Queries are left out: here they do not report a pending kernel fault, so they
    #: cannot stand in for a synchronisation.
    inline_calls: frozenset[str] = frozenset(
        {
            "device_count",
            "device_properties",
            "mem_get_info",
            "event_record",
            "stream_wait_event",
            "event_elapsed_ms",
        }
    )

    #: Every call runs its work before it returns: a session whose GPU thread is idle
    #: has nothing running (the runaway watch asks no device query, which here would
    #: take a pending kernel fault).
    runs_work_at_submission: bool = True

    #: A launch whose thread and element counts are both at most this runs inline on
    #: the worker's loop (numpy over a few thousand floats: microseconds); a larger one
    #: stays on the session's GPU thread.
    INLINE_KERNEL_ELEMENTS: int = 16384
    #: A batch of host-to-device copies of at most this many bytes in all runs inline on
    #: the worker's loop (a slice assignment each: microseconds), as a GPU backend runs
    #: a batch of small copies on a stream; a larger one stays on the GPU thread.
    INLINE_COPY_BYTES: int = 64 << 10

    def _quick_launch(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
        args: bytes,
    ) -> bool:
        """True when :meth:`launch` of these arguments takes microseconds. Every built-in
        kernel's work is bounded by its thread count and its last argument, the element
        count ``n``; a launch this cannot vouch for goes to the GPU thread, which also
        reports its errors."""
        if not isinstance(function, _Function):
            return False
        layout = function.layout
        if layout.kinds[-1] != "u64" or len(args) != layout.size:
            return False
        limit = self.INLINE_KERNEL_ELEMENTS
        try:
            threads = grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]
            return threads <= limit and int.from_bytes(args[-8:], "little") <= limit
        except (TypeError, IndexError):
            return False  # malformed geometry: launch() refuses it, with its error

    def _quick_htod_many(
        self, pieces: Sequence[tuple[int, memoryview]], stream: Handle | None = None
    ) -> bool:
        """True when :meth:`memcpy_htod_many` of these pieces takes microseconds."""
        return sum(src.nbytes for _, src in pieces) <= self.INLINE_COPY_BYTES

    def work_done(self, streams: Sequence[Handle]) -> bool:
        """Every call here finishes before it returns: once the session's GPU thread is
        idle, its work is done; a pending kernel fault is raised, as synchronize does."""
        self._raise_pending(self._current())
        return True

    def __init__(
        self,
        device_count: int = 1,
        total_memory: int = _DEFAULT_TOTAL_MEMORY,
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
        #: Calls that are quick for some arguments (see ``Backend.inline_when``).
        self.inline_when: dict[str, Callable[..., bool]] = {
            "launch": self._quick_launch,
            "memcpy_htod_many": self._quick_htod_many,
        }
        self._device_name = name
        self._arch = arch
        self._device_count = device_count
        self._total_memory = total_memory
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._closed = False
        self._arenas = [
            _Arena(start, start + span, start)
            for start in (ARENA_BASE + d * span for d in range(device_count))
        ]
        # Sorted bases of all live allocations, for the containing-allocation search.
        self._bases: list[int] = []
        self._allocations: dict[int, _Allocation] = {}
        self._allocated_bytes = 0
        self._streams: set[_Stream] = set()
        self._events: set[_Event] = set()
        self._modules: set[_Module] = set()
        self._graphs: set[_Graph] = set()
        self._graph_execs: set[_GraphExec] = set()
        self._pending: dict[int, HipError] = {}
        #: Set by a sticky fault: every later call fails with it until reset_context().
        self._poisoned: HipError | None = None
        #: One built-in module per device, shared by every session as on a GPU backend.
        self._builtin: dict[int, _Module] = {}

    def __repr__(self) -> str:
        return (
            f"EmulatorBackend(device_count={self._device_count}, "
            f"total_memory={self._total_memory}, name={self._device_name!r}, "
            f"arch={self._arch!r})"
        )

    # --- internals: devices, handles, memory -------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise _fail(_E.hipErrorDeinitialized, "the emulator backend has been closed")
        self._check_poisoned()

    def _check_poisoned(self) -> None:
        poisoned = self._poisoned
        if poisoned is not None:
            raise mark_sticky(HipError(poisoned.code, poisoned.message))

    def _check_device(self, device: int) -> int:
        if isinstance(device, bool) or not isinstance(device, int):
            raise _fail(_E.hipErrorInvalidDevice, f"device must be an int, got {device!r}")
        if not 0 <= device < self._device_count:
            raise _fail(
                _E.hipErrorInvalidDevice,
                f"device {device} does not exist (the emulator has {self._device_count})",
            )
        return device

    def _current(self) -> int:
        device: int = getattr(self._tls, "device", 0)
        return device

    def _stream(self, stream: Handle) -> _Stream:
        if not isinstance(stream, _Stream) or stream not in self._streams:
            raise _fail(_E.hipErrorInvalidHandle, f"{stream!r} is not a live stream")
        return stream

    def _stream_or_null(self, stream: Handle | None) -> tuple[_Stream | None, int]:
        """The stream (None for the null stream) and the device its work runs on."""
        if stream is None:
            return None, self._current()
        s = self._stream(stream)
        return s, s.device

    def _event(self, event: Handle) -> _Event:
        if not isinstance(event, _Event) or event not in self._events:
            raise _fail(_E.hipErrorInvalidHandle, f"{event!r} is not a live event")
        return event

    def _module(self, module: Handle) -> _Module:
        if not isinstance(module, _Module) or module not in self._modules:
            raise _fail(_E.hipErrorInvalidHandle, f"{module!r} is not a loaded module")
        return module

    def _function(self, function: Handle) -> _Function:
        if not isinstance(function, _Function) or function.module not in self._modules:
            raise _fail(
                _E.hipErrorInvalidHandle,
                f"{function!r} is not a function of a loaded module",
            )
        return function

    def _graph(self, graph: Handle) -> _Graph:
        if not isinstance(graph, _Graph) or graph not in self._graphs:
            raise _fail(_E.hipErrorInvalidHandle, f"{graph!r} is not a live graph")
        return graph

    def _graph_exec(self, graph_exec: Handle) -> _GraphExec:
        if not isinstance(graph_exec, _GraphExec) or graph_exec not in self._graph_execs:
            raise _fail(_E.hipErrorInvalidHandle, f"{graph_exec!r} is not a live graph exec")
        return graph_exec

    def _find(self, ptr: int, size: int, device: int | None = None) -> tuple[_Allocation, int]:
        """The live allocation holding all of ``[ptr, ptr + size)`` and the offset of
        ``ptr`` in it; with ``device``, the allocation must belong to it. Raises _Fault."""
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise _Fault(f"a device address must be an int, got {type(ptr).__name__}")
        with self._lock:
            i = bisect.bisect_right(self._bases, ptr) - 1
            alloc = self._allocations[self._bases[i]] if i >= 0 else None
        if alloc is None or not alloc.base <= ptr < alloc.base + alloc.size:
            raise _Fault(f"address {ptr:#x} is not inside a live allocation")
        offset = ptr - alloc.base
        if offset + size > alloc.size:
            raise _Fault(
                f"{size} bytes at {ptr:#x} run past the end of the {alloc.size}-byte "
                f"allocation at {alloc.base:#x} (by {offset + size - alloc.size} bytes)"
            )
        if device is not None and alloc.device != device:
            raise _Fault(
                f"address {ptr:#x} is memory of device {alloc.device}; the kernel runs on "
                f"device {device}"
            )
        return alloc, offset

    def _range(self, ptr: int, size: int, what: str) -> tuple[_Allocation, int]:
        """:meth:`_find` for a call checked at submission: hipErrorInvalidValue."""
        try:
            return self._find(ptr, size)
        except _Fault as fault:
            raise _fail(_E.hipErrorInvalidValue, f"{what}: {fault}") from None

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

    def _capture_unsupported(self, stream: _Stream, what: str) -> HipError:
        # As in HIP, an illegal call during capture also invalidates the capture, so the
        # graph that end_capture would return can never silently miss the operation.
        stream.capture_invalidated = True
        return _fail(
            _E.hipErrorStreamCaptureUnsupported,
            f"{what} is not allowed on a capturing stream; the capture is invalidated",
        )

    def _place(self, arena: _Arena, size: int) -> int:
        """An address for ``size`` bytes in ``arena``; called with the lock held."""
        span = _align_up(size, PAGE_SIZE)
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
            cursor = _align_up(base + self._allocations[base].size, PAGE_SIZE)
        if arena.end - cursor >= span:
            return cursor
        raise _fail(_E.hipErrorOutOfMemory, f"no free address range of {size} bytes is left")

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
            max_threads_per_block=_MAX_THREADS_PER_BLOCK,
            clock_rate_khz=1_500_000,
            pci_bus_id=f"0000:{device:02x}:00.0",
            major=1,
            minor=0,
            max_shared_memory_per_block=_MAX_SHARED_MEMORY_PER_BLOCK,
            hip_props={
                "maxThreadsDim": list(_MAX_BLOCK_DIM),
                "maxGridSize": list(_MAX_GRID_DIM),
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
        _check_size(size, "malloc size")
        if size == 0:
            raise _fail(
                _E.hipErrorInvalidValue,
                "malloc of 0 bytes: HIP would return a null pointer; allocate at least 1 byte",
            )
        device = self._current()
        with self._lock:
            self._check_open()
            arena = self._arenas[device]
            free = self._total_memory - arena.used
            if size > free:
                raise _fail(
                    _E.hipErrorOutOfMemory,
                    f"malloc of {size} bytes on device {device}: only {free} of "
                    f"{self._total_memory} bytes are free",
                )
            base = self._place(arena, size)
            try:
                # calloc underneath: untouched pages of a large allocation cost no RAM.
                buf = np.zeros(size, dtype=np.uint8)
            except MemoryError:
                raise _fail(
                    _E.hipErrorOutOfMemory, f"the host cannot back {size} more bytes"
                ) from None
            arena.used += size
            self._allocated_bytes += size
            self._allocations[base] = _Allocation(device, base, size, buf)
            bisect.insort(self._bases, base)
        return base

    def free(self, ptr: int) -> None:
        """Free an allocation by its base address; hipErrorInvalidValue for any other
        address. ``free(0)`` does nothing, as ``hipFree(nullptr)`` does."""
        if ptr == 0:
            return
        with self._lock:
            alloc = self._allocations.pop(ptr, None)
            if alloc is None:
                raise _fail(
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
            raise _fail(_E.hipErrorInvalidValue, "memcpy_htod: the host buffer is not contiguous")
        alloc, offset = self._range(dst, view.nbytes, "memcpy_htod destination")
        if s is not None and s.capture is not None:
            s.capture.append(_UploadOp(dst, view.tobytes()))
            return
        alloc.buf[offset : offset + view.nbytes] = np.frombuffer(view, dtype=np.uint8)

    def host_window(self, dst: int, size: int) -> memoryview:
        """The device bytes ``[dst, dst + size)`` as a writable host view: the emulator's
        device memory is host memory, so the worker may receive an upload's bytes
        straight into it (see ``hipr.backends.base``). The view keeps the memory alive
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
            raise _fail(
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
        _check_size(size, "memcpy_dtod size")
        op = _CopyOp(dst, src, size)
        self._check_copy(op)
        if s is not None and s.capture is not None:
            s.capture.append(op)
            return
        self._copy(op)

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """Set ``size`` bytes to ``value & 0xFF``, as hipMemset takes its value."""
        s, _device = self._stream_or_null(stream)
        _check_size(size, "memset size")
        op = _MemsetOp(ptr, int(value) & 0xFF, size)
        self._range(ptr, size, "memset")
        if s is not None and s.capture is not None:
            s.capture.append(op)
            return
        self._memset(op)

    def _check_copy(self, op: _CopyOp) -> None:
        self._range(op.src, op.size, "memcpy_dtod source")
        self._range(op.dst, op.size, "memcpy_dtod destination")

    def _copy(self, op: _CopyOp) -> None:
        # Both ranges are resolved before anything is written: a bad one writes nothing.
        src, s_off = self._find(op.src, op.size)
        dst, d_off = self._find(op.dst, op.size)
        # numpy detects overlapping source and destination and buffers: memmove semantics.
        dst.buf[d_off : d_off + op.size] = src.buf[s_off : s_off + op.size]

    def _memset(self, op: _MemsetOp) -> None:
        alloc, offset = self._find(op.ptr, op.size)
        alloc.buf[offset : offset + op.size] = op.value

    def _upload(self, op: _UploadOp) -> None:
        alloc, offset = self._find(op.dst, len(op.data))
        alloc.buf[offset : offset + len(op.data)] = np.frombuffer(op.data, dtype=np.uint8)

    # --- streams and events --------------------------------------------------------------

    def stream_create(self) -> _Stream:
        """A new stream on the current device."""
        stream = _Stream(self._current())
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

    def event_create(self) -> _Event:
        """A new event on the current device, with timing."""
        event = _Event(self._current())
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
            raise _fail(
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
            raise _fail(_E.hipErrorInvalidHandle, "event_elapsed_ms: an event was never recorded")
        if s.device != e.device:
            raise _fail(_E.hipErrorInvalidHandle, "event_elapsed_ms: events of different devices")
        return (e.recorded_at - s.recorded_at) * 1000.0

    # --- modules and kernels ------------------------------------------------------------

    def compile(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Always hipErrorNotSupported: there is no device compiler in the emulator."""
        raise _fail(
            _E.hipErrorNotSupported,
            "the emulator has no device compiler; use gpu.builtin(...) kernels "
            f"({', '.join(BUILTINS)}) or a worker with a GPU backend",
        )

    def module_load(self, image: bytes) -> _Module:
        """Always hipErrorInvalidImage: the emulator produces no code objects to load."""
        raise _fail(
            _E.hipErrorInvalidImage,
            f"the emulator cannot load a {len(image)}-byte code object: it runs only the "
            "built-in kernels (builtin_module())",
        )

    def module_unload(self, module: Handle) -> None:
        """Unload a module; its functions become invalid handles."""
        m = self._module(module)
        with self._lock:
            self._modules.discard(m)

    def module_get_function(self, module: Handle, name: str) -> _Function:
        """The kernel ``name`` of ``module``; hipErrorNotFound when absent."""
        m = self._module(module)
        kernel = m.kernels.get(name)
        if kernel is None:
            raise _fail(
                _E.hipErrorNotFound,
                f"no kernel {name!r} in the module; it has {', '.join(m.kernels)}",
            )
        with self._lock:
            function = m.functions.get(name)
            if function is None:
                function = m.functions[name] = _Function(m, kernel)
        return function

    def builtin_module(self) -> _Module:
        """The module of the current device holding :data:`hipr.kernels.builtins.BUILTINS`:
        loaded once per device and shared (sessions never unload it), loaded again only
        after an explicit unload."""
        device = self._current()
        with self._lock:
            self._check_open()
            module = self._builtin.get(device)
            if module is None or module not in self._modules:
                kernels = {**BUILTINS, SPIN_KERNEL.name: SPIN_KERNEL}
                module = self._builtin[device] = _Module(device, kernels)
                self._modules.add(module)
        return module

    def function_params(self, function: Handle) -> list[tuple[int, int, bool]]:
        """The built-in kernel's parameters as its C signature lays them out."""
        layout = self._function(function).layout
        return [
            (offset, _kind_size_align(kind)[0], kind == "ptr")
            for kind, offset in zip(layout.kinds, layout.offsets, strict=True)
        ]

    def _kernel_op(
        self, function: Handle, grid: Dim3, block: Dim3, shared_mem: int, args: bytes
    ) -> _KernelOp:
        """Everything a runtime refuses at launch time, refused now."""
        fn = self._function(function)
        grid = _check_dim3(grid, "grid", _MAX_GRID_DIM)
        block = _check_dim3(block, "block", _MAX_BLOCK_DIM)
        threads = block[0] * block[1] * block[2]
        if threads > _MAX_THREADS_PER_BLOCK:
            raise _fail(
                _E.hipErrorInvalidConfiguration,
                f"block {block} has {threads} threads; at most {_MAX_THREADS_PER_BLOCK}",
            )
        _check_size(shared_mem, "shared_mem")
        if shared_mem > _MAX_SHARED_MEMORY_PER_BLOCK:
            raise _fail(
                _E.hipErrorInvalidValue,
                f"shared_mem {shared_mem} exceeds {_MAX_SHARED_MEMORY_PER_BLOCK} bytes per block",
            )
        try:
            values = unpack_args(fn.layout, bytes(args))
        except HipError as error:
            raise _fail(_E.hipErrorInvalidValue, f"{fn.kernel.name}: {error.message}") from None
        return _KernelOp(fn, grid, block, shared_mem, values)

    def _check_kernel_device(self, op: _KernelOp, device: int) -> None:
        self._function(op.function)
        if op.function.module.device != device:
            raise _fail(
                _E.hipErrorInvalidDeviceFunction,
                f"{op.function.kernel.name} was loaded on device {op.function.module.device} "
                f"but launched on device {device}",
            )

    def _run_kernel(self, op: _KernelOp, device: int) -> None:
        def view(ptr: int, dtype: type[np.generic], count: int) -> npt.NDArray[Any]:
            itemsize = np.dtype(dtype).itemsize
            alloc, offset = self._find(ptr, count * itemsize, device)
            return alloc.buf[offset : offset + count * itemsize].view(dtype)

        if op.function.kernel is SPIN_KERNEL:
            # Runs until its flag is set or the backend closes (the emulated context's
            # teardown; a process that ends takes it along), as a spinning GPU kernel.
            spin_until_flag(view, op.values, lambda: self._closed)
            return
        _KERNELS[op.function.kernel.name](view, op.values, op.grid, op.block, op.shared_mem)

    def launch(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
        args: bytes,
    ) -> None:
        """Run a built-in kernel now. Bad handles, geometry and argument sizes raise here;
        a bad pointer is a device fault, raised by the device's next synchronising call."""
        s, device = self._stream_or_null(stream)
        op = self._kernel_op(function, grid, block, shared_mem, args)
        self._check_kernel_device(op, device)
        if s is not None and s.capture is not None:
            s.capture.append(op)
            return
        self._check_poisoned()
        try:
            self._run_kernel(op, device)
        except _StickyFault as fault:
            self._poison(f"kernel {op.function.kernel.name}: {fault}")
        except _Fault as fault:
            self._set_pending(
                device,
                _fail(_E.hipErrorIllegalAddress, f"kernel {op.function.kernel.name}: {fault}"),
            )

    # --- graphs ---------------------------------------------------------------------------

    def stream_begin_capture(self, stream: Handle) -> None:
        """Record, instead of running, the work later issued on ``stream``."""
        if stream is None:
            raise _fail(_E.hipErrorStreamCaptureUnsupported, "the null stream cannot be captured")
        s = self._stream(stream)
        if s.capture is not None:
            raise _fail(_E.hipErrorIllegalState, f"{s!r} is already capturing")
        s.capture = []
        s.capture_invalidated = False

    def stream_end_capture(self, stream: Handle) -> _Graph:
        """The captured work as a graph whose nodes form one dependency chain."""
        if stream is None:
            raise _fail(_E.hipErrorIllegalState, "the null stream is not capturing")
        s = self._stream(stream)
        ops = s.capture
        if ops is None:
            raise _fail(_E.hipErrorIllegalState, f"{s!r} is not capturing")
        s.capture = None
        if s.capture_invalidated:
            s.capture_invalidated = False
            raise _fail(
                _E.hipErrorStreamCaptureInvalidated,
                "the capture was invalidated by an operation not allowed during capture",
            )
        graph = _Graph()
        previous: tuple[_GraphNode, ...] = ()
        for op in ops:
            node = _GraphNode(graph, op, previous)
            graph.nodes.append(node)
            previous = (node,)
        with self._lock:
            self._check_open()
            self._graphs.add(graph)
        return graph

    def graph_create(self) -> _Graph:
        """An empty graph."""
        graph = _Graph()
        with self._lock:
            self._check_open()
            self._graphs.add(graph)
        return graph

    def graph_destroy(self, graph: Handle) -> None:
        """Destroy a graph; its nodes become invalid, its instantiations live on."""
        g = self._graph(graph)
        with self._lock:
            self._graphs.discard(g)

    def _add_node(self, graph: Handle, dependencies: Sequence[Handle], op: _Op) -> _GraphNode:
        g = self._graph(graph)
        deps: list[_GraphNode] = []
        for dep in dependencies:
            if not isinstance(dep, _GraphNode) or dep.graph is not g:
                raise _fail(
                    _E.hipErrorInvalidValue, f"dependency {dep!r} is not a node of this graph"
                )
            if dep not in deps:
                deps.append(dep)
        node = _GraphNode(g, op, tuple(deps))
        with self._lock:
            g.nodes.append(node)
        return node

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> _GraphNode:
        """A memset node (``value & 0xFF``); the range is checked now."""
        self._graph(graph)
        _check_size(size, "memset size")
        self._range(ptr, size, "graph memset")
        return self._add_node(graph, dependencies, _MemsetOp(ptr, int(value) & 0xFF, size))

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> _GraphNode:
        """A device-to-device copy node; the ranges are checked now."""
        self._graph(graph)
        _check_size(size, "memcpy size")
        op = _CopyOp(dst, src, size)
        self._check_copy(op)
        return self._add_node(graph, dependencies, op)

    def graph_add_kernel(
        self,
        graph: Handle,
        dependencies: Sequence[Handle],
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        args: bytes,
    ) -> _GraphNode:
        """A kernel node; handle, geometry and argument size are checked now."""
        self._graph(graph)
        op = self._kernel_op(function, grid, block, shared_mem, args)
        return self._add_node(graph, dependencies, op)

    def graph_instantiate(self, graph: Handle) -> _GraphExec:
        """A snapshot of the graph's nodes in dependency order."""
        g = self._graph(graph)
        with self._lock:
            self._check_open()
            # A node can only depend on nodes that existed when it was added, so the
            # insertion order is already a topological order.
            graph_exec = _GraphExec(tuple(node.op for node in g.nodes))
            self._graph_execs.add(graph_exec)
        return graph_exec

    def graph_launch(self, graph_exec: Handle, stream: Handle | None) -> None:
        """Replay the nodes now, on the stream's device (or append them to the stream's
        capture). A node that faults (memory freed since instantiation, a bad kernel
        pointer) stops the replay and is reported as hipErrorIllegalAddress by the
        device's next synchronising call."""
        ge = self._graph_exec(graph_exec)
        s, device = self._stream_or_null(stream)
        for op in ge.ops:
            if isinstance(op, _KernelOp):
                self._check_kernel_device(op, device)
        if s is not None and s.capture is not None:
            # Captured into the enclosing capture, as HIP adds a graph launched during
            # capture to the graph being captured.
            s.capture.extend(ge.ops)
            return
        for index, op in enumerate(ge.ops):
            try:
                self._execute(op, device)
            except _Fault as fault:
                self._set_pending(
                    device, _fail(_E.hipErrorIllegalAddress, f"graph node {index}: {fault}")
                )
                return

    def _execute(self, op: _Op, device: int) -> None:
        if isinstance(op, _KernelOp):
            self._run_kernel(op, device)
        elif isinstance(op, _CopyOp):
            self._copy(op)
        elif isinstance(op, _MemsetOp):
            self._memset(op)
        else:
            self._upload(op)

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """Destroy an executable graph."""
        ge = self._graph_exec(graph_exec)
        with self._lock:
            self._graph_execs.discard(ge)

    # --- accounting -----------------------------------------------------------------------

    def stats(self) -> BackendStats:
        """Live resources across all devices and sessions."""
        with self._lock:
            return BackendStats(
                allocations=len(self._allocations),
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
                    _fail(
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


if TYPE_CHECKING:
    # mypy proves the class satisfies the Protocol, signatures included.
    _protocol_check: Backend = EmulatorBackend()
