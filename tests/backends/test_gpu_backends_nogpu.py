"""The cuda and hip backends without a GPU.

Three layers: the error tables and small helpers directly; the real "library missing"
paths (there is no ROCm and no NVIDIA driver here); and both backends end to end on a
simulated runtime. The simulation stands in for hip-python and cuda-bindings: every call
a backend makes is checked against the real binding's signature (its docstring's first
line) before the simulated GPU runs it, so a renamed function or a missing argument
fails here rather than on the first real GPU. Stream work is queued and runs at the
next synchronising call, and captured work runs only when its graph is launched, so
staging and capture bugs show up as wrong bytes.
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import inspect
import re
import struct
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest
import structlog

from hipr.backends import BACKEND_NAMES, BackendUnavailable, load_backend
from hipr.backends._callmap import (
    ADAPTER_SHAPED_CALLS,
    CUDA_CALLS,
    DRIVER_CALLS,
    HIP_CALLS,
    HIPRTC_CALLS,
    NVRTC_CALLS,
    RTC_CALLS,
    DriverCalls,
    RtcCalls,
    RuntimeConstants,
    resolve_constants,
)
from hipr.backends._code_cache import CodeCache
from hipr.backends._errmap import (
    CU_RESULT_TO_HIP,
    CU_UNMAPPED_NAMES,
    HIP_EXTRA_NAMES,
    RTC_RESULT_TO_HIP,
    cu_error,
    cu_result_name,
    hip_code_for_cu,
    hip_code_for_rtc,
    hip_error_name,
    rtc_error,
)
from hipr.backends._launch_extra import LaunchExtra, ReusedLaunchExtra
from hipr.backends._launch_wait import LAUNCH_PROTOTYPE, QUERY_PROTOTYPE, entry_address
from hipr.backends._pinned import PinnedPayloads, PinnedStaging, host_address
from hipr.backends._runtime_cuda import CudaRuntime
from hipr.backends._runtime_hip import HipRuntime
from hipr.backends.cuda_backend import HIP_PRELUDE, PRELUDE_INCLUDE_NAMES, nvrtc_options
from hipr.backends.gpu import GpuBackend, Runtime
from hipr.backends.hip_backend import hiprtc_options
from hipr.backends.interface import Backend
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTIN_SOURCE, BUILTINS

E = HipErrorCode


def _have(package: str, module: str) -> bool:
    # hip-python's "hip.hip" is an attribute of the package, not an importable module;
    # cuda-bindings' "cuda.bindings.driver" is a submodule.
    try:
        importlib.import_module(f"{package}.{module}")
        return True
    except ImportError:
        pass
    try:
        getattr(importlib.import_module(package), module)
    except (ImportError, AttributeError):
        return False
    return True


HAVE_CUDA_BINDINGS = _have("cuda.bindings", "driver")
HAVE_HIP_PYTHON = _have("hip", "hip")
needs_cuda_bindings = pytest.mark.skipif(not HAVE_CUDA_BINDINGS, reason="cuda-bindings absent")
needs_hip_python = pytest.mark.skipif(not HAVE_HIP_PYTHON, reason="hip-python absent")


# === error tables ======================================================================

# HIP's translation, written out independently of errmap: (CUDA name, HIP name).
HIP_TRANSLATION = {
    "CUDA_SUCCESS": "hipSuccess",
    "CUDA_ERROR_OUT_OF_MEMORY": "hipErrorOutOfMemory",
    "CUDA_ERROR_INVALID_VALUE": "hipErrorInvalidValue",
    "CUDA_ERROR_INVALID_DEVICE": "hipErrorInvalidDevice",
    "CUDA_ERROR_DEINITIALIZED": "hipErrorDeinitialized",
    "CUDA_ERROR_NO_DEVICE": "hipErrorNoDevice",
    "CUDA_ERROR_INVALID_CONTEXT": "hipErrorInvalidContext",
    "CUDA_ERROR_NOT_INITIALIZED": "hipErrorNotInitialized",
    "CUDA_ERROR_INVALID_HANDLE": "hipErrorInvalidHandle",
    "CUDA_ERROR_MAP_FAILED": "hipErrorMapFailed",
    "CUDA_ERROR_PROFILER_DISABLED": "hipErrorProfilerDisabled",
    "CUDA_ERROR_PROFILER_NOT_INITIALIZED": "hipErrorProfilerNotInitialized",
    "CUDA_ERROR_PROFILER_ALREADY_STARTED": "hipErrorProfilerAlreadyStarted",
    "CUDA_ERROR_PROFILER_ALREADY_STOPPED": "hipErrorProfilerAlreadyStopped",
    "CUDA_ERROR_INVALID_IMAGE": "hipErrorInvalidImage",
    "CUDA_ERROR_CONTEXT_ALREADY_CURRENT": "hipErrorContextAlreadyCurrent",
    "CUDA_ERROR_UNMAP_FAILED": "hipErrorUnmapFailed",
    "CUDA_ERROR_ARRAY_IS_MAPPED": "hipErrorArrayIsMapped",
    "CUDA_ERROR_ALREADY_MAPPED": "hipErrorAlreadyMapped",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "hipErrorNoBinaryForGpu",
    "CUDA_ERROR_ALREADY_ACQUIRED": "hipErrorAlreadyAcquired",
    "CUDA_ERROR_NOT_MAPPED": "hipErrorNotMapped",
    "CUDA_ERROR_NOT_MAPPED_AS_ARRAY": "hipErrorNotMappedAsArray",
    "CUDA_ERROR_NOT_MAPPED_AS_POINTER": "hipErrorNotMappedAsPointer",
    "CUDA_ERROR_ECC_UNCORRECTABLE": "hipErrorECCNotCorrectable",
    "CUDA_ERROR_UNSUPPORTED_LIMIT": "hipErrorUnsupportedLimit",
    "CUDA_ERROR_CONTEXT_ALREADY_IN_USE": "hipErrorContextAlreadyInUse",
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": "hipErrorPeerAccessUnsupported",
    "CUDA_ERROR_INVALID_PTX": "hipErrorInvalidKernelFile",
    "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT": "hipErrorInvalidGraphicsContext",
    "CUDA_ERROR_INVALID_SOURCE": "hipErrorInvalidSource",
    "CUDA_ERROR_FILE_NOT_FOUND": "hipErrorFileNotFound",
    "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND": "hipErrorSharedObjectSymbolNotFound",
    "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED": "hipErrorSharedObjectInitFailed",
    "CUDA_ERROR_OPERATING_SYSTEM": "hipErrorOperatingSystem",
    "CUDA_ERROR_ILLEGAL_STATE": "hipErrorIllegalState",
    "CUDA_ERROR_NOT_FOUND": "hipErrorNotFound",
    "CUDA_ERROR_NOT_READY": "hipErrorNotReady",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "hipErrorIllegalAddress",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "hipErrorLaunchOutOfResources",
    "CUDA_ERROR_LAUNCH_TIMEOUT": "hipErrorLaunchTimeOut",
    "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED": "hipErrorPeerAccessAlreadyEnabled",
    "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED": "hipErrorPeerAccessNotEnabled",
    "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE": "hipErrorSetOnActiveProcess",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED": "hipErrorContextIsDestroyed",
    "CUDA_ERROR_ASSERT": "hipErrorAssert",
    "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED": "hipErrorHostMemoryAlreadyRegistered",
    "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED": "hipErrorHostMemoryNotRegistered",
    "CUDA_ERROR_LAUNCH_FAILED": "hipErrorLaunchFailure",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": "hipErrorCooperativeLaunchTooLarge",
    "CUDA_ERROR_NOT_SUPPORTED": "hipErrorNotSupported",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": "hipErrorStreamCaptureUnsupported",
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": "hipErrorStreamCaptureInvalidated",
    "CUDA_ERROR_STREAM_CAPTURE_MERGE": "hipErrorStreamCaptureMerge",
    "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED": "hipErrorStreamCaptureUnmatched",
    "CUDA_ERROR_STREAM_CAPTURE_UNJOINED": "hipErrorStreamCaptureUnjoined",
    "CUDA_ERROR_STREAM_CAPTURE_ISOLATION": "hipErrorStreamCaptureIsolation",
    "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT": "hipErrorStreamCaptureImplicit",
    "CUDA_ERROR_CAPTURED_EVENT": "hipErrorCapturedEvent",
    "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD": "hipErrorStreamCaptureWrongThread",
    "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE": "hipErrorGraphExecUpdateFailure",
    "CUDA_ERROR_UNKNOWN": "hipErrorUnknown",
}


def test_table_is_exactly_hips_translation() -> None:
    table = {row.cuda_name: hip_error_name(row.hip_code) for row in CU_RESULT_TO_HIP.values()}
    assert table == HIP_TRANSLATION


@pytest.mark.parametrize("cu_code", sorted(CU_RESULT_TO_HIP))
def test_every_entry(cu_code: int) -> None:
    row = CU_RESULT_TO_HIP[cu_code]
    assert hip_code_for_cu(cu_code) == row.hip_code
    assert cu_result_name(cu_code) == row.cuda_name
    assert not hip_error_name(row.hip_code).startswith("hipErrorUnknown(")
    if cu_code:
        err = cu_error(cu_code, "cuSomething")
        assert err.code == row.hip_code
        assert row.cuda_name in err.message and "cuSomething" in err.message
        assert err.details["cuda_result"] == cu_code


@needs_cuda_bindings
def test_cuda_names_and_values_match_cuda_bindings() -> None:
    from cuda.bindings import driver

    for code, row in CU_RESULT_TO_HIP.items():
        assert int(getattr(driver.CUresult, row.cuda_name)) == code, row
    for code, name in CU_UNMAPPED_NAMES.items():
        assert int(getattr(driver.CUresult, name)) == code, name
    # Whatever else the bindings know (newer MPS, fabric, ... errors) HIP leaves unknown.
    known = set(CU_RESULT_TO_HIP) | set(CU_UNMAPPED_NAMES)
    for result in driver.CUresult:
        if int(result) not in known:
            assert hip_code_for_cu(int(result)) == E.hipErrorUnknown


@needs_hip_python
def test_hip_codes_match_hip_python() -> None:
    from hip import hip

    for row in CU_RESULT_TO_HIP.values():
        name = hip_error_name(row.hip_code)
        assert int(getattr(hip.hipError_t, name)) == row.hip_code, name
    for code, name in HIP_EXTRA_NAMES.items():
        assert int(getattr(hip.hipError_t, name)) == code


@pytest.mark.parametrize("code", [34, 46, 222, 715, 716, 800, 909, 12345, -1])
def test_unknown_and_untranslated_codes_become_hip_error_unknown(code: int) -> None:
    assert hip_code_for_cu(code) == E.hipErrorUnknown
    err = cu_error(code, "cuX")
    assert err.code == E.hipErrorUnknown
    assert cu_result_name(code) in err.message
    if code in CU_UNMAPPED_NAMES:
        assert CU_UNMAPPED_NAMES[code] in err.message
    else:
        assert f"CUresult({code})" in err.message


def test_extra_hip_names_show_in_messages() -> None:
    err = cu_error(5, "cuProfilerStart")
    assert err.code == 5 and "hipErrorProfilerDisabled" in err.message


def test_rtc_table() -> None:
    assert hip_code_for_rtc(6) == E.hipErrorInvalidSource  # COMPILATION
    assert hip_code_for_rtc(5) == E.hipErrorInvalidValue  # INVALID_OPTION
    assert hip_code_for_rtc(1) == E.hipErrorOutOfMemory
    assert hip_code_for_rtc(100) == E.hipErrorInvalidSource  # HIPRTC_ERROR_LINKING
    assert hip_code_for_rtc(77) == E.hipErrorUnknown
    err = rtc_error(6, "nvrtcCompileProgram", "k.hip(3): error: boom\n")
    assert err.code == E.hipErrorInvalidSource
    assert "NVRTC_ERROR_COMPILATION" in err.message and "k.hip(3): error: boom" in err.message


@needs_cuda_bindings
def test_rtc_names_match_nvrtc() -> None:
    from cuda.bindings import nvrtc

    for code, row in RTC_RESULT_TO_HIP.items():
        if row.nvrtc_name.startswith("NVRTC_"):
            assert int(getattr(nvrtc.nvrtcResult, row.nvrtc_name)) == code


@needs_hip_python
def test_rtc_codes_match_hiprtc() -> None:
    from hip import hiprtc

    for code, row in RTC_RESULT_TO_HIP.items():
        name = row.nvrtc_name.replace("NVRTC_", "HIPRTC_")
        assert int(getattr(hiprtc.hiprtcResult, name)) == code


# === small helpers =======================================================================


def test_prelude_defines_hip_spellings() -> None:
    for axis in "xyz":
        for hip_name, cuda_name in (
            ("hipThreadIdx", "threadIdx"),
            ("hipBlockIdx", "blockIdx"),
            ("hipBlockDim", "blockDim"),
            ("hipGridDim", "gridDim"),
        ):
            assert f"#define {hip_name}_{axis} {cuda_name}.{axis}" in HIP_PRELUDE
    assert "#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];" in HIP_PRELUDE
    assert "#define __HIP_PLATFORM_NVIDIA__" in HIP_PRELUDE
    assert "hip/hip_runtime.h" in PRELUDE_INCLUDE_NAMES
    # Everything the built-in kernels spell the HIP way is defined by the prelude.
    used = set(re.findall(r"\bhip[A-Z]\w*|\bHIP_\w+", BUILTIN_SOURCE))
    assert "hipThreadIdx_x" in used and "HIP_DYNAMIC_SHARED" in used
    for name in used:
        assert name in HIP_PRELUDE, name


def test_nvrtc_options() -> None:
    assert nvrtc_options([], "sm_90") == ["--gpu-architecture=sm_90"]
    assert nvrtc_options(["-lineinfo"], "sm_90") == ["--gpu-architecture=sm_90", "-lineinfo"]
    assert nvrtc_options(["--gpu-architecture=compute_80"], "sm_90") == [
        "--gpu-architecture=compute_80"
    ]
    assert nvrtc_options(["-arch", "sm_80"], "sm_90") == ["-arch", "sm_80"]
    assert nvrtc_options(["--offload-arch=sm_89"], "sm_90") == ["--gpu-architecture=sm_89"]
    with pytest.raises(HipError) as info:
        nvrtc_options(["--offload-arch=gfx942"], "sm_90")
    assert info.value.code == E.hipErrorInvalidValue


def test_hiprtc_options() -> None:
    arch = "gfx942:sramecc+:xnack-"
    assert hiprtc_options([], arch) == [f"--offload-arch={arch}"]
    assert hiprtc_options(["-O3"], arch) == [f"--offload-arch={arch}", "-O3"]
    assert hiprtc_options(["--offload-arch=gfx90a"], arch) == ["--offload-arch=gfx90a"]
    for bad in (["--gpu-architecture=sm_90"], ["--offload-arch=sm_90"], ["-arch=sm_80"]):
        with pytest.raises(HipError):
            hiprtc_options(bad, arch)


def test_launch_extra_layout() -> None:
    args = struct.pack("<QbxxxiQ", 0xDEADBEEF, -3, 7, 9)
    for end in (0, 3):
        extra = LaunchExtra(args, buffer_pointer=1, buffer_size=2, end=end)
        words = extra.entries
        assert words[0] == 1 and words[2] == 2 and words[4] == end
        assert ctypes.string_at(words[1], len(args)) == args
        assert ctypes.c_size_t.from_address(words[3]).value == len(args)
        assert extra.packed() == args
    empty = LaunchExtra(b"", buffer_pointer=1, buffer_size=2, end=0)
    assert ctypes.c_size_t.from_address(empty.entries[3]).value == 0


def test_reused_launch_extra_is_refilled_for_each_launch() -> None:
    extra = ReusedLaunchExtra(64, buffer_pointer=1, buffer_size=2, end=3)
    words = [int(v or 0) for v in (ctypes.c_void_p * 5).from_address(extra.address)]
    assert words[0] == 1 and words[2] == 2 and words[4] == 3
    long_args = struct.pack("<QbxxxiQ", 0xDEADBEEF, -3, 7, 9)
    for args in (long_args, b"\x01\x02", b"", bytes(range(64))):
        assert extra.fill(args) == extra.address  # the same array every time
        assert ctypes.c_size_t.from_address(words[3]).value == len(args)
        assert ctypes.string_at(words[1], len(args)) == args
        assert extra.packed() == args


def test_host_address() -> None:
    data = b"hello world"
    addr, n, keep = host_address(memoryview(data), writable=False)
    assert n == len(data) and ctypes.string_at(addr, n) == data
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    addr, n, keep = host_address(arr.data, writable=True)
    assert n == 24 and ctypes.string_at(addr, n) == arr.tobytes()
    strided = np.arange(10, dtype=np.int16)[::2]
    addr, n, keep = host_address(strided.data, writable=False)
    assert ctypes.string_at(addr, n) == strided.tobytes()
    with pytest.raises(HipError):
        host_address(strided.data, writable=True)
    with pytest.raises(HipError):
        host_address(memoryview(b"ro"), writable=True)
    assert host_address(memoryview(b""), writable=False)[1] == 0
    del keep


def test_code_cache_key_and_lru() -> None:
    k = CodeCache.key
    assert k("src", ["a", "b"], "sm_90") != k("src", ["ab"], "sm_90")
    assert k("src", [], "sm_90") != k("src", [], "sm_80")
    assert k("s", ["x"], "a") == k("s", ["x"], "a")
    cache = CodeCache(max_entries=2)
    cache.put("1", b"one")
    cache.put("2", b"two")
    assert cache.get("1") == b"one"
    cache.put("3", b"three")  # evicts "2", the least recently used
    assert cache.get("2") is None and cache.get("1") == b"one" and cache.get("3") == b"three"


class _Ops:
    """Staging ops on plain host memory with fences the test completes by hand."""

    def __init__(self) -> None:
        self.live: dict[int, Any] = {}
        self.fences: list[list[bool]] = []

    def host_alloc(self, size: int) -> int:
        buf = ctypes.create_string_buffer(size)
        self.live[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def host_free(self, ptr: int) -> None:
        del self.live[ptr]

    def fence_after(self, stream: Any) -> Any:
        fence = [False]
        self.fences.append(fence)
        return fence

    def fence_done(self, fence: Any) -> bool:
        return bool(fence[0])

    def fence_destroy(self, fence: Any) -> None:
        pass


def test_pinned_staging_reuses_only_after_fence() -> None:
    ops = _Ops()
    staging = PinnedStaging(ops, max_cached=1 << 20)
    a = staging.take(1000)
    assert a.capacity == PinnedStaging.MIN_BLOCK
    fence = ops.fence_after(None)
    staging.retire([fence], [a])
    b = staging.take(1000)
    assert b.ptr != a.ptr  # a is still being read
    fence[0] = True
    staging.reclaim()
    c = staging.take(10)
    assert c.ptr == a.ptr  # now recycled
    big = staging.take(3 << 20)  # over max_cached: freed on return, not kept
    assert big.capacity == 4 << 20
    staging.give_back([big, b, c])
    assert staging.outstanding == 0
    assert big.ptr not in ops.live
    staging.close(wait=lambda: None)
    assert not ops.live


def test_pinned_payloads_are_lent_until_their_last_view_goes() -> None:
    ops = _Ops()
    payloads = PinnedPayloads(ops)
    assert payloads.take(10) is None  # none reserved
    assert payloads.reserve(2, 4096) == 2
    assert payloads.reserve(2, 4096) == 2  # tops up to the count, no more
    with pytest.raises(ValueError, match="4096 bytes"):
        payloads.reserve(3, 8192)
    first = payloads.take(4096)
    second = payloads.take(100)
    assert first is not None and second is not None and second.nbytes == 100
    assert payloads.take(1) is None and payloads.in_use() == 2  # both lent
    assert payloads.take(4097) is None  # larger than a buffer
    first[:4] = b"pins"
    tail = first[2:4]  # a slice keeps its buffer lent
    del first
    assert payloads.take(1) is None
    del tail
    again = payloads.take(4096)
    assert again is not None and bytes(again[:4]) == b"pins"  # the same memory, reused
    del again
    # Closing frees what nobody views; a buffer still viewed stays mapped.
    assert payloads.close() == 1 and len(ops.live) == 1
    second[:2] = b"ok"
    del second
    assert payloads.close() == 0 and not ops.live


def test_pinned_payloads_keep_what_the_runtime_granted() -> None:
    ops = _Ops()
    granted = 0

    def host_alloc(size: int) -> int:
        nonlocal granted
        if granted == 3:
            raise HipError(HipErrorCode.hipErrorOutOfMemory, "pinned memory exhausted")
        granted += 1
        return _Ops.host_alloc(ops, size)

    ops.host_alloc = host_alloc  # type: ignore[method-assign]
    payloads = PinnedPayloads(ops)
    assert payloads.reserve(5, 1024) == 3
    assert payloads.close() == 0 and not ops.live


# === the runtime tables ===================================================================
# GpuBackend reaches the GPU only through the names in hipr.backends._callmap and the
# adapters; these tests keep the tables and the shared logic in step.

_RUNTIMES: tuple[type[Any], ...] = (CudaRuntime, HipRuntime)
_RUNTIME_FUNCTION = re.compile(r"(cu|hip|nvrtc|hiprtc)[A-Z]\w*")


def _gpu_source_tree() -> ast.Module:
    """The shared logic's modules (gpu.py and its parts, _gpu_*.py) as one tree."""
    from hipr.backends import gpu

    folder = Path(gpu.__file__).parent
    body: list[ast.stmt] = []
    for path in [folder / "gpu.py", *sorted(folder.glob("_gpu_*.py"))]:
        body += ast.parse(path.read_text()).body
    assert len(body) > 100  # every part was read
    return ast.Module(body=body, type_ignores=[])


