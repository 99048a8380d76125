"""hip-python's memory functions over hipr's client: allocation, copies in every
direction (host buffers of any kind, host addresses of this process) and memsets."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from hipr.errors import HipError, HipErrorCode, invalid_value
from hipr.facade import session
from hipr.facade.enums import hipMemcpyKind, hipSuccess
from hipr.facade.hip_handles import unbox_stream
from hipr.facade.hip_registry import served
from hipr.facade.pointer import DeviceArray, address_of, is_device

# --- host buffers ------------------------------------------------------------------------


def _host_view(obj: Any, size: int, writable: bool) -> memoryview:
    """The first ``size`` bytes of a host buffer (bytes, bytearray, memoryview, numpy or
    array.array, ctypes object)."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise invalid_value(
            f"{type(obj).__name__} is not a host buffer (use bytes, bytearray, a numpy array, "
            "array.array or a ctypes object)"
        ) from None
    if not view.c_contiguous:
        raise invalid_value("the host buffer must be C-contiguous")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    if writable and view.readonly:
        raise invalid_value("the destination host buffer is read-only")
    if view.nbytes < size:
        raise invalid_value(f"the host buffer holds {view.nbytes} bytes, fewer than {size}")
    return view[:size]


def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise invalid_value(f"sizeBytes must be a non-negative int, got {size!r}")
    return size


def _htod(dst: Any, src: Any, size: int, stream: Any, asynchronous: bool) -> None:
    if size == 0:
        return
    data = (
        memoryview(ctypes.string_at(src, size))
        if isinstance(src, int)  # a host address in this process
        else _host_view(src, size, writable=False)
    )
    gpu = session.gpu()
    if asynchronous:
        gpu.memcpy_htod_async(address_of(dst), data, stream=unbox_stream(stream))
    else:
        gpu.memcpy_htod(address_of(dst), data)


def _dtoh(dst: Any, src: Any, size: int, stream: Any) -> None:
    if size == 0:
        return
    gpu = session.gpu()
    if isinstance(dst, int):  # a host address in this process
        data = gpu.memcpy_dtoh(address_of(src), size, stream=unbox_stream(stream))
        ctypes.memmove(dst, data, size)
        return
    gpu.memcpy_dtoh(
        address_of(src), size, out=_host_view(dst, size, writable=True), stream=unbox_stream(stream)
    )


def _dtod(dst: Any, src: Any, size: int, stream: Any) -> None:
    if size:
        session.gpu().memcpy_dtod(
            address_of(dst), address_of(src), size, stream=unbox_stream(stream)
        )


def _htoh(dst: Any, src: Any, size: int) -> None:
    if size:
        target = _host_view(dst, size, writable=True)
        target[:] = _host_view(src, size, writable=False)


def _copy(dst: Any, src: Any, size: Any, kind: Any, stream: Any, asynchronous: bool) -> None:
    size = _check_size(size)
    try:
        k = hipMemcpyKind(int(kind))
    except (TypeError, ValueError):
        raise HipError(
            HipErrorCode.hipErrorInvalidMemcpyDirection, f"{kind!r} is not a hipMemcpyKind"
        ) from None
    if k == hipMemcpyKind.hipMemcpyDefault:
        # Direction from the objects themselves; a plain int names device memory here.
        dst_dev = is_device(dst) or isinstance(dst, int)
        src_dev = is_device(src) or isinstance(src, int)
        k = {
            (False, False): hipMemcpyKind.hipMemcpyHostToHost,
            (True, False): hipMemcpyKind.hipMemcpyHostToDevice,
            (False, True): hipMemcpyKind.hipMemcpyDeviceToHost,
            (True, True): hipMemcpyKind.hipMemcpyDeviceToDevice,
        }[(dst_dev, src_dev)]
    if k == hipMemcpyKind.hipMemcpyHostToDevice:
        _htod(dst, src, size, stream, asynchronous)
    elif k == hipMemcpyKind.hipMemcpyDeviceToHost:
        _dtoh(dst, src, size, stream)
    elif k in (hipMemcpyKind.hipMemcpyDeviceToDevice, hipMemcpyKind.hipMemcpyDeviceToDeviceNoCU):
        _dtod(dst, src, size, stream)
    else:
        _htoh(dst, src, size)


# --- memory ------------------------------------------------------------------------------


@served
def hipMalloc(size: int) -> tuple[Any, ...]:
    """(err, DeviceArray of ``size`` bytes); size 0 gives the null pointer, as HIP."""
    size = _check_size(size)
    if size == 0:
        return hipSuccess, DeviceArray(0, 0)
    ptr = session.gpu().malloc(size)
    return hipSuccess, DeviceArray(int(ptr), size)


@served
def hipFree(ptr: Any) -> tuple[Any, ...]:
    """Free an allocation; the null pointer is a no-op."""
    address = address_of(ptr)
    if address:
        session.gpu().free(address)
    return (hipSuccess,)


@served
def hipMemcpy(dst: Any, src: Any, sizeBytes: int, kind: Any) -> tuple[Any, ...]:
    """Copy ``sizeBytes`` in the direction ``kind`` (``hipMemcpyDefault`` infers it);
    device-to-host fills the caller's buffer in place."""
    _copy(dst, src, sizeBytes, kind, None, asynchronous=False)
    return (hipSuccess,)


