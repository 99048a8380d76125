"""The device pointer ``hipMalloc`` returns, shaped like hip-python's ``DeviceArray``:
``int(p)`` is the address, ``.size``/``.itemsize``/``.shape``/``.typestr`` describe it,
``.configure(typestr=..., shape=...)`` re-types it, ``p[i]``/``p[a:b]`` are sub-arrays, and
``__cuda_array_interface__`` describes it to libraries that read that.

It is also a hipr device pointer (``is_device_pointer``, ``__index__``, ``nbytes``), so it
goes wherever hipr takes one: as a kernel argument, to ``memcpy_*``, to ``free``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hipr.errors import invalid_value


def _itemsize(typestr: str) -> int:
    try:
        return int(np.dtype(typestr).itemsize)
    except TypeError:
        raise invalid_value(f"typestr {typestr!r} is not a numpy type string") from None


class DeviceArray:
    """Device memory of this session: an address, its byte count and an optional type and
    shape (bytes, ``|u1``, until :meth:`configure` says otherwise)."""

    __slots__ = ("_address", "_nbytes", "_read_only", "_shape", "_stream", "_typestr")

    def __init__(
        self,
        address: int,
        nbytes: int,
        typestr: str = "|u1",
        shape: tuple[int, ...] | None = None,
    ) -> None:
        self._address = int(address)
        self._nbytes = int(nbytes)
        self._typestr = typestr
        self._shape = shape if shape is not None else (self._nbytes // _itemsize(typestr),)
        self._read_only = False
        self._stream: int | None = None

    # --- what hipr needs --------------------------------------------------------------
    @property
    def is_device_pointer(self) -> bool:
        """Marks a kernel argument that is a device pointer."""
        return True

    def __int__(self) -> int:
        return self._address

    def __index__(self) -> int:
        return self._address

    @property
    def nbytes(self) -> int:
        """Bytes of the array."""
        return self._nbytes

    # --- hip-python's DeviceArray -------------------------------------------------------
    @property
    def size(self) -> int:
        """Elements: the product of :attr:`shape`."""
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _itemsize(self._typestr)

    @property
    def shape(self) -> tuple[int, ...]:
        """Extent per dimension."""
        return self._shape

    @property
    def rank(self) -> int:
        """Dimensions."""
        return len(self._shape)

    @property
    def typestr(self) -> str:
        """The numpy type string of an element."""
        return self._typestr

    @property
    def is_ptr_null(self) -> bool:
        """True for the null pointer (``hipMalloc(0)``)."""
        return self._address == 0

    @property
    def is_read_only(self) -> bool:
        """As configured with ``read_only=``."""
        return self._read_only

    def configure(self, **kwargs: Any) -> DeviceArray:
        """Re-type and re-shape: ``typestr=``, ``shape=``, ``itemsize=`` (checked against the
        typestr), ``read_only=``, ``stream=``; the byte count must stay the same unless
        ``_force=True``. Returns self."""
        force = bool(kwargs.pop("_force", False))
        typestr = str(kwargs.pop("typestr", self._typestr))
        itemsize = kwargs.pop("itemsize", None)
        if itemsize is not None and int(itemsize) != _itemsize(typestr):
            if "shape" not in kwargs and typestr == self._typestr:
                # hip-python's way to say "elements of N bytes" for a byte array.
                typestr = f"|V{int(itemsize)}"
            else:
                raise invalid_value(f"itemsize {itemsize} does not match typestr {typestr!r}")
        shape_arg = kwargs.pop("shape", None)
        shape = (
            tuple(int(n) for n in shape_arg)
            if shape_arg is not None
            else (self._nbytes // _itemsize(typestr),)
        )
        self._read_only = bool(kwargs.pop("read_only", self._read_only))
        self._stream = kwargs.pop("stream", self._stream)
        if kwargs:
            raise invalid_value(f"configure: unknown keyword(s) {sorted(kwargs)}")
        nbytes = math.prod(shape) * _itemsize(typestr)
        if nbytes != self._nbytes and not force:
            raise invalid_value(
                f"configure: {shape} of {typestr!r} is {nbytes} bytes, the array {self._nbytes} "
                "(pass _force=True to change it)"
            )
        self._typestr, self._shape, self._nbytes = typestr, shape, nbytes
        return self

    def __getitem__(self, subscript: int | slice) -> DeviceArray:
        """A contiguous sub-array along the first axis: ``p[i]`` or ``p[a:b]``."""
        rows = self._shape[0] if self._shape else 1
        row_bytes = self._nbytes // rows if rows else 0
        inner = self._shape[1:]
        if isinstance(subscript, slice):
            start, stop, step = subscript.indices(rows)
            if step != 1:
                raise invalid_value("a strided slice of device memory is not contiguous")
            count = max(0, stop - start)
            return DeviceArray(
                self._address + start * row_bytes,
                count * row_bytes,
                self._typestr,
                (count, *inner),
            )
        if isinstance(subscript, int) and not isinstance(subscript, bool):
            index = subscript + rows if subscript < 0 else subscript
            if not 0 <= index < rows:
                raise KeyError(subscript)
            shape = inner if inner else (1,)
            return DeviceArray(self._address + index * row_bytes, row_bytes, self._typestr, shape)
        raise TypeError(f"device arrays take an int or a slice, not {type(subscript).__name__}")

    def __add__(self, offset: int) -> DeviceArray:
        """The bytes from ``offset`` on, as a byte array (pointer arithmetic)."""
        if not isinstance(offset, int) or isinstance(offset, bool):
            return NotImplemented
        if not 0 <= offset <= self._nbytes:
            raise invalid_value(f"offset {offset} is outside this {self._nbytes}-byte array")
        return DeviceArray(self._address + offset, self._nbytes - offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) of the remote memory: its address is on the
        worker, so only libraries that pass it back to hipr can use it."""
        return {
            "shape": self._shape,
            "typestr": self._typestr,
            "data": (self._address, self._read_only),
            "strides": None,
            "version": 3,
            "stream": self._stream,
        }

    def __bool__(self) -> bool:
        return self._address != 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeviceArray):
            return self._address == other._address and self._nbytes == other._nbytes
        if isinstance(other, int):
            return self._address == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._address)

    def __repr__(self) -> str:
        return f"<DeviceArray 0x{self._address:x} shape={self._shape} typestr={self._typestr!r}>"


def address_of(obj: object) -> int:
    """The device address ``obj`` names: a DeviceArray, a hipr DevicePtr, an int, None (0),
    or anything with ``__cuda_array_interface__``."""
    if obj is None:
        return 0
    if isinstance(obj, DeviceArray | int) and not isinstance(obj, bool):
        return int(obj)
    if getattr(obj, "is_device_pointer", False):
        return int(obj)  # type: ignore[call-overload,no-any-return]
    interface = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        return int(interface["data"][0])
    value = getattr(obj, "value", None)  # ctypes.c_void_p
    if isinstance(value, int) or (value is None and hasattr(obj, "_type_")):
        return int(value or 0)
    raise TypeError(f"{type(obj).__name__} does not name a device address")


def is_device(obj: object) -> bool:
    """True for objects that name device memory (rather than a host buffer)."""
    return (
        isinstance(obj, DeviceArray)
        or bool(getattr(obj, "is_device_pointer", False))
        or hasattr(obj, "__cuda_array_interface__")
    )