def test_shared_logic_spells_no_runtime_function() -> None:
    # A name written into gpu.py would reach one runtime only; it belongs in callmap.
    tree = _gpu_source_tree()
    strings = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not {s for s in strings if _RUNTIME_FUNCTION.fullmatch(s)}


def test_every_table_row_is_used_by_the_shared_logic() -> None:
    # mypy checks that what gpu.py uses is in the tables; this checks the converse, so
    # that no row is left behind when the logic stops needing it.
    used = {node.attr for node in ast.walk(_gpu_source_tree()) if isinstance(node, ast.Attribute)}
    for table in (DriverCalls, RtcCalls, RuntimeConstants):
        assert set(table._fields) <= used, set(table._fields) - used


def test_table_columns() -> None:
    assert list(CUDA_CALLS) == [row.cuda for row in DRIVER_CALLS]
    assert list(HIP_CALLS) == [row.hip for row in DRIVER_CALLS]
    assert list(NVRTC_CALLS) == [row.cuda for row in RTC_CALLS]
    assert list(HIPRTC_CALLS) == [row.hip for row in RTC_CALLS]
    for name in CUDA_CALLS:
        assert name.startswith("cu"), name
    for name in HIP_CALLS:
        assert name.startswith("hip"), name
    assert all(n.startswith("nvrtc") for n in NVRTC_CALLS)
    assert all(n.startswith("hiprtc") for n in HIPRTC_CALLS)
    assert set(DriverCalls._fields) >= ADAPTER_SHAPED_CALLS
    assert CudaRuntime.calls == CUDA_CALLS and CudaRuntime.rtc_calls == NVRTC_CALLS
    assert HipRuntime.calls == HIP_CALLS and HipRuntime.rtc_calls == HIPRTC_CALLS


def test_adapters_implement_the_runtime_protocol() -> None:
    members = set(Runtime.__annotations__) | {
        name for name, value in vars(Runtime).items() if inspect.isfunction(value)
    }
    assert {"calls", "open", "bind", "memset_node_args"} <= members
    for runtime in _RUNTIMES:
        missing = {m for m in members if not hasattr(runtime, m)}
        assert not missing, (runtime.__name__, missing)


def _functions_named(module: Any, names: list[str]) -> list[str]:
    """The names that are not callables of ``module``."""
    return [n for n in names if not callable(getattr(module, n, None))]


@needs_cuda_bindings
def test_cuda_column_names_cuda_bindings_functions() -> None:
    from cuda.bindings import driver, nvrtc

    driver_names = [*CUDA_CALLS, str(CudaRuntime.param_info_call)]
    assert not _functions_named(driver, driver_names)
    rtc_names = [*NVRTC_CALLS, *(n for pair in CudaRuntime.rtc_images for n in pair)]
    assert not _functions_named(nvrtc, rtc_names)
    consts = resolve_constants(driver, "cuda")
    assert int(consts.launch_end) == 0 and int(consts.stream_flags) == 1


@needs_hip_python
def test_hip_column_names_hip_python_functions() -> None:
    from hip import hip, hiprtc

    assert HipRuntime.param_info_call is None
    assert not _functions_named(hip, list(HIP_CALLS))
    rtc_names = [*HIPRTC_CALLS, *(n for pair in HipRuntime.rtc_images for n in pair)]
    assert not _functions_named(hiprtc, rtc_names)
    consts = resolve_constants(hip, "hip")
    assert int(consts.launch_end) == 3 and int(consts.stream_flags) == 1


@needs_cuda_bindings
@needs_hip_python
def test_both_columns_take_the_same_arguments() -> None:
    # The shared logic passes one argument list to either runtime's function; only the
    # graph node rows named in ADAPTER_SHAPED_CALLS take adapter-built tails.
    from cuda.bindings import driver, nvrtc
    from hip import hip, hiprtc

    def arity(module: Any, name: str) -> int:
        return _signature_arity(getattr(module, name).__doc__, name)

    for field, row in zip(DriverCalls._fields, DRIVER_CALLS, strict=True):
        if field not in ADAPTER_SHAPED_CALLS:
            assert arity(driver, row.cuda) == arity(hip, row.hip), row
    for row in RTC_CALLS:
        assert arity(nvrtc, row.cuda) == arity(hiprtc, row.hip), row


def test_backends_are_declarations() -> None:
    from hipr.backends.cuda_backend import CudaBackend
    from hipr.backends.hip_backend import HipBackend

    for cls, params in ((CudaBackend, ["_driver", "_nvrtc"]), (HipBackend, ["_hip", "_hiprtc"])):
        assert issubclass(cls, GpuBackend)
        own = {k for k in vars(cls) if not (k.startswith("__") and k != "__init__")}
        assert own == {"__init__"}, own
        sig = inspect.signature(cls)
        assert list(sig.parameters) == params
        assert all(p.kind is p.KEYWORD_ONLY and p.default is None for p in sig.parameters.values())


# === real "library missing" paths ========================================================


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


