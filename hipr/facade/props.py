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
#: Array fields and their lengths (hip-python returns each as a list of ints).
_ARRAYS: dict[str, int] = {
    "maxThreadsDim": 3, "maxGridSize": 3, "maxTexture2D": 2, "maxTexture2DMipmap": 2,
    "maxTexture2DLinear": 3, "maxTexture2DGather": 2, "maxTexture3D": 3, "maxTexture3DAlt": 3,
    "maxTexture1DLayered": 2, "maxTexture2DLayered": 3, "maxTextureCubemapLayered": 2,
    "maxSurface2D": 2, "maxSurface3D": 3, "maxSurface1DLayered": 2, "maxSurface2DLayered": 3,
    "maxSurfaceCubemapLayered": 2, "reserved": 63, "hipReserved": 32,
}  # fmt: skip
#: hipDeviceArch_t's feature bits, in the struct's order.
_ARCH_BITS: tuple[str, ...] = (
    "hasGlobalInt32Atomics", "hasGlobalFloatAtomicExch", "hasSharedInt32Atomics",
    "hasSharedFloatAtomicExch", "hasFloatAtomicAdd", "hasGlobalInt64Atomics",
    "hasSharedInt64Atomics", "hasDoubles", "hasWarpVote", "hasWarpBallot", "hasWarpShuffle",
    "hasFunnelShift", "hasThreadFenceSystem", "hasSyncThreadsExt", "hasSurfaceFuncs",
    "has3dGrid", "hasDynamicParallelism",
)  # fmt: skip


class hipUUID_t:  # hip-python's name
    """A device's 16-byte UUID (``.bytes``), as hip-python's struct wrapper gives it."""

    def __init__(self, raw: bytes = bytes(16)) -> None:
        self.bytes = bytes(raw).ljust(16, b"\0")[:16]

    @staticmethod
    def PROPERTIES() -> list[str]:
        """The field names."""
        return ["bytes"]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, hipUUID_t) and other.bytes == self.bytes

    def __hash__(self) -> int:
        return hash(self.bytes)


class hipDeviceArch_t:  # hip-python's name
    """The device's feature bits (``hasDoubles``, ``hasWarpShuffle``, ...), each 0 or 1;
    0 where the worker's runtime does not report them."""

    def __init__(self, **bits: int) -> None:
        for name in _ARCH_BITS:
            setattr(self, name, int(bits.get(name, 0)))

    @staticmethod
    def PROPERTIES() -> list[str]:
        """The field names, in the struct's order."""
        return list(_ARCH_BITS)


def _default(name: str) -> Any:
    """A field's zero value, of the type hip-python 10 returns for it."""
    if name in _STRINGS:
        return ""
    if name in _ARRAYS:
        return [0] * _ARRAYS[name]
    if name == "luid":
        return bytes(8)
    if name == "uuid":
        return hipUUID_t()
    if name == "arch":
        return hipDeviceArch_t()
    return 0


class hipDeviceProp_t:  # hip-python's name
    """hip-python's device property struct: every field of HIP's ``hipDeviceProp_t`` as an
    attribute, of the type hip-python 10 returns (``name`` and ``gcnArchName`` as ``str``,
    array fields as lists of ints of the field's length, ``luid`` as 8 bytes, ``uuid`` and
    ``arch`` as struct objects, the rest ints), zero until ``hipGetDeviceProperties`` fills
    it. A field the worker's runtime does not report stays 0. The two HDP register
    pointers (``hdpMemFlushCntl``, ``hdpRegFlushCntl``) read 0: a client has no use for
    the worker's registers (hip-python gives a pointer object)."""

    def __init__(self, **fields: Any) -> None:
        for name in FIELDS:
            object.__setattr__(self, name, _default(name))
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
        if key in _ARRAYS:
            # As long as the C field, whatever the runtime reported.
            items = [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]
            value = (items + [0] * _ARRAYS[key])[: _ARRAYS[key]]
        elif key == "uuid" and isinstance(value, bytes | bytearray):
            value = hipUUID_t(bytes(value))
        elif key in ("uuid", "arch", "luid"):
            continue  # a runtime's own encoding of these is not hip-python's
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
