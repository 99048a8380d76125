"""Kernel arguments as hip-python programs give them to ``hipModuleLaunchKernel``.

- ``extra`` as a tuple (or list) of arguments: ctypes scalars and structures, device
  pointers (a DeviceArray, a hipr DevicePtr, a plain int address, None for null). They are
  packed with C alignment, each at the offset a C compiler gives the same struct member.
- ``extra`` in the runtime's raw form: ``(HIP_LAUNCH_PARAM_BUFFER_POINTER, buffer,
  HIP_LAUNCH_PARAM_BUFFER_SIZE, size, HIP_LAUNCH_PARAM_END)``, where ``buffer`` is the
  packed arguments (a ctypes structure, bytes-like object or host address).
- ``kernelParams``: one entry per argument, each a ctypes object or a ctypes pointer to one
  (its width is then known); a bare address is refused, its width cannot be known remotely.

The result is a list :meth:`hipr.Function.launch` packs unchanged.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from hipr.errors import HipError, HipErrorCode, invalid_value
from hipr.facade.pointer import address_of, is_device

HIP_LAUNCH_PARAM_BUFFER_POINTER = 1
HIP_LAUNCH_PARAM_BUFFER_SIZE = 2
HIP_LAUNCH_PARAM_END = 3


class _Address:
    """A device pointer argument given as a plain address."""

    __slots__ = ("address",)

    def __init__(self, address: int) -> None:
        self.address = address

    @property
    def is_device_pointer(self) -> bool:
        return True

    def __int__(self) -> int:
        return self.address

    def __index__(self) -> int:
        return self.address


def _raw_form(extra: Sequence[Any]) -> bool:
    return (
        len(extra) == 5
        and isinstance(extra[0], int)
        and extra[0] == HIP_LAUNCH_PARAM_BUFFER_POINTER
        and isinstance(extra[2], int)
        and extra[2] == HIP_LAUNCH_PARAM_BUFFER_SIZE
        and isinstance(extra[4], int)
        and extra[4] == HIP_LAUNCH_PARAM_END
    )


def _size_value(size: Any) -> int:
    if isinstance(size, int):
        return size
    if isinstance(size, ctypes._SimpleCData):
        return int(size.value)
    contents = getattr(size, "contents", None)  # a ctypes pointer to a size_t
    if contents is not None:
        return int(contents.value)
    raise invalid_value(f"HIP_LAUNCH_PARAM_BUFFER_SIZE: cannot read a size from {size!r}")


def _raw_bytes(buffer: Any, size: int) -> bytes:
    if isinstance(buffer, int):
        # A host address in this process: the program's own packed buffer.
        return ctypes.string_at(buffer, size)
    if isinstance(buffer, ctypes._Pointer):
        return ctypes.string_at(ctypes.addressof(buffer.contents), size)
    view = memoryview(buffer).cast("B")
    if view.nbytes < size:
        raise invalid_value(f"the argument buffer holds {view.nbytes} bytes, not {size}")
    return bytes(view[:size])


def _one(index: int, arg: Any) -> Any:
    if arg is None:
        return _Address(0)
    if isinstance(arg, ctypes._SimpleCData | ctypes.Structure | ctypes.Union | ctypes.Array):
        return arg
    if isinstance(arg, np.generic):
        return arg
    if isinstance(arg, int) and not isinstance(arg, bool):
        # hip-python turns a plain int in ``extra`` into a pointer: keep that meaning.
        return _Address(arg)
    if is_device(arg):
        return _Address(address_of(arg))
    raise invalid_value(
        f"extra[{index}]: cannot pass {type(arg).__name__}; use ctypes scalars or structures "
        "and device pointers"
    )


def kernel_args(kernel_params: Any, extra: Any) -> list[Any]:
    """The arguments of one launch, from ``kernelParams`` or ``extra`` (not both)."""
    if kernel_params is not None and extra is not None:
        raise invalid_value("hipModuleLaunchKernel: give kernelParams or extra, not both")
    if extra is not None:
        if not isinstance(extra, list | tuple):
            raise invalid_value("extra must be a tuple of arguments or the HIP_LAUNCH_PARAM form")
        if _raw_form(extra):
            data = _raw_bytes(extra[1], _size_value(extra[3]))
            # One opaque, byte-aligned block: it is already laid out as the kernel wants.
            return [(ctypes.c_char * len(data)).from_buffer_copy(data)] if data else []
        return [_one(i, a) for i, a in enumerate(extra)]
    if kernel_params is None:
        return []
    out = []
    for index, param in enumerate(kernel_params):
        if isinstance(param, ctypes._Pointer):
            param = param.contents
        elif isinstance(param, ctypes.c_void_p) or not isinstance(
            param, ctypes._SimpleCData | ctypes.Structure | ctypes.Union | ctypes.Array
        ):
            raise HipError(
                HipErrorCode.hipErrorNotSupported,
                f"kernelParams[{index}] is a bare address: its argument's width cannot be read "
                "remotely; pass ctypes objects (or ctypes pointers to them), or use extra=",
            )
        out.append(param)
    return out