@needs_hip_python
def test_hip_backend_unavailable_without_rocm() -> None:
    from hipr.backends.hip_backend import HipBackend

    try:
        from hip import hip as real_hip

        real_hip.hipGetDeviceCount()  # type: ignore[no-untyped-call]
    except RuntimeError:
        pass
    else:  # pragma: no cover - a machine with ROCm
        pytest.skip("ROCm is installed here")
    with pytest.raises(BackendUnavailable) as info:
        HipBackend()
    err = info.value
    assert err.kind == "backend_unavailable" and err.library == "libamdhip64.so"
    assert err.code == E.hipErrorInsufficientDriver
    assert "hip backend unavailable: could not load libamdhip64.so" in _one_line(err)
    with pytest.raises(BackendUnavailable):
        load_backend("hip")


def test_hip_backend_unavailable_without_hip_python(monkeypatch: pytest.MonkeyPatch) -> None:
    from hipr.backends.hip_backend import HipBackend

    monkeypatch.setitem(sys.modules, "hip", None)
    with pytest.raises(BackendUnavailable) as info:
        HipBackend()
    assert info.value.library == "hip-python"
    assert "hip-python package is not installed" in _one_line(info.value)


@needs_cuda_bindings
def test_cuda_backend_unavailable_without_libcuda() -> None:
    from cuda.bindings import driver

    from hipr.backends.cuda_backend import CudaBackend

    try:
        driver.cuInit(0)
    except RuntimeError:
        pass
    else:  # pragma: no cover - a machine with an NVIDIA driver
        pytest.skip("libcuda is installed here")
    with pytest.raises(BackendUnavailable) as info:
        CudaBackend()
    err = info.value
    assert err.library == "libcuda.so.1" and err.code == E.hipErrorInsufficientDriver
    assert "cuda backend unavailable: could not load libcuda.so.1" in _one_line(err)


def test_cuda_backend_unavailable_without_cuda_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    from hipr.backends.cuda_backend import CudaBackend

    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(BackendUnavailable) as info:
        CudaBackend()
    err = info.value
    assert err.library == "cuda-bindings" and err.kind == "backend_unavailable"
    assert "cuda-bindings package is not installed" in _one_line(err)


