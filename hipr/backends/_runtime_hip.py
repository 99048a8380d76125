"""The hip runtime: hip-python (``hip.hip`` and ``hip.hiprtc``), as :class:`GpuBackend`
drives it.

The calls and flags the shared logic uses are the HIP column of
:mod:`hipr.backends._callmap`; what is here is what HIP does in its own shape:
probing with ``hipGetDeviceCount``, ``hipSetDevice``, ``hipDeviceProp_t``, the graph
node parameter structs, and hiprtc's options and code objects. Every hip-python call
returns ``(hipError_t, outputs...)``, and a failure keeps its code as the HipError's.

Without ROCm, hip-python imports fine and its first call raises ``RuntimeError: failed
to dlopen 'libamdhip64.so'``; :meth:`HipRuntime.open` turns that into
:class:`~hipr.backends.BackendUnavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hipr.backends._callmap import HIP_CALLS, HIPRTC_CALLS, RuntimeConstants, resolve_constants
from hipr.backends._errmap import hip_error_name
from hipr.backends._hipprops import struct_hip_props
from hipr.backends._link import hip_link
from hipr.backends._runtime import RuntimeBase, cstr, import_bindings, with_default_target
from hipr.backends.interface import DeviceProperties, Dim3
from hipr.backends.sticky import STICKY_HIP_CODES, mark_sticky
from hipr.errors import HipError, HipErrorCode

__all__ = ["LIBHIP", "HipRuntime", "hiprtc_options"]

E = HipErrorCode

#: The runtime library named when the hip backend cannot start.
LIBHIP = "libamdhip64.so"
_HIP_SUCCESS = 0
#: hipErrorInsufficientDriver as hipGetDeviceCount reports it.
_HIP_DRIVER_TOO_OLD = 35
#: ``hipStreamPerThread`` is ``(hipStream_t)2`` in HIP's headers; hip-python has no name.


def hiprtc_options(options: Sequence[str], arch: str) -> list[str]:
    """The hiprtc options: the user's, ``--offload-arch=<gcnArchName>`` first unless
    they chose a target; an NVIDIA target is refused."""
    out: list[str] = []
    has_arch = False
    for opt in options:
        if opt.startswith(("--gpu-architecture", "-arch")) or (
            opt.startswith("--offload-arch=")
            and opt.split("=", 1)[1].startswith(("sm_", "compute_"))
        ):
            raise HipError(
                E.hipErrorInvalidValue,
                f"{opt} names a target this worker's AMD GPU ({arch}) cannot run",
            )
        if opt.startswith("--offload-arch"):
            has_arch = True
        out.append(opt)
    return with_default_target(out, has_arch, f"--offload-arch={arch}")


class HipRuntime(RuntimeBase):
    """:class:`~hipr.backends.gpu.Runtime` over hip-python (see module doc).

    ``hip``/``hiprtc`` replace the hip-python modules; tests use them to run the backend
    without ROCm."""

    name = "hip"
    library = LIBHIP
    rtc_library = "libhiprtc"
    calls = HIP_CALLS
    rtc_calls = HIPRTC_CALLS
    rtc_images: tuple[tuple[str, str], ...] = (("hiprtcGetCodeSize", "hiprtcGetCode"),)
    # HIP launches whatever argument bytes it is given: nothing to trim.
    param_info_call: str | None = None
    not_ready = int(E.hipErrorNotReady)
    # hipMemcpyBatchAsync exists, but hip-python's generated wrapper takes its ``dsts``
    # and ``sizes`` arrays as outputs, so they cannot be passed: one call per copy.
    batch_copy_call: str | None = None

    def __init__(self, hip: Any = None, hiprtc: Any = None) -> None:
        super().__init__(hip, hiprtc)

    @staticmethod
    def load_bindings() -> tuple[Any, Any]:
        """hip-python's (hip, hiprtc), or BackendUnavailable."""

        def load() -> tuple[Any, Any]:
            from hip import hip, hiprtc

            return hip, hiprtc

        return import_bindings(load, backend="hip", package="hip-python", library=LIBHIP)

    def error(self, code: int, call: str) -> HipError:
        """The HipError for hipError_t ``code``: the same code, HIP's name for it."""
        error = HipError(code, f"{call} failed: {hip_error_name(code)} ({code})")
        return mark_sticky(error) if code in STICKY_HIP_CODES else error

    def open(self) -> int:
        """The device count; BackendUnavailable when the library or a device is missing."""
        try:
            result = self.api.hipGetDeviceCount()
        except (OSError, RuntimeError) as exc:
            raise self.could_not_load(exc) from exc
        err = int(result[0])
        count = int(result[1]) if err == _HIP_SUCCESS else 0
        if err not in (_HIP_SUCCESS, int(E.hipErrorNoDevice)):
            code = (
                E.hipErrorInsufficientDriver if err == _HIP_DRIVER_TOO_OLD else E.hipErrorNoDevice
            )
            raise self.unavailable(
                code,
                f"hipGetDeviceCount in {LIBHIP} failed with {hip_error_name(err)} ({err})",
            )
        if count < 1:
            raise self.no_device("AMD")
        return count

    def constants(self) -> RuntimeConstants[Any]:
        """The HIP column of :data:`~hipr.backends._callmap.CONSTANTS`."""
        return resolve_constants(self.api, "hip")

    def bind(self, device: int) -> None:
        """hipSetDevice on the calling thread."""
        self.call("hipSetDevice", device)

    def release(self) -> None:
        """Nothing: HIP's per-device state needs no release."""

    def read_properties(self, device: int) -> DeviceProperties:
        """From hipDeviceProp_t; ``arch`` is its gcnArchName (``gfx942:sramecc+:...``)."""
        p = self.call("hipGetDeviceProperties", device)
        bus = self.call("hipDeviceGetPCIBusId", 64, device)
        return DeviceProperties(
            name=cstr(p.name),
            arch=cstr(p.gcnArchName),
            total_memory=int(p.totalGlobalMem),
            multiprocessor_count=int(p.multiProcessorCount),
            warp_size=int(p.warpSize),
            max_threads_per_block=int(p.maxThreadsPerBlock),
            clock_rate_khz=int(p.clockRate),
            pci_bus_id=cstr(bus),
            major=int(p.major),
            minor=int(p.minor),
            max_shared_memory_per_block=int(p.sharedMemPerBlock),
            hip_props=struct_hip_props(p, skip=frozenset({"reserved", "hipReserved"})),
        )

    def compile_options(self, options: Sequence[str], arch: str) -> list[str]:
        """:func:`hiprtc_options`."""
        return hiprtc_options(options, arch)

    def program_headers(self) -> tuple[list[bytes], list[bytes]]:
        """None: hiprtc ships hip/hip_runtime.h itself."""
        return [], []

    def link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """hiprtc's linker: hiprtcLinkCreate, hiprtcLinkAddData, hiprtcLinkComplete."""
        return hip_link(self.rtc_api, inputs)

    def module_global(self, module: Any, name: str) -> tuple[int, int]:
        """``hipModuleGetGlobal``: the variable's address and size."""
        ptr, size = self.call("hipModuleGetGlobal", module, name.encode())
        return int(ptr), int(size)

    def output_buffer(self, size: int) -> bytearray:
        """A bytearray, which hip-python fills in place."""
        return bytearray(size)

    def loadable_image(self, image: bytes) -> bytes:
        """Code objects load as they are."""
        return image

    def memset_node_args(self, device: int, ptr: int, value: int, size: int) -> tuple[Any, ...]:
        """(hipMemsetParams,)."""
        params = self.api.hipMemsetParams(
            dst=ptr, elementSize=1, width=size, height=1, pitch=size, value=value
        )
        return (params,)

    def memcpy_node_args(self, device: int, dst: int, src: int, size: int) -> tuple[Any, ...]:
        """(dst, src, size, hipMemcpyDeviceToDevice) for hipGraphAddMemcpyNode1D."""
        return dst, src, size, self.api.hipMemcpyKind.hipMemcpyDeviceToDevice

    def kernel_node_params(
        self, function: Any, grid: Dim3, block: Dim3, shared_mem: int, extra: int
    ) -> Any:
        """A hipKernelNodeParams."""
        p = self.api.hipKernelNodeParams()
        p.func = function
        # dim3 members are read-only attributes of a mutable struct: set its fields.
        g, b = p.gridDim, p.blockDim
        g.x, g.y, g.z = (int(v) for v in grid)
        b.x, b.y, b.z = (int(v) for v in block)
        p.sharedMemBytes = shared_mem
        p.kernelParams = None
        p.extra = extra
        return p
