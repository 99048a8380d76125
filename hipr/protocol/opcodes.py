"""Opcodes, grouped in ranges of 256: one range per handler module. Each opcode's request
and reply are declared in :mod:`hipr.protocol.messages` (docs/protocol.md, "Opcodes")."""

from __future__ import annotations

from enum import IntEnum


class OpcodeRange(IntEnum):
    """The high byte of an opcode: which handler module owns it."""

    SESSION = 0x00
    DEVICE = 0x01
    MEMORY = 0x02
    STREAM = 0x03
    EVENT = 0x04
    MODULE = 0x05
    GRAPH = 0x06
    ADMIN = 0x07


class Opcode(IntEnum):
    """Every request a client can send. Values are wire-stable: never renumber."""

    # session / system 0x00xx
    HELLO = 0x0001
    GOODBYE = 0x0002
    PING = 0x0003
    #: Continuation of a request's bulk data (the request frame had MORE set).
    DATA = 0x0004
    RESUME = 0x0005
    SYNC_ERRORS = 0x0006
    #: Runs in order and replies; its reply acknowledges every earlier request.
    BARRIER = 0x0007
    #: The first frame of a data link: a further connection of a session that carries
    #: the chunks of its striped uploads (protocol 1.4).
    DATA_LINK = 0x0008

    # device 0x01xx
    DEVICE_COUNT = 0x0101
    SET_DEVICE = 0x0102
    GET_DEVICE = 0x0103
    DEVICE_PROPERTIES = 0x0104
    DEVICE_SYNCHRONIZE = 0x0105
    MEM_GET_INFO = 0x0106
    #: A device limit (CUDA's CUlimit numbering), read only: the CUDA proxy's cuCtxGetLimit.
    DEVICE_LIMIT = 0x0107

    # memory 0x02xx
    MALLOC = 0x0201
    FREE = 0x0202
    MEMCPY_HTOD = 0x0210
    MEMCPY_DTOH = 0x0211
    MEMCPY_DTOD = 0x0212
    #: Protocol 1.1: small host-to-device copies on one stream, their bytes one after another.
    MEMCPY_HTOD_MANY = 0x0213
    MEMSET = 0x0220
    MALLOC_HTOD = 0x0230

    # stream 0x03xx
    STREAM_CREATE = 0x0301
    STREAM_DESTROY = 0x0302
    STREAM_SYNCHRONIZE = 0x0303
    STREAM_QUERY = 0x0304
    STREAM_WAIT_EVENT = 0x0305
    STREAM_BEGIN_CAPTURE = 0x0310
    STREAM_END_CAPTURE = 0x0311

    # event 0x04xx
    EVENT_CREATE = 0x0401
    EVENT_DESTROY = 0x0402
    EVENT_RECORD = 0x0403
    EVENT_SYNCHRONIZE = 0x0404
    EVENT_QUERY = 0x0405
    EVENT_ELAPSED_TIME = 0x0406

    # module 0x05xx
    MODULE_COMPILE = 0x0501
    MODULE_LOAD = 0x0502
    MODULE_UNLOAD = 0x0503
    MODULE_GET_FUNCTION = 0x0504
    MODULE_BUILTIN = 0x0505
    COMPILE_AND_GET_FUNCTION = 0x0506
    #: Compile only: the code object comes back (hiprtcGetCode), nothing is loaded.
    PROGRAM_COMPILE = 0x0507
    #: A kernel's parameter layout, for clients given bare argument pointers (the proxy's
    #: kernelParams). Asked only of a worker that lists it; older ones answer unknown-opcode.
    FUNCTION_PARAMS = 0x0508
    #: A kernel's attribute (CUDA's CUfunction_attribute numbering), read or set: the
    #: CUDA proxy's cuFuncGetAttribute / cuFuncSetAttribute.
    FUNCTION_ATTRIBUTE = 0x0509
    #: A kernel's occupancy on the device (cuOccupancy*), for the CUDA proxy.
    FUNCTION_OCCUPANCY = 0x050A
    #: A loaded module's global variable (address and size), for the CUDA proxy's
    #: cuModuleGetGlobal / cuLibraryGetGlobal; copies may then name it.
    MODULE_GET_GLOBAL = 0x050B
    #: Link compiled device code (hiprtcLink* / cuLink*) into one loadable image.
    PROGRAM_LINK = 0x050C
    LAUNCH_KERNEL = 0x0510
    #: Protocol 1.1: launches of one kernel configuration, one argument buffer each.
    LAUNCH_KERNELS = 0x0511

    # graph 0x06xx
    GRAPH_CREATE = 0x0601
    GRAPH_DESTROY = 0x0602
    GRAPH_ADD_MEMSET = 0x0610
    GRAPH_ADD_MEMCPY = 0x0611
    GRAPH_ADD_KERNEL = 0x0612
    GRAPH_INSTANTIATE = 0x0620
    GRAPH_LAUNCH = 0x0621
    GRAPH_EXEC_DESTROY = 0x0622

    # admin 0x07xx
    ADMIN_STATUS = 0x0701

    @property
    def range(self) -> OpcodeRange:
        """The range, and so the handler module, this opcode belongs to."""
        return OpcodeRange(self.value >> 8)


#: Names by value: the worker names every request it runs (logs, metrics), and a dict
#: look-up costs a fraction of building the enum member.
_NAMES: dict[int, str] = {op.value: op.name for op in Opcode}


def opcode_name(value: int) -> str:
    """``"MALLOC"`` for 0x0201; ``"0x7f01"`` for a value with no name."""
    name = _NAMES.get(value)
    return name if name is not None else f"0x{value:04x}"