@pytest.mark.parametrize("as_on_a_gpu_host", [False, True])
def test_cuda_bindings_that_fail_to_import_name_libcuda(
    monkeypatch: pytest.MonkeyPatch, as_on_a_gpu_host: bool
) -> None:
    # Installed but broken (a module of the package raising ImportError) is the driver
    # library's fault on CUDA...
    from hipr.backends.cuda_backend import CudaBackend

    if as_on_a_gpu_host:  # working bindings imported by an earlier test, as on the H100
        for name in ("cuda.bindings.driver", "cuda.bindings.nvrtc"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    package = types.ModuleType("cuda.bindings")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", package)
    # Where cuda-bindings works (a GPU host), earlier tests left its modules imported,
    # and ``from cuda.bindings import driver`` would find them: hide them too, so the
    # broken package is all there is, on every host.
    _hide_modules(monkeypatch, "cuda.bindings.")
    with pytest.raises(BackendUnavailable) as info:
        CudaBackend()
    assert info.value.library == "libcuda.so.1"
    assert "could not load libcuda.so.1" in _one_line(info.value)


def test_hip_python_that_fails_to_import_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    # ... while on HIP any ImportError means hip-python itself is not usable.
    from hipr.backends.hip_backend import HipBackend

    monkeypatch.setitem(sys.modules, "hip", types.ModuleType("hip"))
    with pytest.raises(BackendUnavailable) as info:
        HipBackend()
    assert info.value.library == "hip-python"


def test_cuda_backend_driver_present_but_no_device() -> None:
    from hipr.backends.cuda_backend import CudaBackend

    drv = SimpleNamespace(cuInit=lambda flags: (100,))
    with pytest.raises(BackendUnavailable) as info:
        CudaBackend(_driver=drv, _nvrtc=None)
    assert info.value.code == E.hipErrorNoDevice
    assert "CUDA_ERROR_NO_DEVICE" in _one_line(info.value)
    drv = SimpleNamespace(cuInit=lambda flags: (34,))  # the toolkit's stub libcuda
    with pytest.raises(BackendUnavailable) as info:
        CudaBackend(_driver=drv, _nvrtc=None)
    assert info.value.code == E.hipErrorInsufficientDriver


def test_a_missing_libamdhip64_reads_as_text_not_bytes() -> None:
    from hipr.backends.hip_backend import HipBackend

    def fails() -> tuple[int, int]:
        # hip-python's loader quotes bytes reprs, as seen on a host without ROCm.
        raise OSError(
            "failed to dlopen 'b'libamdhip64.so'': b'libamdhip64.so: cannot open shared "
            "object file: No such file or directory'"
        )

    with pytest.raises(BackendUnavailable) as info:
        HipBackend(_hip=SimpleNamespace(hipGetDeviceCount=fails), _hiprtc=None)
    text = _one_line(info.value)
    assert "failed to dlopen 'libamdhip64.so': libamdhip64.so: cannot open" in text
    assert "'b'" not in text and "b'" not in text


def test_hip_backend_runtime_present_but_no_device() -> None:
    from hipr.backends.hip_backend import HipBackend

    fake = SimpleNamespace(hipGetDeviceCount=lambda: (100, 0))
    with pytest.raises(BackendUnavailable) as info:
        HipBackend(_hip=fake, _hiprtc=None)
    assert info.value.code == E.hipErrorNoDevice and "sees no AMD GPU" in str(info.value)


def test_backend_unavailable_message_is_one_line() -> None:
    err = BackendUnavailable(
        message="x backend unavailable:\n  could not\tload libx.so", library="libx.so"
    )
    assert err.message == "x backend unavailable: could not load libx.so"
    assert err.library == "libx.so" and err.code == E.hipErrorNoDevice
    assert isinstance(err, HipError)


# === load_backend ===========================================================================


def _hide_modules(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    for name in [n for n in sys.modules if n.startswith(prefix)]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def no_gpu_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither hip-python nor cuda-bindings importable, as on a machine without them,
    whatever this host has: "auto" must then fall back (or refuse) on a GPU host too."""
    for prefix in ("hip.", "cuda."):
        _hide_modules(monkeypatch, prefix)
    for name in ("hip", "cuda", "cuda.bindings"):
        monkeypatch.setitem(sys.modules, name, None)


def test_auto_falls_back_to_emulator_and_says_why(no_gpu_runtime: None) -> None:
    with structlog.testing.capture_logs() as logs:
        backend = load_backend("auto", device_count=2, total_memory=1 << 24, name="Test GPU")
    try:
        assert backend.name == "emulator"
        assert backend.device_count() == 2
        assert isinstance(backend, Backend)
    finally:
        backend.close()
    chosen = [entry for entry in logs if entry["event"] == "backend selected"]
    assert len(chosen) == 1
    entry = chosen[0]
    assert entry["backend"] == "emulator" and entry["requested"] == "auto"
    assert entry["log_level"] == "warning" and "--no-emulator-fallback" in entry["fallback"]
    assert set(entry["skipped"]) == {"hip", "cuda"}
    assert "hip backend unavailable" in entry["skipped"]["hip"]
    assert "cuda backend unavailable" in entry["skipped"]["cuda"]


def test_auto_without_fallback_refuses_and_says_why(no_gpu_runtime: None) -> None:
    with pytest.raises(BackendUnavailable) as refused:
        load_backend("auto", fallback=False)
    message = refused.value.message
    assert "emulator fallback is off" in message and "hipr[cuda]" in message
    assert "hip:" in message and "cuda:" in message


def test_explicit_emulator_gets_its_options() -> None:
    backend = load_backend("emulator", device_count=3, total_memory=1 << 20, name="E")
    try:
        assert backend.device_count() == 3
        assert backend.device_properties(0).name == "E"
    finally:
        backend.close()


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError) as info:
        load_backend("rocm")
    for name in BACKEND_NAMES:
        assert repr(name) in str(info.value)


# === both backends on a simulated runtime ================================================


class SimError(Exception):
    """A call the simulation was not written for."""


def _signature_arity(doc: str | None, name: str) -> int:
    """Positional parameters of a binding function, from its docstring's first line."""
    assert doc, f"{name} has no docstring to check against"
    first = doc.strip().split("\n", 1)[0]
    m = re.fullmatch(rf"{name}\((.*)\)", first.strip())
    assert m, f"unexpected signature line for {name}: {first!r}"
    inner = m.group(1).strip()
    if not inner:
        return 0
    depth, count = 0, 1
    for ch in inner:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            count += 1
    return count


class SimStream:
    def __init__(self, label: str) -> None:
        self.label = label
        self.queue: list[Callable[[], None]] = []
        self.capture: list[Callable[[], None]] | None = None

    def __repr__(self) -> str:
        return f"<SimStream {self.label}>"

    def __int__(self) -> int:
        # What a native caller is given for the stream (``SimGpu.stream`` maps it back).
        return id(self)


class SimEvent:
    def __init__(self) -> None:
        self.done = False


class SimGraph:
    def __init__(self, ops: list[Callable[[], None]]) -> None:
        self.ops = ops


BUILTIN_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)')


class SimGpu:
    """Device memory, queued stream work and the built-in kernels, in host memory."""

    def __init__(self, total: int = 64 << 20) -> None:
        self.total = total
        self.mem: dict[int, bytearray] = {}
        self.next = 0x7F00_0000_0000
        self.host: dict[int, Any] = {}
        self.ptds = SimStream("per-thread")
        self.streams: list[SimStream] = [self.ptds]
        self.functions: dict[int, str] = {}
        self.launches: list[tuple[str, bytes]] = []
        self.sticky = 0
        self.calls: list[str] = []
        self.compiles: list[list[str]] = []
        #: CUDA refuses argument bytes past a kernel's last parameter; HIP does not.
        self.strict_param_size = False
        #: What a batch of copies answers: 0, or an error code (a driver without it).
        self.batch_result = 0
        #: As a real context once a kernel faulted: every driver call fails with the
        #: sticky error, destroys and frees included (off by default: tests of other
        #: things read the fault at a synchronisation and carry on).
        self.poisoning = False
        self.lock = threading.RLock()
        #: The native entry points offered (``_make(..., native=True)``), if any.
        self.native: SimNativeEntries | None = None

    def param_layout(self, fn: int) -> list[tuple[int, int]]:
        """(offset, size) of each parameter of a built-in kernel."""
        sizes = {"ptr": (8, 8), "u64": (8, 8), "f32": (4, 4), "f64": (8, 8)}
        sizes.update({"i8": (1, 1), "i16": (2, 2), "i32": (4, 4), "probe_struct": (24, 8)})
        layout, end = [], 0
        for kind in BUILTINS[self.functions[fn]].arg_kinds:
            size, align = sizes[kind]
            end += -end % align
            layout.append((end, size))
            end += size
        return layout

    def param_space(self, fn: int) -> int:
        offset, size = self.param_layout(fn)[-1]
        return offset + size

    # memory
    def alloc(self, size: int) -> int:
        if sum(map(len, self.mem.values())) + size > self.total:
            raise _Fail(2)
        ptr = self.next
        self.next += (size + 0xFFFF) & ~0xFFFF
        self.mem[ptr] = bytearray(size)
        return ptr

    def locate(self, ptr: int, n: int) -> tuple[bytearray, int]:
        for base, buf in self.mem.items():
            if base <= ptr and ptr + n <= base + len(buf):
                return buf, ptr - base
        raise _Fail(700)

    def write(self, ptr: int, data: bytes) -> None:
        buf, off = self.locate(ptr, len(data))
        buf[off : off + len(data)] = data

    def read(self, ptr: int, n: int) -> bytes:
        buf, off = self.locate(ptr, n)
        return bytes(buf[off : off + n])

    # streams
    def stream(self, s: Any) -> SimStream:
        if isinstance(s, SimStream):
            return s
        value = _addr(s)
        for stream in self.streams:  # a native caller's int(stream)
            if id(stream) == value:
                return stream
        assert value == 2, f"only the per-thread default stream may be passed raw: {s!r}"
        return self.ptds

    def enqueue(self, s: Any, op: Callable[[], None]) -> None:
        stream = self.stream(s)
        with self.lock:  # sessions' threads enqueue while another one runs every queue
            if stream.capture is not None:
                stream.capture.append(op)
            else:
                stream.queue.append(op)

    def run(self, stream: SimStream) -> None:
        with self.lock:
            ops, stream.queue = stream.queue, []
            for op in ops:
                try:
                    op()
                except _Fail as fail:
                    self.sticky = fail.code
                    break

    def run_all(self) -> None:
        with self.lock:
            for stream in list(self.streams):
                self.run(stream)

    # kernels
    def kernel(self, fn: int, args: bytes) -> Callable[[], None]:
        name = self.functions[fn]
        self.launches.append((name, args))

        def run() -> None:
            if name in ("fill_f32", "scale_f32"):
                ptr, value, n = struct.unpack_from("<Qf4xQ", args)
                old = np.frombuffer(self.read(ptr, 4 * n), np.float32)
                new = np.full(n, value, np.float32) if name == "fill_f32" else old * value
                self.write(ptr, new.astype(np.float32).tobytes())
            elif name == "axpy_f32":
                y, x, a, n = struct.unpack_from("<QQf4xQ", args)
                xs = np.frombuffer(self.read(x, 4 * n), np.float32)
                ys = np.frombuffer(self.read(y, 4 * n), np.float32)
                self.write(y, (ys + np.float32(a) * xs).astype(np.float32).tobytes())
            elif name == "mixed_args_probe":
                out, a8, a32, f, d, a16, sa, sb, sc, n = struct.unpack_from(
                    "<Qb3xif4xdh6xb7xdh6xQ", args
                )
                vals = a8 + a32 + f + d + a16 + sa + sb + sc + np.arange(n, dtype=np.float64)
                self.write(out, vals.tobytes())

        return run


class _Fail(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _read_extra(address: int, end: int) -> bytes:
    words = [ctypes.c_void_p.from_address(address + 8 * i).value or 0 for i in range(5)]
    assert words[0] == 1 and words[2] == 2 and words[4] == end, words
    size = ctypes.c_size_t.from_address(words[3]).value
    return ctypes.string_at(words[1], size)


def _fill_c_buffer(buf: Any, data: bytes) -> None:
    """Write into the output buffer a binding fills in place (bytes or bytearray)."""
    if isinstance(buf, bytearray):
        buf[: len(data)] = data
        return
    # cuda-bindings writes through the char* of a bytes object; so does this.
    address = ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value
    assert address is not None
    ctypes.memmove(address, data, len(data))


class SimProgram:
    def __init__(self, src: bytes, headers: dict[bytes, bytes]) -> None:
        self.src = src
        self.headers = headers
        self.log = b""
        self.image = b""
        self.virtual = False


def _sim_compile(gpu: SimGpu, prog: SimProgram, options: list[bytes], needs_header: bool) -> int:
    opts = [o.decode() for o in options]
    gpu.compiles.append(opts)
    text = prog.src.decode()
    if any(o.startswith("--no-such") for o in opts):
        prog.log = b"error: unknown option"
        return 5
    if (
        needs_header
        and "#include <hip/hip_runtime.h>" in text
        and b"hip/hip_runtime.h" not in prog.headers
    ):
        prog.log = b"catastrophic error: cannot open source file hip/hip_runtime.h"
        return 6
    if "undefined_name" in text:
        prog.log = b'kernel.hip(2): error: identifier "undefined_name" is undefined\n'
        return 6
    prog.log = b""
    prog.virtual = any("compute_" in o for o in opts)
    prog.image = b"\x7fELF-sim\n" + prog.src
    return 0


class SimBinding:
    """A stand-in for one binding module: functions run on ``gpu`` after their arity is
    checked against the real module's; everything else (enums, structs, constants)
    comes from the real module."""

    def __init__(self, real: Any, gpu: SimGpu, handlers: dict[str, Callable[..., Any]]) -> None:
        self._real = real
        self._gpu = gpu
        self._handlers = handlers

    def __getattr__(self, name: str) -> Any:
        handler = self._handlers.get(name)
        if handler is None:
            attr = getattr(self._real, name)
            if callable(attr) and not isinstance(attr, type) and name[:2] in ("cu", "hi", "nv"):
                raise SimError(f"the simulation does not implement {name}")
            return attr
        arity = _signature_arity(getattr(self._real, name).__doc__, name)

        def call(*args: Any) -> tuple[Any, ...]:
            assert len(args) == arity, f"{name} takes {arity} arguments, got {len(args)}"
            self._gpu.calls.append(name)
            gpu = self._gpu
            if gpu.poisoning and gpu.sticky and not name.startswith(("nvrtc", "hiprtc")):
                return (gpu.sticky,)
            try:
                out = handler(*args)
            except _Fail as fail:
                return (fail.code,)
            return (0, *out) if isinstance(out, tuple) else (0,) if out is None else (0, out)

        return call


class SimNativeEntries:
    """C entry points for a simulated binding's launch and stream query (what the
    worker's native launch-and-wait calls, ``hipr.backends._launch_wait``): ctypes
    callbacks into the binding's own functions, so their arity checks and the call log
    hold. ``not_ready_polls`` queries answer "not ready" first (a kernel still running)."""

    def __init__(self, binding: SimBinding, launch: str, query: str, not_ready: int) -> None:
        self.not_ready_polls = 0
        self.queries = 0

        def launch_entry(f: int, *rest: Any) -> int:
            *dims, shared, stream, params, extra = rest
            assert params is None
            return int(getattr(binding, launch)(f, *dims, shared, stream, None, extra)[0])

        def query_entry(stream: int) -> int:
            self.queries += 1
            if self.not_ready_polls > 0:
                self.not_ready_polls -= 1
                return not_ready
            return int(getattr(binding, query)(stream)[0])

        self._launch = LAUNCH_PROTOTYPE(launch_entry)
        self._query = QUERY_PROTOTYPE(query_entry)

    def __call__(self) -> tuple[int, int]:
        return entry_address(self._launch), entry_address(self._query)


def _common_handlers(
    gpu: SimGpu, p: str, end: int, function_handle: Callable[[int], Any]
) -> dict[str, Callable[..., Any]]:
    """Handlers whose argument order is the same in both runtimes; ``p`` prefixes names
    (``cu``/``hip``) where the two spell them alike after the prefix."""

    def sync_all(*_: Any) -> None:
        gpu.run_all()
        if gpu.sticky:
            raise _Fail(gpu.sticky)

    def stream_sync(s: Any) -> None:
        stream = gpu.stream(s)
        if stream.capture is not None:
            raise _Fail(900)
        gpu.run(stream)
        if gpu.sticky:
            raise _Fail(gpu.sticky)

    def htod(dst: int, src: int, n: int, s: Any) -> None:
        gpu.enqueue(s, lambda: gpu.write(dst, ctypes.string_at(src, n)))

    def dtoh(dst: int, src: int, n: int, s: Any) -> None:
        def run() -> None:
            ctypes.memmove(dst, gpu.read(src, n), n)

        gpu.enqueue(s, run)

    def dtod(dst: int, src: int, n: int, s: Any) -> None:
        gpu.enqueue(s, lambda: gpu.write(dst, gpu.read(src, n)))

    def memset(ptr: int, value: int, n: int, s: Any) -> None:
        gpu.enqueue(s, lambda: gpu.write(ptr, bytes([value]) * n))

    def free(ptr: int) -> None:
        gpu.run_all()
        if int(ptr) not in gpu.mem:
            raise _Fail(1)
        del gpu.mem[int(ptr)]

    def host_alloc(size: int, flags: int) -> int:
        buf = ctypes.create_string_buffer(size)
        gpu.host[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def host_free(ptr: int) -> None:
        del gpu.host[int(ptr)]

    def stream_create(flags: int) -> SimStream:
        assert int(flags) == 1, "streams are created non-blocking"
        stream = SimStream(f"s{len(gpu.streams)}")
        gpu.streams.append(stream)
        return stream

    def stream_destroy(s: SimStream) -> None:
        gpu.run(s)
        gpu.streams.remove(s)

    def record(e: SimEvent, s: Any) -> None:
        e.done = False

        def mark() -> None:
            e.done = True

        gpu.enqueue(s, mark)

    def event_query(e: SimEvent) -> None:
        if not e.done:
            raise _Fail(600)

    def event_sync(e: SimEvent) -> None:
        gpu.run_all()
        if gpu.sticky:
            raise _Fail(gpu.sticky)

    def load(image: bytes) -> Any:
        if not bytes(image).startswith(b"\x7fELF-sim"):
            raise _Fail(200)
        return {"names": BUILTIN_KERNEL_RE.findall(bytes(image).decode(errors="replace"))}

    def get_function(module: dict[str, Any], name: bytes) -> Any:
        if name.decode() not in module["names"]:
            raise _Fail(500)
        address = 0x1000 + len(gpu.functions)
        gpu.functions[address] = name.decode()
        return function_handle(address)

    def launch(
        f: Any,
        gx: int,
        gy: int,
        gz: int,
        bx: int,
        by: int,
        bz: int,
        shared: int,
        s: Any,
        params: Any,
        extra: int,
    ) -> None:
        assert params is None
        if bx * by * bz > 1024:
            raise _Fail(1)
        args = _read_extra(extra, end)
        if gpu.strict_param_size and len(args) > gpu.param_space(_addr(f)):
            raise _Fail(701)  # what CUDA answers to bytes past the last parameter
        if gpu.functions.get(_addr(f)) == "reduce_sum_f32" and shared < 4 * bx:

            def past_shared_memory() -> None:  # it indexes 4 bytes a thread of it
                raise _Fail(700)

            gpu.enqueue(s, past_shared_memory)
            return
        gpu.enqueue(s, gpu.kernel(_addr(f), args))

    def begin_capture(s: Any, mode: Any) -> None:
        assert "RELAXED" in str(mode).upper() or int(mode) == 2
        gpu.stream(s).capture = []

    def end_capture(s: Any) -> SimGraph:
        stream = gpu.stream(s)
        if stream.capture is None:
            raise _Fail(1)
        ops, stream.capture = stream.capture, None
        return SimGraph(ops)

    def graph_launch(g: SimGraph, s: Any) -> None:
        for op in g.ops:
            gpu.enqueue(s, op)

    def add_empty(g: SimGraph, deps: Any, n: int) -> object:
        assert (deps is None) == (n == 0)
        return object()

    def instantiate(g: SimGraph, flags: int) -> SimGraph:
        return SimGraph(list(g.ops))

    return {
        f"{p}StreamSynchronize": stream_sync,
        f"{p}MemcpyHtoDAsync": htod,
        f"{p}MemcpyDtoHAsync": dtoh,
        f"{p}MemcpyDtoDAsync": dtod,
        f"{p}MemsetD8Async": memset,
        f"{p}StreamDestroy": stream_destroy,
        f"{p}StreamQuery": stream_sync,
        f"{p}StreamWaitEvent": lambda s, e, flags: None,
        f"{p}EventRecord": record,
        f"{p}EventQuery": event_query,
        f"{p}EventSynchronize": event_sync,
        f"{p}EventDestroy": lambda e: None,
        f"{p}EventElapsedTime": lambda a, b: 0.25,
        f"{p}ModuleLoadData": load,
        f"{p}ModuleUnload": lambda m: None,
        f"{p}ModuleGetFunction": get_function,
        f"{p}StreamBeginCapture": begin_capture,
        f"{p}StreamEndCapture": end_capture,
        f"{p}GraphCreate": lambda flags: SimGraph([]),
        f"{p}GraphDestroy": lambda g: None,
        f"{p}GraphAddEmptyNode": add_empty,
        f"{p}GraphLaunch": graph_launch,
        f"{p}GraphExecDestroy": lambda g: None,
        "_sync_all": sync_all,
        "_free": free,
        "_host_alloc": host_alloc,
        "_host_free": host_free,
        "_stream_create": stream_create,
        "_launch": launch,
        "_instantiate": instantiate,
    }


def _addr(handle: Any) -> int:
    if isinstance(handle, int):
        return handle
    if hasattr(handle, "as_c_void_p"):
        return int(handle.as_c_void_p().value or 0)
    return int(handle)


def make_sim_cuda(gpu: SimGpu) -> tuple[SimBinding, SimBinding]:
    from cuda.bindings import driver, nvrtc

    h = _common_handlers(gpu, "cu", end=0, function_handle=driver.CUfunction)
    attrs = {
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 9,
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
        "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132,
        "CU_DEVICE_ATTRIBUTE_WARP_SIZE": 32,
        "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024,
        "CU_DEVICE_ATTRIBUTE_CLOCK_RATE": 1_980_000,
        "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK": 49152,
    }

    def memset_node(g: SimGraph, deps: Any, n: int, params: Any, ctx: Any) -> object:
        ptr, value, width = int(params.dst), int(params.value), int(params.width)
        assert int(params.elementSize) == 1 and int(params.height) == 1
        g.ops.append(lambda: gpu.write(ptr, bytes([value]) * width))
        return object()

    def memcpy_node(g: SimGraph, deps: Any, n: int, p: Any, ctx: Any) -> object:
        dst, src, size = int(p.dstDevice), int(p.srcDevice), int(p.WidthInBytes)
        assert int(p.Height) == 1 and int(p.Depth) == 1
        g.ops.append(lambda: gpu.write(dst, gpu.read(src, size)))
        return object()

    def kernel_node(g: SimGraph, deps: Any, n: int, p: Any) -> object:
        args = _read_extra(int(p.extra), 0)  # read now: the driver copies at add time
        if len(args) > gpu.param_space(int(p.func)):
            raise _Fail(701)
        g.ops.append(gpu.kernel(int(p.func), args))
        return object()

    def param_info(f: Any, index: int) -> tuple[int, int]:
        layout = gpu.param_layout(int(f))
        if index >= len(layout):
            raise _Fail(1)
        return layout[index]

    def batch_copy(
        dsts: Any, srcs: Any, sizes: Any, count: int, attrs: Any, idxs: Any, n: int, s: Any
    ) -> None:
        # As strict as the driver: pointers as CUdeviceptr, one attribute set that reads
        # sources in stream order.
        assert len(dsts) == len(srcs) == len(sizes) == count and n == len(attrs) == 1
        assert list(idxs) == [0]
        assert all(isinstance(p, driver.CUdeviceptr) for p in (*dsts, *srcs))
        stream_order = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        assert attrs[0].srcAccessOrder == stream_order
        if gpu.batch_result:
            raise _Fail(gpu.batch_result)
        # No order within a batch: the simulation runs its copies last to first, each
        # reading its source when the stream gets to it.
        for dst, src, size in reversed(list(zip(dsts, srcs, sizes, strict=True))):
            h["cuMemcpyHtoDAsync"](int(dst), int(src), int(size), s)

    gpu.strict_param_size = True
    drv_handlers: dict[str, Callable[..., Any]] = {
        "cuFuncGetParamInfo": param_info,
        "cuMemcpyBatchAsync": batch_copy,
        **{k: v for k, v in h.items() if not k.startswith("_")},
        "cuInit": lambda flags: None,
        "cuDeviceGetCount": lambda: 1,
        "cuDeviceGet": lambda i: driver.CUdevice(i),
        "cuDevicePrimaryCtxRetain": lambda dev: driver.CUcontext(0xC0),
        "cuDevicePrimaryCtxRelease": lambda dev: None,
        "cuCtxSetCurrent": lambda ctx: None,
        "cuCtxSynchronize": h["_sync_all"],
        "cuDeviceGetAttribute": lambda attr, dev: attrs[attr.name],
        "cuDeviceGetName": lambda n, dev: b"Sim H100\0\0\0",
        "cuDeviceGetPCIBusId": lambda n, dev: b"0000:9a:00.0\0",
        "cuDeviceTotalMem": lambda dev: gpu.total,
        "cuMemGetInfo": lambda: (gpu.total - sum(map(len, gpu.mem.values())), gpu.total),
        "cuMemAlloc": lambda size: driver.CUdeviceptr(gpu.alloc(size)),
        "cuMemFree": lambda ptr: h["_free"](int(ptr)),
        "cuMemHostAlloc": h["_host_alloc"],
        "cuMemFreeHost": h["_host_free"],
        "cuStreamCreate": h["_stream_create"],
        "cuStreamIsCapturing": lambda s: driver.CUstreamCaptureStatus(
            1 if gpu.stream(s).capture is not None else 0
        ),
        "cuEventCreate": lambda flags: SimEvent(),
        "cuLaunchKernel": h["_launch"],
        "cuGraphAddMemsetNode": memset_node,
        "cuGraphAddMemcpyNode": memcpy_node,
        "cuGraphAddKernelNode": kernel_node,
        "cuGraphInstantiate": h["_instantiate"],
    }

    def create(src: bytes, name: bytes, n: int, headers: Any, includes: Any) -> SimProgram:
        assert n == len(headers or []) == len(includes or [])
        return SimProgram(src, dict(zip(includes or [], headers or [], strict=True)))

    def compile_(prog: SimProgram, n: int, opts: list[bytes]) -> None:
        assert n == len(opts)
        code = _sim_compile(gpu, prog, opts, needs_header=True)
        if code:
            raise _Fail(code)

    def cubin_size(prog: SimProgram) -> int:
        if prog.virtual:
            raise _Fail(3)
        return len(prog.image)

    rtc_handlers: dict[str, Callable[..., Any]] = {
        "nvrtcCreateProgram": create,
        "nvrtcCompileProgram": compile_,
        "nvrtcGetProgramLogSize": lambda prog: len(prog.log) + 1,
        "nvrtcGetProgramLog": lambda prog, buf: _fill_c_buffer(buf, prog.log + b"\0"),
        "nvrtcGetCUBINSize": cubin_size,
        "nvrtcGetCUBIN": lambda prog, buf: _fill_c_buffer(buf, prog.image),
        "nvrtcGetPTXSize": lambda prog: len(prog.image) + 1,
        "nvrtcGetPTX": lambda prog, buf: _fill_c_buffer(buf, prog.image + b"\0"),
        "nvrtcDestroyProgram": lambda prog: None,
    }
    return SimBinding(driver, gpu, drv_handlers), SimBinding(nvrtc, gpu, rtc_handlers)


def make_sim_hip(gpu: SimGpu) -> tuple[SimBinding, SimBinding]:
    from hip import hip, hiprtc

    h = _common_handlers(gpu, "hip", end=3, function_handle=hip.ihipModuleSymbol_t.fromObj)
    props = SimpleNamespace(
        name="Sim MI300X",
        gcnArchName="gfx942:sramecc+:xnack-",
        totalGlobalMem=gpu.total,
        multiProcessorCount=304,
        warpSize=64,
        maxThreadsPerBlock=1024,
        clockRate=2_100_000,
        major=9,
        minor=4,
        sharedMemPerBlock=65536,
    )

    def memset_node(g: SimGraph, deps: Any, n: int, params: Any) -> object:
        ptr, value, width = _addr(params.dst), int(params.value), int(params.width)
        g.ops.append(lambda: gpu.write(ptr, bytes([value]) * width))
        return object()

    def memcpy_node(
        g: SimGraph, deps: Any, n: int, dst: int, src: int, size: int, kind: Any
    ) -> object:
        assert int(kind) == 3  # hipMemcpyDeviceToDevice
        g.ops.append(lambda: gpu.write(dst, gpu.read(src, size)))
        return object()

    def kernel_node(g: SimGraph, deps: Any, n: int, p: Any) -> object:
        args = _read_extra(_addr(p.extra), 3)
        g.ops.append(gpu.kernel(_addr(p.func), args))
        assert p.gridDim.x >= 1 and p.blockDim.x >= 1
        return object()

    hip_handlers: dict[str, Callable[..., Any]] = {
        **{k: v for k, v in h.items() if not k.startswith("_")},
        "hipGetDeviceCount": lambda: 1,
        "hipSetDevice": lambda d: None,
        "hipDeviceSynchronize": h["_sync_all"],
        "hipGetDeviceProperties": lambda d: props,
        "hipDeviceGetPCIBusId": lambda n, d: "0000:c1:00.0",
        "hipMemGetInfo": lambda: (gpu.total - sum(map(len, gpu.mem.values())), gpu.total),
        "hipMalloc": gpu.alloc,
        "hipFree": h["_free"],
        "hipHostMalloc": h["_host_alloc"],
        "hipHostFree": h["_host_free"],
        "hipStreamCreateWithFlags": h["_stream_create"],
        "hipStreamIsCapturing": lambda s: 1 if gpu.stream(s).capture is not None else 0,
        "hipEventCreateWithFlags": lambda flags: SimEvent(),
        "hipModuleLaunchKernel": h["_launch"],
        "hipGraphAddMemsetNode": memset_node,
        "hipGraphAddMemcpyNode1D": memcpy_node,
        "hipGraphAddKernelNode": kernel_node,
        "hipGraphInstantiateWithFlags": h["_instantiate"],
    }

    def create(src: bytes, name: bytes, n: int, headers: Any, includes: Any) -> SimProgram:
        assert n == 0
        return SimProgram(src, {})

    def compile_(prog: SimProgram, n: int, opts: list[bytes]) -> None:
        code = _sim_compile(gpu, prog, opts, needs_header=False)
        if code:
            raise _Fail(code)

    rtc_handlers: dict[str, Callable[..., Any]] = {
        "hiprtcCreateProgram": create,
        "hiprtcCompileProgram": compile_,
        "hiprtcGetProgramLogSize": lambda prog: len(prog.log) + 1,
        "hiprtcGetProgramLog": lambda prog, buf: _fill_c_buffer(buf, prog.log + b"\0"),
        "hiprtcGetCodeSize": lambda prog: len(prog.image),
        "hiprtcGetCode": lambda prog, buf: _fill_c_buffer(buf, prog.image),
        "hiprtcDestroyProgram": lambda prog: None,
    }
    return SimBinding(hip, gpu, hip_handlers), SimBinding(hiprtc, gpu, rtc_handlers)


def _make(kind: str, native: bool = False) -> tuple[Any, SimGpu]:
    """A GPU backend of ``kind`` over a simulated runtime; with ``native``, the runtime
    offers C entry points for the native launch-and-wait (``gpu.native``)."""
    gpu = SimGpu()
    if kind == "cuda":
        if not HAVE_CUDA_BINDINGS:
            pytest.skip("cuda-bindings absent")
        from hipr.backends.cuda_backend import CudaBackend

        drv, rtc = make_sim_cuda(gpu)
        if native:
            gpu.native = drv.native_entries = SimNativeEntries(  # type: ignore[attr-defined]
                drv, "cuLaunchKernel", "cuStreamQuery", CudaRuntime.not_ready
            )
        return CudaBackend(_driver=drv, _nvrtc=rtc), gpu
    if not HAVE_HIP_PYTHON:
        pytest.skip("hip-python absent")
    from hipr.backends.hip_backend import HipBackend

    hip_mod, rtc_mod = make_sim_hip(gpu)
    if native:
        gpu.native = hip_mod.native_entries = SimNativeEntries(  # type: ignore[attr-defined]
            hip_mod, "hipModuleLaunchKernel", "hipStreamQuery", HipRuntime.not_ready
        )
    return HipBackend(_hip=hip_mod, _hiprtc=rtc_mod), gpu


@pytest.fixture(params=["cuda", "hip"])
def sim(request: pytest.FixtureRequest) -> Any:
    backend, gpu = _make(str(request.param))
    backend.bind_thread(0)
    yield backend, gpu
    backend.close()
    assert not gpu.host, "close() left pinned host memory behind"


def _fill_args(ptr: int, value: float, n: int) -> bytes:
    return struct.pack("<Qf4xQ", ptr, value, n)


def test_sim_is_a_backend(sim: Any) -> None:
    backend, _ = sim
    assert isinstance(backend, Backend)


def test_sim_device_properties(sim: Any) -> None:
    backend, gpu = sim
    props = backend.device_properties(0)
    if backend.name == "cuda":
        assert (props.name, props.arch, props.warp_size) == ("Sim H100", "sm_90", 32)
        assert props.pci_bus_id == "0000:9a:00.0" and props.clock_rate_khz == 1_980_000
    else:
        assert (props.name, props.arch, props.warp_size) == (
            "Sim MI300X",
            "gfx942:sramecc+:xnack-",
            64,
        )
        assert props.pci_bus_id == "0000:c1:00.0" and (props.major, props.minor) == (9, 4)
    assert props.total_memory == gpu.total and props.max_threads_per_block == 1024
    assert backend.device_count() == 1
    with pytest.raises(HipError) as info:
        backend.device_properties(1)
    assert info.value.code == E.hipErrorInvalidDevice
    free, total = backend.mem_get_info()
    assert free == total == gpu.total


def test_sim_memory_and_copies(sim: Any) -> None:
    backend, gpu = sim
    a = backend.malloc(100)
    b = backend.malloc(100)
    assert backend.stats().allocations == 2 and backend.stats().allocated_bytes == 200
    assert backend.malloc(0) == 0
    backend.free(0)
    stream = backend.stream_create()
    for s in (None, stream):
        backend.memset(a, 0, 100, s)
        backend.memcpy_htod(a + 3, memoryview(b"abcde"), s)
        backend.memcpy_dtod(b + 10, a + 3, 5, s)
        out = bytearray(7)
        backend.memcpy_dtoh(memoryview(out), b + 9, s)
        assert bytes(out) == b"\0abcde\0"
    backend.memcpy_htod(a, memoryview(b""), stream)  # size 0: nothing to do
    with pytest.raises(HipError) as info:
        backend.malloc(gpu.total * 2)
    assert info.value.code == E.hipErrorOutOfMemory
    backend.stream_destroy(stream)
    backend.free(a)
    backend.free(b)
    assert backend.stats().is_zero()


def test_sim_async_htod_source_may_be_reused_at_once(sim: Any) -> None:
    backend, gpu = sim
    stream = backend.stream_create()
    ptr = backend.malloc(1000)
    src = bytearray(b"\x11" * 1000)
    backend.memcpy_htod(ptr, memoryview(src), stream)
    assert gpu.read(ptr, 1) == b"\0"  # still queued, as on a GPU
    src[:] = b"\x22" * 1000
    backend.stream_synchronize(stream)
    assert gpu.read(ptr, 1000) == b"\x11" * 1000
    # the pinned block comes back once its fence completed, and is reused
    backend.memcpy_htod(ptr, memoryview(src), stream)
    backend.stream_synchronize(stream)
    assert len(gpu.host) == 1
    backend.free(ptr)
    backend.stream_destroy(stream)


def test_sim_async_htod_from_a_payload_buffer_is_not_staged(sim: Any) -> None:
    """A copy on a stream whose bytes sit in a pinned payload buffer (an upload's chunk)
    DMAs from that buffer: no staging block, and the buffer stays lent, whoever else
    lets go of it, until a fence behind the copy has passed; the bytes land whole."""
    backend, gpu = sim
    size = 10_320  # past the copies carved from a stream's block (MAX_CARVED)
    assert size > PinnedStaging.MAX_CARVED
    assert backend.reserve_payload_buffers(2, 1 << 16) == 2
    stream = backend.stream_create()
    ptr = backend.malloc(size)
    chunk = backend.payload_buffer(size)
    assert chunk is not None
    body = bytes(range(256)) * 40 + b"\x05" * 80
    chunk[:] = body
    pinned_before = len(gpu.host)
    backend.memcpy_htod(ptr, chunk[4:], stream)  # as a DATA frame's bulk after its prefix
    assert backend._staging.outstanding == 0 and len(gpu.host) == pinned_before
    del chunk
    assert backend.payload_buffer_figures()["in_use"] == 1  # held by the copy
    assert gpu.read(ptr, 1) == b"\0"  # still queued, as on a GPU
    backend.stream_synchronize(stream)  # the fence passes; the hold is let go
    assert gpu.read(ptr, size - 4) == body[4:]
    assert backend.payload_buffer_figures()["in_use"] == 0
    # A program that polls instead: a query that finds the work done lets go too.
    chunk = backend.payload_buffer(size)
    assert chunk is not None
    backend.memcpy_htod(ptr, chunk[4:], stream)
    del chunk
    assert backend.payload_buffer_figures()["in_use"] == 1
    gpu.run_all()  # the device finished, nobody synchronized
    assert backend.stream_query(stream)
    assert backend.payload_buffer_figures()["in_use"] == 0
    # A buffer of the caller's own is staged as before (and may be reused at once).
    mine = bytearray(b"\x09" * size)
    backend.memcpy_htod(ptr, memoryview(mine), stream)
    assert backend._staging.outstanding == 1
    backend.stream_synchronize(stream)
    assert gpu.read(ptr, 4) == b"\x09" * 4
    backend.free(ptr)
    backend.stream_destroy(stream)


def test_pinned_payloads_know_their_own_bytes() -> None:
    ops = _Ops()
    payloads = PinnedPayloads(ops)
    assert not payloads.owns(12345, 1)  # none reserved
    assert payloads.reserve(3, 4096) == 3
    starts = sorted(ops.live)
    for start in starts:
        assert payloads.owns(start, 4096) and payloads.owns(start + 4000, 96)
        assert not payloads.owns(start + 4000, 97)  # runs past the buffer
        assert not payloads.owns(start - 1, 2)
    mine = ctypes.create_string_buffer(64)
    assert not payloads.owns(ctypes.addressof(mine), 64)
    assert payloads.close() == 0 and not payloads.owns(starts[0], 1)


def test_pinned_staging_holds_objects_until_their_fence() -> None:
    ops = _Ops()
    staging = PinnedStaging(ops)
    held = bytearray(8)
    fence = ops.fence_after(None)
    staging.hold([fence], [held])
    before = sys.getrefcount(held)
    staging.reclaim()
    assert sys.getrefcount(held) == before  # the fence has not passed
    fence[0] = True
    staging.reclaim()
    assert sys.getrefcount(held) == before - 1  # let go
    staging.close(wait=lambda: None)


def _count(gpu: SimGpu, suffix: str) -> int:
    return sum(1 for name in gpu.calls if name.endswith(suffix))


def test_sim_small_async_copies_are_carved_from_one_block_per_stream(sim: Any) -> None:
    backend, gpu = sim
    piece = PinnedStaging.CARVE_ALIGN
    per_block = PinnedStaging.MIN_BLOCK // piece
    count = per_block + per_block // 2  # a full block, then half of the next
    ptr = backend.malloc(4 * count)
    stream, other = backend.stream_create(), backend.stream_create()
    src = bytearray(4)
    records = _count(gpu, "EventRecord")
    for i in range(count):
        src[:] = i.to_bytes(4, "little")
        backend.memcpy_htod(ptr + 4 * i, memoryview(src), stream)
    src[:] = b"\xff" * 4  # reused at once: every copy read its own staged bytes
    # One fence for the block that filled up, none per copy; a second stream has a
    # block of its own.
    assert _count(gpu, "EventRecord") == records + 1
    backend.memcpy_htod(ptr, memoryview(b"\x07\x00\x00\x00"), other)
    assert gpu.read(ptr, 4) == b"\0" * 4  # still queued, as on a GPU
    backend.stream_synchronize(stream)
    got = np.frombuffer(gpu.read(ptr, 4 * count), np.uint32)
    assert np.array_equal(got, np.arange(count, dtype=np.uint32))
    backend.stream_synchronize(other)
    assert gpu.read(ptr, 4) == b"\x07\x00\x00\x00"
    # A copy over the carve size is staged in a block of its own, as before.
    backend.memcpy_htod(ptr, memoryview(bytes(PinnedStaging.MAX_CARVED + 1)[: 4 * count]), stream)
    backend.stream_synchronize(stream)
    # Destroying a stream retires its block behind a fence; once done, all come back.
    backend.stream_destroy(stream)
    backend.stream_destroy(other)
    backend.synchronize()
    assert backend._staging.outstanding == 0
    host_blocks = len(gpu.host)
    for _ in range(3):  # a new stream carves from a pooled block: no new pinned memory
        again = backend.stream_create()
        backend.memcpy_htod(ptr, memoryview(src), again)
        backend.stream_destroy(again)
        backend.synchronize()
    assert len(gpu.host) == host_blocks
    backend.free(ptr)


def test_sim_carve_blocks_of_streams_never_destroyed_are_freed_at_close(sim: Any) -> None:
    backend, gpu = sim
    ptr = backend.malloc(4)
    stream = backend.stream_create()
    backend.memcpy_htod(ptr, memoryview(b"abcd"), stream)
    assert gpu.host  # the stream's carve block
    backend.close()  # the fixture checks that no pinned memory is left
    assert gpu.read(ptr, 4) == b"abcd"  # close waited for the copy before freeing


def test_small_copies_on_a_stream_may_run_inline(sim: Any) -> None:
    backend, _ = sim
    quick = backend.inline_when["memcpy_htod"]
    stream = backend.stream_create()
    small = memoryview(bytes(PinnedStaging.MAX_CARVED))
    assert quick(0, small, stream)
    assert not quick(0, memoryview(bytes(PinnedStaging.MAX_CARVED + 1)), stream)
    assert not quick(0, small, None)  # the default stream's copy waits for it to finish
    assert not quick(0, small)
    backend.stream_destroy(stream)


def test_sim_many_small_copies(sim: Any) -> None:
    """memcpy_htod_many: on the default stream every piece is issued and one synchronise
    covers them all; on a stream each is carved; either way each lands in its place and
    the source may be reused at once."""
    backend, gpu = sim
    count = 50
    ptr = backend.malloc(4 * count)
    src = bytearray(np.arange(count, dtype=np.uint32).tobytes())
    pieces = [(ptr + 4 * i, memoryview(src)[4 * i : 4 * i + 4]) for i in range(count)]
    syncs = _count(gpu, "StreamSynchronize")
    backend.memcpy_htod_many(pieces, None)
    assert _count(gpu, "StreamSynchronize") == syncs + 1
    src[:] = bytes(len(src))
    assert np.array_equal(
        np.frombuffer(gpu.read(ptr, 4 * count), np.uint32), np.arange(count, dtype=np.uint32)
    )
    stream = backend.stream_create()
    records = _count(gpu, "EventRecord")
    queries = _count(gpu, "StreamIsCapturing")
    backend.memcpy_htod_many([(ptr, memoryview(b"\x07\x00\x00\x00"))] * 3, stream)
    assert _count(gpu, "EventRecord") == records  # carved: no fence per copy
    assert _count(gpu, "StreamIsCapturing") == queries + 1  # one look for the batch
    backend.stream_synchronize(stream)
    assert gpu.read(ptr, 4) == b"\x07\x00\x00\x00"
    # A piece too large to carve, between carved ones: staged its own way, in order.
    big = bytes(range(256)) * ((PinnedStaging.MAX_CARVED + 256) // 256)
    bigptr = backend.malloc(len(big))
    src[:] = np.arange(count, dtype=np.uint32).tobytes()
    backend.memcpy_htod_many(
        [(ptr, memoryview(src)[:4]), (bigptr, memoryview(big)), (ptr + 4, memoryview(src)[4:8])],
        stream,
    )
    src[:] = bytes(len(src))  # reusable at once
    backend.stream_synchronize(stream)
    assert gpu.read(bigptr, len(big)) == big
    assert np.frombuffer(gpu.read(ptr, 8), np.uint32).tolist() == [0, 1]
    backend.free(bigptr)
    quick = backend.inline_when["memcpy_htod_many"]
    assert quick(pieces, stream)
    assert not quick(pieces, None)  # the default stream's copies wait for their end
    assert not quick([(ptr, memoryview(bytes(PinnedStaging.MAX_CARVED + 1)))], stream)
    backend.stream_destroy(stream)
    backend.free(ptr)


def test_sim_small_copies_on_a_stream_go_as_one_batch(sim: Any) -> None:
    """A MEMCPY_HTOD_MANY's pieces, destinations apart, side by side in one carved region
    on a stream or in the caller's bytes on the default stream: one batch call on CUDA
    (hip-python cannot pass HIP's, so one call each there), the sources reusable at once;
    a batch that no longer fits the carve block gets a fresh one."""
    backend, gpu = sim
    batched = backend.name == "cuda"
    count = 40
    ptr = backend.malloc(4 * count)
    stream = backend.stream_create()
    src = bytearray(np.arange(count, dtype=np.uint32).tobytes())
    pieces = [(ptr + 4 * i, memoryview(src)[4 * i : 4 * i + 4]) for i in range(count)]
    batches, singles = _count(gpu, "MemcpyBatchAsync"), _count(gpu, "MemcpyHtoDAsync")
    backend.memcpy_htod_many(pieces, stream)
    src[:] = bytes(len(src))
    assert _count(gpu, "MemcpyBatchAsync") == batches + batched
    assert _count(gpu, "MemcpyHtoDAsync") == singles + (0 if batched else count)
    backend.stream_synchronize(stream)
    assert np.frombuffer(gpu.read(ptr, 4 * count), np.uint32).tolist() == list(range(count))
    # The default stream's pieces too: one batch, then the one synchronise.
    src[:] = np.arange(count, 2 * count, dtype=np.uint32).tobytes()
    batches = _count(gpu, "MemcpyBatchAsync")
    backend.memcpy_htod_many(pieces, None)
    assert _count(gpu, "MemcpyBatchAsync") == batches + batched
    got = np.frombuffer(gpu.read(ptr, 4 * count), np.uint32).tolist()
    assert got == list(range(count, 2 * count))
    # Two batches of ten 4 KiB pieces: the second does not fit what the first left of the
    # carve block, which retires behind a fence recorded after the first batch's copies;
    # and a batch larger than a block goes piece by piece.
    size = PinnedStaging.MAX_CARVED
    big = backend.malloc(40 * size)
    data = bytes(range(256)) * (40 * size // 256)
    fresh = backend.stream_create()

    def run(first: int, count: int) -> list[str]:
        start = len(gpu.calls)
        chunk = [
            (big + i * size, memoryview(data)[i * size : (i + 1) * size])
            for i in range(first, first + count)
        ]
        backend.memcpy_htod_many(chunk, fresh)
        return gpu.calls[start:]

    for first in (0, 10):
        calls = run(first, 10)
        assert sum(c.endswith("MemcpyBatchAsync") for c in calls) == batched
    calls = run(20, 20)  # 80 KiB: more than a block
    assert not any(c.endswith("MemcpyBatchAsync") for c in calls)
    assert sum(c.endswith("MemcpyHtoDAsync") for c in calls) == 20
    backend.stream_synchronize(fresh)
    assert gpu.read(big, len(data)) == data
    for s in (stream, fresh):
        backend.stream_destroy(s)
    backend.free(big)
    backend.free(ptr)


def test_sim_overlapping_small_copies_keep_their_order(sim: Any) -> None:
    """Pieces that write a byte in common go one call each, in order (a batch keeps no
    order: the simulated one runs its copies last to first): the last one wins."""
    backend, gpu = sim
    ptr = backend.malloc(8)
    stream = backend.stream_create()
    batches = _count(gpu, "MemcpyBatchAsync")
    backend.memcpy_htod_many(
        [
            (ptr, memoryview(b"\x01\x01\x01\x01")),
            (ptr + 4, memoryview(b"\x02\x02\x02\x02")),
            (ptr + 2, memoryview(b"\x03\x03\x03\x03")),
        ],
        stream,
    )
    backend.stream_synchronize(stream)
    assert _count(gpu, "MemcpyBatchAsync") == batches
    assert gpu.read(ptr, 8) == b"\x01\x01\x03\x03\x03\x03\x02\x02"
    backend.stream_destroy(stream)
    backend.free(ptr)


def test_sim_a_driver_without_batches_gets_one_call_per_copy() -> None:
    """A driver older than its binding turns the first batch down as unsupported: those
    copies go one call each, and so do later ones, without asking again; any other
    failure of a batch is the copies' own, raised as a single copy's would be."""
    backend, gpu = _make("cuda")
    try:
        backend.bind_thread(0)
        ptr = backend.malloc(16)
        stream = backend.stream_create()
        words = [(ptr + 4 * i, memoryview(bytes([i + 1]) * 4)) for i in range(4)]
        gpu.batch_result = 1  # CUDA_ERROR_INVALID_VALUE: these copies are wrong
        with pytest.raises(HipError) as err:
            backend.memcpy_htod_many(words, stream)
        assert err.value.code == HipErrorCode.hipErrorInvalidValue
        gpu.batch_result = 801  # CUDA_ERROR_NOT_SUPPORTED
        singles = _count(gpu, "MemcpyHtoDAsync")
        backend.memcpy_htod_many(words, stream)
        assert _count(gpu, "MemcpyHtoDAsync") == singles + 4
        batches = _count(gpu, "MemcpyBatchAsync")
        backend.memcpy_htod_many(words, stream)
        assert _count(gpu, "MemcpyBatchAsync") == batches  # not asked again
        backend.stream_synchronize(stream)
        assert gpu.read(ptr, 16) == b"".join(bytes([i + 1]) * 4 for i in range(4))
        backend.stream_destroy(stream)
        backend.free(ptr)
    finally:
        backend.close()


def test_sim_builtins_launch_with_packed_args(sim: Any) -> None:
    backend, gpu = sim
    mod = backend.builtin_module()
    assert backend.builtin_module() is mod  # once per device
    fill = backend.module_get_function(mod, "fill_f32")
    probe = backend.module_get_function(mod, "mixed_args_probe")
    with pytest.raises(HipError) as info:
        backend.module_get_function(mod, "nope")
    assert info.value.code == E.hipErrorNotFound
    n = 10
    x = backend.malloc(4 * n)
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(x, 2.5, n))
    out = np.empty(n, np.float32)
    backend.memcpy_dtoh(out.data, x)
    assert (out == 2.5).all()
    d = backend.malloc(8 * n)
    args = struct.pack("<Qb3xif4xdh6xb7xdh6xQ", d, -7, 1000, 1.5, 0.25, -3, 5, 2.5, -2, n)
    assert len(args) == 72
    backend.launch(probe, (1, 1, 1), (64, 1, 1), 0, None, args)
    got = np.empty(n, np.float64)
    backend.memcpy_dtoh(got.data, d)
    assert np.array_equal(got, -7 + 1000 + 1.5 + 0.25 - 3 + 5 + 2.5 - 2 + np.arange(n))
    assert gpu.launches[-1] == ("mixed_args_probe", args)  # bytes arrived unchanged
    with pytest.raises(HipError) as info:
        backend.launch(fill, (1, 1, 1), (2048, 1, 1), 0, None, _fill_args(x, 1.0, n))
    assert info.value.code == E.hipErrorInvalidValue
    with pytest.raises(HipError) as info:
        backend.launch(fill, (0, 1, 1), (32, 1, 1), 0, None, _fill_args(x, 1.0, n))
    assert info.value.code == E.hipErrorInvalidConfiguration
    backend.module_unload(mod)  # the shared built-in module stays loaded
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(x, 1.0, n))
    backend.free(x)
    backend.free(d)
    assert backend.stats().is_zero()


def test_sim_launcher_runs_a_batch_as_launch_would(sim: Any) -> None:
    """``launcher``: one configuration made ready once, then one call per launch; the
    same bytes reach the runtime as through ``launch``, tail padding is trimmed, a
    launch the runtime refuses fails alone, and a bad configuration fails at once."""
    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    n = 8
    x = backend.malloc(4 * n)
    stream = backend.stream_create()
    launch = backend.launcher(fill, (1, 1, 1), (32, 1, 1), 0, stream)
    before = len(gpu.launches)
    for value in (1.0, 2.0, 3.0):
        launch(_fill_args(x, value, n))
    launch(_fill_args(x, 4.0, n) + b"\0" * 8)  # a sizeof-style packer's tail
    backend.stream_synchronize(stream)
    sent = [args for _, args in gpu.launches[before:]]
    assert sent[:3] == [_fill_args(x, v, n) for v in (1.0, 2.0, 3.0)]
    # CUDA refuses a padded buffer, so the tail goes, as in launch(); HIP takes it.
    padded = _fill_args(x, 4.0, n) + (b"" if backend.name == "cuda" else b"\0" * 8)
    assert sent[3] == padded
    out = np.empty(n, np.float32)
    backend.memcpy_dtoh(out.data, x)
    assert (out == 4.0).all()
    too_big = backend.launcher(fill, (1, 1, 1), (2048, 1, 1), 0, None)
    with pytest.raises(HipError) as info:
        too_big(_fill_args(x, 1.0, n))
    assert info.value.code == E.hipErrorInvalidValue
    with pytest.raises(HipError) as info:
        backend.launcher(fill, (0, 1, 1), (32, 1, 1), 0, None)
    assert info.value.code == E.hipErrorInvalidConfiguration
    backend.stream_destroy(stream)
    with pytest.raises(HipError) as info:
        backend.launcher(fill, (1, 1, 1), (32, 1, 1), 0, stream)
    assert info.value.code == E.hipErrorInvalidHandle
    backend.free(x)


def test_sim_a_batch_of_launches_fails_launch_by_launch(sim: Any) -> None:
    """The worker's LAUNCH_KERNELS runs its launches through the backend's launcher: a
    launch that fails stops none after it and is named in the batch's error; a
    configuration that cannot launch at all fails the batch naming its first launch."""
    from hipr.handlers.module import _launch_each

    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    x = backend.malloc(16)

    def name_of(index: int) -> str:
        return f"LAUNCH_KERNELS (launch {index + 1} of 3)"

    good = [(0, _fill_args(x, 1.0, 4)), (2, _fill_args(x, 3.0, 4))]
    if backend.name == "cuda":  # CUDA refuses arguments past the kernel's parameters
        junk = _fill_args(x, 2.0, 4) + b"\1" + b"\0" * 7
        with pytest.raises(HipError, match=r"launch 2 of 3") as info:
            _launch_each(
                backend,
                (fill, (1, 1, 1), (4, 1, 1), 0, None),
                [good[0], (1, junk), good[1]],
                name_of,
            )
        assert info.value.code == E.hipErrorLaunchOutOfResources
        backend.synchronize()
        assert np.frombuffer(gpu.read(x, 16), np.float32).tolist() == [3.0] * 4
    stream = backend.stream_create()
    backend.stream_destroy(stream)
    before = len(gpu.launches)
    with pytest.raises(HipError, match=r"launch 1 of 3") as info:
        _launch_each(backend, (fill, (1, 1, 1), (4, 1, 1), 0, stream), good, name_of)
    assert info.value.code == E.hipErrorInvalidHandle
    assert len(gpu.launches) == before
    backend.free(x)


def test_sim_compile(sim: Any) -> None:
    backend, gpu = sim
    image = backend.compile(BUILTIN_SOURCE, "k.hip", ["-O3"])
    assert backend.compile(BUILTIN_SOURCE, "k.hip", ["-O3"]) == image
    assert len(gpu.compiles) == 1  # the second came from the cache
    opts = gpu.compiles[0]
    assert opts[0] == (
        "--gpu-architecture=sm_90"
        if backend.name == "cuda"
        else "--offload-arch=gfx942:sramecc+:xnack-"
    )
    mod = backend.module_load(image)
    assert backend.stats().modules == 1
    backend.module_get_function(mod, "axpy_f32")
    backend.module_unload(mod)
    assert backend.stats().modules == 0
    with pytest.raises(HipError) as info:
        backend.module_unload(mod)
    assert info.value.code == E.hipErrorInvalidHandle
    broken = (
        "#include <hip/hip_runtime.h>\n"
        'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }'
    )
    with pytest.raises(HipError) as info:
        backend.compile(broken, "broken.hip", [])
    assert info.value.code == E.hipErrorInvalidSource
    assert 'identifier "undefined_name" is undefined' in info.value.message
    assert "broken.hip" in info.value.message
    with pytest.raises(HipError) as info:
        backend.compile(BUILTIN_SOURCE, "k.hip", ["--no-such-flag"])
    assert info.value.code == E.hipErrorInvalidValue
    with pytest.raises(HipError) as info:
        backend.module_load(b"not an image")
    assert info.value.code == E.hipErrorInvalidImage


def test_sim_cuda_virtual_arch_gives_ptx() -> None:
    backend, _ = _make("cuda")
    ptx = backend.compile(BUILTIN_SOURCE, "k.hip", ["--gpu-architecture=compute_90"])
    assert ptx.endswith(b"\0")
    backend.close()


def test_sim_events_and_streams(sim: Any) -> None:
    backend, _ = sim
    s1, s2 = backend.stream_create(), backend.stream_create()
    e1, e2 = backend.event_create(), backend.event_create()
    backend.event_record(e1, s1)
    assert not backend.event_query(e1)  # queued, not yet run
    backend.stream_wait_event(s2, e1)
    backend.event_record(e2, s1)
    backend.event_synchronize(e2)
    assert backend.event_query(e1) and backend.event_query(e2)
    assert backend.event_elapsed_ms(e1, e2) == 0.25
    assert backend.stream_query(s1) and backend.stream_query(None)
    assert backend.stats().streams == 2 and backend.stats().events == 2
    for e in (e1, e2):
        backend.event_destroy(e)
    for s in (s1, s2):
        backend.stream_destroy(s)
    with pytest.raises(HipError) as info:
        backend.stream_synchronize(s1)
    assert info.value.code == E.hipErrorInvalidHandle
    with pytest.raises(HipError) as info:
        backend.event_record("not an event", None)
    assert info.value.code == E.hipErrorInvalidHandle
    assert backend.stats().is_zero()


def test_sim_graph_capture_keeps_staged_source(sim: Any) -> None:
    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "scale_f32")
    n = 8
    s = backend.stream_create()
    a, b = backend.malloc(4 * n), backend.malloc(4 * n)
    src = bytearray(np.arange(n, dtype=np.float32).tobytes())
    backend.stream_begin_capture(s)
    backend.memcpy_htod(a, memoryview(src), s)
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, s, _fill_args(a, 2.0, n))
    backend.memcpy_dtod(b, a, 4 * n, s)
    with pytest.raises(HipError) as info:
        backend.memcpy_dtoh(memoryview(bytearray(4)), a, s)  # cannot complete while capturing
    assert info.value.code == E.hipErrorStreamCaptureUnsupported
    graph = backend.stream_end_capture(s)
    src[:] = b"\0" * len(src)
    gexec = backend.graph_instantiate(graph)
    backend.graph_destroy(graph)
    assert len(gpu.host) == 1  # the staged block lives with the exec
    backend.graph_launch(gexec, s)
    backend.graph_launch(gexec, s)
    backend.stream_synchronize(s)
    out = np.empty(n, np.float32)
    backend.memcpy_dtoh(out.data, b)
    assert np.array_equal(out, np.arange(n, dtype=np.float32) * 2)
    assert backend.stats().graphs == 0 and backend.stats().graph_execs == 1
    backend.graph_exec_destroy(gexec)
    backend.synchronize()
    backend.free(a)
    backend.free(b)
    backend.stream_destroy(s)
    assert backend.stats().is_zero()


def test_sim_captured_batch_of_small_copies_keeps_its_sources(sim: Any) -> None:
    """memcpy_htod_many into a stream being captured: each piece is staged as a captured
    memcpy_htod stages it (its block lives with the graph), never carved."""
    backend, gpu = sim
    s = backend.stream_create()
    x = backend.malloc(8)
    src = bytearray(b"\1\2\3\4\5\6\7\x08")
    backend.stream_begin_capture(s)
    backend.memcpy_htod_many([(x, memoryview(src)[:4]), (x + 4, memoryview(src)[4:])], s)
    graph = backend.stream_end_capture(s)
    src[:] = bytes(8)
    gexec = backend.graph_instantiate(graph)
    backend.graph_destroy(graph)
    assert gpu.read(x, 8) == bytes(8)  # recorded, not run
    backend.graph_launch(gexec, s)
    backend.stream_synchronize(s)
    assert gpu.read(x, 8) == b"\1\2\3\4\5\6\7\x08"
    backend.graph_exec_destroy(gexec)
    backend.free(x)
    backend.stream_destroy(s)
    backend.synchronize()
    assert backend.stats().is_zero()


def test_sim_graph_capture_on_default_stream(sim: Any) -> None:
    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    x = backend.malloc(16)
    backend.stream_begin_capture(None)
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(x, 4.0, 4))
    backend.memset(x, 0, 4)  # recorded, not run, and no synchronise inside a capture
    backend.memcpy_htod(x + 4, memoryview(b"\1\2\3\4"))
    graph = backend.stream_end_capture(None)
    assert gpu.read(x, 16) == b"\0" * 16
    gexec = backend.graph_instantiate(graph)
    backend.graph_launch(gexec, None)
    backend.synchronize()
    out = gpu.read(x, 16)
    assert out[:4] == b"\0" * 4 and out[4:8] == b"\1\2\3\4"
    assert np.frombuffer(out[8:], np.float32).tolist() == [4.0, 4.0]
    backend.graph_exec_destroy(gexec)
    backend.graph_destroy(graph)
    backend.free(x)


