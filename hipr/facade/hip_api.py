"""hip-python's ``hip`` functions over hipr's client (``hipr.hip`` re-exports them).

Each returns hip-python's tuple: the ``hipError_t`` first, then the results, ``(err,)``
when there are none; results hip-python writes into a caller's object (device
properties, device-to-host copies) are written there. :data:`HIP_API` is what is served;
:mod:`hipr.facade.hip_names` answers the rest of hip-python's names.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HIP_API",
    "hipGraphExec",
    "ihipEvent_t",
    "ihipGraph",
    "ihipModuleSymbol_t",
    "ihipModule_t",
    "ihipStream_t",
]


from hipr.errors import HipError, HipErrorCode, error_name, invalid_value
from hipr.facade import (
    hip_memory,  # noqa: F401  (registers the memory functions)
    session,
)
from hipr.facade.catalog import HIP_CONSTANTS
from hipr.facade.enums import (
    hipDeviceAttribute_t,
    hipError_t,
    hipStreamCaptureStatus,
    hipSuccess,
)
from hipr.facade.hip_handles import (
    hipGraphExec,
    ihipEvent_t,
    ihipGraph,
    ihipModule_t,
    ihipModuleSymbol_t,
    ihipStream_t,
    unbox,
    unbox_stream,
)
from hipr.facade.hip_registry import HIP_API, served
from hipr.facade.launch import kernel_args
from hipr.facade.props import attribute_value, fill, hipDeviceProp_t

# --- devices -----------------------------------------------------------------------------


@served
def hipInit(flags: int = 0) -> tuple[Any, ...]:
    """Connect the facade's session (done by any first call anyway)."""
    session.gpu()
    return (hipSuccess,)


@served
def hipGetDeviceCount() -> tuple[Any, ...]:
    """(err, count) of the worker's visible devices."""
    return hipSuccess, session.gpu().device_count()


@served
def hipSetDevice(deviceId: int) -> tuple[Any, ...]:
    """Make ``deviceId`` current for the session."""
    session.gpu().set_device(int(deviceId))
    return (hipSuccess,)


@served
def hipGetDevice() -> tuple[Any, ...]:
    """(err, device) current for the session."""
    return hipSuccess, session.gpu().get_device()


@served
def hipDeviceGet(ordinal: int) -> tuple[Any, ...]:
    """(err, device) for ``ordinal``: the ordinal itself, once checked."""
    count = session.gpu().device_count()
    if not 0 <= int(ordinal) < count:
        raise HipError(HipErrorCode.hipErrorInvalidDevice, f"device {ordinal} of {count}")
    return hipSuccess, int(ordinal)


@served
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


@served
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


@served
def hipDeviceGetName(len: int, device: int) -> tuple[Any, ...]:
    """(err, name as bytes of at most ``len - 1`` characters)."""
    name = session.gpu().device_properties(int(device)).name.encode()
    return hipSuccess, name[: max(0, int(len) - 1)]


@served
def hipDeviceComputeCapability(device: int) -> tuple[Any, ...]:
    """(err, major, minor)."""
    props = session.gpu().device_properties(int(device))
    return hipSuccess, props.major, props.minor


@served
def hipDeviceTotalMem(device: int) -> tuple[Any, ...]:
    """(err, bytes of device memory)."""
    return hipSuccess, session.gpu().device_properties(int(device)).total_memory


@served
def hipDeviceGetPCIBusId(len: int, device: int) -> tuple[Any, ...]:
    """(err, PCI bus id as bytes, ``"0000:65:00.0"``)."""
    bus = session.gpu().device_properties(int(device)).pci_bus_id.encode()
    return hipSuccess, bus[: max(0, int(len) - 1)]


@served
def hipDeviceSynchronize() -> tuple[Any, ...]:
    """Wait for all work of the current device; reports asynchronous errors."""
    session.gpu().synchronize()
    return (hipSuccess,)


@served
def hipCtxSynchronize() -> tuple[Any, ...]:
    """As hipDeviceSynchronize (the session is the context)."""
    session.gpu().synchronize()
    return (hipSuccess,)


@served
def hipMemGetInfo() -> tuple[Any, ...]:
    """(err, free, total) bytes of the current device."""
    free, total = session.gpu().mem_get_info()
    return hipSuccess, free, total


@served
def hipDriverGetVersion() -> tuple[Any, ...]:
    """(err, version): the HIP version whose API the facade follows."""
    session.gpu()
    return hipSuccess, HIP_CONSTANTS.get("HIP_VERSION", 0)


@served
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


@served
def hipGetErrorName(hip_error: Any) -> tuple[Any, ...]:
    """(hipSuccess, the error's name as bytes)."""
    code = int(hip_error)
    try:
        return hipSuccess, hipError_t(code).name.encode()
    except ValueError:
        return hipSuccess, error_name(code).encode()


@served
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


