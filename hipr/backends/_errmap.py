"""CUDA driver and NVRTC result codes translated to HIP's ``hipError_t``.

:data:`CU_RESULT_TO_HIP` is the one table for ``CUresult``. It follows the translation
HIP's own NVIDIA layer applies (``hipCUResultTohipError`` in hipamd's ``nvidia_detail``
headers), so a program sees on our cuda backend the code HIP-on-NVIDIA would give it.
Every mapped code happens to keep its number, but the table is explicit so that a
CUDA code HIP does not translate (``CUDA_ERROR_NOT_PERMITTED``, ``CUDA_ERROR_TIMEOUT``,
the MPS errors, ...) becomes ``hipErrorUnknown`` exactly as HIP does, instead of leaking
a number HIP code would not recognise.

It is keyed by the integer values of ``CUresult`` so it needs no cuda-bindings to be
read or tested. NVRTC and HIPRTC share one numbering for their results;
:data:`RTC_RESULT_TO_HIP` says which ``hipError_t`` each becomes when compiling.
"""

from __future__ import annotations

from typing import NamedTuple

from hipr.backends.sticky import STICKY_CU_RESULTS, mark_sticky
from hipr.errors import HipError, HipErrorCode, error_name

E = HipErrorCode


class CuMapping(NamedTuple):
    """One row: the CUDA name of a ``CUresult`` and the ``hipError_t`` it becomes."""

    cuda_name: str
    hip_code: int


#: hipError_t values HIP defines but :class:`HipErrorCode` does not list (HIP's
#: profiler and interop codes), so that messages still name them.
HIP_EXTRA_NAMES: dict[int, str] = {
    5: "hipErrorProfilerDisabled",
    6: "hipErrorProfilerNotInitialized",
    7: "hipErrorProfilerAlreadyStarted",
    8: "hipErrorProfilerAlreadyStopped",
    207: "hipErrorArrayIsMapped",
    208: "hipErrorAlreadyMapped",
    210: "hipErrorAlreadyAcquired",
    211: "hipErrorNotMapped",
    212: "hipErrorNotMappedAsArray",
    213: "hipErrorNotMappedAsPointer",
    214: "hipErrorECCNotCorrectable",
    216: "hipErrorContextAlreadyInUse",
    219: "hipErrorInvalidGraphicsContext",
}

