"""The device linkers behind PROGRAM_LINK, driven through simulated bindings: what is
passed to cuLink*/hiprtcLink* and what comes back. A real cuda link is run on the GPU host
(docs/gpu-runs/2026-11-26-h200-proxy-front.txt); the hip one has had no AMD GPU yet."""

from __future__ import annotations

import ctypes
import enum
from typing import Any

import pytest

from hipr.backends._link import HIPRTC_ERROR_LINKING, cuda_input_kind, cuda_link, hip_link
from hipr.errors import HipError, HipErrorCode

_CUBIN = b"\x7fELF" + bytes(60)
_PTX = b"//\n.version 8.0\n.target sm_90\n"


class FakeDriver:
    """cuda-bindings' driver as far as linking goes; ``fail_at`` makes one call fail."""

    class CUjit_option(enum.IntEnum):
        CU_JIT_INFO_LOG_BUFFER = 3
        CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
        CU_JIT_ERROR_LOG_BUFFER = 5
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6

    CUjitInputType = int

    def __init__(self, fail_at: str = "") -> None:
        self.fail_at = fail_at
        self.added: list[tuple[int, bytes, bytes]] = []
        self.destroyed = False
        self.logs: list[Any] = []
        self._image = ctypes.create_string_buffer(b"LINKED", 6)

    def cuLinkCreate(self, n: int, keys: list[Any], values: list[Any]) -> tuple[int, str]:
        self.logs = values
        return 0, "state"

    def cuLinkAddData(
        self, state: str, kind: int, data: bytes, size: int, name: bytes, *rest: Any
    ) -> tuple[int]:
        assert state == "state" and size == len(data)
        self.added.append((kind, data, name))
        return (218 if self.fail_at == "add" else 0,)

    def cuLinkComplete(self, state: str) -> tuple[int, int, int]:
        if self.fail_at == "complete":
            self.logs[2][:18] = b"undefined: helper\0"
            return 218, 0, 0
        self.logs[0][:3] = b"ok\0"
        return 0, ctypes.addressof(self._image), 6

    def cuLinkDestroy(self, state: str) -> tuple[int]:
        self.destroyed = True
        return (0,)


def test_input_kinds_on_cuda() -> None:
    assert cuda_input_kind(1, _PTX) == 1 and cuda_input_kind(0, b"anything") == 0
    # hiprtc's LLVM kinds from a program written for AMD: the code says what it is.
    assert cuda_input_kind(100, _CUBIN) == 0
    assert cuda_input_kind(101, _PTX) == 1
    assert cuda_input_kind(100, b"\x50\xed\x55\xba" + bytes(12)) == 2
    with pytest.raises(HipError) as info:
        cuda_input_kind(100, b"BC\xc0\xde")  # real LLVM bitcode
    assert info.value.code == HipErrorCode.hipErrorInvalidValue


def test_cuda_link_passes_each_input_and_copies_the_image_out() -> None:
    driver = FakeDriver()
    image, log = cuda_link(driver, [(100, _CUBIN, "a"), (1, _PTX, "b.ptx")])
    assert image == b"LINKED" and log == "ok" and driver.destroyed
    assert driver.added == [(0, _CUBIN, b"a"), (1, _PTX + b"\0", b"b.ptx")]


@pytest.mark.parametrize("where", ["add", "complete"])
def test_a_failed_cuda_link_says_why_and_frees_the_state(where: str) -> None:
    driver = FakeDriver(fail_at=where)
    with pytest.raises(HipError) as info:
        cuda_link(driver, [(1, _PTX, "b.ptx")])
    assert info.value.details["rtc_result"] == HIPRTC_ERROR_LINKING
    assert info.value.code == HipErrorCode.hipErrorInvalidSource
    assert driver.destroyed
    if where == "complete":
        assert "undefined: helper" in info.value.message


class FakeHiprtc:
    """hip-python's hiprtc as far as linking goes."""

    hiprtcJITInputType = int

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.added: list[tuple[int, bytes, bytes]] = []
        self.destroyed = False
        self._image = ctypes.create_string_buffer(b"HSACO", 5)

    def hiprtcLinkCreate(self, n: int, keys: Any, values: Any) -> tuple[int, str]:
        return 0, "state"

    def hiprtcLinkAddData(
        self, state: str, kind: int, data: bytes, size: int, name: bytes, *rest: Any
    ) -> tuple[int]:
        self.added.append((kind, data, name))
        return (0,)

    def hiprtcLinkComplete(self, state: str) -> tuple[int, int, int]:
        if self.fail:
            return HIPRTC_ERROR_LINKING, 0, 0
        return 0, ctypes.addressof(self._image), 5

    def hiprtcLinkDestroy(self, state: str) -> tuple[int]:
        self.destroyed = True
        return (0,)


def test_hip_link_takes_bitcode_as_it_is() -> None:
    rtc = FakeHiprtc()
    assert hip_link(rtc, [(100, b"BC\xc0\xde", "a.bc")]) == (b"HSACO", "")
    assert rtc.added == [(100, b"BC\xc0\xde", b"a.bc")] and rtc.destroyed
    failing = FakeHiprtc(fail=True)
    with pytest.raises(HipError) as info:
        hip_link(failing, [(100, b"BC\xc0\xde", "a.bc")])
    assert info.value.details["rtc_result"] == HIPRTC_ERROR_LINKING and failing.destroyed


def test_hiprtc_relocatable_code_is_nvrtcs_rdc() -> None:
    from hipr.backends.cuda_backend import nvrtc_options

    assert nvrtc_options(["-fgpu-rdc"], "sm_90") == [
        "--gpu-architecture=sm_90",
        "--relocatable-device-code=true",
    ]
    assert nvrtc_options(["-fno-gpu-rdc"], "sm_90")[1] == "--relocatable-device-code=false"