def test_sim_graph_explicit(sim: Any) -> None:
    backend, gpu = sim
    mod = backend.builtin_module()
    fill = backend.module_get_function(mod, "fill_f32")
    scale = backend.module_get_function(mod, "scale_f32")
    n = 6
    a, b = backend.malloc(4 * n), backend.malloc(4 * n)
    g = backend.graph_create()
    n1 = backend.graph_add_memset(g, [], a, 0xFF, 4 * n)
    n2 = backend.graph_add_kernel(g, [n1], fill, (1, 1, 1), (32, 1, 1), 0, _fill_args(a, 3.0, n))
    n3 = backend.graph_add_memcpy(g, [n2], b, a, 4 * n)
    backend.graph_add_kernel(g, [n3], scale, (1, 1, 1), (32, 1, 1), 0, _fill_args(b, 2.0, n))
    backend.graph_add_memset(g, [n3], b, 0, 0)
    backend.graph_add_memcpy(g, [], b, a, 0)
    gexec = backend.graph_instantiate(g)
    backend.graph_launch(gexec, None)
    backend.synchronize()
    assert np.frombuffer(gpu.read(b, 4 * n), np.float32).tolist() == [6.0] * n
    backend.graph_exec_destroy(gexec)
    backend.graph_destroy(g)
    with pytest.raises(HipError):
        backend.graph_destroy(g)
    backend.free(a)
    backend.free(b)
    assert backend.stats().is_zero()


