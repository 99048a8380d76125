"""``hipDeviceProp_t``, ``dim3`` and device attributes, filled from hipr's
:class:`~hipr.backends.interface.DeviceProperties` (the worker's answer to DEVICE_PROPERTIES)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hipr.backends.interface import DeviceProperties
from hipr.facade.catalog import HIP_ENUM_ROWS

#: hipDeviceProp_t's fields in the struct's order, as hip-python's ``PROPERTIES()`` lists
#: them (tests/facade/test_catalog.py compares the two where hip-python is installed).
FIELDS: tuple[str, ...] = (
    "name", "uuid", "luid", "luidDeviceNodeMask", "totalGlobalMem", "sharedMemPerBlock",
    "regsPerBlock", "warpSize", "memPitch", "maxThreadsPerBlock", "maxThreadsDim",
    "maxGridSize", "clockRate", "totalConstMem", "major", "minor", "textureAlignment",
    "texturePitchAlignment", "deviceOverlap", "multiProcessorCount",
    "kernelExecTimeoutEnabled", "integrated", "canMapHostMemory", "computeMode",
    "maxTexture1D", "maxTexture1DMipmap", "maxTexture1DLinear", "maxTexture2D",
    "maxTexture2DMipmap", "maxTexture2DLinear", "maxTexture2DGather", "maxTexture3D",
    "maxTexture3DAlt", "maxTextureCubemap", "maxTexture1DLayered", "maxTexture2DLayered",
    "maxTextureCubemapLayered", "maxSurface1D", "maxSurface2D", "maxSurface3D",
    "maxSurface1DLayered", "maxSurface2DLayered", "maxSurfaceCubemap",
    "maxSurfaceCubemapLayered", "surfaceAlignment", "concurrentKernels", "ECCEnabled",
    "pciBusID", "pciDeviceID", "pciDomainID", "tccDriver", "asyncEngineCount",
    "unifiedAddressing", "memoryClockRate", "memoryBusWidth", "l2CacheSize",
    "persistingL2CacheMaxSize", "maxThreadsPerMultiProcessor", "streamPrioritiesSupported",
    "globalL1CacheSupported", "localL1CacheSupported", "sharedMemPerMultiprocessor",
    "regsPerMultiprocessor", "managedMemory", "isMultiGpuBoard", "multiGpuBoardGroupID",
    "hostNativeAtomicSupported", "singleToDoublePrecisionPerfRatio", "pageableMemoryAccess",
    "concurrentManagedAccess", "computePreemptionSupported",
    "canUseHostPointerForRegisteredMem", "cooperativeLaunch", "cooperativeMultiDeviceLaunch",
    "sharedMemPerBlockOptin", "pageableMemoryAccessUsesHostPageTables",
    "directManagedMemAccessFromHost", "maxBlocksPerMultiProcessor",
    "accessPolicyMaxWindowSize", "reservedSharedMemPerBlock", "hostRegisterSupported",
    "sparseHipArraySupported", "hostRegisterReadOnlySupported",
    "timelineSemaphoreInteropSupported", "memoryPoolsSupported", "gpuDirectRDMASupported",
    "gpuDirectRDMAFlushWritesOptions", "gpuDirectRDMAWritesOrdering",
    "memoryPoolSupportedHandleTypes", "deferredMappingHipArraySupported",
    "ipcEventSupported", "clusterLaunch", "unifiedFunctionPointers", "reserved",
    "hipReserved", "gcnArchName", "maxSharedMemoryPerMultiProcessor",
    "clockInstructionRate", "arch", "hdpMemFlushCntl", "hdpRegFlushCntl",
    "cooperativeMultiDeviceUnmatchedFunc", "cooperativeMultiDeviceUnmatchedGridDim",
    "cooperativeMultiDeviceUnmatchedBlockDim", "cooperativeMultiDeviceUnmatchedSharedMem",
    "isLargeBar", "asicRevision",
)  # fmt: skip

_STRINGS = frozenset({"name", "gcnArchName"})
_DIM3 = frozenset({"maxThreadsDim", "maxGridSize"})


class hipDeviceProp_t:  # hip-python's name
    """hip-python's device property struct: every field of HIP's ``hipDeviceProp_t`` as an
    attribute (``name`` and ``gcnArchName`` as ``str``, ``maxThreadsDim``/``maxGridSize`` as
    lists of three ints, the rest ints), zero until ``hipGetDeviceProperties`` fills it.
    A field the worker's runtime does not report stays 0."""

    def __init__(self, **fields: Any) -> None:
        for name in FIELDS:
            default: Any = "" if name in _STRINGS else [0, 0, 0] if name in _DIM3 else 0
            object.__setattr__(self, name, default)
        for key, value in fields.items():
            setattr(self, key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        if key not in FIELDS:
            raise AttributeError(f"hipDeviceProp_t has no field {key!r}")
        object.__setattr__(self, key, value)

    @staticmethod
    def PROPERTIES() -> list[str]:
        """The field names, in the struct's order."""
        return list(FIELDS)

    def __repr__(self) -> str:
        return f"<hipDeviceProp_t name={self.name!r} gcnArchName={self.gcnArchName!r}>"  # type: ignore[attr-defined]


def _pci(bus_id: str) -> tuple[int, int, int]:
    """(domain, bus, device) of ``"0000:65:00.0"``; zeros when it does not parse."""
    try:
        domain, bus, rest = bus_id.split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return 0, 0, 0


def fields_of(props: DeviceProperties) -> dict[str, Any]:
    """hipDeviceProp_t field -> value, for what ``props`` tells."""
    domain, bus, device = _pci(props.pci_bus_id)
    out: dict[str, Any] = {
        "pciDomainID": domain,
        "pciBusID": bus,
        "pciDeviceID": device,
    }
    # hip_props first: the runtime's own figures win over values derived here, except
    # for the named fields below, which every backend reports.
    out.update(props.hip_props or {})
    out.update(
        name=props.name,
        gcnArchName=props.arch,
        totalGlobalMem=props.total_memory,
        multiProcessorCount=props.multiprocessor_count,
        warpSize=props.warp_size,
        maxThreadsPerBlock=props.max_threads_per_block,
        clockRate=props.clock_rate_khz,
        major=props.major,
        minor=props.minor,
        sharedMemPerBlock=props.max_shared_memory_per_block,
    )
    return {k: v for k, v in out.items() if k in FIELDS}


def fill(target: hipDeviceProp_t, props: DeviceProperties) -> hipDeviceProp_t:
    """Write ``props`` into ``target`` (in place, as hipGetDeviceProperties does)."""
    for key, value in fields_of(props).items():
        setattr(target, key, list(value) if isinstance(value, list | tuple) else value)
    return target


# hipDeviceAttribute_t member (without its prefix) -> (hipDeviceProp_t field, index).
_ATTRIBUTE_FIELDS: dict[str, tuple[str, int | None]] = {
    "MaxBlockDimX": ("maxThreadsDim", 0),
    "MaxBlockDimY": ("maxThreadsDim", 1),
    "MaxBlockDimZ": ("maxThreadsDim", 2),
    "MaxGridDimX": ("maxGridSize", 0),
    "MaxGridDimY": ("maxGridSize", 1),
    "MaxGridDimZ": ("maxGridSize", 2),
    "ComputeCapabilityMajor": ("major", None),
    "ComputeCapabilityMinor": ("minor", None),
    "KernelExecTimeout": ("kernelExecTimeoutEnabled", None),
    "MaxPitch": ("memPitch", None),
    "MaxRegistersPerBlock": ("regsPerBlock", None),
    "MaxRegistersPerMultiprocessor": ("regsPerMultiprocessor", None),
    "MaxSharedMemoryPerBlock": ("sharedMemPerBlock", None),
    "MultiprocessorCount": ("multiProcessorCount", None),
    "TotalConstantMemory": ("totalConstMem", None),
    "PciBusId": ("pciBusID", None),
    "PciDeviceId": ("pciDeviceID", None),
    "PciDomainId": ("pciDomainID", None),
    "EccEnabled": ("ECCEnabled", None),
    "TccDriver": ("tccDriver", None),
    "MaxSharedMemoryPerMultiprocessor": ("maxSharedMemoryPerMultiProcessor", None),
}


def attribute_field(member_name: str) -> tuple[str, int | None] | None:
    """The hipDeviceProp_t field (and index) behind ``hipDeviceAttribute<X>``, or None."""
    short = member_name.removeprefix("hipDeviceAttribute")
    if short in _ATTRIBUTE_FIELDS:
        return _ATTRIBUTE_FIELDS[short]
    # Most attributes are a field of the same name with a lower-case first letter.
    guess = short[:1].lower() + short[1:]
    for name in FIELDS:
        if name.lower() == guess.lower():
            return name, None
    return None


def attribute_value(member_name: str, props: DeviceProperties) -> int | None:
    """The value of device attribute ``member_name`` for ``props``; None when the worker's
    runtime does not report it."""
    where = attribute_field(member_name)
    if where is None:
        return None
    name, index = where
    value = fields_of(props).get(name)
    if value is None:
        return None
    if index is not None:
        return int(value[index])
    return int(value) if isinstance(value, int) else None


def attribute_names() -> list[str]:
    """Every hipDeviceAttribute_t member name."""
    return [row.split(" ")[1] for row in HIP_ENUM_ROWS if row.startswith("hipDeviceAttribute_t ")]


class dim3:  # hip-python's name
    """A launch geometry, ``dim3(x=32)``; unpacks with ``*`` into x, y, z."""

    __slots__ = ("x", "y", "z")

    def __init__(self, x: int = 1, y: int = 1, z: int = 1) -> None:
        self.x, self.y, self.z = int(x), int(y), int(z)

    def __iter__(self) -> Iterator[int]:
        return iter((self.x, self.y, self.z))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dim3):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"dim3(x={self.x}, y={self.y}, z={self.z})"
