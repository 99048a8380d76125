"""Client-side handles: device pointers, streams, events, modules, kernels, graphs.

Each handle remembers the session it belongs to, so a handle used after its session is
gone fails locally with a clear error instead of naming someone else's object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hipr.client.direct import Send, sends
from hipr.client.link import launch_key
from hipr.client.timeouts import with_timeouts
from hipr.errors import HipError, HipErrorCode, SessionLostError, invalid_value
from hipr.kernels.builtins import BuiltinKernel
from hipr.kernels.kernel_args import pack_args, packer, register_pointer_type
from hipr.protocol.messages import GraphAddKernel, LaunchConfig, LaunchKernel
from hipr.protocol.opcodes import Opcode


class AsyncGpu(Protocol):
    """What a handle needs of the session that made it (``hipr.client.api.AsyncGpu``
    implements it; this module never imports the API)."""

    session_id: str

    @property
    def lost(self) -> bool: ...
    async def _call(self, opcode: Opcode, args: Any = None, data: Any = b"") -> Any: ...
    async def _post(self, opcode: Opcode, args: Any = None, data: Any = b"") -> None: ...
    async def _launch(self, plan: LaunchPlan, data: bytes) -> None: ...
    def _link(self) -> Any: ...
    async def event_elapsed_ms(self, start: Event, end: Event) -> float: ...


Dim = int | Sequence[int]


@dataclass(frozen=True, slots=True)
class DevicePtr:
    """A device address and the bytes available from it to the end of its allocation.

    ``int(p)`` is the address; ``p + n`` is the address ``n`` bytes in, with ``n`` fewer
    bytes available (checked here and again by the worker).
    """

    address: int
    size: int

    @property
    def is_device_pointer(self) -> bool:
        """Marks a kernel argument that is a device pointer."""
        return True

    def __int__(self) -> int:
        return self.address

    def __index__(self) -> int:
        return self.address

    def __add__(self, offset: int) -> DevicePtr:
        if not isinstance(offset, int) or isinstance(offset, bool):
            return NotImplemented
        if not 0 <= offset <= self.size:
            raise invalid_value(f"offset {offset} is outside this {self.size}-byte allocation")
        return DevicePtr(self.address + offset, self.size - offset)

    def __repr__(self) -> str:
        return f"DevicePtr(0x{self.address:x}, size={self.size})"


register_pointer_type(DevicePtr)


def dim3(value: Dim, what: str) -> list[int]:
    """A launch dimension as a list of 1 to 3 positive ints."""
    if type(value) is int and value >= 1:
        return [value]  # the common spelling, checked without the general walk below
    try:
        dims = [value] if isinstance(value, int) else list(value)
    except TypeError:  # neither an int nor a sequence (a numpy integer, say)
        dims = []
    if not 1 <= len(dims) <= 3 or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims
    ):
        raise invalid_value(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return dims


class _Handle:
    """A per-session id on the worker, bound to the client that made it."""

    kind = "handle"

    def __init__(self, gpu: AsyncGpu, handle_id: int) -> None:
        self._gpu = gpu
        self.id = handle_id
        self._session = gpu.session_id

    def _check(self) -> int:
        if self._gpu.lost:
            raise SessionLostError(
                message=f"this {self.kind} belonged to session {self._session}, which is lost"
            )
        if self._session != self._gpu.session_id:
            raise HipError(
                HipErrorCode.hipErrorInvalidHandle,
                f"this {self.kind} belongs to a session that no longer exists",
            )
        return self.id

    def _link(self) -> Any:
        """The connection this handle's requests go over."""
        return self._gpu._link()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


def handle_id(obj: _Handle | None) -> int | None:
    """The wire id of an optional handle (None for the default stream)."""
    return None if obj is None else obj._check()


