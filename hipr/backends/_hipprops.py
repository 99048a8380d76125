"""The ``hipDeviceProp_t`` fields beyond :class:`~hipr.backends.interface.DeviceProperties`'
named ones, read from each runtime (``DeviceProperties.hip_props``).

HIP programs ask for them (``props.maxThreadsDim``, ``hipDeviceGetAttribute(...MaxGridDimX)``)
through ``hipr.hip``; a field a runtime cannot tell is left out rather than guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: hipDeviceProp_t field -> the CUDA device attribute(s) giving it (three for a dim3).
CUDA_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "maxThreadsDim": (
        "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X",
        "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y",
        "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z",
    ),
    "maxGridSize": (
        "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X",
        "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y",
        "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z",
    ),
    "totalConstMem": ("CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY",),
    "regsPerBlock": ("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK",),
    "memPitch": ("CU_DEVICE_ATTRIBUTE_MAX_PITCH",),
    "textureAlignment": ("CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT",),
    "memoryClockRate": ("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE",),
    "memoryBusWidth": ("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH",),
    "l2CacheSize": ("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE",),
    "maxThreadsPerMultiProcessor": ("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",),
    "concurrentKernels": ("CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS",),
    "ECCEnabled": ("CU_DEVICE_ATTRIBUTE_ECC_ENABLED",),
    "pciDeviceID": ("CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID",),
    "pciDomainID": ("CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID",),
    "integrated": ("CU_DEVICE_ATTRIBUTE_INTEGRATED",),
    "canMapHostMemory": ("CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY",),
    "computeMode": ("CU_DEVICE_ATTRIBUTE_COMPUTE_MODE",),
    "asyncEngineCount": ("CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT",),
    "unifiedAddressing": ("CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",),
    "managedMemory": ("CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY",),
    "sharedMemPerMultiprocessor": ("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",),
    "regsPerMultiprocessor": ("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR",),
    "cooperativeLaunch": ("CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH",),
    "sharedMemPerBlockOptin": ("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",),
    "maxBlocksPerMultiProcessor": ("CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR",),
    "streamPrioritiesSupported": ("CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED",),
    "kernelExecTimeoutEnabled": ("CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT",),
    "isMultiGpuBoard": ("CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD",),
    "persistingL2CacheMaxSize": ("CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE",),
}


def cuda_hip_props(attribute: Any, get: Callable[[Any], int]) -> dict[str, int | list[int]]:
    """The fields of :data:`CUDA_ATTRIBUTES` that this cuda-bindings knows, each read with
    ``get(CUdevice_attribute member)``; a field whose attribute fails is left out."""
    out: dict[str, int | list[int]] = {}
    for field_name, names in CUDA_ATTRIBUTES.items():
        try:
            values = [int(get(getattr(attribute, n))) for n in names]
        except Exception:  # an attribute older or newer than this driver: leave it out
            continue
        out[field_name] = values if len(values) > 1 else values[0]
    return out


def cuda_attribute_lists(attribute: Any, get: Callable[[Any], int]) -> dict[str, list[int]]:
    """Every CUDA device attribute this cuda-bindings knows, as the driver answers it:
    ``{"cudaAttributeIds": [...], "cudaAttributeValues": [...]}`` (an attribute the
    driver refuses is left out). The proxy's libcuda.so.1 answers cuDeviceGetAttribute,
    and so the CUDA runtime's device properties, from these."""
    ids: list[int] = []
    values: list[int] = []
    for member in attribute:
        if member.name.endswith("_MAX"):
            continue
        try:
            value = int(get(member))
        except Exception:  # an attribute this driver does not know: leave it out
            continue
        ids.append(int(member))
        values.append(value)
    return {"cudaAttributeIds": ids, "cudaAttributeValues": values}


def struct_hip_props(props: Any, skip: frozenset[str] = frozenset()) -> dict[str, int | list[int]]:
    """Every integer (or list of integers) field of hip-python's ``hipDeviceProp_t``."""
    out: dict[str, int | list[int]] = {}
    names = props.PROPERTIES() if hasattr(props, "PROPERTIES") else []
    for name in names:
        if name in skip:
            continue
        try:
            value = getattr(props, name)
        except Exception:  # a field hip-python cannot convert: leave it out
            continue
        if isinstance(value, bool | int):
            out[name] = int(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, int) for v in value):
            out[name] = [int(v) for v in value]
    return out
