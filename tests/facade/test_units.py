"""Parts of the facade that need no worker: the device pointer, dim3, the property
struct, ``extra`` packing with C alignment, error names, unsupported names."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest

from hipr import HipError, hip, hiprtc
from hipr.facade.launch import kernel_args
from hipr.kernels.kernel_args import pack_args

pytestmark = pytest.mark.timeout(30)


def test_device_array_like_hip_pythons() -> None:
    p = hip.DeviceArray(0x1000, 64)
    assert int(p) == 0x1000 and p.size == 64 and p.itemsize == 1 and p.shape == (64,)
    assert p.configure(typestr="float32", shape=(16,)) is p
    assert (p.size, p.itemsize, p.typestr) == (16, 4, "float32")
    assert int(p[2]) == 0x1008 and p[2:6].shape == (4,) and int(p[2:6]) == 0x1008
    assert p.__cuda_array_interface__["data"] == (0x1000, False)
    with pytest.raises(HipError):
        p.configure(shape=(17,))
    p.configure(shape=(2, 8))
    assert p[1].shape == (8,) and int(p[1]) == 0x1000 + 32
    assert int(p + 4) == 0x1004 and (p + 4).nbytes == 60


def test_dim3_unpacks() -> None:
    block = hip.dim3(x=32)
    assert tuple(block) == (32, 1, 1)
    x, y, z = hip.dim3(4, 2)
    assert (x, y, z) == (4, 2, 1)


def test_device_prop_struct() -> None:
    props = hip.hipDeviceProp_t()
    assert "gcnArchName" in props.PROPERTIES() and props.maxThreadsDim == [0, 0, 0]
    assert props.name == "" and props.totalGlobalMem == 0
    with pytest.raises(AttributeError):
        props.notAField = 1  # type: ignore[attr-defined]


class _Struct(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int8), ("b", ctypes.c_double), ("c", ctypes.c_int16)]


def test_extra_packs_mixed_widths_with_c_alignment() -> None:
    """char, short, int, float, double, a struct and a pointer land where a C compiler puts
    the members of a struct with the same fields."""
    ptr = hip.DeviceArray(0x7000_0000_1000, 256)
    extra = (
        ctypes.c_char(b"x"),
        ctypes.c_short(-2),
        ctypes.c_int(7),
        ctypes.c_float(1.5),
        ctypes.c_double(2.25),
        _Struct(3, 4.5, -6),
        ptr,
        ctypes.c_uint8(9),
    )

    class Same(ctypes.Structure):
        _fields_ = [
            ("c", ctypes.c_char),
            ("s", ctypes.c_short),
            ("i", ctypes.c_int),
            ("f", ctypes.c_float),
            ("d", ctypes.c_double),
            ("st", _Struct),
            ("p", ctypes.c_uint64),
            ("u", ctypes.c_uint8),
        ]

    packed = pack_args(kernel_args(None, extra))
    want = Same(b"x", -2, 7, 1.5, 2.25, _Struct(3, 4.5, -6), 0x7000_0000_1000, 9)
    # The runtime takes the buffer without trailing padding.
    assert packed.data == bytes(want)[: Same.u.offset + 1]
    assert packed.pointer_offsets() == [Same.p.offset]


def test_extra_plain_int_and_none_are_pointers() -> None:
    packed = pack_args(kernel_args(None, (ctypes.c_int(1), 0x1234_5678, None)))
    assert packed.data[8:16] == (0x1234_5678).to_bytes(8, "little")
    assert packed.data[16:24] == bytes(8)
    assert packed.pointer_offsets() == [8, 16]


def test_extra_raw_launch_param_form() -> None:
    class Args(ctypes.Structure):
        _fields_ = [("n", ctypes.c_int), ("x", ctypes.c_double)]

    args = Args(5, 0.5)
    size = ctypes.c_size_t(ctypes.sizeof(args))
    extra = (
        hip.HIP_LAUNCH_PARAM_BUFFER_POINTER,
        args,
        hip.HIP_LAUNCH_PARAM_BUFFER_SIZE,
        ctypes.pointer(size),
        hip.HIP_LAUNCH_PARAM_END,
    )
    assert pack_args(kernel_args(None, extra)).data == bytes(args)
    by_address = (1, ctypes.addressof(args), 2, ctypes.sizeof(args), 3)
    assert pack_args(kernel_args(None, by_address)).data == bytes(args)


def test_kernel_params_of_ctypes_objects() -> None:
    a, b = ctypes.c_float(2.0), ctypes.c_int64(3)
    packed = pack_args(kernel_args([ctypes.pointer(a), b], None))
    assert packed.data == bytes(a) + bytes(4) + bytes(b)
    with pytest.raises(HipError) as info:
        kernel_args([ctypes.c_void_p(1234)], None)
    assert info.value.name == "hipErrorNotSupported"


def test_error_enum_members() -> None:
    err = hip.hipError_t.hipErrorNotSupported
    assert (err.name, err.value) == ("hipErrorNotSupported", 801)
    assert hip.hipError_t.hipSuccess == 0 and hip.hipError_t(0) is hip.hipError_t.hipSuccess
    assert hiprtc.hiprtcResult.HIPRTC_SUCCESS == hiprtc.HIPRTC_SUCCESS == 0
    assert hip.hipMemcpyKind.hipMemcpyDefault == 4
    assert hip.hipDeviceAttribute_t.hipDeviceAttributeMaxGridDimX.name.endswith("GridDimX")


def test_error_names_and_strings_need_no_worker() -> None:
    assert hip.hipGetErrorName(hip.hipError_t.hipErrorOutOfMemory) == (
        hip.hipError_t.hipSuccess,
        b"hipErrorOutOfMemory",
    )
    err, text = hip.hipGetErrorString(hip.hipError_t.hipErrorInvalidValue)
    assert err == hip.hipError_t.hipSuccess and text == b"invalid argument"
    assert hiprtc.hiprtcGetErrorString(hiprtc.hiprtcResult.HIPRTC_ERROR_COMPILATION) == (
        hiprtc.HIPRTC_SUCCESS,
        b"HIPRTC_ERROR_COMPILATION",
    )
    assert hiprtc.hiprtcVersion()[0] == hiprtc.HIPRTC_SUCCESS


def test_unsupported_function_keeps_its_tuple_shape_and_names_itself() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err, ptr = hip.hipExtMallocWithFlags(1024, 1)
        (err2,) = hip.hipDeviceReset()
        err3, lowered = hiprtc.hiprtcGetLoweredName(None, b"kernel<int>")
    assert err == err2 == hip.hipError_t.hipErrorNotSupported and ptr is None
    assert "hiprtcGetLoweredName" in hip.last_error_message()
    assert any("hipExtMallocWithFlags" in str(w.message) for w in caught)
    assert hip.hipPeekAtLastError() == (hip.hipError_t.hipErrorNotSupported,)
    assert hip.hipGetLastError() == (hip.hipError_t.hipErrorNotSupported,)
    assert hip.hipGetLastError() == (hip.hipError_t.hipSuccess,)
    assert "hipDeviceReset" not in hip.SUPPORTED and "hipMalloc" in hip.SUPPORTED
    assert "hiprtcCompileProgram" in hip.SUPPORTED
    assert err3 == hip.hipError_t.hipErrorNotSupported and lowered is None


def test_unsupported_struct_refuses_construction_and_unknown_names_raise() -> None:
    with pytest.raises(HipError) as info:
        hip.hipMemsetParams()
    assert info.value.name == "hipErrorNotSupported" and "hipMemsetParams" in str(info.value)
    with pytest.raises(AttributeError):
        hip.hipNoSuchFunction  # noqa: B018
    assert hip.hipStreamNonBlocking == 1 and hip.hipLimit_t.__name__ == "hipLimit_t"
    assert "hipMallocManaged" in dir(hip)


def test_numpy_scalars_pass_too() -> None:
    packed = pack_args(kernel_args(None, (np.float32(1.0), np.int64(2))))
    assert len(packed.data) == 16