@with_timeouts
class Stream(_Handle):
    """A stream: work issued on it runs in order."""

    kind = "stream"

    def _synchronize_request(self) -> tuple[Opcode, dict[str, Any], bytes]:
        """:meth:`synchronize`'s request: opcode, wire arguments, bytes."""
        return Opcode.STREAM_SYNCHRONIZE, {"stream": self._check()}, b""

    @sends(Send.WAIT, _synchronize_request)
    async def synchronize(self) -> None:
        """Wait for the stream's work."""
        await self._gpu._call(*self._synchronize_request())

    async def query(self) -> bool:
        """True when the stream has no pending work."""
        result = await self._gpu._call(Opcode.STREAM_QUERY, {"stream": self._check()})
        return bool(result["done"])

    async def wait_event(self, event: Event) -> None:
        """Later work on this stream waits for ``event``."""
        await self._gpu._post(
            Opcode.STREAM_WAIT_EVENT, {"stream": self._check(), "event": event._check()}
        )

    async def begin_capture(self) -> None:
        """Capture the work issued on this stream into a graph, instead of running it."""
        await self._gpu._call(Opcode.STREAM_BEGIN_CAPTURE, {"stream": self._check()})

    async def end_capture(self) -> Graph:
        """Stop capturing; the captured graph."""
        result = await self._gpu._call(Opcode.STREAM_END_CAPTURE, {"stream": self._check()})
        return Graph(self._gpu, result["graph"])

    async def destroy(self) -> None:
        """Destroy the stream (its queued work still completes)."""
        await self._gpu._post(Opcode.STREAM_DESTROY, {"stream": self._check()})


