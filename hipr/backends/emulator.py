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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hipr.backends._emulator_core import (
    ARENA_BASE,
    ARENA_SPAN,
    DEFAULT_TOTAL_MEMORY,
    MAX_BLOCK_DIM,
    MAX_DEVICES,
    MAX_GRID_DIM,
    MAX_SHARED_MEMORY_PER_BLOCK,
    MAX_THREADS_PER_BLOCK,
    PAGE_SIZE,
    EmulatorCore,
)
from hipr.backends._emulator_objects import (
    CopyOp,
    Function,
    Graph,
    GraphExec,
    GraphNode,
    KernelOp,
    MemsetOp,
    Module,
    Op,
    check_dim3,
    check_size,
    fail,
)
from hipr.backends.interface import Dim3, Handle
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTIN_GLOBALS, BUILTINS
from hipr.kernels.builtins_numpy import (
    NUMPY_KERNELS,
    KernelFault,
    StickyKernelFault,
    spin_until_flag,
)
from hipr.kernels.kernel_args import kind_size_align, unpack_args
from hipr.kernels.spin_kernel import SPIN_KERNEL

if TYPE_CHECKING:
    pass

__all__ = [
    "ARENA_BASE",
    "ARENA_SPAN",
    "MAX_DEVICES",
    "PAGE_SIZE",
    "EmulatorBackend",
]

_E = HipErrorCode


