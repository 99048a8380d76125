"""The emulator's objects: device memory, streams, events, modules and functions, the
operations a stream or graph runs, graphs, and each device's address arena; and the
argument checks its calls share. Plain classes: :class:`~hipr.backends.emulator.
EmulatorBackend` gives them meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hipr.backends.interface import Dim3
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BuiltinKernel
from hipr.kernels.kernel_args import arg_layout

_E = HipErrorCode


def fail(code: HipErrorCode, message: str) -> HipError:
    return HipError(code, message)


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class Allocation:
    __slots__ = ("base", "buf", "device", "size")

    def __init__(self, device: int, base: int, size: int, buf: npt.NDArray[np.uint8]) -> None:
        self.device = device
        self.base = base
        self.size = size
        self.buf = buf


class Stream:
    __slots__ = ("capture", "capture_invalidated", "device")

    def __init__(self, device: int) -> None:
        self.device = device
        #: The operations recorded since stream_begin_capture, or None when not capturing.
        self.capture: list[Op] | None = None
        self.capture_invalidated = False

    def __repr__(self) -> str:
        return f"<emulator stream on device {self.device} at {id(self):#x}>"


class Event:
    __slots__ = ("device", "recorded_at")

    def __init__(self, device: int) -> None:
        self.device = device
        self.recorded_at: float | None = None

    def __repr__(self) -> str:
        return f"<emulator event on device {self.device} at {id(self):#x}>"


class Module:
    __slots__ = ("device", "functions", "globals", "kernels")

    def __init__(self, device: int, kernels: dict[str, BuiltinKernel]) -> None:
        self.device = device
        self.kernels = kernels
        self.functions: dict[str, Function] = {}
        #: The module's variables: name -> (device address, size).
        self.globals: dict[str, tuple[int, int]] = {}

    def __repr__(self) -> str:
        return f"<emulator module on device {self.device} at {id(self):#x}>"


class Function:
    __slots__ = ("kernel", "layout", "module")

    def __init__(self, module: Module, kernel: BuiltinKernel) -> None:
        self.module = module
        self.kernel = kernel
        self.layout = arg_layout(kernel.arg_kinds)

    def __repr__(self) -> str:
        return f"<emulator function {self.kernel.name} at {id(self):#x}>"


@dataclass(frozen=True, slots=True)
class MemsetOp:
    ptr: int
    value: int
    size: int


@dataclass(frozen=True, slots=True)
class CopyOp:
    dst: int
    src: int
    size: int


@dataclass(frozen=True, slots=True)
class UploadOp:
    """A host-to-device copy captured from a stream: the bytes are owned by the op."""

    dst: int
    data: bytes


@dataclass(frozen=True, slots=True)
class KernelOp:
    function: Function
    grid: Dim3
    block: Dim3
    shared_mem: int
    values: tuple[Any, ...]


Op = MemsetOp | CopyOp | UploadOp | KernelOp


class GraphNode:
    __slots__ = ("dependencies", "graph", "op")

    def __init__(self, graph: Graph, op: Op, dependencies: tuple[GraphNode, ...]) -> None:
        self.graph = graph
        self.op = op
        self.dependencies = dependencies

    def __repr__(self) -> str:
        return f"<emulator graph node {type(self.op).__name__} at {id(self):#x}>"


class Graph:
    __slots__ = ("nodes",)

    def __init__(self) -> None:
        self.nodes: list[GraphNode] = []

    def __repr__(self) -> str:
        return f"<emulator graph of {len(self.nodes)} nodes at {id(self):#x}>"


class GraphExec:
    __slots__ = ("ops",)

    def __init__(self, ops: tuple[Op, ...]) -> None:
        self.ops = ops

    def __repr__(self) -> str:
        return f"<emulator graph exec of {len(self.ops)} nodes at {id(self):#x}>"


@dataclass(slots=True)
class Arena:
    start: int
    end: int
    next: int
    used: int = 0
    #: Once the bump pointer has reached the end, placement searches the gaps instead.
    wrapped: bool = False


def check_size(size: int, what: str) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise fail(_E.hipErrorInvalidValue, f"{what} must be an int, got {type(size).__name__}")
    if size < 0:
        raise fail(_E.hipErrorInvalidValue, f"{what} must not be negative, got {size}")
    return size


def check_dim3(dims: Dim3, what: str, limits: tuple[int, int, int]) -> Dim3:
    values: tuple[object, ...] = tuple(dims) if isinstance(dims, tuple | list) else ()
    checked = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(checked) != 3 or len(values) != 3:
        raise fail(_E.hipErrorInvalidValue, f"{what} must be three ints (x, y, z), got {dims!r}")
    for axis, value, limit in zip("xyz", checked, limits, strict=True):
        if not 1 <= value <= limit:
            raise fail(
                _E.hipErrorInvalidConfiguration,
                f"{what}.{axis} must be between 1 and {limit}, got {value}",
            )
    return (checked[0], checked[1], checked[2])
