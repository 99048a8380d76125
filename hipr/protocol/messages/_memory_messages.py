"""Memory messages (0x02xx): allocation, copies, memset."""

from __future__ import annotations

from hipr.protocol.messages._schema import Message, Out, field, message
from hipr.protocol.opcodes import Opcode

#: Pieces one MEMCPY_HTOD_MANY may carry, and bytes in all (the Python client sends at
#: most 64 pieces of at most 4 KiB, 64 KiB in all: BATCH_ITEMS, BATCH_BYTES).
MAX_PIECES = 4096
MAX_PIECES_BYTES = 1 << 20

_STREAM_DOC = "the stream; absent, null or 0: the null stream of the current device"


def _stream() -> str:
    return field("handle", _STREAM_DOC, required=False, default="the null stream")


@message(Opcode.MALLOC, reply=(Out("ptr", "address", "the allocation's start (0 for size 0)"),))
class Malloc(Message):
    """Allocate on the current device. Size 0 gives the null pointer and allocates
    nothing, as `hipMalloc` does. Counted against the tenant's `max_device_memory`."""

    size = field("size", "bytes to allocate", unit="bytes")


@message(Opcode.FREE, fire_and_forget=True)
class Free(Message):
    """Free an allocation of this session. The null pointer is a no-op, as
    `hipFree(nullptr)` is. While a graph of the session may still write it (or a capture
    runs), the memory stays held and counted until that graph and its instantiations are
    destroyed or the session ends."""

    ptr = field("address", "the allocation's start address")


@message(
    Opcode.MEMCPY_HTOD,
    fire_and_forget=True,
    streams_request=True,
    request_bulk="the `size` bytes to copy: in this frame after the CBOR map and, for a "
    "copy larger than a chunk, in DATA frames that follow",
)
class MemcpyHtod(Message):
    """Copy host bytes to device memory of this session."""

    dst = field("address", "where the bytes go; [dst, dst+size) must lie in one allocation")
    size = field("size", "bytes to copy: the request's bulk data in all", unit="bytes")
    stream = _stream()
    striped = field(
        "bool",
        "the bytes come as chunks on the session's data links (DATA_LINK, protocol 1.4), "
        "not in this request, which then has no bulk and must wait for its reply. Chunk "
        "`j` holds bytes `[j * chunk_bytes, min((j + 1) * chunk_bytes, size))`, on any data "
        "link, in any order, before or after this request; one sent again brings the same "
        "bytes. Replied once every chunk arrived and its copy was issued; a copy none of "
        "whose chunks arrives for the worker's `frame_timeout` fails (`invalid_value`, "
        "`stalled`)",
        required=False,
        default="false",
    )


@message(
    Opcode.MEMCPY_DTOH,
    reply=(Out("size", "size", "bytes copied: the reply's bulk data in all", unit="bytes"),),
    reply_bulk="the bytes read: copies larger than 4 MiB come as REPLY|MORE frames (no "
    "CBOR part, chunks of 4 MiB) before the final REPLY frame, which carries `{size}` "
    "and the last chunk",
)
class MemcpyDtoh(Message):
    """Copy device memory of this session to the host."""

    src = field("address", "where the bytes come from; [src, src+size) in one allocation")
    size = field("size", "bytes to copy", unit="bytes")
    stream = _stream()
    striped = field(
        "bool",
        "the bytes go out as chunks on the session's data links (DATA_LINK, protocol 1.4), "
        "not in the reply, which then carries `{size}` alone. Chunk `j` (bytes "
        "`[j * chunk_bytes, min((j + 1) * chunk_bytes, size))`) is a frame DATA, flags "
        "REPLY, this request's id, CBOR part `{offset}` and the bytes, on data link `j` "
        "modulo the links attached; the reply follows once every chunk was written. A "
        "session without data links, or a link that fails or stops being read for the "
        "worker's `frame_timeout`, fails the request: a read changes nothing, so the "
        "client may ask again without `striped`",
        required=False,
        default="false",
    )


@message(Opcode.MEMCPY_DTOD, fire_and_forget=True)
class MemcpyDtod(Message):
    """Copy between this session's allocations."""

    dst = field("address", "destination; [dst, dst+size) in one allocation")
    src = field("address", "source; [src, src+size) in one allocation")
    size = field("size", "bytes to copy", unit="bytes")
    stream = _stream()


@message(
    Opcode.MEMCPY_HTOD_MANY,
    fire_and_forget=True,
    request_bulk="the pieces' bytes, one after another, `sum(size)` bytes in all, in this "
    "one frame",
    batch_of="MEMCPY_HTOD",
    since_minor=1,
)
class MemcpyHtodMany(Message):
    """Host-to-device copies in order, as if each came as its own MEMCPY_HTOD on
    `stream`. Each destination range is checked; a refused piece (outside the session's
    allocations, or past the tenant's `max_request_rate`: each piece counts as one
    request) stops none of the others; the first refusal, else a failure of the copies,
    is the request's error, a refusal naming its piece."""

    dst = field(
        "[uint]",
        "each piece's device address",
        range=f"1 to {MAX_PIECES} items, as many as `size`",
    )
    size = field(
        "[uint]",
        "each piece's byte count",
        unit="bytes",
        range=f"each at most {MAX_PIECES_BYTES}; their sum is the bulk data's length",
    )
    stream = _stream()


@message(Opcode.MEMSET, fire_and_forget=True)
class Memset(Message):
    """Set `size` bytes to the byte `value`."""

    ptr = field("address", "start; [ptr, ptr+size) in one allocation")
    value = field("uint", "the byte", range="[0, 255]")
    size = field("size", "bytes to set", unit="bytes")
    stream = _stream()


@message(
    Opcode.MALLOC_HTOD,
    streams_request=True,
    reply=(Out("ptr", "address", "the new allocation's start"),),
    request_bulk="the `size` bytes, in this frame and DATA frames, as MEMCPY_HTOD's",
)
class MallocHtod(Message):
    """Allocate and fill in one round trip. Nothing stays allocated when the copy fails."""

    size = field("size", "bytes to allocate and copy, at least 1", unit="bytes")
    stream = field(
        "handle",
        "the stream the copy runs on (the Python client sends none)",
        required=False,
        default="the null stream",
    )
