"""hiprtc's linking and bitcode through ``from hipr import hiprtc``, shaped as hip-python's:
``hiprtcLinkCreate`` -> (result, state), ``hiprtcLinkComplete`` -> (result, image, size).
On the emulator the facade tests' stand-in compiler and linker answer (the worker's
checks and the wire are real); on a GPU backend (HIPR_TEST_BACKEND=cuda) two ``-fgpu-rdc``
programs link for real and the result runs."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from hipr import hip, hiprtc
from tests.facade.conftest import FacadeTarget
from tests.proxy.link_program import APPLY, HELPER

pytestmark = pytest.mark.timeout(120)
R = hiprtc.hiprtcResult
BITCODE = hiprtc.hiprtcJITInputType.hipJitInputLLVMBitcode


def _ok(result: tuple[object, ...]) -> tuple[object, ...]:
    assert result[0] in (R.HIPRTC_SUCCESS, hip.hipError_t.hipSuccess), result
    return result[1:]


def _bitcode(source: bytes, headers: list[bytes], names: list[bytes]) -> bytearray:
    (prog,) = _ok(hiprtc.hiprtcCreateProgram(source, b"p.hip", len(headers), headers, names))
    _ok(hiprtc.hiprtcCompileProgram(prog, 1, [b"-fgpu-rdc"]))
    (size,) = _ok(hiprtc.hiprtcGetBitcodeSize(prog))
    code = bytearray(size)  # type: ignore[call-overload]
    _ok(hiprtc.hiprtcGetBitcode(prog, code))
    _ok(hiprtc.hiprtcDestroyProgram(prog.createRef()))  # type: ignore[attr-defined]
    return code


def test_two_programs_link_into_one_module(facade: FacadeTarget, tmp_path: Path) -> None:
    a = _bitcode(APPLY, [b"#define OFFSET 0.25f\n"], [b"offset.h"])
    b = _bitcode(HELPER, [], [])
    (link,) = _ok(hiprtc.hiprtcLinkCreate(0, None, None))
    _ok(hiprtc.hiprtcLinkAddData(link, BITCODE, a, len(a), b"apply", 0, None, None))
    path = tmp_path / "helper.bc"
    path.write_bytes(bytes(b))
    _ok(hiprtc.hiprtcLinkAddFile(link, BITCODE, str(path).encode(), 0, None, None))
    image, size = _ok(hiprtc.hiprtcLinkComplete(link))
    assert isinstance(image, bytes) and size == len(image) > 0
    (module,) = _ok(hip.hipModuleLoadData(image))
    if facade.is_gpu:
        (apply,) = _ok(hip.hipModuleGetFunction(module, b"apply"))
        x = np.array([1, 2, 3, 4], np.float32)
        (d,) = _ok(hip.hipMalloc(x.nbytes))
        _ok(hip.hipMemcpy(d, x, x.nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice))
        extra = (d, ctypes.c_ulonglong(4))
        _ok(hip.hipModuleLaunchKernel(apply, 1, 1, 1, 4, 1, 1, 0, None, None, extra))
        _ok(hip.hipMemcpy(x, d, x.nbytes, hip.hipMemcpyKind.hipMemcpyDeviceToHost))
        assert x.tolist() == [2.25, 4.25, 6.25, 8.25]
        _ok(hip.hipFree(d))
    _ok(hip.hipModuleUnload(module))
    _ok(hiprtc.hiprtcLinkDestroy(link))
    assert hiprtc.hiprtcLinkComplete(link)[0] == R.HIPRTC_ERROR_INVALID_INPUT


def test_bad_links_are_refused(facade: FacadeTarget) -> None:
    (link,) = _ok(hiprtc.hiprtcLinkCreate(0, None, None))
    assert hiprtc.hiprtcLinkComplete(link)[0] == R.HIPRTC_ERROR_INVALID_INPUT  # no inputs
    assert hiprtc.hiprtcLinkAddData(link, 7, b"abc", 3, b"x", 0, None, None)[0] == (
        R.HIPRTC_ERROR_INVALID_INPUT
    )
    assert hiprtc.hiprtcLinkAddData(link, BITCODE, b"abc", 9, b"x", 0, None, None)[0] == (
        R.HIPRTC_ERROR_INVALID_INPUT
    )
    assert hiprtc.hiprtcLinkAddFile(link, BITCODE, b"/no/such.bc", 0, None, None)[0] == (
        R.HIPRTC_ERROR_INVALID_INPUT
    )
    # Not code at all: the worker's linker refuses it, as a linker does.
    _ok(hiprtc.hiprtcLinkAddData(link, 1, b"not code", 8, b"junk", 0, None, None))
    assert hiprtc.hiprtcLinkComplete(link)[0] == R.HIPRTC_ERROR_LINKING
    _ok(hiprtc.hiprtcLinkDestroy(link))
    (prog,) = _ok(hiprtc.hiprtcCreateProgram(HELPER, b"p.hip", 0, [], []))
    assert hiprtc.hiprtcGetBitcodeSize(prog)[0] == R.HIPRTC_ERROR_INVALID_PROGRAM