@served
def hipGetLastError() -> tuple[Any, ...]:
    """(the last error of this thread's calls,), which is then reset to hipSuccess."""
    code, _ = session.peek_last_error()
    session.clear_last_error()
    return (hipSuccess if code is None else code,)


@served
def hipPeekAtLastError() -> tuple[Any, ...]:
    """(the last error of this thread's calls,), left as it is."""
    code, _ = session.peek_last_error()
    return (hipSuccess if code is None else code,)


# --- streams -----------------------------------------------------------------------------

_capturing: set[int] = set()


@served
def hipStreamCreate() -> tuple[Any, ...]:
    """(err, stream)."""
    return hipSuccess, ihipStream_t(session.gpu().stream_create())


@served
def hipStreamCreateWithFlags(flags: int) -> tuple[Any, ...]:
    """(err, stream); flags are accepted and do not change hipr's streams."""
    return hipSuccess, ihipStream_t(session.gpu().stream_create())


@served
def hipStreamCreateWithPriority(flags: int, priority: int) -> tuple[Any, ...]:
    """(err, stream); flags and priority are accepted and do not change hipr's streams."""
    return hipSuccess, ihipStream_t(session.gpu().stream_create())


@served
def hipStreamDestroy(stream: Any) -> tuple[Any, ...]:
    """Destroy a stream (its queued work still completes)."""
    handle = unbox_stream(stream)
    if handle is None:
        raise HipError(HipErrorCode.hipErrorInvalidHandle, "the default stream is not destroyed")
    _capturing.discard(id(handle))
    handle.destroy()
    return (hipSuccess,)


@served
def hipStreamSynchronize(stream: Any) -> tuple[Any, ...]:
    """Wait for the stream's work (the default stream: all work)."""
    handle = unbox_stream(stream)
    if handle is None:
        session.gpu().synchronize()
    else:
        handle.synchronize()
    return (hipSuccess,)


@served
def hipStreamQuery(stream: Any) -> tuple[Any, ...]:
    """(hipSuccess,) when the stream is idle, else (hipErrorNotReady,). The default stream
    has no query on the wire: it is synchronized, then reported idle."""
    handle = unbox_stream(stream)
    if handle is None:
        session.gpu().synchronize()
        return (hipSuccess,)
    return (hipSuccess if handle.query() else hipError_t.hipErrorNotReady,)


@served
def hipStreamWaitEvent(stream: Any, event: Any, flags: int = 0) -> tuple[Any, ...]:
    """Later work on ``stream`` waits for ``event`` (the default stream: the host waits)."""
    handle = unbox_stream(stream)
    ev = unbox(event, ihipEvent_t, "event (ihipEvent_t)")
    if handle is None:
        ev.synchronize()
    else:
        handle.wait_event(ev)
    return (hipSuccess,)


@served
def hipStreamBeginCapture(stream: Any, mode: Any = 0) -> tuple[Any, ...]:
    """Capture the stream's work into a graph instead of running it."""
    handle = unbox_stream(stream)
    if handle is None:
        raise HipError(HipErrorCode.hipErrorStreamCaptureUnsupported, "the default stream")
    handle.begin_capture()
    _capturing.add(id(handle))
    return (hipSuccess,)


@served
def hipStreamEndCapture(stream: Any) -> tuple[Any, ...]:
    """(err, graph) captured since hipStreamBeginCapture."""
    handle = unbox_stream(stream)
    if handle is None:
        raise HipError(HipErrorCode.hipErrorIllegalState, "the default stream is not capturing")
    _capturing.discard(id(handle))
    return hipSuccess, ihipGraph(handle.end_capture())


@served
def hipStreamIsCapturing(stream: Any) -> tuple[Any, ...]:
    """(err, hipStreamCaptureStatus) of captures begun through the facade."""
    handle = unbox_stream(stream)
    active = handle is not None and id(handle) in _capturing
    status = (
        hipStreamCaptureStatus.hipStreamCaptureStatusActive
        if active
        else hipStreamCaptureStatus.hipStreamCaptureStatusNone
    )
    return hipSuccess, status


# --- events ------------------------------------------------------------------------------


@served
def hipEventCreate() -> tuple[Any, ...]:
    """(err, event) with timing."""
    return hipSuccess, ihipEvent_t(session.gpu().event_create())


@served
def hipEventCreateWithFlags(flags: int) -> tuple[Any, ...]:
    """(err, event); flags are accepted, events always time."""
    return hipSuccess, ihipEvent_t(session.gpu().event_create())


@served
def hipEventDestroy(event: Any) -> tuple[Any, ...]:
    """Destroy an event."""
    unbox(event, ihipEvent_t, "event (ihipEvent_t)").destroy()
    return (hipSuccess,)


