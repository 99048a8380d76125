"""Each served function against a worker, as hip-python documents it: the tuple shape,
the error enum, results written into the caller's objects."""

from __future__ import annotations

import array
import ctypes

import numpy as np
import pytest

from hipr import hip
from tests.facade.conftest import FacadeTarget, hip_check

pytestmark = pytest.mark.timeout(60)
OK = hip.hipError_t.hipSuccess
K = hip.hipMemcpyKind


def test_device_queries(facade: FacadeTarget) -> None:
    err, count = hip.hipGetDeviceCount()
    assert err is OK and isinstance(err, hip.hipError_t) and count >= 1
    assert hip.hipSetDevice(0) == (OK,)
    assert hip.hipGetDevice() == (OK, 0)
    props = hip.hipDeviceProp_t()
    assert hip.hipGetDeviceProperties(props, 0) == (OK,)
    assert props.name and props.gcnArchName and props.totalGlobalMem > 0
    assert props.warpSize in (32, 64) and props.maxThreadsPerBlock >= 256
    assert props.multiProcessorCount > 0 and props.clockRate > 0
    assert props.maxThreadsDim[0] >= 256 and props.maxGridSize[0] >= 65535
    assert props.sharedMemPerBlock > 0
    err, again = hip.hipGetDeviceProperties(0)
    assert err is OK and again.name == props.name
    A = hip.hipDeviceAttribute_t
    assert hip.hipDeviceGetAttribute(A.hipDeviceAttributeMaxBlockDimX, 0) == (
        OK,
        props.maxThreadsDim[0],
    )
    assert hip.hipDeviceGetAttribute(A.hipDeviceAttributeWarpSize, 0) == (OK, props.warpSize)
    assert hip.hipDeviceGetAttribute(A.hipDeviceAttributeMultiprocessorCount, 0)[1] == (
        props.multiProcessorCount
    )
    assert hip.hipDeviceGetAttribute(A.hipDeviceAttributeComputeCapabilityMajor, 0)[1] == (
        props.major
    )
    err, free, total = hip.hipMemGetInfo()
    assert err is OK and 0 < free <= total
    assert hip.hipDeviceTotalMem(0) == (OK, props.totalGlobalMem)
    assert hip.hipDeviceGetName(256, 0) == (OK, props.name.encode())
    assert hip.hipDeviceComputeCapability(0) == (OK, props.major, props.minor)
    err, version = hip.hipRuntimeGetVersion()
    assert err is OK and version > 0
    assert hip.hipDriverGetVersion()[0] is OK
    assert hip.hipDeviceSynchronize() == (OK,)


def test_invalid_device_is_an_enum_not_an_exception(facade: FacadeTarget) -> None:
    _err, count = hip.hipGetDeviceCount()
    assert hip.hipSetDevice(count + 5) == (hip.hipError_t.hipErrorInvalidDevice,)
    assert hip.hipGetDeviceProperties(count + 5) == (hip.hipError_t.hipErrorInvalidDevice, None)
    assert "device" in hip.last_error_message()
    assert hip.hipPeekAtLastError() == (hip.hipError_t.hipErrorInvalidDevice,)
    assert hip.hipGetLastError() == (hip.hipError_t.hipErrorInvalidDevice,)
    assert hip.hipGetLastError() == (OK,)


def test_malloc_returns_a_device_array(facade: FacadeTarget) -> None:
    err, ptr = hip.hipMalloc(4096)
    assert err is OK and int(ptr) != 0 and ptr.size == 4096 and ptr.itemsize == 1
    ptr.configure(typestr="float32", shape=(1024,))
    assert ptr.size == 1024 and ptr.itemsize == 4
    assert hip.hipFree(ptr) == (OK,)
    assert hip.hipMalloc(0)[1].is_ptr_null and hip.hipFree(None) == (OK,)
    huge = hip.hipMalloc(1 << 50)
    assert huge == (hip.hipError_t.hipErrorOutOfMemory, None)


