"""hip-python's ``hip`` functions over hipr's client (``hipr.hip`` re-exports them).

Each returns hip-python's tuple: the ``hipError_t`` first, then the results, ``(err,)``
when there are none; results hip-python writes into a caller's object (device
properties, device-to-host copies) are written there. :data:`HIP_API` is what is served;
:mod:`hipr.facade.hip_names` answers the rest of hip-python's names.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from hipr.errors import HipError, HipErrorCode, error_name, invalid_value
from hipr.facade import session
from hipr.facade.catalog import HIP_CONSTANTS, HIP_FUNCTIONS
from hipr.facade.enums import (
    hip_error,
    hipDeviceAttribute_t,
    hipError_t,
    hipMemcpyKind,
    hipStreamCaptureStatus,
    hipSuccess,
)
from hipr.facade.launch import kernel_args
from hipr.facade.pointer import DeviceArray, address_of, is_device
from hipr.facade.props import attribute_value, fill, hipDeviceProp_t

#: Every served function, by name.
HIP_API: dict[str, Callable[..., tuple[Any, ...]]] = {}


def _hip_error(exc: HipError) -> Any:
    return hip_error(exc.code)


def _api(fn: Callable[..., tuple[Any, ...]]) -> Any:
    """Register ``fn`` under its name with hip-python's result count for it."""
    wrapped = session.hip_call(HIP_FUNCTIONS.get(fn.__name__, 0), _hip_error)(fn)
    HIP_API[fn.__name__] = wrapped
    return wrapped


# --- handles -----------------------------------------------------------------------------


class _HandleBox:
    """A hip-python style handle around the hipr client handle it stands for."""

    __slots__ = ("_h",)

    def __init__(self, handle: Any) -> None:
        self._h = handle

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._h!r}>"

    def __int__(self) -> int:
        return int(getattr(self._h, "id", 0))


class ihipStream_t(_HandleBox):  # hip-python's name
    """A stream (``hipStreamCreate``); ``None`` or ``0`` is the default stream."""

    __slots__ = ()


class ihipEvent_t(_HandleBox):  # hip-python's name
    """An event (``hipEventCreate``)."""

    __slots__ = ()


class ihipModule_t(_HandleBox):  # hip-python's name
    """A loaded code object (``hipModuleLoadData``)."""

    __slots__ = ()


class ihipModuleSymbol_t(_HandleBox):  # hip-python's name
    """A kernel of a module (``hipModuleGetFunction``)."""

    __slots__ = ()


class ihipGraph(_HandleBox):  # hip-python's name
    """A graph (``hipStreamEndCapture``, ``hipGraphCreate``)."""

    __slots__ = ()


class hipGraphExec(_HandleBox):  # hip-python's name
    """An instantiated graph (``hipGraphInstantiate``)."""

    __slots__ = ()


def _unbox(obj: Any, cls: type[_HandleBox], what: str) -> Any:
    if isinstance(obj, cls):
        return obj._h
    raise HipError(
        HipErrorCode.hipErrorInvalidHandle, f"expected a {what}, got {type(obj).__name__}"
    )


def _stream(stream: Any) -> Any:
    """The hipr stream of ``stream``; None for the default stream (None or 0)."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return None
    return _unbox(stream, ihipStream_t, "stream (ihipStream_t)")


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
        gpu.memcpy_htod_async(address_of(dst), data, stream=_stream(stream))
    else:
        gpu.memcpy_htod(address_of(dst), data)


def _dtoh(dst: Any, src: Any, size: int, stream: Any) -> None:
    if size == 0:
        return
    gpu = session.gpu()
    if isinstance(dst, int):  # a host address in this process
        data = gpu.memcpy_dtoh(address_of(src), size, stream=_stream(stream))
        ctypes.memmove(dst, data, size)
        return
    gpu.memcpy_dtoh(
        address_of(src), size, out=_host_view(dst, size, writable=True), stream=_stream(stream)
    )


def _dtod(dst: Any, src: Any, size: int, stream: Any) -> None:
    if size:
        session.gpu().memcpy_dtod(address_of(dst), address_of(src), size, stream=_stream(stream))


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


# --- devices -----------------------------------------------------------------------------


@_api
def hipInit(flags: int = 0) -> tuple[Any, ...]:
    """Connect the facade's session (done by any first call anyway)."""
    session.gpu()
    return (hipSuccess,)