#: ``CUresult`` value -> (CUDA name, hipError_t). Codes absent here map to hipErrorUnknown.
CU_RESULT_TO_HIP: dict[int, CuMapping] = {
    0: CuMapping("CUDA_SUCCESS", E.hipSuccess),
    1: CuMapping("CUDA_ERROR_INVALID_VALUE", E.hipErrorInvalidValue),
    2: CuMapping("CUDA_ERROR_OUT_OF_MEMORY", E.hipErrorOutOfMemory),
    3: CuMapping("CUDA_ERROR_NOT_INITIALIZED", E.hipErrorNotInitialized),
    4: CuMapping("CUDA_ERROR_DEINITIALIZED", E.hipErrorDeinitialized),
    5: CuMapping("CUDA_ERROR_PROFILER_DISABLED", 5),
    6: CuMapping("CUDA_ERROR_PROFILER_NOT_INITIALIZED", 6),
    7: CuMapping("CUDA_ERROR_PROFILER_ALREADY_STARTED", 7),
    8: CuMapping("CUDA_ERROR_PROFILER_ALREADY_STOPPED", 8),
    100: CuMapping("CUDA_ERROR_NO_DEVICE", E.hipErrorNoDevice),
    101: CuMapping("CUDA_ERROR_INVALID_DEVICE", E.hipErrorInvalidDevice),
    200: CuMapping("CUDA_ERROR_INVALID_IMAGE", E.hipErrorInvalidImage),
    201: CuMapping("CUDA_ERROR_INVALID_CONTEXT", E.hipErrorInvalidContext),
    202: CuMapping("CUDA_ERROR_CONTEXT_ALREADY_CURRENT", E.hipErrorContextAlreadyCurrent),
    205: CuMapping("CUDA_ERROR_MAP_FAILED", E.hipErrorMapFailed),
    206: CuMapping("CUDA_ERROR_UNMAP_FAILED", E.hipErrorUnmapFailed),
    207: CuMapping("CUDA_ERROR_ARRAY_IS_MAPPED", 207),
    208: CuMapping("CUDA_ERROR_ALREADY_MAPPED", 208),
    209: CuMapping("CUDA_ERROR_NO_BINARY_FOR_GPU", E.hipErrorNoBinaryForGpu),
    210: CuMapping("CUDA_ERROR_ALREADY_ACQUIRED", 210),
    211: CuMapping("CUDA_ERROR_NOT_MAPPED", 211),
    212: CuMapping("CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 212),
    213: CuMapping("CUDA_ERROR_NOT_MAPPED_AS_POINTER", 213),
    214: CuMapping("CUDA_ERROR_ECC_UNCORRECTABLE", 214),
    215: CuMapping("CUDA_ERROR_UNSUPPORTED_LIMIT", E.hipErrorUnsupportedLimit),
    216: CuMapping("CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 216),
    217: CuMapping("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", E.hipErrorPeerAccessUnsupported),
    # HIP has no "invalid PTX"; its NVIDIA layer reports a bad kernel file.
    218: CuMapping("CUDA_ERROR_INVALID_PTX", E.hipErrorInvalidKernelFile),
    219: CuMapping("CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", 219),
    300: CuMapping("CUDA_ERROR_INVALID_SOURCE", E.hipErrorInvalidSource),
    301: CuMapping("CUDA_ERROR_FILE_NOT_FOUND", E.hipErrorFileNotFound),
    302: CuMapping(
        "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", E.hipErrorSharedObjectSymbolNotFound
    ),
    303: CuMapping("CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", E.hipErrorSharedObjectInitFailed),
    304: CuMapping("CUDA_ERROR_OPERATING_SYSTEM", E.hipErrorOperatingSystem),
    400: CuMapping("CUDA_ERROR_INVALID_HANDLE", E.hipErrorInvalidHandle),
    401: CuMapping("CUDA_ERROR_ILLEGAL_STATE", E.hipErrorIllegalState),
    500: CuMapping("CUDA_ERROR_NOT_FOUND", E.hipErrorNotFound),
    600: CuMapping("CUDA_ERROR_NOT_READY", E.hipErrorNotReady),
    700: CuMapping("CUDA_ERROR_ILLEGAL_ADDRESS", E.hipErrorIllegalAddress),
    701: CuMapping("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", E.hipErrorLaunchOutOfResources),
    702: CuMapping("CUDA_ERROR_LAUNCH_TIMEOUT", E.hipErrorLaunchTimeOut),
    704: CuMapping("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", E.hipErrorPeerAccessAlreadyEnabled),
    705: CuMapping("CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", E.hipErrorPeerAccessNotEnabled),
    # HIP names this one after the runtime error cudaSetDevice* raises in the same case.
    708: CuMapping("CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", E.hipErrorSetOnActiveProcess),
    709: CuMapping("CUDA_ERROR_CONTEXT_IS_DESTROYED", E.hipErrorContextIsDestroyed),
    710: CuMapping("CUDA_ERROR_ASSERT", E.hipErrorAssert),
    712: CuMapping(
        "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", E.hipErrorHostMemoryAlreadyRegistered
    ),
    713: CuMapping("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", E.hipErrorHostMemoryNotRegistered),
    719: CuMapping("CUDA_ERROR_LAUNCH_FAILED", E.hipErrorLaunchFailure),
    720: CuMapping("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", E.hipErrorCooperativeLaunchTooLarge),
    801: CuMapping("CUDA_ERROR_NOT_SUPPORTED", E.hipErrorNotSupported),
    900: CuMapping("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", E.hipErrorStreamCaptureUnsupported),
    901: CuMapping("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", E.hipErrorStreamCaptureInvalidated),
    902: CuMapping("CUDA_ERROR_STREAM_CAPTURE_MERGE", E.hipErrorStreamCaptureMerge),
    903: CuMapping("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", E.hipErrorStreamCaptureUnmatched),
    904: CuMapping("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", E.hipErrorStreamCaptureUnjoined),
    905: CuMapping("CUDA_ERROR_STREAM_CAPTURE_ISOLATION", E.hipErrorStreamCaptureIsolation),
    906: CuMapping("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", E.hipErrorStreamCaptureImplicit),
    907: CuMapping("CUDA_ERROR_CAPTURED_EVENT", E.hipErrorCapturedEvent),
    908: CuMapping("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", E.hipErrorStreamCaptureWrongThread),
    910: CuMapping("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", E.hipErrorGraphExecUpdateFailure),
    999: CuMapping("CUDA_ERROR_UNKNOWN", E.hipErrorUnknown),
}

#: Names of CUresult codes HIP does not translate, for messages only. Kept apart from
#: the table so that the table stays exactly HIP's translation.
CU_UNMAPPED_NAMES: dict[int, str] = {
    34: "CUDA_ERROR_STUB_LIBRARY",
    36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
    402: "CUDA_ERROR_LOSSY_QUERY",
    703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
    711: "CUDA_ERROR_TOO_MANY_PEERS",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    800: "CUDA_ERROR_NOT_PERMITTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    909: "CUDA_ERROR_TIMEOUT",
    912: "CUDA_ERROR_INVALID_CLUSTER_SIZE",
    913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
}


class RtcMapping(NamedTuple):
    """One row of :data:`RTC_RESULT_TO_HIP`: the NVRTC name and the hipError_t."""

    nvrtc_name: str
    hip_code: int


#: nvrtcResult / hiprtcResult value -> (NVRTC name, hipError_t). A rejected program is
#: hipErrorInvalidSource (what hipModuleLoadData and hiprtc users check for); bad options
#: or inputs are the caller's mistake, hipErrorInvalidValue; the rest is the compiler's
#: own failure, hipErrorUnknown. HIPRTC_ERROR_LINKING (100) is a failed link of the
#: program, so it too is hipErrorInvalidSource.
RTC_RESULT_TO_HIP: dict[int, RtcMapping] = {
    0: RtcMapping("NVRTC_SUCCESS", E.hipSuccess),
    1: RtcMapping("NVRTC_ERROR_OUT_OF_MEMORY", E.hipErrorOutOfMemory),
    2: RtcMapping("NVRTC_ERROR_PROGRAM_CREATION_FAILURE", E.hipErrorInvalidSource),
    3: RtcMapping("NVRTC_ERROR_INVALID_INPUT", E.hipErrorInvalidValue),
    4: RtcMapping("NVRTC_ERROR_INVALID_PROGRAM", E.hipErrorInvalidValue),
    5: RtcMapping("NVRTC_ERROR_INVALID_OPTION", E.hipErrorInvalidValue),
    6: RtcMapping("NVRTC_ERROR_COMPILATION", E.hipErrorInvalidSource),
    7: RtcMapping("NVRTC_ERROR_BUILTIN_OPERATION_FAILURE", E.hipErrorUnknown),
    8: RtcMapping("NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION", E.hipErrorInvalidValue),
    9: RtcMapping("NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION", E.hipErrorInvalidValue),
    10: RtcMapping("NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID", E.hipErrorInvalidValue),
    11: RtcMapping("NVRTC_ERROR_INTERNAL_ERROR", E.hipErrorUnknown),
    100: RtcMapping("HIPRTC_ERROR_LINKING", E.hipErrorInvalidSource),
}


def hip_error_name(code: int) -> str:
    """HIP's name for a hipError_t, including the ones :class:`HipErrorCode` omits."""
    return HIP_EXTRA_NAMES.get(code) or error_name(code)


def cu_result_name(code: int) -> str:
    """The CUDA name of a CUresult value, or ``CUresult(<n>)`` for one we do not know."""
    row = CU_RESULT_TO_HIP.get(code)
    if row is not None:
        return row.cuda_name
    return CU_UNMAPPED_NAMES.get(code, f"CUresult({code})")


def hip_code_for_cu(code: int) -> int:
    """The hipError_t that HIP's NVIDIA layer returns for CUresult ``code``."""
    row = CU_RESULT_TO_HIP.get(int(code))
    return int(row.hip_code) if row is not None else int(E.hipErrorUnknown)


def cu_error(code: int, call: str, detail: str = "") -> HipError:
    """The HipError for a failed driver call: HIP's code, a message naming both runtimes.

    ``call`` is the driver function (``"cuMemAlloc"``); ``detail`` adds context."""
    code = int(code)
    hip_code = hip_code_for_cu(code)
    msg = f"{call} failed: {cu_result_name(code)} ({code})"
    if hip_code in HIP_EXTRA_NAMES:
        # HipError.name cannot spell these; say it here.
        msg += f" [{hip_error_name(hip_code)}]"
    if detail:
        msg += f": {detail}"
    error = HipError(hip_code, msg, cuda_result=code)
    return mark_sticky(error) if code in STICKY_CU_RESULTS else error


def rtc_result_name(code: int) -> str:
    """The NVRTC (or HIPRTC) name of a result code."""
    row = RTC_RESULT_TO_HIP.get(int(code))
    return row.nvrtc_name if row is not None else f"nvrtcResult({int(code)})"


def hip_code_for_rtc(code: int) -> int:
    """The hipError_t a failed NVRTC/HIPRTC call becomes; unknown codes are hipErrorUnknown."""
    row = RTC_RESULT_TO_HIP.get(int(code))
    return int(row.hip_code) if row is not None else int(E.hipErrorUnknown)


def rtc_error(code: int, call: str, log: str = "") -> HipError:
    """The HipError for a failed NVRTC/HIPRTC call; ``log`` (the compiler's output) is
    appended to the message so the user sees why their source was refused."""
    code = int(code)
    msg = f"{call} failed: {rtc_result_name(code)} ({code})"
    if log.strip():
        msg += f"\n{log.rstrip()}"
    return HipError(hip_code_for_rtc(code), msg, rtc_result=code)
