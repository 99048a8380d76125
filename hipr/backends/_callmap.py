"""CUDA driver and NVRTC calls beside their HIP and HIPRTC counterparts.

:class:`~hipr.backends.gpu.GpuBackend` is written once against *what* it calls
(``malloc``, ``stream_begin_capture``, ...); these tables say what each runtime calls
that, one row per operation with both spellings side by side, as hipify pairs them.
Keeping the two spellings on one row, rather than one table per runtime, means a
call added to the shared logic is added for both runtimes at once, and a reader sees
at a glance where HIP's name is not CUDA's with the prefix changed.

Only calls whose arguments the shared logic passes alike on both runtimes belong here
(the graph node calls take their runtime-specific parameter blocks from the runtime
adapter). Calls one runtime alone needs (``cuInit``, ``hipSetDevice``, ...) stay in
:mod:`~hipr.backends._runtime_cuda` and :mod:`~hipr.backends._runtime_hip`.

Like :mod:`hipr.backends._errmap`, this module needs neither vendor library: the names
are strings, resolved on the binding module when called.
"""

from __future__ import annotations

import functools
from typing import Any, Generic, Literal, NamedTuple, TypeVar

__all__ = [
    "ADAPTER_SHAPED_CALLS",
    "CONSTANTS",
    "CUDA_CALLS",
    "DRIVER_CALLS",
    "HIPRTC_CALLS",
    "HIP_CALLS",
    "NVRTC_CALLS",
    "RTC_CALLS",
    "DriverCalls",
    "Names",
    "RtcCalls",
    "RuntimeConstants",
    "Side",
    "resolve_constants",
]

T = TypeVar("T")

#: Which column of a table: the CUDA spelling or the HIP one.
Side = Literal["cuda", "hip"]


class Names(NamedTuple):
    """One row: the CUDA spelling and the HIP spelling of the same thing."""

    cuda: str
    hip: str


class DriverCalls(NamedTuple, Generic[T]):
    """The runtime functions the shared backend calls, by what they do.

    As :data:`DRIVER_CALLS` each field holds a :class:`Names` row; as
    :data:`CUDA_CALLS` or :data:`HIP_CALLS` it holds one runtime's function name.
    """

    synchronize: T
    mem_get_info: T
    malloc: T
    free: T
    host_alloc: T
    host_free: T
    memcpy_htod_async: T
    memcpy_dtoh_async: T
    memcpy_dtod_async: T
    memset_d8_async: T
    stream_create: T
    stream_destroy: T
    stream_synchronize: T
    stream_query: T
    stream_wait_event: T
    stream_is_capturing: T
    stream_begin_capture: T
    stream_end_capture: T
    event_create: T
    event_destroy: T
    event_record: T
    event_synchronize: T
    event_query: T
    event_elapsed_time: T
    module_load_data: T
    module_unload: T
    module_get_function: T
    launch_kernel: T
    graph_create: T
    graph_destroy: T
    graph_add_empty_node: T
    graph_add_memset_node: T
    graph_add_memcpy_node: T
    graph_add_kernel_node: T
    graph_instantiate: T
    graph_launch: T
    graph_exec_destroy: T


class RtcCalls(NamedTuple, Generic[T]):
    """The run-time compiler functions the shared backend calls (reading the compiled
    image back differs in shape and is named by the runtime adapter)."""

    create_program: T
    compile_program: T
    program_log_size: T
    program_log: T
    destroy_program: T


class RuntimeConstants(NamedTuple, Generic[T]):
    """Flags and values the shared backend passes to the runtime.

    In :data:`CONSTANTS` each field is a :class:`Names` row of attribute paths on the
    binding module (dots walk into enums); :func:`resolve_constants` gives the values,
    exactly as the binding spells them (enum members stay enum members).
    """

    #: Streams are created non-blocking: see GpuBackend's module doc.
    stream_flags: T
    #: Events a client creates keep timing.
    event_flags: T
    #: Fences behind staged copies need no timing.
    fence_flags: T
    #: Staging buffers are pinned for every context.
    host_alloc_flags: T
    #: Captures are relaxed, so other sessions' allocations do not break them.
    capture_mode: T
    #: What the capture-status query answers for a stream that is not capturing.
    capture_status_none: T
    #: The three marker words of a launch's ``extra`` array.
    launch_buffer_pointer: T
    launch_buffer_size: T
    launch_end: T