def test_sim_illegal_address_surfaces_at_sync(sim: Any) -> None:
    backend, _ = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(0x10, 1.0, 4))  # async
    with pytest.raises(HipError) as info:
        backend.synchronize()
    assert info.value.code == E.hipErrorIllegalAddress


def test_sim_tail_padding_is_trimmed_but_junk_is_not(sim: Any) -> None:
    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    x = backend.malloc(16)
    padded = _fill_args(x, 5.0, 4) + b"\0" * 8  # a sizeof-style packer's tail
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, padded)
    g = backend.graph_create()
    backend.graph_add_kernel(g, [], fill, (1, 1, 1), (32, 1, 1), 0, padded)
    backend.graph_destroy(g)
    backend.synchronize()
    assert np.frombuffer(gpu.read(x, 16), np.float32).tolist() == [5.0] * 4
    junk = _fill_args(x, 5.0, 4) + b"\1" + b"\0" * 7
    if backend.name == "cuda":
        with pytest.raises(HipError) as info:
            backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, junk)
        assert info.value.code == E.hipErrorLaunchOutOfResources
        assert gpu.launches[-2][1] == _fill_args(x, 5.0, 4)  # trimmed to 24 bytes
    backend.free(x)


def test_sim_query_reports_an_asynchronous_failure(sim: Any) -> None:
    backend, _ = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(0x10, 1.0, 4))  # async
    with pytest.raises(HipError) as info:
        backend.stream_query(None)
    assert info.value.code == E.hipErrorIllegalAddress
    call = "cuStreamQuery" if backend.name == "cuda" else "hipStreamQuery"
    assert info.value.message.startswith(f"{call} failed: ")
    # Sticky, as on a GPU: the next synchronising call reports it again.
    with pytest.raises(HipError) as info:
        backend.synchronize()
    assert info.value.code == E.hipErrorIllegalAddress