@pytest.mark.parametrize("host", ["array", "numpy", "bytearray", "memoryview", "ctypes"])
def test_memcpy_round_trip_fills_the_callers_buffer(facade: FacadeTarget, host: str) -> None:
    n = 256
    values = np.arange(n, dtype=np.float32)
    out: object
    if host == "array":
        src, out = array.array("f", values), array.array("f", [0.0] * n)
    elif host == "numpy":
        src, out = values, np.zeros(n, np.float32)
    elif host == "bytearray":
        src, out = bytearray(values.tobytes()), bytearray(n * 4)
    elif host == "memoryview":
        src, out = memoryview(values.tobytes()), memoryview(bytearray(n * 4))
    else:
        src, out = (ctypes.c_float * n)(*values), (ctypes.c_float * n)()
    ptr = hip_check(hip.hipMalloc(n * 4))
    assert hip.hipMemcpy(ptr, src, n * 4, K.hipMemcpyHostToDevice) == (OK,)
    assert hip.hipMemcpy(out, ptr, n * 4, K.hipMemcpyDeviceToHost) == (OK,)
    assert bytes(memoryview(out).cast("B")) == values.tobytes()  # type: ignore[arg-type]
    hip_check(hip.hipFree(ptr))


def test_memcpy_kinds_default_and_explicit(facade: FacadeTarget) -> None:
    data = np.arange(64, dtype=np.int32)
    a = hip_check(hip.hipMalloc(data.nbytes))
    b = hip_check(hip.hipMalloc(data.nbytes))
    out = np.zeros_like(data)
    hip_check(hip.hipMemcpy(a, data, data.nbytes, K.hipMemcpyDefault))
    hip_check(hip.hipMemcpy(b, a, data.nbytes, K.hipMemcpyDefault))
    hip_check(hip.hipMemcpy(out, b, data.nbytes, K.hipMemcpyDefault))
    assert (out == data).all()
    host2 = np.zeros_like(data)
    hip_check(hip.hipMemcpy(host2, data, data.nbytes, K.hipMemcpyHostToHost))
    assert (host2 == data).all()
    hip_check(hip.hipMemcpyHtoD(a, data[::-1].copy(), data.nbytes))
    hip_check(hip.hipMemcpyDtoD(b, a, data.nbytes))
    hip_check(hip.hipMemcpyDtoH(out, b, data.nbytes))
    assert (out == data[::-1]).all()
    # A host address in this process works as in hip-python.
    hip_check(hip.hipMemcpyDtoH(host2.ctypes.data, a, data.nbytes))
    assert (host2 == data[::-1]).all()
    # Offsets into an allocation: slices and raw addresses.
    part = np.zeros(4, np.int32)
    a.configure(typestr="int32", shape=(64,))
    hip_check(hip.hipMemcpy(part, a[60:64], 16, K.hipMemcpyDeviceToHost))
    assert list(part) == [3, 2, 1, 0]
    hip_check(hip.hipMemcpy(part, int(a) + 4, 16, K.hipMemcpyDeviceToHost))
    assert list(part) == [62, 61, 60, 59]
    assert hip.hipMemcpy(out, a, data.nbytes, 77) == (
        hip.hipError_t.hipErrorInvalidMemcpyDirection,
    )
    assert hip.hipMemcpy(a, data, 1 << 20, K.hipMemcpyHostToDevice)[0] is not OK
    for p in (a, b):
        hip_check(hip.hipFree(p))


def test_memsets(facade: FacadeTarget) -> None:
    ptr = hip_check(hip.hipMalloc(64))
    out = bytearray(64)
    hip_check(hip.hipMemset(ptr, 0x1AB, 64))  # the low byte, as HIP
    hip_check(hip.hipMemcpyDtoH(out, ptr, 64))
    assert out == b"\xab" * 64
    hip_check(hip.hipMemsetD8(ptr, 7, 8))
    hip_check(hip.hipMemsetD16(ptr, 0x1234, 8))
    hip_check(hip.hipMemsetD32(int(ptr) + 16, 0xDEADBEEF, 4))
    hip_check(hip.hipMemcpyDtoH(out, ptr, 64))
    assert out[:16] == b"\x34\x12" * 8
    assert out[16:32] == (0xDEADBEEF).to_bytes(4, "little") * 4
    assert out[32:] == b"\xab" * 32
    stream = hip_check(hip.hipStreamCreate())
    hip_check(hip.hipMemsetAsync(ptr, 0, 64, stream))
    hip_check(hip.hipMemsetD32Async(ptr, 0x01010101, 2, stream))
    hip_check(hip.hipMemsetD16Async(int(ptr) + 8, 0xBEEF, 1, stream))
    hip_check(hip.hipMemsetD8Async(int(ptr) + 10, 0x55, 2, stream))
    hip_check(hip.hipStreamSynchronize(stream))
    hip_check(hip.hipMemcpyDtoH(out, ptr, 16))
    assert out[:16] == b"\x01" * 8 + b"\xef\xbe\x55\x55" + b"\0" * 4
    hip_check(hip.hipStreamDestroy(stream))
    hip_check(hip.hipFree(ptr))