#: Each operation of :class:`DriverCalls`: (CUDA driver API, HIP). Every row's two
#: functions take the same arguments in the same order, except the graph node calls,
#: whose trailing parameters the runtime adapter builds.
DRIVER_CALLS: DriverCalls[Names] = DriverCalls(
    # The primary context is shared by all sessions: this waits for the whole device,
    # as hipDeviceSynchronize does.
    synchronize=Names("cuCtxSynchronize", "hipDeviceSynchronize"),
    mem_get_info=Names("cuMemGetInfo", "hipMemGetInfo"),
    malloc=Names("cuMemAlloc", "hipMalloc"),
    free=Names("cuMemFree", "hipFree"),
    host_alloc=Names("cuMemHostAlloc", "hipHostMalloc"),
    host_free=Names("cuMemFreeHost", "hipHostFree"),
    memcpy_htod_async=Names("cuMemcpyHtoDAsync", "hipMemcpyHtoDAsync"),
    memcpy_dtoh_async=Names("cuMemcpyDtoHAsync", "hipMemcpyDtoHAsync"),
    memcpy_dtod_async=Names("cuMemcpyDtoDAsync", "hipMemcpyDtoDAsync"),
    memset_d8_async=Names("cuMemsetD8Async", "hipMemsetD8Async"),
    stream_create=Names("cuStreamCreate", "hipStreamCreateWithFlags"),
    stream_destroy=Names("cuStreamDestroy", "hipStreamDestroy"),
    stream_synchronize=Names("cuStreamSynchronize", "hipStreamSynchronize"),
    stream_query=Names("cuStreamQuery", "hipStreamQuery"),
    stream_wait_event=Names("cuStreamWaitEvent", "hipStreamWaitEvent"),
    stream_is_capturing=Names("cuStreamIsCapturing", "hipStreamIsCapturing"),
    stream_begin_capture=Names("cuStreamBeginCapture", "hipStreamBeginCapture"),
    stream_end_capture=Names("cuStreamEndCapture", "hipStreamEndCapture"),
    event_create=Names("cuEventCreate", "hipEventCreateWithFlags"),
    event_destroy=Names("cuEventDestroy", "hipEventDestroy"),
    event_record=Names("cuEventRecord", "hipEventRecord"),
    event_synchronize=Names("cuEventSynchronize", "hipEventSynchronize"),
    event_query=Names("cuEventQuery", "hipEventQuery"),
    event_elapsed_time=Names("cuEventElapsedTime", "hipEventElapsedTime"),
    module_load_data=Names("cuModuleLoadData", "hipModuleLoadData"),
    module_unload=Names("cuModuleUnload", "hipModuleUnload"),
    module_get_function=Names("cuModuleGetFunction", "hipModuleGetFunction"),
    # Both take a function of a loaded module and the driver-API ``extra`` array.
    launch_kernel=Names("cuLaunchKernel", "hipModuleLaunchKernel"),
    graph_create=Names("cuGraphCreate", "hipGraphCreate"),
    graph_destroy=Names("cuGraphDestroy", "hipGraphDestroy"),
    graph_add_empty_node=Names("cuGraphAddEmptyNode", "hipGraphAddEmptyNode"),
    # cuda: (..., CUDA_MEMSET_NODE_PARAMS, context); hip: (..., hipMemsetParams).
    graph_add_memset_node=Names("cuGraphAddMemsetNode", "hipGraphAddMemsetNode"),
    # cuda: (..., CUDA_MEMCPY3D, context); hip: (..., dst, src, size, kind).
    graph_add_memcpy_node=Names("cuGraphAddMemcpyNode", "hipGraphAddMemcpyNode1D"),
    graph_add_kernel_node=Names("cuGraphAddKernelNode", "hipGraphAddKernelNode"),
    graph_instantiate=Names("cuGraphInstantiate", "hipGraphInstantiateWithFlags"),
    graph_launch=Names("cuGraphLaunch", "hipGraphLaunch"),
    graph_exec_destroy=Names("cuGraphExecDestroy", "hipGraphExecDestroy"),
)