@served
def hipEventRecord(event: Any, stream: Any = None) -> tuple[Any, ...]:
    """Record ``event`` on ``stream`` (default: the default stream)."""
    unbox(event, ihipEvent_t, "event (ihipEvent_t)").record(unbox_stream(stream))
    return (hipSuccess,)


@served
def hipEventSynchronize(event: Any) -> tuple[Any, ...]:
    """Wait for the event."""
    unbox(event, ihipEvent_t, "event (ihipEvent_t)").synchronize()
    return (hipSuccess,)


@served
def hipEventQuery(event: Any) -> tuple[Any, ...]:
    """(hipSuccess,) once the event completed, else (hipErrorNotReady,)."""
    done = unbox(event, ihipEvent_t, "event (ihipEvent_t)").query()
    return (hipSuccess if done else hipError_t.hipErrorNotReady,)


@served
def hipEventElapsedTime(start: Any, stop: Any) -> tuple[Any, ...]:
    """(err, milliseconds from ``start`` to ``stop``)."""
    a = unbox(start, ihipEvent_t, "event (ihipEvent_t)")
    b = unbox(stop, ihipEvent_t, "event (ihipEvent_t)")
    return hipSuccess, session.gpu().event_elapsed_ms(a, b)


# --- modules and kernels -----------------------------------------------------------------


def _image_bytes(image: Any) -> bytes:
    if isinstance(image, bytes):
        return image
    code = getattr(image, "code", None)  # a hiprtc program's code, passed as it is
    if isinstance(code, bytes):
        return code
    return bytes(memoryview(image).cast("B"))


@served
def hipModuleLoadData(image: Any) -> tuple[Any, ...]:
    """(err, module) from a code object (``hiprtcGetCode``'s bytes, a CUBIN/PTX, an HSACO)."""
    return hipSuccess, ihipModule_t(session.gpu().module_load(_image_bytes(image)))


@served
def hipModuleLoadDataEx(
    image: Any, numOptions: int = 0, optionValues: Any = None
) -> tuple[Any, ...]:
    """As hipModuleLoadData; JIT options are not forwarded (the third result is None)."""
    return hipSuccess, ihipModule_t(session.gpu().module_load(_image_bytes(image))), None


@served
def hipModuleGetFunction(module: Any, kname: Any) -> tuple[Any, ...]:
    """(err, kernel) named ``kname`` (bytes or str) in ``module``."""
    name = kname.decode() if isinstance(kname, bytes | bytearray) else str(kname)
    handle = unbox(module, ihipModule_t, "module (ihipModule_t)")
    return hipSuccess, ihipModuleSymbol_t(handle.function(name))


@served
def hipModuleUnload(module: Any) -> tuple[Any, ...]:
    """Unload a module; its kernels become invalid."""
    unbox(module, ihipModule_t, "module (ihipModule_t)").unload()
    return (hipSuccess,)


@served
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
    function = unbox(f, ihipModuleSymbol_t, "kernel (ihipModuleSymbol_t)")
    args = kernel_args(kernelParams, extra)
    function.launch(
        (int(gridDimX), int(gridDimY), int(gridDimZ)),
        (int(blockDimX), int(blockDimY), int(blockDimZ)),
        args,
        int(sharedMemBytes or 0),
        unbox_stream(stream),
    )
    return (hipSuccess,)


# --- graphs ------------------------------------------------------------------------------


@served
def hipGraphCreate(flags: int = 0) -> tuple[Any, ...]:
    """(err, empty graph)."""
    return hipSuccess, ihipGraph(session.gpu().graph_create())


@served
def hipGraphInstantiate(graph: Any, bufferSize: int = 0) -> tuple[Any, ...]:
    """(err, executable graph, error node, log): the last two are None and b""."""
    handle = unbox(graph, ihipGraph, "graph (ihipGraph)")
    return hipSuccess, hipGraphExec(handle.instantiate()), None, b""


@served
def hipGraphInstantiateWithFlags(graph: Any, flags: int = 0) -> tuple[Any, ...]:
    """(err, executable graph)."""
    handle = unbox(graph, ihipGraph, "graph (ihipGraph)")
    return hipSuccess, hipGraphExec(handle.instantiate())


@served
def hipGraphLaunch(graphExec: Any, stream: Any = None) -> tuple[Any, ...]:
    """Launch an executable graph on ``stream``."""
    unbox(graphExec, hipGraphExec, "executable graph (hipGraphExec)").launch(unbox_stream(stream))
    return (hipSuccess,)


@served
def hipGraphDestroy(graph: Any) -> tuple[Any, ...]:
    """Destroy a graph (its instantiations live on)."""
    unbox(graph, ihipGraph, "graph (ihipGraph)").destroy()
    return (hipSuccess,)


@served
def hipGraphExecDestroy(graphExec: Any) -> tuple[Any, ...]:
    """Destroy an executable graph."""
    unbox(graphExec, hipGraphExec, "executable graph (hipGraphExec)").destroy()
    return (hipSuccess,)
