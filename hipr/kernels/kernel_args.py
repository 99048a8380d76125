"""Kernel arguments packed with C alignment into one buffer (the runtime's ``extra`` path).

AMD's C HIP Remote took every argument as 8 bytes; a ``char``, a ``float`` or a struct
then arrives misplaced. Here each argument has an exact type: a device pointer is 8
bytes, a numpy scalar its own size, a ``ctypes.Structure`` its own bytes and alignment.
Plain Python ints and floats are refused because their C width is ambiguous.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

import numpy as np

from hipr.errors import invalid_value

#: At most this many arguments and bytes, as hipModuleLaunchKernel can take.
MAX_ARGS = 256
MAX_ARGS_BYTES = 4096
POINTER_SIZE = 8


@runtime_checkable
class DeviceAddress(Protocol):
    """Anything that names a device address: the client's ``DevicePtr``."""

    def __index__(self) -> int: ...

    @property
    def is_device_pointer(self) -> bool: ...


class ArgSlot(NamedTuple):
    """Where one argument sits in the packed buffer; ``kind`` is ``ptr`` for pointers
    (the worker checks those against the session's allocations) else ``value``. (A
    named tuple: built once per argument of every launch, it costs a fifth of a frozen
    dataclass.)"""

    offset: int
    size: int
    kind: str


#: ``ArgSlot(...)`` without the named tuple's Python-level ``__new__`` (a launch's hot path).
_new_slot = tuple.__new__


class PackedArgs(NamedTuple):
    """The packed buffer and its layout."""

    data: bytes
    slots: tuple[ArgSlot, ...]

    def pointer_offsets(self) -> list[int]:
        """Offsets of the pointer arguments."""
        return [s.offset for s in self.slots if s.kind == "ptr"]

    def to_wire(self) -> dict[str, Any]:
        """The CBOR map a launch request carries."""
        return {"args": self.data, "ptrs": self.pointer_offsets()}


#: ``PackedArgs(...)`` without the named tuple's Python-level ``__new__``.
_new_packed = tuple.__new__


#: numpy scalar types whose ``tobytes()`` is already the little-endian C value, with
#: their alignment: looked up first, since a launch is the hottest call a client makes
#: and the general path below costs several microseconds per numpy argument.
_NUMPY_FAST: dict[type, int] = {}
if sys.byteorder == "little":
    for _type in (
        np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
        np.float16, np.float32, np.float64, np.bool_,
    ):  # fmt: skip
        _NUMPY_FAST[_type] = np.dtype(_type).alignment


#: Classes whose instances are device pointers (``int()`` is the address), registered
#: by the client (:func:`register_pointer_type`): a pointer argument then skips the
#: general checks below, which cost more than the rest of its packing.
_POINTER_TYPES: set[type] = set()


def register_pointer_type(cls: type) -> None:
    """Have :func:`pack_args` take instances of ``cls`` (which must define ``__index__``
    as the device address and ``is_device_pointer``) as pointers at once."""
    if not getattr(cls, "is_device_pointer", False) or not hasattr(cls, "__index__"):
        raise TypeError(f"{cls.__name__} is not a device pointer type")
    _POINTER_TYPES.add(cls)


def _encode_one(index: int, arg: object) -> tuple[bytes, int, str]:
    """(bytes, alignment, kind) of one argument."""
    fast = _NUMPY_FAST.get(type(arg))
    if fast is not None:
        return arg.tobytes(), fast, "value"  # type: ignore[attr-defined]
    if isinstance(arg, bool):
        raise invalid_value(
            f"kernel argument {index}: a Python bool has no fixed C width; pass np.bool_ or "
            "np.uint8"
        )
    if getattr(arg, "is_device_pointer", False):
        address = int(arg)  # type: ignore[call-overload]
        return address.to_bytes(POINTER_SIZE, "little", signed=False), POINTER_SIZE, "ptr"
    if isinstance(arg, np.generic):
        scalar = np.asarray(arg)
        if scalar.dtype.kind not in "biuf" or scalar.dtype.hasobject:
            raise invalid_value(
                f"kernel argument {index}: numpy type {scalar.dtype} is not a C scalar"
            )
        data = scalar.astype(scalar.dtype.newbyteorder("<")).tobytes()
        return data, scalar.dtype.alignment, "value"
    if isinstance(arg, ctypes.Structure | ctypes.Union | ctypes.Array):
        return bytes(arg), ctypes.alignment(arg), "value"
    if isinstance(arg, ctypes._SimpleCData):
        return bytes(arg), ctypes.alignment(arg), "value"  # type: ignore[arg-type]
    if isinstance(arg, int | float):
        kind = "int" if isinstance(arg, int) else "float"
        raise invalid_value(
            f"kernel argument {index}: a plain Python {kind} ({arg!r}) has an ambiguous C width; "
            f"wrap it, e.g. np.int32({arg!r}) or np.float32({arg!r})"
        )
    raise invalid_value(
        f"kernel argument {index}: cannot pass {type(arg).__name__}; use a DevicePtr, a numpy "
        "scalar (np.int32, np.float32, ...) or a ctypes.Structure"
    )