#: The rows of :data:`DRIVER_CALLS` whose two functions differ in arguments: after
#: (graph, dependencies, count) each takes what its runtime adapter builds.
ADAPTER_SHAPED_CALLS: frozenset[str] = frozenset({"graph_add_memset_node", "graph_add_memcpy_node"})

#: Each operation of :class:`RtcCalls`: (NVRTC, HIPRTC).
RTC_CALLS: RtcCalls[Names] = RtcCalls(
    create_program=Names("nvrtcCreateProgram", "hiprtcCreateProgram"),
    compile_program=Names("nvrtcCompileProgram", "hiprtcCompileProgram"),
    program_log_size=Names("nvrtcGetProgramLogSize", "hiprtcGetProgramLogSize"),
    program_log=Names("nvrtcGetProgramLog", "hiprtcGetProgramLog"),
    destroy_program=Names("nvrtcDestroyProgram", "hiprtcDestroyProgram"),
)

#: Each field of :class:`RuntimeConstants`: (cuda-bindings path, hip-python path).
CONSTANTS: RuntimeConstants[Names] = RuntimeConstants(
    stream_flags=Names("CUstream_flags.CU_STREAM_NON_BLOCKING", "hipStreamNonBlocking"),
    event_flags=Names("CUevent_flags.CU_EVENT_DEFAULT", "hipEventDefault"),
    fence_flags=Names("CUevent_flags.CU_EVENT_DISABLE_TIMING", "hipEventDisableTiming"),
    host_alloc_flags=Names("CU_MEMHOSTALLOC_PORTABLE", "hipHostMallocPortable"),
    capture_mode=Names(
        "CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED",
        "hipStreamCaptureMode.hipStreamCaptureModeRelaxed",
    ),
    capture_status_none=Names(
        "CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE",
        "hipStreamCaptureStatus.hipStreamCaptureStatusNone",
    ),
    # cuda-bindings spells the markers as ints under *_AS_INT (the plain names are
    # pointers there); HIP ends the array with (void*)3 where CUDA uses (void*)0.
    launch_buffer_pointer=Names(
        "CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT", "HIP_LAUNCH_PARAM_BUFFER_POINTER"
    ),
    launch_buffer_size=Names("CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT", "HIP_LAUNCH_PARAM_BUFFER_SIZE"),
    launch_end=Names("CU_LAUNCH_PARAM_END_AS_INT", "HIP_LAUNCH_PARAM_END"),
)

#: One runtime's column of each table.
CUDA_CALLS: DriverCalls[str] = DriverCalls(*[row.cuda for row in DRIVER_CALLS])
HIP_CALLS: DriverCalls[str] = DriverCalls(*[row.hip for row in DRIVER_CALLS])
NVRTC_CALLS: RtcCalls[str] = RtcCalls(*[row.cuda for row in RTC_CALLS])
HIPRTC_CALLS: RtcCalls[str] = RtcCalls(*[row.hip for row in RTC_CALLS])


def resolve_constants(module: Any, side: Side) -> RuntimeConstants[Any]:
    """The values of :data:`CONSTANTS` for ``side``, looked up on its binding module."""
    paths = [getattr(row, side) for row in CONSTANTS]
    return RuntimeConstants(
        *[functools.reduce(getattr, str(path).split("."), module) for path in paths]
    )