@served
def hipMemcpyWithStream(
    dst: Any, src: Any, sizeBytes: int, kind: Any, stream: Any
) -> tuple[Any, ...]:
    """hipMemcpy ordered on ``stream``, complete on return."""
    _copy(dst, src, sizeBytes, kind, stream, asynchronous=False)
    if unbox_stream(stream) is not None:
        unbox_stream(stream).synchronize()
    return (hipSuccess,)


@served
def hipMemcpyAsync(dst: Any, src: Any, sizeBytes: int, kind: Any, stream: Any) -> tuple[Any, ...]:
    """Copy on ``stream``. A host source may be reused at once (its bytes are sent before
    this returns); a device-to-host copy has filled its destination when this returns."""
    _copy(dst, src, sizeBytes, kind, stream, asynchronous=True)
    return (hipSuccess,)


@served
def hipMemcpyHtoD(dst: Any, src: Any, sizeBytes: int) -> tuple[Any, ...]:
    """Host to device."""
    _htod(dst, src, _check_size(sizeBytes), None, asynchronous=False)
    return (hipSuccess,)


@served
def hipMemcpyDtoH(dst: Any, src: Any, sizeBytes: int) -> tuple[Any, ...]:
    """Device to host, into ``dst`` in place."""
    _dtoh(dst, src, _check_size(sizeBytes), None)
    return (hipSuccess,)


@served
def hipMemcpyDtoD(dst: Any, src: Any, sizeBytes: int) -> tuple[Any, ...]:
    """Device to device."""
    _dtod(dst, src, _check_size(sizeBytes), None)
    return (hipSuccess,)


@served
def hipMemcpyHtoDAsync(dst: Any, src: Any, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """Host to device on ``stream``."""
    _htod(dst, src, _check_size(sizeBytes), stream, asynchronous=True)
    return (hipSuccess,)


@served
def hipMemcpyDtoHAsync(dst: Any, src: Any, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """Device to host on ``stream``, into ``dst`` in place."""
    _dtoh(dst, src, _check_size(sizeBytes), stream)
    return (hipSuccess,)


@served
def hipMemcpyDtoDAsync(dst: Any, src: Any, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """Device to device on ``stream``."""
    _dtod(dst, src, _check_size(sizeBytes), stream)
    return (hipSuccess,)


def _memset(dst: Any, value: int, count: int, dtype: Any, stream: Any) -> None:
    count = _check_size(count)
    if count == 0:
        return
    width = np.dtype(dtype).itemsize
    pattern = int(value) & ((1 << (8 * width)) - 1)
    raw = pattern.to_bytes(width, "little")
    gpu = session.gpu()
    if raw == raw[:1] * width:
        # A repeated byte is a plain memset: no data crosses the link.
        gpu.memset(address_of(dst), raw[0], count * width, stream=unbox_stream(stream))
    else:
        # No wide fill on the wire: the pattern travels as data.
        data = np.full(count, pattern, dtype=np.dtype(dtype).newbyteorder("<")).data
        if stream is None:
            gpu.memcpy_htod(address_of(dst), data)
        else:
            gpu.memcpy_htod_async(address_of(dst), data, stream=unbox_stream(stream))


@served
def hipMemset(dst: Any, value: int, sizeBytes: int) -> tuple[Any, ...]:
    """Set ``sizeBytes`` bytes to the low byte of ``value``."""
    _memset(dst, value, sizeBytes, np.uint8, None)
    return (hipSuccess,)


@served
def hipMemsetAsync(dst: Any, value: int, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """hipMemset on ``stream``."""
    _memset(dst, value, sizeBytes, np.uint8, stream)
    return (hipSuccess,)


@served
def hipMemsetD8(dest: Any, value: int, count: int) -> tuple[Any, ...]:
    """Set ``count`` bytes."""
    _memset(dest, value, count, np.uint8, None)
    return (hipSuccess,)


@served
def hipMemsetD16(dest: Any, value: int, count: int) -> tuple[Any, ...]:
    """Set ``count`` 16-bit values."""
    _memset(dest, value, count, np.uint16, None)
    return (hipSuccess,)


@served
def hipMemsetD32(dest: Any, value: int, count: int) -> tuple[Any, ...]:
    """Set ``count`` 32-bit values."""
    _memset(dest, value, count, np.uint32, None)
    return (hipSuccess,)


@served
def hipMemsetD8Async(dest: Any, value: int, count: int, stream: Any) -> tuple[Any, ...]:
    """hipMemsetD8 on ``stream``."""
    _memset(dest, value, count, np.uint8, stream)
    return (hipSuccess,)


@served
def hipMemsetD16Async(dest: Any, value: int, count: int, stream: Any) -> tuple[Any, ...]:
    """hipMemsetD16 on ``stream``."""
    _memset(dest, value, count, np.uint16, stream)
    return (hipSuccess,)


@served
def hipMemsetD32Async(dst: Any, value: int, count: int, stream: Any) -> tuple[Any, ...]:
    """hipMemsetD32 on ``stream``."""
    _memset(dst, value, count, np.uint32, stream)
    return (hipSuccess,)
