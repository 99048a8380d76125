"""Device-code linking for PROGRAM_LINK: the driver's linker on cuda (cuLinkCreate,
cuLinkAddData, cuLinkComplete), hiprtc's on hip (hiprtcLinkCreate, ...). Each input is a
``(hiprtcJITInputType, code, name)``; the result is the loadable image and the linker's
information log."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

from hipr.backends._errmap import cu_result_name, rtc_error
from hipr.backends._image_kind import image_vendor
from hipr.errors import HipError, HipErrorCode

__all__ = ["HIPRTC_ERROR_LINKING", "cuda_input_kind", "cuda_link", "hip_link"]

#: hiprtcResult of a failed link.
HIPRTC_ERROR_LINKING = 100
#: hiprtcJITInputType / CUjitInputType values the two share.
_CUBIN, _PTX, _FATBINARY = 0, 1, 2
#: hiprtc's LLVM kinds: on NVIDIA hiprtc hands out a CUBIN or PTX where AMD gives bitcode.
_LLVM_KINDS = frozenset({100, 101, 102})
_LOG_BYTES = 1 << 16

Input = tuple[int, bytes, str]


def cuda_input_kind(kind: int, code: bytes) -> int:
    """The CUjitInputType for an input of hiprtcJITInputType ``kind``: the first six are
    numbered alike; an LLVM kind (a program written for AMD's hiprtc, whose
    ``hiprtcGetBitcode`` on NVIDIA gives the compiled code) is read from the code itself."""
    if kind not in _LLVM_KINDS:
        return kind
    head = bytes(code[:4])
    if head == b"\x7fELF":
        return _CUBIN
    if len(head) == 4 and struct.unpack("<I", head)[0] == 0xBA55ED50:
        return _FATBINARY
    if image_vendor(code) == "nvidia":
        return _PTX
    raise HipError(
        HipErrorCode.hipErrorInvalidValue,
        f"input of kind {kind} (LLVM bitcode) is not NVIDIA code: a cuda worker links "
        "CUBINs, PTX and fat binaries (compile with -fgpu-rdc on this worker)",
    )


def _text(buf: bytearray) -> str:
    return bytes(buf).split(b"\0", 1)[0].decode(errors="replace").strip()


def _cuda_create(api: Any) -> tuple[Any, bytearray | None, bytearray | None]:
    """cuLinkCreate with info and error log buffers; without them where the binding
    refuses the buffers (the link itself does not need them)."""
    info: bytearray | None = bytearray(_LOG_BYTES)
    errors: bytearray | None = bytearray(_LOG_BYTES)
    option = api.CUjit_option
    keys = [
        option.CU_JIT_INFO_LOG_BUFFER,
        option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        option.CU_JIT_ERROR_LOG_BUFFER,
        option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ]
    try:
        err, state = api.cuLinkCreate(len(keys), keys, [info, _LOG_BYTES, errors, _LOG_BYTES])
    except (TypeError, ValueError, RuntimeError, AttributeError):
        # A binding that takes no buffers for the log options: link without the logs.
        err, state = api.cuLinkCreate(0, [], [])
        info = errors = None
    if int(err):
        raise rtc_error(HIPRTC_ERROR_LINKING, f"cuLinkCreate ({cu_result_name(int(err))})")
    return state, info, errors


def cuda_link(api: Any, inputs: Sequence[Input]) -> tuple[bytes, str]:
    """Link with the driver's linker (cuda-bindings' ``driver`` as ``api``) for the
    current context."""
    state, info, errors = _cuda_create(api)

    def failed(call: str, err: int) -> HipError:
        log = _text(errors) if errors is not None else ""
        return rtc_error(HIPRTC_ERROR_LINKING, f"{call} ({cu_result_name(err)})", log)

    try:
        for kind, code, name in inputs:
            cu_kind = cuda_input_kind(kind, code)
            data = bytes(code)
            if cu_kind == _PTX and not data.endswith(b"\0"):
                data += b"\0"  # the driver reads PTX as a C string
            (err,) = api.cuLinkAddData(
                state, api.CUjitInputType(cu_kind), data, len(data), name.encode(), 0, [], []
            )
            if int(err):
                raise failed(f"cuLinkAddData of {name!r}", int(err))
        err, cubin, size = api.cuLinkComplete(state)
        if int(err):
            raise failed("cuLinkComplete", int(err))
        # The image lives in the link state: copy it out before the state goes.
        image = ctypes.string_at(int(cubin), int(size))
        return image, _text(info) if info is not None else ""
    finally:
        api.cuLinkDestroy(state)


def hip_link(rtc: Any, inputs: Sequence[Input]) -> tuple[bytes, str]:
    """Link with hiprtc's linker (hip-python's ``hiprtc`` as ``rtc``)."""

    def check(result: Any, call: str) -> Any:
        err = int(result[0])
        if err:
            raise rtc_error(err, call)
        return result[1:]

    (state,) = check(rtc.hiprtcLinkCreate(0, None, None), "hiprtcLinkCreate")
    try:
        for kind, code, name in inputs:
            data = bytes(code)
            check(
                rtc.hiprtcLinkAddData(
                    state,
                    rtc.hiprtcJITInputType(kind),
                    data,
                    len(data),
                    name.encode(),
                    0,
                    None,
                    None,
                ),
                f"hiprtcLinkAddData of {name!r}",
            )
        binary, size = check(rtc.hiprtcLinkComplete(state), "hiprtcLinkComplete")
        # The binary belongs to the link state: copy it out before the state goes.
        return ctypes.string_at(int(binary), int(size)), ""
    finally:
        rtc.hiprtcLinkDestroy(state)