@_api
def hipGetDeviceCount() -> tuple[Any, ...]:
    """(err, count) of the worker's visible devices."""
    return hipSuccess, session.gpu().device_count()


@_api
def hipSetDevice(deviceId: int) -> tuple[Any, ...]:
    """Make ``deviceId`` current for the session."""
    session.gpu().set_device(int(deviceId))
    return (hipSuccess,)


@_api
def hipGetDevice() -> tuple[Any, ...]:
    """(err, device) current for the session."""
    return hipSuccess, session.gpu().get_device()


@_api
def hipDeviceGet(ordinal: int) -> tuple[Any, ...]:
    """(err, device) for ``ordinal``: the ordinal itself, once checked."""
    count = session.gpu().device_count()
    if not 0 <= int(ordinal) < count:
        raise HipError(HipErrorCode.hipErrorInvalidDevice, f"device {ordinal} of {count}")
    return hipSuccess, int(ordinal)


@_api
def hipGetDeviceProperties(prop: Any, deviceId: int | None = None) -> tuple[Any, ...]:
    """``hipGetDeviceProperties(props, device)`` fills ``props`` (a ``hipDeviceProp_t``)
    and returns ``(err,)``; ``hipGetDeviceProperties(device)`` returns ``(err, props)``."""
    if deviceId is None:
        props = fill(hipDeviceProp_t(), session.gpu().device_properties(int(prop)))
        return hipSuccess, props
    if not isinstance(prop, hipDeviceProp_t):
        raise invalid_value(f"prop must be a hipDeviceProp_t, got {type(prop).__name__}")
    fill(prop, session.gpu().device_properties(int(deviceId)))
    return (hipSuccess,)


@_api
def hipDeviceGetAttribute(attr: Any, deviceId: int) -> tuple[Any, ...]:
    """(err, value) of one ``hipDeviceAttribute_t`` of ``deviceId``; hipErrorInvalidValue
    for an attribute the worker's runtime does not report."""
    try:
        member = hipDeviceAttribute_t(int(attr))
    except (TypeError, ValueError):
        raise invalid_value(f"{attr!r} is not a hipDeviceAttribute_t") from None
    name = getattr(attr, "name", None) or member.name
    value = attribute_value(name, session.gpu().device_properties(int(deviceId)))
    if value is None:
        raise invalid_value(f"{name} is not reported by this worker's runtime")
    return hipSuccess, value


@_api
def hipDeviceGetName(len: int, device: int) -> tuple[Any, ...]:
    """(err, name as bytes of at most ``len - 1`` characters)."""
    name = session.gpu().device_properties(int(device)).name.encode()
    return hipSuccess, name[: max(0, int(len) - 1)]


@_api
def hipDeviceComputeCapability(device: int) -> tuple[Any, ...]:
    """(err, major, minor)."""
    props = session.gpu().device_properties(int(device))
    return hipSuccess, props.major, props.minor


@_api
def hipDeviceTotalMem(device: int) -> tuple[Any, ...]:
    """(err, bytes of device memory)."""
    return hipSuccess, session.gpu().device_properties(int(device)).total_memory


@_api
def hipDeviceGetPCIBusId(len: int, device: int) -> tuple[Any, ...]:
    """(err, PCI bus id as bytes, ``"0000:65:00.0"``)."""
    bus = session.gpu().device_properties(int(device)).pci_bus_id.encode()
    return hipSuccess, bus[: max(0, int(len) - 1)]


@_api
def hipDeviceSynchronize() -> tuple[Any, ...]:
    """Wait for all work of the current device; reports asynchronous errors."""
    session.gpu().synchronize()
    return (hipSuccess,)


@_api
def hipCtxSynchronize() -> tuple[Any, ...]:
    """As hipDeviceSynchronize (the session is the context)."""
    session.gpu().synchronize()
    return (hipSuccess,)


@_api
def hipMemGetInfo() -> tuple[Any, ...]:
    """(err, free, total) bytes of the current device."""
    free, total = session.gpu().mem_get_info()
    return hipSuccess, free, total


@_api
def hipDriverGetVersion() -> tuple[Any, ...]:
    """(err, version): the HIP version whose API the facade follows."""
    session.gpu()
    return hipSuccess, HIP_CONSTANTS.get("HIP_VERSION", 0)


