"""Device messages (0x01xx)."""

from __future__ import annotations

from hipr.protocol.messages._schema import Message, Out, field, message
from hipr.protocol.opcodes import Opcode

_DEVICE_RANGE = "[0, 2^31-1], below DEVICE_COUNT's `count`"


@message(Opcode.DEVICE_COUNT, reply=(Out("count", "uint", "devices the session can use"),))
class DeviceCount(Message):
    """How many devices are visible."""


@message(Opcode.SET_DEVICE)
class SetDevice(Message):
    """Make a device current for the session's later calls (replies `{}`)."""

    device = field("uint", "the device's index", range=_DEVICE_RANGE)


@message(Opcode.GET_DEVICE, reply=(Out("device", "uint", "the session's current device"),))
class GetDevice(Message):
    """The session's current device."""


@message(
    Opcode.DEVICE_PROPERTIES,
    reply=(
        Out("name", "text", "the device's marketing name"),
        Out("arch", "text", "gcnArchName on AMD (`gfx942:sramecc+`), `sm_90` on NVIDIA"),
        Out("total_memory", "size", "device memory", unit="bytes"),
        Out("multiprocessor_count", "uint", "compute units / SMs"),
        Out("warp_size", "uint", "threads per wavefront / warp"),
        Out("max_threads_per_block", "uint", "threads one block may have"),
        Out("clock_rate_khz", "uint", "the core clock", unit="kHz"),
        Out("pci_bus_id", "text", "`0000:3b:00.0`"),
        Out("major", "uint", "compute capability major (0 where it has none)"),
        Out("minor", "uint", "compute capability minor"),
        Out("max_shared_memory_per_block", "size", "shared memory per block", unit="bytes"),
        Out(
            "hip_props",
            "map",
            "more `hipDeviceProp_t` fields by their HIP names (`maxThreadsDim`, "
            "`maxGridSize`, `l2CacheSize`, ...): integers or arrays of integers, as far as "
            "the runtime tells them",
        ),
    ),
)
class DeviceProperties(Message):
    """A device's properties."""

    device = field("uint", "the device's index", range=_DEVICE_RANGE)


@message(Opcode.DEVICE_SYNCHRONIZE)
class DeviceSynchronize(Message):
    """Wait for all of the session's work on the current device (replies `{}`). A
    synchronising call: an earlier fire-and-forget error is its error reply."""


@message(
    Opcode.MEM_GET_INFO,
    reply=(
        Out("free", "size", "free memory of the current device", unit="bytes"),
        Out("total", "size", "total memory of the current device", unit="bytes"),
    ),
)
class MemGetInfo(Message):
    """Free and total memory of the current device."""


#: CUlimit values are small; anything past this is a client's mistake.
MAX_DEVICE_LIMIT = 64


@message(Opcode.DEVICE_LIMIT, reply=(Out("value", "uint", "the limit's value"),))
class DeviceLimit(Message):
    """A limit of the current device's context in CUlimit numbering (stack size, printf
    FIFO, malloc heap, L2 fetch granularity, persisting L2 size, ...), as cuCtxGetLimit
    reads it. Read only: the context may be shared by tenants, and a limit set would hold
    for all of them. hipErrorNotSupported on a backend that cannot tell (hip and the
    emulator for now); hipErrorUnsupportedLimit for a limit the driver does not know."""

    limit = field("uint", "the CUlimit number", range=f"[0, {MAX_DEVICE_LIMIT}]")
