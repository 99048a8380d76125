"""The wire protocol, sans-I/O: header, opcodes, frame codec."""

from hipr.protocol.codec import (
    DEFAULT_MAX_PAYLOAD,
    Frame,
    FrameDecoder,
    decode_payload,
    encode_frame,
    encode_frame_parts,
)
from hipr.protocol.header import (
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    PROTOCOL_VERSION,
    Flags,
    Header,
    version_major,
    version_text,
)
from hipr.protocol.opcodes import Opcode, OpcodeRange, opcode_name

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "HEADER_SIZE",
    "MAGIC",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PROTOCOL_VERSION",
    "Flags",
    "Frame",
    "FrameDecoder",
    "Header",
    "Opcode",
    "OpcodeRange",
    "decode_payload",
    "encode_frame",
    "encode_frame_parts",
    "opcode_name",
    "version_major",
    "version_text",
]