@_api
def hipRuntimeGetVersion() -> tuple[Any, ...]:
    """(err, version): the HIP version whose API the facade follows."""
    session.gpu()
    return hipSuccess, HIP_CONSTANTS.get("HIP_VERSION", 0)


# --- errors ------------------------------------------------------------------------------

_DESCRIPTIONS = {
    0: "no error",
    1: "invalid argument",
    2: "out of memory",
    3: "initialization error",
    100: "no ROCm-capable device is detected",
    101: "invalid device ordinal",
    200: "device kernel image is invalid",
    300: "device kernel source is invalid",
    400: "invalid resource handle",
    500: "named symbol not found",
    600: "device not ready",
    700: "an illegal memory access was encountered",
    719: "unspecified launch failure",
    801: "operation not supported",
    999: "unknown error",
}


@_api
def hipGetErrorName(hip_error: Any) -> tuple[Any, ...]:
    """(hipSuccess, the error's name as bytes)."""
    code = int(hip_error)
    try:
        return hipSuccess, hipError_t(code).name.encode()
    except ValueError:
        return hipSuccess, error_name(code).encode()


@_api
def hipGetErrorString(hipError: Any) -> tuple[Any, ...]:
    """(hipSuccess, a description of the error as bytes)."""
    code = int(hipError)
    text = _DESCRIPTIONS.get(code)
    if text is None:
        try:
            text = hipError_t(code).name
        except ValueError:
            text = "unknown error"
    return hipSuccess, text.encode()


@_api
def hipGetLastError() -> tuple[Any, ...]:
    """(the last error of this thread's calls,), which is then reset to hipSuccess."""
    code, _ = session.peek_last_error()
    session.clear_last_error()
    return (hipSuccess if code is None else code,)


@_api
def hipPeekAtLastError() -> tuple[Any, ...]:
    """(the last error of this thread's calls,), left as it is."""
    code, _ = session.peek_last_error()
    return (hipSuccess if code is None else code,)


# --- memory ------------------------------------------------------------------------------


@_api
def hipMalloc(size: int) -> tuple[Any, ...]:
    """(err, DeviceArray of ``size`` bytes); size 0 gives the null pointer, as HIP."""
    size = _check_size(size)
    if size == 0:
        return hipSuccess, DeviceArray(0, 0)
    ptr = session.gpu().malloc(size)
    return hipSuccess, DeviceArray(int(ptr), size)


@_api
def hipFree(ptr: Any) -> tuple[Any, ...]:
    """Free an allocation; the null pointer is a no-op."""
    address = address_of(ptr)
    if address:
        session.gpu().free(address)
    return (hipSuccess,)


@_api
def hipMemcpy(dst: Any, src: Any, sizeBytes: int, kind: Any) -> tuple[Any, ...]:
    """Copy ``sizeBytes`` in the direction ``kind`` (``hipMemcpyDefault`` infers it);
    device-to-host fills the caller's buffer in place."""
    _copy(dst, src, sizeBytes, kind, None, asynchronous=False)
    return (hipSuccess,)


@_api
def hipMemcpyWithStream(
    dst: Any, src: Any, sizeBytes: int, kind: Any, stream: Any
) -> tuple[Any, ...]:
    """hipMemcpy ordered on ``stream``, complete on return."""
    _copy(dst, src, sizeBytes, kind, stream, asynchronous=False)
    if _stream(stream) is not None:
        _stream(stream).synchronize()
    return (hipSuccess,)


@_api
def hipMemcpyAsync(dst: Any, src: Any, sizeBytes: int, kind: Any, stream: Any) -> tuple[Any, ...]:
    """Copy on ``stream``. A host source may be reused at once (its bytes are sent before
    this returns); a device-to-host copy has filled its destination when this returns."""
    _copy(dst, src, sizeBytes, kind, stream, asynchronous=True)
    return (hipSuccess,)


@_api
def hipMemcpyHtoD(dst: Any, src: Any, sizeBytes: int) -> tuple[Any, ...]:
    """Host to device."""
    _htod(dst, src, _check_size(sizeBytes), None, asynchronous=False)
    return (hipSuccess,)


@_api
def hipMemcpyDtoH(dst: Any, src: Any, sizeBytes: int) -> tuple[Any, ...]:
    """Device to host, into ``dst`` in place."""
    _dtoh(dst, src, _check_size(sizeBytes), None)
    return (hipSuccess,)


