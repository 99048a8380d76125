"""The fixed 24-byte frame header (docs/protocol.md, "Frames"), little-endian on every
platform."""

from __future__ import annotations

import struct
from enum import IntFlag
from typing import NamedTuple

MAGIC = b"HIPR"
PROTOCOL_MAJOR = 1
#: 1.1: LAUNCH_KERNELS and MEMCPY_HTOD_MANY (many launches of one kernel configuration,
#: many small copies on one stream, in one frame). A client sends them only to a worker
#: that answered HELLO with 1.1 or later.
#: 1.2: MODULE_LOAD by content hash (its `sha256` field): a client offers the hash of a
#: code object the worker may hold for its tenant, and sends the bytes only when told
#: `held: false`. A client offers hashes only to a worker that answered HELLO with 1.2.
#: 1.3: LAUNCH_KERNEL(S)'s `synchronize` (launches and a device synchronize fused in one
#: request).
#: 1.4: data links (DATA_LINK, HELLO's `data_links`, MEMCPY_HTOD's `striped`): one upload's
#: chunks over several connections at once, each received by a thread of its own.
PROTOCOL_MINOR = 4
#: Major in the high byte, minor in the low byte, as AMD's C HIP Remote did (0x0100).
PROTOCOL_VERSION = (PROTOCOL_MAJOR << 8) | PROTOCOL_MINOR

HEADER = struct.Struct("<4sHHIIQ")
HEADER_SIZE = HEADER.size
#: Where the request id lies in a header: after the magic, the version and the opcode.
REQUEST_ID_AT = struct.calcsize("<4sHH")
assert HEADER_SIZE == 24

#: Request ids are 32-bit on the wire; 0 is reserved for worker-initiated frames.
MAX_REQUEST_ID = 0xFFFF_FFFF


class Flags(IntFlag):
    """Header flag bits."""

    NONE = 0
    #: Fire-and-forget: the worker sends no reply; an error is reported by the next call.
    NO_REPLY = 1 << 0
    #: The frame answers the request of the same id.
    REPLY = 1 << 1
    #: The reply is an error; its CBOR part is the error map.
    ERROR = 1 << 2
    #: More frames of the same request or reply follow (bulk data in bounded chunks).
    MORE = 1 << 3


def version_major(version: int) -> int:
    """The major number of a header's version field."""
    return version >> 8


def version_text(version: int) -> str:
    """``"1.0"`` for ``0x0100``."""
    return f"{version >> 8}.{version & 0xFF}"


class Header(NamedTuple):
    """One decoded frame header. A named tuple: a frame's header is built on every
    receive, and a tuple is made several times faster than a frozen dataclass."""

    opcode: int
    request_id: int
    flags: Flags
    payload_length: int
    version: int = PROTOCOL_VERSION

    def pack(self) -> bytes:
        """The header's 24 bytes."""
        return HEADER.pack(
            MAGIC, self.version, self.opcode, self.request_id, int(self.flags), self.payload_length
        )