def test_sim_graph_nodes_get_the_adapters_parameter_blocks(sim: Any) -> None:
    backend, gpu = sim
    x = backend.malloc(8)
    g = backend.graph_create()
    backend.graph_add_memset(g, [], x, 0x1AB, 8)  # only the low byte is a memset value
    n = backend.graph_add_memcpy(g, [], x + 4, x, 4)
    assert n is not None
    gexec = backend.graph_instantiate(g)
    backend.graph_launch(gexec, None)
    backend.synchronize()
    assert gpu.read(x, 8) == b"\xab" * 8
    node_calls = {c for c in gpu.calls if "GraphAdd" in c}
    expected = (
        {"cuGraphAddMemsetNode", "cuGraphAddMemcpyNode"}
        if backend.name == "cuda"
        else {"hipGraphAddMemsetNode", "hipGraphAddMemcpyNode1D"}
    )
    assert node_calls == expected
    backend.graph_exec_destroy(gexec)
    backend.graph_destroy(g)
    backend.free(x)


def test_sim_lane_borrowed_by_another_thread(sim: Any) -> None:
    """A session thread's lane run from the loop thread: work goes to the lane's default
    stream (in order with what the session thread issued), a capture begun there is the
    lane's, and the borrowing thread's own state comes back unchanged."""
    import threading

    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    x = backend.malloc(16)
    lanes: list[Any] = []
    streams: list[Any] = []

    def session_thread() -> None:
        backend.bind_thread(0)
        backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(x, 1.0, 4))
        lanes.append(backend.current_lane())
        streams.append(backend._default_stream())

    worker = threading.Thread(target=session_thread)
    worker.start()
    worker.join()
    lane = lanes[0]
    own_stream = backend._default_stream()
    assert own_stream is not streams[0]

    def borrowed() -> Any:
        backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, _fill_args(x, 2.0, 2))
        return backend._default_stream()

    assert backend.run_in_lane(lane, borrowed) is streams[0]
    assert backend._default_stream() is own_stream  # the borrower's state is back
    assert backend.run_in_lane(lane, backend.work_done, []) in (True, False)
    backend.run_in_lane(lane, backend.stream_begin_capture, None)
    assert getattr(lane, "ptds_capture", None) is not None
    assert getattr(backend._tls, "ptds_capture", None) is None
    graph = backend.run_in_lane(lane, backend.stream_end_capture, None)
    backend.graph_destroy(graph)
    backend.synchronize()
    assert np.frombuffer(gpu.read(x, 16), np.float32).tolist() == [2.0, 2.0, 1.0, 1.0]
    backend.run_in_lane(lane, backend.release_thread)  # as the session's teardown does
    assert not getattr(lane, "default_streams", {})
    backend.free(x)