@_api
def hipMemcpyDtoD(dst: Any, src: Any, sizeBytes: int) -> tuple[Any, ...]:
    """Device to device."""
    _dtod(dst, src, _check_size(sizeBytes), None)
    return (hipSuccess,)


@_api
def hipMemcpyHtoDAsync(dst: Any, src: Any, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """Host to device on ``stream``."""
    _htod(dst, src, _check_size(sizeBytes), stream, asynchronous=True)
    return (hipSuccess,)


@_api
def hipMemcpyDtoHAsync(dst: Any, src: Any, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """Device to host on ``stream``, into ``dst`` in place."""
    _dtoh(dst, src, _check_size(sizeBytes), stream)
    return (hipSuccess,)


@_api
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
        gpu.memset(address_of(dst), raw[0], count * width, stream=_stream(stream))
    else:
        # No wide fill on the wire: the pattern travels as data.
        data = np.full(count, pattern, dtype=np.dtype(dtype).newbyteorder("<")).data
        if stream is None:
            gpu.memcpy_htod(address_of(dst), data)
        else:
            gpu.memcpy_htod_async(address_of(dst), data, stream=_stream(stream))


@_api
def hipMemset(dst: Any, value: int, sizeBytes: int) -> tuple[Any, ...]:
    """Set ``sizeBytes`` bytes to the low byte of ``value``."""
    _memset(dst, value, sizeBytes, np.uint8, None)
    return (hipSuccess,)


@_api
def hipMemsetAsync(dst: Any, value: int, sizeBytes: int, stream: Any) -> tuple[Any, ...]:
    """hipMemset on ``stream``."""
    _memset(dst, value, sizeBytes, np.uint8, stream)
    return (hipSuccess,)


@_api
def hipMemsetD8(dest: Any, value: int, count: int) -> tuple[Any, ...]:
    """Set ``count`` bytes."""
    _memset(dest, value, count, np.uint8, None)
    return (hipSuccess,)


@_api
def hipMemsetD16(dest: Any, value: int, count: int) -> tuple[Any, ...]:
    """Set ``count`` 16-bit values."""
    _memset(dest, value, count, np.uint16, None)
    return (hipSuccess,)


@_api
def hipMemsetD32(dest: Any, value: int, count: int) -> tuple[Any, ...]:
    """Set ``count`` 32-bit values."""
    _memset(dest, value, count, np.uint32, None)
    return (hipSuccess,)


@_api
def hipMemsetD8Async(dest: Any, value: int, count: int, stream: Any) -> tuple[Any, ...]:
    """hipMemsetD8 on ``stream``."""
    _memset(dest, value, count, np.uint8, stream)
    return (hipSuccess,)


@_api
def hipMemsetD16Async(dest: Any, value: int, count: int, stream: Any) -> tuple[Any, ...]:
    """hipMemsetD16 on ``stream``."""
    _memset(dest, value, count, np.uint16, stream)
    return (hipSuccess,)


@_api
def hipMemsetD32Async(dst: Any, value: int, count: int, stream: Any) -> tuple[Any, ...]:
    """hipMemsetD32 on ``stream``."""
    _memset(dst, value, count, np.uint32, stream)
    return (hipSuccess,)


# --- streams -----------------------------------------------------------------------------

_capturing: set[int] = set()


@_api
def hipStreamCreate() -> tuple[Any, ...]:
    """(err, stream)."""
    return hipSuccess, ihipStream_t(session.gpu().stream_create())


@_api
def hipStreamCreateWithFlags(flags: int) -> tuple[Any, ...]:
    """(err, stream); flags are accepted and do not change hipr's streams."""
    return hipSuccess, ihipStream_t(session.gpu().stream_create())


@_api
def hipStreamCreateWithPriority(flags: int, priority: int) -> tuple[Any, ...]:
    """(err, stream); flags and priority are accepted and do not change hipr's streams."""
    return hipSuccess, ihipStream_t(session.gpu().stream_create())


@_api
def hipStreamDestroy(stream: Any) -> tuple[Any, ...]:
    """Destroy a stream (its queued work still completes)."""
    handle = _stream(stream)
    if handle is None:
        raise HipError(HipErrorCode.hipErrorInvalidHandle, "the default stream is not destroyed")
    _capturing.discard(id(handle))
    handle.destroy()
    return (hipSuccess,)


@_api
def hipStreamSynchronize(stream: Any) -> tuple[Any, ...]:
    """Wait for the stream's work (the default stream: all work)."""
    handle = _stream(stream)
    if handle is None:
        session.gpu().synchronize()
    else:
        handle.synchronize()
    return (hipSuccess,)


@_api
def hipStreamQuery(stream: Any) -> tuple[Any, ...]:
    """(hipSuccess,) when the stream is idle, else (hipErrorNotReady,). The default stream
    has no query on the wire: it is synchronized, then reported idle."""
    handle = _stream(stream)
    if handle is None:
        session.gpu().synchronize()
        return (hipSuccess,)
    return (hipSuccess if handle.query() else hipError_t.hipErrorNotReady,)


@_api
def hipStreamWaitEvent(stream: Any, event: Any, flags: int = 0) -> tuple[Any, ...]:
    """Later work on ``stream`` waits for ``event`` (the default stream: the host waits)."""
    handle = _stream(stream)
    ev = _unbox(event, ihipEvent_t, "event (ihipEvent_t)")
    if handle is None:
        ev.synchronize()
    else:
        handle.wait_event(ev)
    return (hipSuccess,)


@_api
def hipStreamBeginCapture(stream: Any, mode: Any = 0) -> tuple[Any, ...]:
    """Capture the stream's work into a graph instead of running it."""
    handle = _stream(stream)
    if handle is None:
        raise HipError(HipErrorCode.hipErrorStreamCaptureUnsupported, "the default stream")
    handle.begin_capture()
    _capturing.add(id(handle))
    return (hipSuccess,)


@_api
def hipStreamEndCapture(stream: Any) -> tuple[Any, ...]:
    """(err, graph) captured since hipStreamBeginCapture."""
    handle = _stream(stream)
    if handle is None:
        raise HipError(HipErrorCode.hipErrorIllegalState, "the default stream is not capturing")
    _capturing.discard(id(handle))
    return hipSuccess, ihipGraph(handle.end_capture())


@_api
def hipStreamIsCapturing(stream: Any) -> tuple[Any, ...]:
    """(err, hipStreamCaptureStatus) of captures begun through the facade."""
    handle = _stream(stream)
    active = handle is not None and id(handle) in _capturing
    status = (
        hipStreamCaptureStatus.hipStreamCaptureStatusActive
        if active
        else hipStreamCaptureStatus.hipStreamCaptureStatusNone
    )
    return hipSuccess, status


# --- events ------------------------------------------------------------------------------


@_api
def hipEventCreate() -> tuple[Any, ...]:
    """(err, event) with timing."""
    return hipSuccess, ihipEvent_t(session.gpu().event_create())


@_api
def hipEventCreateWithFlags(flags: int) -> tuple[Any, ...]:
    """(err, event); flags are accepted, events always time."""
    return hipSuccess, ihipEvent_t(session.gpu().event_create())


@_api
def hipEventDestroy(event: Any) -> tuple[Any, ...]:
    """Destroy an event."""
    _unbox(event, ihipEvent_t, "event (ihipEvent_t)").destroy()
    return (hipSuccess,)


@_api
def hipEventRecord(event: Any, stream: Any = None) -> tuple[Any, ...]:
    """Record ``event`` on ``stream`` (default: the default stream)."""
    _unbox(event, ihipEvent_t, "event (ihipEvent_t)").record(_stream(stream))
    return (hipSuccess,)


@_api
def hipEventSynchronize(event: Any) -> tuple[Any, ...]:
    """Wait for the event."""
    _unbox(event, ihipEvent_t, "event (ihipEvent_t)").synchronize()
    return (hipSuccess,)


@_api
def hipEventQuery(event: Any) -> tuple[Any, ...]:
    """(hipSuccess,) once the event completed, else (hipErrorNotReady,)."""
    done = _unbox(event, ihipEvent_t, "event (ihipEvent_t)").query()
    return (hipSuccess if done else hipError_t.hipErrorNotReady,)


@_api
def hipEventElapsedTime(start: Any, stop: Any) -> tuple[Any, ...]:
    """(err, milliseconds from ``start`` to ``stop``)."""
    a = _unbox(start, ihipEvent_t, "event (ihipEvent_t)")
    b = _unbox(stop, ihipEvent_t, "event (ihipEvent_t)")
    return hipSuccess, session.gpu().event_elapsed_ms(a, b)


# --- modules and kernels -----------------------------------------------------------------


def _image_bytes(image: Any) -> bytes:
    if isinstance(image, bytes):
        return image
    code = getattr(image, "code", None)  # a hiprtc program's code, passed as it is
    if isinstance(code, bytes):
        return code
    return bytes(memoryview(image).cast("B"))


@_api
def hipModuleLoadData(image: Any) -> tuple[Any, ...]:
    """(err, module) from a code object (``hiprtcGetCode``'s bytes, a CUBIN/PTX, an HSACO)."""
    return hipSuccess, ihipModule_t(session.gpu().module_load(_image_bytes(image)))


@_api
def hipModuleLoadDataEx(
    image: Any, numOptions: int = 0, optionValues: Any = None
) -> tuple[Any, ...]:
    """As hipModuleLoadData; JIT options are not forwarded (the third result is None)."""
    return hipSuccess, ihipModule_t(session.gpu().module_load(_image_bytes(image))), None


@_api
def hipModuleGetFunction(module: Any, kname: Any) -> tuple[Any, ...]:
    """(err, kernel) named ``kname`` (bytes or str) in ``module``."""
    name = kname.decode() if isinstance(kname, bytes | bytearray) else str(kname)
    handle = _unbox(module, ihipModule_t, "module (ihipModule_t)")
    return hipSuccess, ihipModuleSymbol_t(handle.function(name))


@_api
def hipModuleUnload(module: Any) -> tuple[Any, ...]:
    """Unload a module; its kernels become invalid."""
    _unbox(module, ihipModule_t, "module (ihipModule_t)").unload()
    return (hipSuccess,)


@_api
def hipModuleLaunchKernel(
    f: Any,
    gridDimX: int,
    gridDimY: int,
    gridDimZ: int,
    blockDimX: int,
    blockDimY: int,
    blockDimZ: int,
    sharedMemBytes: int = 0,
    stream: Any = None,
    kernelParams: Any = None,
    extra: Any = None,
) -> tuple[Any, ...]:
    """Launch ``f`` (asynchronous: a fault surfaces at a later synchronising call).
    Arguments come in ``extra`` (a tuple of ctypes values and device pointers, or the
    ``HIP_LAUNCH_PARAM_*`` form) or ``kernelParams`` (ctypes objects); see
    :mod:`hipr.facade.launch`."""
    function = _unbox(f, ihipModuleSymbol_t, "kernel (ihipModuleSymbol_t)")
    args = kernel_args(kernelParams, extra)
    function.launch(
        (int(gridDimX), int(gridDimY), int(gridDimZ)),
        (int(blockDimX), int(blockDimY), int(blockDimZ)),
        args,
        int(sharedMemBytes or 0),
        _stream(stream),
    )
    return (hipSuccess,)


# --- graphs ------------------------------------------------------------------------------


@_api
def hipGraphCreate(flags: int = 0) -> tuple[Any, ...]:
    """(err, empty graph)."""
    return hipSuccess, ihipGraph(session.gpu().graph_create())


@_api
def hipGraphInstantiate(graph: Any, bufferSize: int = 0) -> tuple[Any, ...]:
    """(err, executable graph, error node, log): the last two are None and b""."""
    handle = _unbox(graph, ihipGraph, "graph (ihipGraph)")
    return hipSuccess, hipGraphExec(handle.instantiate()), None, b""


@_api
def hipGraphInstantiateWithFlags(graph: Any, flags: int = 0) -> tuple[Any, ...]:
    """(err, executable graph)."""
    handle = _unbox(graph, ihipGraph, "graph (ihipGraph)")
    return hipSuccess, hipGraphExec(handle.instantiate())


@_api
def hipGraphLaunch(graphExec: Any, stream: Any = None) -> tuple[Any, ...]:
    """Launch an executable graph on ``stream``."""
    _unbox(graphExec, hipGraphExec, "executable graph (hipGraphExec)").launch(_stream(stream))
    return (hipSuccess,)


@_api
def hipGraphDestroy(graph: Any) -> tuple[Any, ...]:
    """Destroy a graph (its instantiations live on)."""
    _unbox(graph, ihipGraph, "graph (ihipGraph)").destroy()
    return (hipSuccess,)


@_api
def hipGraphExecDestroy(graphExec: Any) -> tuple[Any, ...]:
    """Destroy an executable graph."""
    _unbox(graphExec, hipGraphExec, "executable graph (hipGraphExec)").destroy()
    return (hipSuccess,)
