"""The cuda runtime: cuda-bindings' driver API and NVRTC, as :class:`GpuBackend` drives them.

This is what HIP itself does on NVIDIA (its ``nvidia_detail`` layer calls CUDA), so
errors are translated by :mod:`hipr.backends._errmap` exactly as HIP translates them,
and HIP kernel source compiles through NVRTC with a small HIP prelude. The calls and
flags the shared logic uses are the CUDA column of :mod:`hipr.backends._callmap`; what
is here is only what CUDA does in its own shape: ``cuInit`` and the primary contexts,
device attributes, the graph node parameter structs, NVRTC's options, prelude and
CUBIN/PTX output, and ``cuFuncGetParamInfo`` (CUDA refuses argument bytes past a
kernel's last parameter, so the shared launch path trims zero tail padding).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from hipr.backends._callmap import CUDA_CALLS, NVRTC_CALLS, RuntimeConstants, resolve_constants
from hipr.backends._errmap import cu_error, cu_result_name
from hipr.backends._hipprops import cuda_attribute_lists, cuda_hip_props
from hipr.backends._link import cuda_link
from hipr.backends._runtime import RuntimeBase, cstr, import_bindings, with_default_target
from hipr.backends.interface import DeviceProperties, Dim3
from hipr.errors import HipError, HipErrorCode

__all__ = ["HIP_PRELUDE", "LIBCUDA", "PRELUDE_INCLUDE_NAMES", "CudaRuntime", "nvrtc_options"]

E = HipErrorCode

#: The virtual ``hip/hip_runtime.h`` NVRTC sees: HIP's device-side spellings in CUDA
#: terms, enough for hipr.kernels.builtins and ordinary HIP kernels. Host API calls have
#: no place in run-time compiled device code, so none are declared.
HIP_PRELUDE = r"""
#ifndef HIPR_HIP_PRELUDE_H
#define HIPR_HIP_PRELUDE_H

#define __HIP_PLATFORM_NVIDIA__ 1
#define __HIP_PLATFORM_NVCC__ 1
#define __HIPCC_RTC__ 1
#define __HIP_DEVICE_COMPILE__ 1

#define hipThreadIdx_x threadIdx.x
#define hipThreadIdx_y threadIdx.y
#define hipThreadIdx_z threadIdx.z
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockIdx_z blockIdx.z
#define hipBlockDim_x blockDim.x
#define hipBlockDim_y blockDim.y
#define hipBlockDim_z blockDim.z
#define hipGridDim_x gridDim.x
#define hipGridDim_y gridDim.y
#define hipGridDim_z gridDim.z

#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];
#define HIP_DYNAMIC_SHARED_ATTRIBUTE
#define HIP_KERNEL_NAME(...) __VA_ARGS__
#define __HIP_KERNEL_NAME(...) __VA_ARGS__

/* HIP's runtime header brings the fixed-width integers; NVRTC has no libc to. The
   compiler's own type macros keep them identical to <cstdint>'s where both appear. */
#if defined(__INT64_TYPE__) && defined(__UINT64_TYPE__)
typedef __INT8_TYPE__ int8_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __INT16_TYPE__ int16_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __INT32_TYPE__ int32_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT64_TYPE__ uint64_t;
#else
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
/* HIP's shuffles take no mask; CUDA declares the maskless forms only below sm_70. */
template <typename T> __device__ inline T __shfl(T v, int lane, int width = warpSize) {
  return __shfl_sync(0xffffffffu, v, lane, width);
}
template <typename T> __device__ inline T __shfl_up(T v, unsigned int d, int width = warpSize) {
  return __shfl_up_sync(0xffffffffu, v, d, width);
}
template <typename T> __device__ inline T __shfl_down(T v, unsigned int d, int width = warpSize) {
  return __shfl_down_sync(0xffffffffu, v, d, width);
}
template <typename T> __device__ inline T __shfl_xor(T v, int m, int width = warpSize) {
  return __shfl_xor_sync(0xffffffffu, v, m, width);
}
#endif