@pytest.mark.anyio
async def test_a_worker_moves_bulk_copies_through_its_pinned_payload_buffers(
    sim: Any, anyio_backend: str, tmp_path: Path
) -> None:
    import hipr
    from hipr.handlers.admin import worker_status
    from hipr.observability.metrics import WorkerCollector
    from hipr.worker.config import WorkerConfig
    from hipr.worker.server import FRAME_HEADROOM, running_worker

    backend, _ = sim
    lent: list[int] = []
    take = backend.payload_buffer

    def payload_buffer(size: int) -> memoryview | None:
        view = take(size)
        if view is not None:
            lent.append(size)
        return view

    backend.payload_buffer = payload_buffer
    chunk = 4 << 20
    # Enough for an upload's read-ahead and copy pipeline (and the 64 MiB default's size).
    config = WorkerConfig(pinned_payload_bytes=16 * (chunk + FRAME_HEADROOM), resume_grace=0.0)
    data = np.random.default_rng(7).integers(0, 256, size=10 * chunk + 12345, dtype=np.uint8)
    with anyio.fail_after(60):
        async with running_worker(config, backend, [f"unix://{tmp_path}/w.sock"]) as worker:
            assert len(backend._payloads._blocks) == 16
            # Operators see them: the status call's figures and a gauge.
            status = worker_status(worker, None)["pinned_payload_buffers"]
            assert status == {"held": 16, "in_use": 0, "bytes": 16 * (chunk + FRAME_HEADROOM)}
            gauges = {
                sample.labels["state"]: sample.value
                for family in WorkerCollector(worker, telemetry=False).collect()
                if family.name == "hipr_pinned_payload_buffers"
                for sample in family.samples
            }
            assert gauges == {"held": 16, "in_use": 0}
            async with hipr.aconnect(worker.bound_urls[0]) as client:
                ptr = await client.malloc(data.nbytes)
                await client.memcpy_htod(ptr, data)
                back = np.empty_like(data)
                await client.memcpy_dtoh(ptr, out=back)
                assert np.array_equal(back, data)
                await client.free(ptr)
    # Every chunk of the download filled a pinned buffer; every chunk-sized frame of the
    # upload (its bytes after a few of arguments) landed in one where the loop receives
    # payloads into buffers of their own (asyncio's push mode; trio's stream hands over
    # bytes objects). The upload's short last frame is decoded as small frames are.
    download = [chunk] * 10 + [data.nbytes % chunk]
    upload = [size for size in lent if chunk < size <= chunk + FRAME_HEADROOM]
    assert sorted(set(lent) - set(upload)) == sorted(set(download))
    assert len(lent) - len(upload) == len(download)
    assert len(upload) == (10 if anyio_backend == "asyncio" else 0)
    assert backend._payloads.in_use() == 0


@pytest.mark.anyio
async def test_uploads_on_a_stream_read_their_payload_buffers_until_the_copy_ran(
    sim: Any, anyio_backend: str, tmp_path: Path
) -> None:
    """Uploads on a stream DMA straight from the pinned payload buffers they arrived in
    (asyncio's push mode), each buffer held until a fence behind its copy has passed. The
    simulated runtime runs a stream's copies only at its synchronize: a buffer lent out
    again before its copy ran would show here as wrong bytes."""
    import hipr
    from hipr.worker.config import WorkerConfig
    from hipr.worker.server import FRAME_HEADROOM, running_worker

    backend, _ = sim
    held: list[int] = []
    hold = backend._staging.hold

    def counted(fences: Any, objects: Any) -> None:
        held.append(len(objects))
        hold(fences, objects)

    backend._staging.hold = counted
    chunk = 4 << 20
    config = WorkerConfig(pinned_payload_bytes=16 * (chunk + FRAME_HEADROOM), resume_grace=0.0)
    rng = np.random.default_rng(11)
    uploads = [rng.integers(0, 256, size=3 * chunk + 777 * i, dtype=np.uint8) for i in range(5)]
    with anyio.fail_after(60):
        async with running_worker(config, backend, [f"unix://{tmp_path}/s.sock"]) as worker:
            async with hipr.aconnect(worker.bound_urls[0]) as client:
                stream = await client.stream_create()
                ptrs = [await client.malloc(u.nbytes) for u in uploads]
                for ptr, data in zip(ptrs, uploads, strict=True):
                    await client.memcpy_htod_async(ptr, data, stream)
                await stream.synchronize()
                for ptr, data in zip(ptrs, uploads, strict=True):
                    back = np.empty_like(data)
                    await client.memcpy_dtoh(ptr, out=back)
                    assert np.array_equal(back, data)
                    await client.free(ptr)
    # 20 chunks for 16 buffers, none free again before the synchronize: the first went
    # straight from their buffers, the rest (in pageable buffers) were staged. Under trio
    # the reader task hands payloads over as bytes: all staged.
    assert bool(held) == (anyio_backend == "asyncio")
    assert backend._payloads.in_use() == 0


@pytest.mark.anyio
async def test_a_worker_serves_when_its_backend_pins_buffers_of_another_size(
    sim: Any, anyio_backend: str, tmp_path: Path
) -> None:
    """A backend already holding payload buffers of another size (a second worker on it
    with another max_frame_bytes): the worker says so in its log and copies through
    pageable memory instead of failing to start."""
    import hipr
    from hipr.worker.config import WorkerConfig
    from hipr.worker.server import running_worker

    backend, _ = sim
    assert backend.reserve_payload_buffers(1, 4096) == 1
    data = np.arange(3 << 20, dtype=np.uint32).view(np.uint8)
    with anyio.fail_after(60), structlog.testing.capture_logs() as logs:
        async with running_worker(
            WorkerConfig(resume_grace=0.0), backend, [f"unix://{tmp_path}/w.sock"]
        ) as worker:
            async with hipr.aconnect(worker.bound_urls[0]) as client:
                ptr = await client.malloc(data.nbytes)
                await client.memcpy_htod(ptr, data)
                back = np.frombuffer(await client.memcpy_dtoh(ptr, data.nbytes), np.uint8)
                await client.free(ptr)
    assert np.array_equal(back, data)
    assert any(entry["event"] == "no pinned payload buffers" for entry in logs)
    assert backend.payload_buffer_figures() == {"held": 1, "in_use": 0, "bytes": 4096}


def test_sim_a_small_copy_back_is_made_quickly_or_not_at_all(
    sim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memcpy_dtoh_if_quick`` (PyTorch's ``item()`` on the worker's loop): the bytes of a
    stream's finished work, copied through a pinned block that goes back at once; or
    nothing, when the copy is too large, the stream is being captured, or its work had
    not ended within the poll. Then ``dst`` is untouched and the block goes back only
    once a fence behind the queued copy has passed; a failed stream raises, as the
    usual copy would, and gives the block back."""
    backend, gpu = sim
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    n = 4
    x = backend.malloc(4 * n)
    stream = backend.stream_create()
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, stream, _fill_args(x, 3.0, n))
    out = np.zeros(n, np.float32)
    assert backend.memcpy_dtoh_if_quick(out.data, x, stream, 1e-3)
    assert (out == 3.0).all() and backend._staging.outstanding == 0
    # The default stream, and an empty copy.
    out[:] = 0
    assert backend.memcpy_dtoh_if_quick(out.data, x, None, 1e-3) and (out == 3.0).all()
    assert backend.memcpy_dtoh_if_quick(memoryview(bytearray()), x, None, 1e-3)
    # Too large: nothing queued.
    big = backend.malloc(backend.quick_dtoh_bytes + 1)
    calls = len(gpu.calls)
    assert not backend.memcpy_dtoh_if_quick(
        memoryview(bytearray(backend.quick_dtoh_bytes + 1)), big, None, 1e-3
    )
    assert len(gpu.calls) == calls
    # Still running when the poll ends: dst untouched, the block held until its fence.
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, stream, _fill_args(x, 5.0, n))
    with monkeypatch.context() as patched:
        patched.setattr(backend, "_query", lambda fn, handle: False)
        out[:] = 0
        assert not backend.memcpy_dtoh_if_quick(out.data, x, stream, 0.0)
        assert (out == 0.0).all() and backend._staging.outstanding == 1
    backend.stream_synchronize(stream)  # the fence passes: the block goes back
    assert backend._staging.outstanding == 0
    # Being captured: refused before anything is queued.
    backend.stream_begin_capture(stream)
    assert not backend.memcpy_dtoh_if_quick(out.data, x, stream, 1e-3)
    backend.graph_destroy(backend.stream_end_capture(stream))
    # A failed stream (a faulted kernel): its error, the block back.
    gpu.sticky = 700
    with pytest.raises(HipError) as info:
        backend.memcpy_dtoh_if_quick(out.data, x, stream, 1e-3)
    assert info.value.code == E.hipErrorIllegalAddress
    gpu.sticky = 0
    assert backend._staging.outstanding == 0
    backend.stream_destroy(stream)