#: struct codes of the numpy integer types (standard sizes, little-endian with ``<``):
#: their values pack as Python ints, exactly. Floats and bools pack as their own bytes
#: (``tobytes``), so that every bit pattern, a signalling NaN's included, arrives as is.
_INTEGER_CODES: dict[type, str] = {
    np.int8: "b", np.uint8: "B", np.int16: "h", np.uint16: "H",
    np.int32: "i", np.uint32: "I", np.int64: "q", np.uint64: "Q",
}  # fmt: skip


class _Layout:
    """How arguments of one sequence of types pack: one ``struct`` format with the C
    padding in it, and what turns each argument into its field. Worked out once per
    sequence of types (a program launches few kinds of kernels, many times), so that a
    launch packs in one ``Struct.pack`` instead of a walk with alignment arithmetic."""

    __slots__ = ("convert", "slots", "struct")

    def __init__(self, types: tuple[type, ...]) -> None:
        fields = ["<"]
        convert: list[Any] = []
        slots: list[ArgSlot] = []
        end = 0
        for cls in types:
            if cls in _POINTER_TYPES:
                code, size, alignment, kind = "Q", POINTER_SIZE, POINTER_SIZE, "ptr"
                how: Any = operator.index
            else:
                alignment = _NUMPY_FAST[cls]
                size = np.dtype(cls).itemsize
                kind = "value"
                code = _INTEGER_CODES.get(cls, f"{size}s")
                how = int if cls in _INTEGER_CODES else cls.tobytes  # type: ignore[attr-defined]
            offset = -(-end // alignment) * alignment
            if offset > end:
                fields.append(f"{offset - end}x")
            fields.append(code)
            convert.append(how)
            slots.append(ArgSlot(offset, size, kind))
            end = offset + size
        self.struct = struct.Struct("".join(fields))
        self.convert = tuple(convert)
        self.slots = tuple(slots)

    def pack(self, args: Sequence[object]) -> PackedArgs:
        """``args`` (of this layout's types) packed."""
        return _new_packed(PackedArgs, (self.data(args), self.slots))

    def data(self, args: Sequence[object]) -> bytes:
        """``args`` (of this layout's types) as their bytes alone."""
        # The types came from ``args``, so the two have the same length.
        return self.struct.pack(*[how(arg) for how, arg in zip(self.convert, args)])  # noqa: B905


#: Layouts by the tuple of argument types; None for a sequence the general walk packs.
_LAYOUTS: dict[tuple[type, ...], _Layout | None] = {}
#: Distinct sequences of types remembered (a program that makes more starts over).
_MAX_LAYOUTS = 1024


def _layout(types: tuple[type, ...]) -> _Layout | None:
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    fast = all(cls in _POINTER_TYPES or cls in _NUMPY_FAST for cls in types)
    layout = _Layout(types) if fast and types and len(types) <= MAX_ARGS else None
    if layout is not None and layout.struct.size > MAX_ARGS_BYTES:
        layout = None  # the general walk refuses it, with its message
    _LAYOUTS[types] = layout
    return layout


def pack_args(args: Sequence[object]) -> PackedArgs:
    """Pack ``args`` at the offsets a C compiler gives a struct of the same members."""
    types = tuple(map(type, args))
    layout = _LAYOUTS.get(types, False)
    if layout is False:
        layout = _layout(types)
    if layout is not None:
        try:
            return layout.pack(args)  # type: ignore[union-attr]
        except (struct.error, OverflowError, TypeError):
            pass  # a pointer out of range, say: the walk below says what is wrong
    return _pack_each(args)


def packer(types: tuple[type, ...]) -> Callable[[Sequence[object]], bytes]:
    """A function that packs arguments of exactly ``types`` into the bytes
    :func:`pack_args` gives them, made once for a kernel launched many times: the
    layout's one ``Struct.pack`` where the types allow, else :func:`pack_args` itself
    (which also says what is wrong with a bad argument)."""
    layout = _LAYOUTS.get(types, False)
    if layout is False:
        layout = _layout(types)
    if layout is None:
        return _packed_data
    data = layout.data  # type: ignore[union-attr]

    def pack(args: Sequence[object]) -> bytes:
        try:
            return data(args)
        except (struct.error, OverflowError, TypeError):
            return pack_args(args).data  # a pointer out of range, say: it says what

    return pack


def _packed_data(args: Sequence[object]) -> bytes:
    return pack_args(args).data


def _pack_each(args: Sequence[object]) -> PackedArgs:
    """:func:`pack_args` argument by argument: any argument type, and the checks."""
    if len(args) > MAX_ARGS:
        raise invalid_value(f"{len(args)} kernel arguments: at most {MAX_ARGS} are allowed")
    buffer = bytearray()
    slots: list[ArgSlot] = []
    fast = _NUMPY_FAST
    pointers = _POINTER_TYPES
    for index, arg in enumerate(args):
        cls = type(arg)
        alignment = fast.get(cls)
        # _encode_one's first cases, without the call and its checks.
        if alignment is not None:
            data: bytes = arg.tobytes()  # type: ignore[attr-defined]
            kind = "value"
        elif cls in pointers:
            data = arg.__index__().to_bytes(POINTER_SIZE, "little")  # type: ignore[attr-defined]
            alignment, kind = POINTER_SIZE, "ptr"
        else:
            data, alignment, kind = _encode_one(index, arg)
        end = len(buffer)
        offset = -(-end // alignment) * alignment
        if offset > end:
            buffer += bytes(offset - end)
        buffer += data
        slots.append(_new_slot(ArgSlot, (offset, len(data), kind)))
    # No trailing padding: the runtime checks the buffer against the kernel's parameter
    # size, which ends at the last parameter (CUDA refuses a padded buffer).
    if len(buffer) > MAX_ARGS_BYTES:
        raise invalid_value(
            f"kernel arguments take {len(buffer)} bytes: at most {MAX_ARGS_BYTES} are allowed"
        )
    return PackedArgs(bytes(buffer), tuple(slots))


# --- reading a packed buffer back, by kind (the emulator's kernels) ---------------------

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


def kind_size_align(kind: str) -> tuple[int, int]:
    """(size, alignment) in bytes of an argument of ``kind``."""
    if kind == "probe_struct":
        return _PROBE_STRUCT.size, _PROBE_STRUCT_ALIGN
    code = _SCALAR_CODES.get(kind)
    if code is None:
        raise invalid_value(f"unknown kernel argument kind {kind!r}")
    size = struct.calcsize("<" + code)
    # C scalars are aligned to their own size on every ABI HIP targets.
    return size, size


@dataclass(frozen=True, slots=True)
class ArgLayout:
    """Where each argument of a kernel sits in its packed buffer, C rules."""

    kinds: tuple[str, ...]
    offsets: tuple[int, ...]
    #: The packed size: the end of the last argument, with no trailing padding, as
    #: :func:`pack_args` produces (CUDA refuses a padded buffer).
    size: int


def arg_layout(kinds: Sequence[str]) -> ArgLayout:
    """The C layout of arguments of ``kinds`` (``i8`` ... ``f64``, ``ptr``, ``probe_struct``)."""
    offsets: list[int] = []
    end = 0
    for kind in kinds:
        size, align = kind_size_align(kind)
        offset = -(-end // align) * align
        offsets.append(offset)
        end = offset + size
    return ArgLayout(tuple(kinds), tuple(offsets), end)


def unpack_args(layout: ArgLayout, data: bytes) -> tuple[Any, ...]:
    """Decode a packed argument buffer: ints, floats, and ``(a, b, c)`` for a probe_struct.

    A buffer whose length is not exactly ``layout.size`` is refused with
    hipErrorInvalidValue: it means the client packed other types than the kernel takes.
    """
    if len(data) != layout.size:
        raise invalid_value(
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