class EmulatorBackend(EmulatorCore):
    """A :class:`~hipr.backends.interface.Backend` that emulates ``device_count`` GPUs in host
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
        if not isinstance(function, Function):
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

    def __init__(
        self,
        device_count: int = 1,
        total_memory: int = DEFAULT_TOTAL_MEMORY,
        name: str = "hipr emulator",
        arch: str = "emu",
    ) -> None:
        super().__init__(device_count, total_memory, name, arch)
        #: Calls that are quick for some arguments (see ``Backend.inline_when``).
        self.inline_when: dict[str, Callable[..., bool]] = {
            "launch": self._quick_launch,
            "memcpy_htod_many": self._quick_htod_many,
        }

    # --- modules and kernels ------------------------------------------------------------

    def compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """Always hipErrorNotSupported: there is no device compiler in the emulator."""
        raise fail(
            _E.hipErrorNotSupported,
            "the emulator has no device compiler; use gpu.builtin(...) kernels "
            f"({', '.join(BUILTINS)}) or a worker with a GPU backend",
        )

    def program_link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """Always hipErrorNotSupported: there is no device linker in the emulator."""
        raise fail(
            _E.hipErrorNotSupported,
            f"the emulator has no device linker (asked to link {len(inputs)} inputs): "
            "link on a worker with a GPU backend (cuda: cuLink*, hip: hiprtcLink*)",
        )

    def module_load(self, image: bytes) -> Module:
        """Always hipErrorInvalidImage: the emulator produces no code objects to load."""
        raise fail(
            _E.hipErrorInvalidImage,
            f"the emulator cannot load a {len(image)}-byte code object: it runs only the "
            "built-in kernels (builtin_module())",
        )

    def module_unload(self, module: Handle) -> None:
        """Unload a module; its functions become invalid handles."""
        m = self._module(module)
        with self._lock:
            self._modules.discard(m)
            self._drop_module_variables(m)

    def module_get_function(self, module: Handle, name: str) -> Function:
        """The kernel ``name`` of ``module``; hipErrorNotFound when absent."""
        m = self._module(module)
        kernel = m.kernels.get(name)
        if kernel is None:
            raise fail(
                _E.hipErrorNotFound,
                f"no kernel {name!r} in the module; it has {', '.join(m.kernels)}",
            )
        with self._lock:
            function = m.functions.get(name)
            if function is None:
                function = m.functions[name] = Function(m, kernel)
        return function

    def builtin_module(self) -> Module:
        """The module of the current device holding :data:`hipr.kernels.builtins.BUILTINS`:
        loaded once per device and shared (sessions never unload it), loaded again only
        after an explicit unload."""
        device = self._current()
        with self._lock:
            self._check_open()
            module = self._builtin.get(device)
            if module is None or module not in self._modules:
                kernels = {**BUILTINS, SPIN_KERNEL.name: SPIN_KERNEL}
                module = Module(device, kernels)
                self._module_variables(module, BUILTIN_GLOBALS)
                self._builtin[device] = module
                self._modules.add(module)
        return module

    def module_global(self, module: Handle, name: str) -> tuple[int, int]:
        """A module's variable (the built-in module's :data:`BUILTIN_GLOBALS`): its device
        address and size; hipErrorNotFound when the module has none of that name."""
        m = self._module(module)
        found = m.globals.get(name)
        if found is None:
            raise fail(
                _E.hipErrorNotFound,
                f"no variable {name!r} in the module; it has {', '.join(m.globals) or 'none'}",
            )
        return found

    def function_params(self, function: Handle) -> list[tuple[int, int, bool]]:
        """The built-in kernel's parameters as its C signature lays them out."""
        layout = self._function(function).layout
        return [
            (offset, kind_size_align(kind)[0], kind == "ptr")
            for kind, offset in zip(layout.kinds, layout.offsets, strict=True)
        ]

    def _kernel_op(
        self, function: Handle, grid: Dim3, block: Dim3, shared_mem: int, args: bytes
    ) -> KernelOp:
        """Everything a runtime refuses at launch time, refused now."""
        fn = self._function(function)
        grid = check_dim3(grid, "grid", MAX_GRID_DIM)
        block = check_dim3(block, "block", MAX_BLOCK_DIM)
        threads = block[0] * block[1] * block[2]
        if threads > MAX_THREADS_PER_BLOCK:
            raise fail(
                _E.hipErrorInvalidConfiguration,
                f"block {block} has {threads} threads; at most {MAX_THREADS_PER_BLOCK}",
            )
        check_size(shared_mem, "shared_mem")
        if shared_mem > MAX_SHARED_MEMORY_PER_BLOCK:
            raise fail(
                _E.hipErrorInvalidValue,
                f"shared_mem {shared_mem} exceeds {MAX_SHARED_MEMORY_PER_BLOCK} bytes per block",
            )
        try:
            values = unpack_args(fn.layout, bytes(args))
        except HipError as error:
            raise fail(_E.hipErrorInvalidValue, f"{fn.kernel.name}: {error.message}") from None
        return KernelOp(fn, grid, block, shared_mem, values)

    def _check_kernel_device(self, op: KernelOp, device: int) -> None:
        self._function(op.function)
        if op.function.module.device != device:
            raise fail(
                _E.hipErrorInvalidDeviceFunction,
                f"{op.function.kernel.name} was loaded on device {op.function.module.device} "
                f"but launched on device {device}",
            )

    def _run_kernel(self, op: KernelOp, device: int) -> None:
        def view(ptr: int, dtype: type[np.generic], count: int) -> npt.NDArray[Any]:
            itemsize = np.dtype(dtype).itemsize
            alloc, offset = self._find(ptr, count * itemsize, device)
            return alloc.buf[offset : offset + count * itemsize].view(dtype)

        if op.function.kernel is SPIN_KERNEL:
            # Runs until its flag is set or the backend closes (the emulated context's
            # teardown; a process that ends takes it along), as a spinning GPU kernel.
            spin_until_flag(view, op.values, lambda: self._closed)
            return
        kernel, module = op.function.kernel, op.function.module
        # A kernel's module variables follow its arguments (BuiltinKernel.reads).
        values = (*op.values, *(module.globals[name][0] for name in kernel.reads))
        NUMPY_KERNELS[kernel.name](view, values, op.grid, op.block, op.shared_mem)

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
        except StickyKernelFault as fault:
            self._poison(f"kernel {op.function.kernel.name}: {fault}")
        except KernelFault as fault:
            self._set_pending(
                device,
                fail(_E.hipErrorIllegalAddress, f"kernel {op.function.kernel.name}: {fault}"),
            )

    # --- graphs ---------------------------------------------------------------------------

    def stream_begin_capture(self, stream: Handle) -> None:
        """Record, instead of running, the work later issued on ``stream``."""
        if stream is None:
            raise fail(_E.hipErrorStreamCaptureUnsupported, "the null stream cannot be captured")
        s = self._stream(stream)
        if s.capture is not None:
            raise fail(_E.hipErrorIllegalState, f"{s!r} is already capturing")
        s.capture = []
        s.capture_invalidated = False

    def stream_end_capture(self, stream: Handle) -> Graph:
        """The captured work as a graph whose nodes form one dependency chain."""
        if stream is None:
            raise fail(_E.hipErrorIllegalState, "the null stream is not capturing")
        s = self._stream(stream)
        ops = s.capture
        if ops is None:
            raise fail(_E.hipErrorIllegalState, f"{s!r} is not capturing")
        s.capture = None
        if s.capture_invalidated:
            s.capture_invalidated = False
            raise fail(
                _E.hipErrorStreamCaptureInvalidated,
                "the capture was invalidated by an operation not allowed during capture",
            )
        graph = Graph()
        previous: tuple[GraphNode, ...] = ()
        for op in ops:
            node = GraphNode(graph, op, previous)
            graph.nodes.append(node)
            previous = (node,)
        with self._lock:
            self._check_open()
            self._graphs.add(graph)
        return graph

    def graph_create(self) -> Graph:
        """An empty graph."""
        graph = Graph()
        with self._lock:
            self._check_open()
            self._graphs.add(graph)
        return graph

    def graph_destroy(self, graph: Handle) -> None:
        """Destroy a graph; its nodes become invalid, its instantiations live on."""
        g = self._graph(graph)
        with self._lock:
            self._graphs.discard(g)

    def _add_node(self, graph: Handle, dependencies: Sequence[Handle], op: Op) -> GraphNode:
        g = self._graph(graph)
        deps: list[GraphNode] = []
        for dep in dependencies:
            if not isinstance(dep, GraphNode) or dep.graph is not g:
                raise fail(
                    _E.hipErrorInvalidValue, f"dependency {dep!r} is not a node of this graph"
                )
            if dep not in deps:
                deps.append(dep)
        node = GraphNode(g, op, tuple(deps))
        with self._lock:
            g.nodes.append(node)
        return node

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> GraphNode:
        """A memset node (``value & 0xFF``); the range is checked now."""
        self._graph(graph)
        check_size(size, "memset size")
        self._range(ptr, size, "graph memset")
        return self._add_node(graph, dependencies, MemsetOp(ptr, int(value) & 0xFF, size))

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> GraphNode:
        """A device-to-device copy node; the ranges are checked now."""
        self._graph(graph)
        check_size(size, "memcpy size")
        op = CopyOp(dst, src, size)
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
    ) -> GraphNode:
        """A kernel node; handle, geometry and argument size are checked now."""
        self._graph(graph)
        op = self._kernel_op(function, grid, block, shared_mem, args)
        return self._add_node(graph, dependencies, op)

    def graph_instantiate(self, graph: Handle) -> GraphExec:
        """A snapshot of the graph's nodes in dependency order."""
        g = self._graph(graph)
        with self._lock:
            self._check_open()
            # A node can only depend on nodes that existed when it was added, so the
            # insertion order is already a topological order.
            graph_exec = GraphExec(tuple(node.op for node in g.nodes))
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
            if isinstance(op, KernelOp):
                self._check_kernel_device(op, device)
        if s is not None and s.capture is not None:
            # Captured into the enclosing capture, as HIP adds a graph launched during
            # capture to the graph being captured.
            s.capture.extend(ge.ops)
            return
        for index, op in enumerate(ge.ops):
            try:
                self._execute(op, device)
            except KernelFault as fault:
                self._set_pending(
                    device, fail(_E.hipErrorIllegalAddress, f"graph node {index}: {fault}")
                )
                return

    def _execute(self, op: Op, device: int) -> None:
        if isinstance(op, KernelOp):
            self._run_kernel(op, device)
        elif isinstance(op, CopyOp):
            self._copy(op)
        elif isinstance(op, MemsetOp):
            self._memset(op)
        else:
            self._upload(op)

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """Destroy an executable graph."""
        ge = self._graph_exec(graph_exec)
        with self._lock:
            self._graph_execs.discard(ge)


if TYPE_CHECKING:
    from hipr.backends.interface import Backend

    # mypy proves the class satisfies the Protocol, signatures included.
    _protocol_check: Backend = EmulatorBackend()