#endif /* HIPR_HIP_PRELUDE_H */
"""

#: Header names the prelude answers to in ``#include``.
PRELUDE_INCLUDE_NAMES: tuple[str, ...] = ("hip/hip_runtime.h", "hip/hip_runtime_api.h")

#: The driver library named when the cuda backend cannot start.
LIBCUDA = "libcuda.so.1"
_CU_SUCCESS = 0
# Driver present but unusable at this version: the stub libcuda of a toolkit, a kernel
# module of another version, a newer-driver-only call, a compat package refused.
_CU_DRIVER_TOO_OLD = {34, 36, 803, 804}


#: hiprtc's spellings of relocatable device code, as NVRTC spells them.
_RDC = {
    "-fgpu-rdc": "--relocatable-device-code=true",
    "-fno-gpu-rdc": "--relocatable-device-code=false",
}


def nvrtc_options(options: Sequence[str], arch: str) -> list[str]:
    """The NVRTC options for a compile: the user's, with ``--offload-arch=sm_XY`` and
    ``-fgpu-rdc`` translated, and ``--gpu-architecture=<arch>`` first unless they chose one."""
    out: list[str] = []
    has_arch = False
    for opt in options:
        if opt.startswith("--offload-arch="):
            target = opt.split("=", 1)[1]
            if not target.startswith(("sm_", "compute_")):
                raise HipError(
                    E.hipErrorInvalidValue,
                    f"{opt} names a target this worker's NVIDIA GPU ({arch}) cannot run",
                )
            out.append(f"--gpu-architecture={target}")
            has_arch = True
            continue
        if opt.startswith(("--gpu-architecture", "-arch")):
            has_arch = True
        # hiprtc's relocatable device code (for hiprtcLink*) is NVRTC's -rdc.
        out.append(_RDC.get(opt, opt))
    return with_default_target(out, has_arch, f"--gpu-architecture={arch}")


class CudaRuntime(RuntimeBase):
    """:class:`~hipr.backends.gpu.Runtime` over cuda-bindings (see module doc).

    ``driver``/``nvrtc`` replace cuda-bindings' modules; tests use them to run the
    backend without an NVIDIA driver."""

    name = "cuda"
    library = LIBCUDA
    rtc_library = "libnvrtc"
    calls = CUDA_CALLS
    rtc_calls = NVRTC_CALLS
    # A virtual architecture (compute_XY) gives no CUBIN, only PTX.
    rtc_images: tuple[tuple[str, str], ...] = (
        ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
        ("nvrtcGetPTXSize", "nvrtcGetPTX"),
    )
    param_info_call: str | None = "cuFuncGetParamInfo"
    not_ready = 600  # CUDA_ERROR_NOT_READY
    # CUDA 12.8 and later drivers; an older one answers the first batch with an error
    # and the backend goes back to one call per copy.
    batch_copy_call: str | None = "cuMemcpyBatchAsync"

    def __init__(self, driver: Any = None, nvrtc: Any = None) -> None:
        super().__init__(driver, nvrtc)
        self._devices: list[Any] = []
        self._contexts: dict[int, Any] = {}
        self._lock = threading.Lock()
        #: The one attribute set of every batched copy (made on first use).
        self._batch_attrs: Any = None

    def copy_batch(
        self, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: Any
    ) -> None:
        """cuMemcpyBatchAsync with one attribute set for all: sources read in stream
        order (see :meth:`~hipr.backends.gpu.Runtime.copy_batch`)."""
        api = self.api
        attrs = self._batch_attrs
        if attrs is None:
            attrs = api.CUmemcpyAttributes()
            order = api.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
            attrs.srcAccessOrder = order
            self._batch_attrs = attrs
        pointer = api.CUdeviceptr
        self.call(
            "cuMemcpyBatchAsync",
            [pointer(d) for d in dsts],
            [pointer(s) for s in srcs],
            list(sizes),
            len(sizes),
            [attrs],
            [0],
            1,
            stream,
        )

    @staticmethod
    def load_bindings() -> tuple[Any, Any]:
        """cuda-bindings' (driver, nvrtc), or BackendUnavailable naming what failed."""

        def load() -> tuple[Any, Any]:
            from cuda.bindings import driver, nvrtc

            return driver, nvrtc

        return import_bindings(
            load,
            backend="cuda",
            package="cuda-bindings",
            library=LIBCUDA,
            missing=(ModuleNotFoundError,),
            # cuda-pathfinder raises DynamicLibNotFoundError (a RuntimeError).
            broken=(ImportError, OSError, RuntimeError),
        )

    def error(self, code: int, call: str) -> HipError:
        """HIP's translation of CUresult ``code`` (see :mod:`hipr.backends._errmap`)."""
        return cu_error(code, call)

    def open(self) -> int:
        """cuInit, then the devices; BackendUnavailable when none is usable."""
        try:
            (err,) = self.api.cuInit(0)
        except (OSError, RuntimeError) as exc:
            # cuda-pathfinder raises DynamicLibNotFoundError (a RuntimeError) here.
            raise self.could_not_load(exc) from exc
        code = int(err)
        if code != _CU_SUCCESS:
            hip_code = (
                E.hipErrorInsufficientDriver if code in _CU_DRIVER_TOO_OLD else E.hipErrorNoDevice
            )
            raise self.unavailable(
                hip_code, f"cuInit in {LIBCUDA} failed with {cu_result_name(code)} ({code})"
            )
        count = int(self.call("cuDeviceGetCount"))
        if count < 1:
            raise self.no_device("NVIDIA")
        self._devices = [self.call("cuDeviceGet", i) for i in range(count)]
        return count

    def constants(self) -> RuntimeConstants[Any]:
        """The CUDA column of :data:`~hipr.backends._callmap.CONSTANTS`."""
        return resolve_constants(self.api, "cuda")

    def _context(self, device: int) -> Any:
        """``device``'s primary context, retained on first use and kept until release."""
        with self._lock:
            ctx = self._contexts.get(device)
            if ctx is None:
                ctx = self.call("cuDevicePrimaryCtxRetain", self._devices[device])
                self._contexts[device] = ctx
            return ctx

    def bind(self, device: int) -> None:
        """Make ``device``'s primary context current on the calling thread."""
        self.call("cuCtxSetCurrent", self._context(device))

    def release(self) -> None:
        """Release the primary contexts retained by :meth:`bind`."""
        with self._lock:
            devices, self._contexts = list(self._contexts), {}
        for device in devices:
            self.raw("cuDevicePrimaryCtxRelease", self._devices[device])

    def read_properties(self, device: int) -> DeviceProperties:
        """From device attributes; ``arch`` is ``sm_<major><minor>``."""
        dev = self._devices[device]
        attr = self.api.CUdevice_attribute

        def get(name: str) -> int:
            return int(self.call("cuDeviceGetAttribute", getattr(attr, name), dev))

        major = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        raw_name = self.call("cuDeviceGetName", 256, dev)
        bus = self.call("cuDeviceGetPCIBusId", 64, dev)
        return DeviceProperties(
            name=cstr(raw_name),
            arch=f"sm_{major}{minor}",
            total_memory=int(self.call("cuDeviceTotalMem", dev)),
            multiprocessor_count=get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            warp_size=get("CU_DEVICE_ATTRIBUTE_WARP_SIZE"),
            max_threads_per_block=get("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
            clock_rate_khz=get("CU_DEVICE_ATTRIBUTE_CLOCK_RATE"),
            pci_bus_id=cstr(bus),
            major=major,
            minor=minor,
            max_shared_memory_per_block=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
            hip_props={
                **cuda_hip_props(attr, lambda a: self.call("cuDeviceGetAttribute", a, dev)),
                **cuda_attribute_lists(attr, lambda a: self.call("cuDeviceGetAttribute", a, dev)),
            },
        )

    def compile_options(self, options: Sequence[str], arch: str) -> list[str]:
        """:func:`nvrtc_options`."""
        return nvrtc_options(options, arch)

    def program_headers(self) -> tuple[list[bytes], list[bytes]]:
        """The HIP prelude under each name HIP code includes it by."""
        return (
            [HIP_PRELUDE.encode()] * len(PRELUDE_INCLUDE_NAMES),
            [n.encode() for n in PRELUDE_INCLUDE_NAMES],
        )

    def output_buffer(self, size: int) -> bytes:
        """A bytes object: cuda-bindings writes through its ``char*``."""
        return b" " * size

    def loadable_image(self, image: bytes) -> bytes:
        """PTX text NUL-terminated, as cuModuleLoadData needs it; binaries unchanged."""
        if image and not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
            return image + b"\0"
        return image

    def memset_node_args(self, device: int, ptr: int, value: int, size: int) -> tuple[Any, ...]:
        """(CUDA_MEMSET_NODE_PARAMS, context)."""
        params = self.api.CUDA_MEMSET_NODE_PARAMS()
        params.dst = ptr
        params.value = value
        params.elementSize = 1
        params.width = size
        params.height = 1
        params.pitch = size
        return params, self._context(device)

    def memcpy_node_args(self, device: int, dst: int, src: int, size: int) -> tuple[Any, ...]:
        """(CUDA_MEMCPY3D of one row between device pointers, context)."""
        d = self.api
        p = d.CUDA_MEMCPY3D()
        p.srcMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice = src
        p.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.dstDevice = dst
        p.WidthInBytes = size
        p.Height = 1
        p.Depth = 1
        return p, self._context(device)

    def kernel_node_params(
        self, function: Any, grid: Dim3, block: Dim3, shared_mem: int, extra: int
    ) -> Any:
        """A CUDA_KERNEL_NODE_PARAMS."""
        p = self.api.CUDA_KERNEL_NODE_PARAMS()
        p.func = function
        p.gridDimX, p.gridDimY, p.gridDimZ = (int(v) for v in grid)
        p.blockDimX, p.blockDimY, p.blockDimZ = (int(v) for v in block)
        p.sharedMemBytes = shared_mem
        p.extra = extra
        return p

    def function_attribute(self, function: Any, attribute: int, value: int | None) -> int:
        """``cuFuncGetAttribute`` (after ``cuFuncSetAttribute`` when ``value`` is given)."""
        try:
            which = self.api.CUfunction_attribute(attribute)
        except ValueError:
            raise HipError(
                E.hipErrorInvalidValue, f"unknown function attribute {attribute}"
            ) from None
        if value is not None:
            self.call("cuFuncSetAttribute", function, which, value)
        return int(self.call("cuFuncGetAttribute", which, function))

    def device_limit(self, limit: int) -> int:
        """``cuCtxGetLimit`` on the current context."""
        try:
            which = self.api.CUlimit(limit)
        except ValueError:
            raise HipError(E.hipErrorUnsupportedLimit, f"unknown device limit {limit}") from None
        return int(self.call("cuCtxGetLimit", which))

    def link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """The driver's linker: cuLinkCreate, cuLinkAddData, cuLinkComplete."""
        return cuda_link(self.api, inputs)

    def module_global(self, module: Any, name: str) -> tuple[int, int]:
        """``cuModuleGetGlobal``: the variable's address and size."""
        ptr, size = self.call("cuModuleGetGlobal", module, name.encode())
        return int(ptr), int(size)

    def function_occupancy(
        self, function: Any, query: str, numbers: dict[str, Any]
    ) -> dict[str, int]:
        """The cuOccupancy* figure ``query`` (see hipr.handlers.function_attrs)."""
        if query == "max_active_blocks":
            value = self.call(
                "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                function, numbers["block_size"], numbers["dynamic_smem"], numbers["flags"],
            )  # fmt: skip
            return {"value": int(value)}
        if query == "available_dynamic_smem":
            value = self.call(
                "cuOccupancyAvailableDynamicSMemPerBlock",
                function, numbers["num_blocks"], numbers["block_size"],
            )  # fmt: skip
            return {"value": int(value)}
        if query == "max_active_clusters":
            config = self._cluster_config(numbers)
            return {"value": int(self.call("cuOccupancyMaxActiveClusters", function, config))}
        min_grid, block = self.call(
            "cuOccupancyMaxPotentialBlockSizeWithFlags",
            function, None, numbers["dynamic_smem"], numbers["block_limit"], numbers["flags"],
        )  # fmt: skip
        return {"min_grid": int(min_grid), "block_size": int(block)}

    def _cluster_config(self, numbers: dict[str, Any]) -> Any:
        """A CUlaunchConfig of ``grid``, ``block``, ``dynamic_smem`` and, when given,
        ``cluster`` dimensions (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)."""
        api = self.api
        config = api.CUlaunchConfig()
        grid, block = numbers.get("grid", (1, 1, 1)), numbers.get("block", (1, 1, 1))
        config.gridDimX, config.gridDimY, config.gridDimZ = (int(v) for v in grid)
        config.blockDimX, config.blockDimY, config.blockDimZ = (int(v) for v in block)
        config.sharedMemBytes = int(numbers.get("dynamic_smem", 0))
        if "cluster" in numbers:
            attr = api.CUlaunchAttribute()
            attr.id = api.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = (int(v) for v in numbers["cluster"])
            config.attrs = [attr]
            config.numAttrs = 1
        return config