@with_timeouts
class Event(_Handle):
    """An event: a point in a stream's work, with timing."""

    kind = "event"

    async def record(self, stream: Stream | None = None) -> None:
        """Record the event on ``stream`` (the default stream when None)."""
        await self._gpu._post(
            Opcode.EVENT_RECORD, {"event": self._check(), "stream": handle_id(stream)}
        )

    def _synchronize_request(self) -> tuple[Opcode, dict[str, Any], bytes]:
        """:meth:`synchronize`'s request: opcode, wire arguments, bytes."""
        return Opcode.EVENT_SYNCHRONIZE, {"event": self._check()}, b""

    @sends(Send.WAIT, _synchronize_request)
    async def synchronize(self) -> None:
        """Wait for the event."""
        await self._gpu._call(*self._synchronize_request())

    async def query(self) -> bool:
        """True when the event has completed."""
        result = await self._gpu._call(Opcode.EVENT_QUERY, {"event": self._check()})
        return bool(result["done"])

    async def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end``."""
        return await self._gpu.event_elapsed_ms(self, end)

    async def destroy(self) -> None:
        """Destroy the event."""
        await self._gpu._post(Opcode.EVENT_DESTROY, {"event": self._check()})


def launch_args(
    function: Function,
    grid: Dim,
    block: Dim,
    args: Sequence[object],
    shared_mem: int,
) -> dict[str, Any]:
    """The wire arguments of a launch or kernel node (``LaunchKernel``'s keys, less the
    stream; a kernel node's are the same)."""
    if not isinstance(shared_mem, int) or shared_mem < 0:
        raise invalid_value(f"shared_mem must be a non-negative int, got {shared_mem!r}")
    packed = pack_args(list(args))
    return {
        _FUNCTION: function._check(),
        _GRID: dim3(grid, "grid"),
        _BLOCK: dim3(block, "block"),
        _SHARED_MEM: shared_mem,
        _ARGS: packed.data,
        _PTRS: packed.pointer_offsets(),
    }


# A launch's keys (hipr.protocol.messages): module constants, read on every launch.
_FUNCTION = LaunchConfig.function
_GRID = LaunchConfig.grid
_BLOCK = LaunchConfig.block
_SHARED_MEM = LaunchConfig.shared_mem
_PTRS = LaunchConfig.ptrs
_ARGS = LaunchKernel.args
_STREAM = LaunchKernel.stream


@dataclass(frozen=True, slots=True, eq=False)
class LaunchPlan:
    """What every launch of one kernel in one configuration shares (geometry, shared
    memory, stream, the argument types' layout), checked and built once: a program
    launches few configurations, many times, and each launch then costs its argument
    bytes' packing and little else."""

    #: The launch's wire arguments but ``args`` (never changed: copied to be sent).
    wire: dict[str, Any]
    #: The geometry as the caller gave it when the plan was made (checked then).
    grid: Dim
    block: Dim
    #: What a batch of these launches shares (``hipr.client.link.launch_key``).
    batch_key: tuple[Any, ...]
    #: Packs arguments of the plan's types into their bytes.
    pack: Callable[[Sequence[object]], bytes]


#: Configurations a Function remembers (a program that makes more starts over).
_MAX_PLANS = 64


@with_timeouts
class Function(_Handle):
    """A kernel of a loaded module."""

    kind = "function"

    def __init__(
        self, gpu: AsyncGpu, handle_id: int, name: str, builtin: BuiltinKernel | None = None
    ) -> None:
        super().__init__(gpu, handle_id)
        self.name = name
        self._plans: dict[tuple[Any, ...], LaunchPlan] = {}
        #: A built-in kernel's declaration: its launches are checked against it when a
        #: configuration is first seen (count, types, shared memory), so a mistake
        #: fails at ``launch()``, not at the next synchronize.
        self._builtin = builtin

    def _launch_plan(
        self,
        grid: Dim,
        block: Dim,
        args: Sequence[object] = (),
        shared_mem: int = 0,
        stream: Stream | None = None,
    ) -> tuple[LaunchPlan, bytes]:
        """:meth:`launch`'s plan (kept for its configuration) and argument bytes. The
        handles are checked at every launch: a lost session fails here, not later."""
        self._check()
        if stream is not None:
            stream._check()
        if type(args) is not list and type(args) is not tuple:
            args = list(args)  # an iterator is read once
        types = tuple(map(type, args))
        key: tuple[Any, ...] = (grid, block, shared_mem, stream, types)
        try:
            plan = self._plans.get(key)
        except TypeError:  # a list for grid or block: this launch's plan is not kept
            plan = None
            key = ()
        if plan is not None and not (
            type(shared_mem) is int
            and (grid is plan.grid or _plain(grid))
            and (block is plan.block or _plain(block))
        ):
            # Equal to a kept plan's values but not of its types (True == 1, 1.0 == 1):
            # checked anew, so that a bad value is refused as it always is.
            plan = None
            key = ()
        if plan is None:
            plan = self._new_plan(grid, block, args, shared_mem, stream)
            if key:
                if len(self._plans) >= _MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = plan
            return plan, pack_args(args).data
        return plan, plan.pack(args)

    @sends(Send.LAUNCH, _launch_plan)
    async def launch(
        self,
        grid: Dim,
        block: Dim,
        args: Sequence[object] = (),
        shared_mem: int = 0,
        stream: Stream | None = None,
    ) -> None:
        """Launch the kernel (asynchronous: a failure surfaces at the next sync).

        ``args`` are typed: DevicePtr, numpy scalars, ctypes structures; never plain
        Python ints or floats, whose C width would be a guess.
        """
        await self._gpu._launch(*self._launch_plan(grid, block, args, shared_mem, stream))

    def _new_plan(
        self,
        grid: Dim,
        block: Dim,
        args: Sequence[object],
        shared_mem: int,
        stream: Stream | None,
    ) -> LaunchPlan:
        wire = launch_args(self, grid, block, args, shared_mem)
        if self._builtin is not None:  # after the general checks, which say more of a bad value
            self._builtin.check_launch(args, block, shared_mem)
        del wire[_ARGS]
        wire[_STREAM] = handle_id(stream)
        return LaunchPlan(wire, grid, block, launch_key(wire), packer(tuple(map(type, args))))

    def __repr__(self) -> str:
        return f"<Function {self.name!r}>"


def _plain(dim: Dim) -> bool:
    """True when a launch dimension is an int or a tuple of ints, exactly (no bool, no
    numpy integer): what a kept plan's check has already accepted when it is equal."""
    kind = type(dim)
    if kind is int:
        return True
    return kind is tuple and all(type(value) is int for value in dim)  # type: ignore[union-attr]


@with_timeouts
class Module(_Handle):
    """A loaded code object."""

    kind = "module"

    async def function(self, name: str) -> Function:
        """The kernel called ``name`` (``extern "C"`` names are the simplest)."""
        result = await self._gpu._call(
            Opcode.MODULE_GET_FUNCTION, {"module": self._check(), "name": name}
        )
        return Function(self._gpu, result["function"], name)

    async def unload(self) -> None:
        """Unload the module; its functions become invalid."""
        await self._gpu._call(Opcode.MODULE_UNLOAD, {"module": self._check()})


class GraphNode(_Handle):
    """A node of a graph, usable as a dependency of later nodes."""

    kind = "graph node"


def _deps(dependencies: Sequence[GraphNode]) -> list[int]:
    return [node._check() for node in dependencies]


@with_timeouts
class Graph(_Handle):
    """A graph of GPU work, built explicitly or captured from a stream."""

    kind = "graph"

    async def add_memset(
        self, ptr: DevicePtr | int, value: int, size: int, dependencies: Sequence[GraphNode] = ()
    ) -> GraphNode:
        """A memset node."""
        result = await self._gpu._call(
            Opcode.GRAPH_ADD_MEMSET,
            {
                "graph": self._check(),
                "dependencies": _deps(dependencies),
                "ptr": int(ptr),
                "value": value,
                "size": size,
            },
        )
        return GraphNode(self._gpu, result["node"])

    async def add_memcpy(
        self,
        dst: DevicePtr | int,
        src: DevicePtr | int,
        size: int,
        dependencies: Sequence[GraphNode] = (),
    ) -> GraphNode:
        """A device-to-device copy node."""
        result = await self._gpu._call(
            Opcode.GRAPH_ADD_MEMCPY,
            {
                "graph": self._check(),
                "dependencies": _deps(dependencies),
                "dst": int(dst),
                "src": int(src),
                "size": size,
            },
        )
        return GraphNode(self._gpu, result["node"])

    async def add_kernel(
        self,
        function: Function,
        grid: Dim,
        block: Dim,
        args: Sequence[object] = (),
        shared_mem: int = 0,
        dependencies: Sequence[GraphNode] = (),
    ) -> GraphNode:
        """A kernel node."""
        wire = launch_args(function, grid, block, args, shared_mem)
        wire[GraphAddKernel.graph] = self._check()
        wire[GraphAddKernel.dependencies] = _deps(dependencies)
        result = await self._gpu._call(Opcode.GRAPH_ADD_KERNEL, wire)
        return GraphNode(self._gpu, result["node"])

    async def instantiate(self) -> GraphExec:
        """An executable snapshot of the graph."""
        result = await self._gpu._call(Opcode.GRAPH_INSTANTIATE, {"graph": self._check()})
        return GraphExec(self._gpu, result["exec"])

    async def destroy(self) -> None:
        """Destroy the graph (its instantiations live on)."""
        await self._gpu._post(Opcode.GRAPH_DESTROY, {"graph": self._check()})


@with_timeouts
class GraphExec(_Handle):
    """An instantiated graph, ready to launch any number of times."""

    kind = "graph exec"

    async def launch(self, stream: Stream | None = None) -> None:
        """Launch the graph on ``stream``."""
        await self._gpu._post(
            Opcode.GRAPH_LAUNCH, {"exec": self._check(), "stream": handle_id(stream)}
        )

    async def destroy(self) -> None:
        """Destroy the executable graph."""
        await self._gpu._post(Opcode.GRAPH_EXEC_DESTROY, {"exec": self._check()})