def test_streams_and_events(facade: FacadeTarget) -> None:
    err, stream = hip.hipStreamCreate()
    assert err is OK and isinstance(stream, hip.ihipStream_t)
    s2 = hip_check(hip.hipStreamCreateWithFlags(hip.hipStreamNonBlocking))
    start, stop = hip_check(hip.hipEventCreate()), hip_check(hip.hipEventCreate())
    ptr = hip_check(hip.hipMalloc(1 << 16))
    data = np.ones(1 << 14, np.float32)
    out = np.zeros_like(data)
    assert hip.hipEventRecord(start, stream) == (OK,)
    hip_check(hip.hipMemcpyAsync(ptr, data, data.nbytes, K.hipMemcpyHostToDevice, stream))
    hip_check(hip.hipMemcpyHtoDAsync(ptr, data, data.nbytes, stream))
    assert hip.hipEventRecord(stop, stream) == (OK,)
    assert hip.hipStreamWaitEvent(s2, stop, 0) == (OK,)
    hip_check(hip.hipMemcpyDtoHAsync(out, ptr, data.nbytes, s2))
    hip_check(hip.hipMemcpyDtoDAsync(ptr, ptr, 0, s2))
    assert hip.hipStreamSynchronize(s2) == (OK,)
    assert hip.hipEventSynchronize(stop) == (OK,)
    assert hip.hipEventQuery(stop) == (OK,)
    assert hip.hipStreamQuery(stream) == (OK,)
    assert hip.hipStreamQuery(None) == (OK,)
    err, ms = hip.hipEventElapsedTime(start, stop)
    assert err is OK and ms >= 0.0
    assert (out == data).all()
    assert hip.hipStreamSynchronize(0) == (OK,)
    assert hip.hipEventRecord(start) == (OK,)
    for e in (start, stop):
        assert hip.hipEventDestroy(e) == (OK,)
    for s in (stream, s2):
        assert hip.hipStreamDestroy(s) == (OK,)
    assert hip.hipStreamSynchronize(object())[0] is hip.hipError_t.hipErrorInvalidHandle
    hip_check(hip.hipFree(ptr))


def test_graph_capture(facade: FacadeTarget) -> None:
    stream = hip_check(hip.hipStreamCreate())
    ptr = hip_check(hip.hipMalloc(64))
    hip_check(hip.hipMemset(ptr, 0, 64))
    assert hip.hipStreamBeginCapture(
        stream, hip.hipStreamCaptureMode.hipStreamCaptureModeGlobal
    ) == (OK,)
    assert hip.hipStreamIsCapturing(stream) == (
        OK,
        hip.hipStreamCaptureStatus.hipStreamCaptureStatusActive,
    )
    hip_check(hip.hipMemsetAsync(ptr, 9, 32, stream))
    err, graph = hip.hipStreamEndCapture(stream)
    assert err is OK and isinstance(graph, hip.ihipGraph)
    err, exec_, node, _log = hip.hipGraphInstantiate(graph, 0)
    assert err is OK and node is None
    assert hip.hipGraphLaunch(exec_, stream) == (OK,)
    hip_check(hip.hipStreamSynchronize(stream))
    out = bytearray(64)
    hip_check(hip.hipMemcpyDtoH(out, ptr, 64))
    assert out == b"\x09" * 32 + b"\0" * 32
    exec2 = hip_check(hip.hipGraphInstantiateWithFlags(graph, 0))
    for fn, obj in (
        (hip.hipGraphExecDestroy, exec_),
        (hip.hipGraphExecDestroy, exec2),
        (hip.hipGraphDestroy, graph),
        (hip.hipStreamDestroy, stream),
        (hip.hipFree, ptr),
    ):
        assert fn(obj) == (OK,)
    assert hip.hipStreamIsCapturing(None)[1] == (
        hip.hipStreamCaptureStatus.hipStreamCaptureStatusNone
    )


def test_module_errors_are_enums(facade: FacadeTarget) -> None:
    err, module = hip.hipModuleLoadData(b"not a code object")
    assert err is not OK and module is None
    assert hip.hipModuleGetFunction(object(), b"k")[0] is hip.hipError_t.hipErrorInvalidHandle
    assert hip.hipModuleLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, ())[0] is (
        hip.hipError_t.hipErrorInvalidHandle
    )
