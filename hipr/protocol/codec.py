"""Sans-I/O frame codec: bytes in, frames out, and back. No sockets here.

A frame is the 24-byte header followed by ``payload_length`` bytes of payload. A
non-empty payload is ``u32 args_length | CBOR args | raw bulk bytes``: the length
prefix lets the bulk part be used in place (no re-encoding, no copy to find where
the CBOR ends). An empty payload means "no arguments, no bulk".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import cbor2

from hipr.errors import ProtocolError
from hipr.protocol.header import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    Flags,
    Header,
)

ARGS_LENGTH = struct.Struct("<I")
_pack_header = HEADER.pack
#: The header followed by the CBOR part's length prefix.
_pack_head = struct.Struct(HEADER.format + "I").pack
#: A payload limit for peers that set none; the worker's config usually lowers it.
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024 + 64 * 1024
_EMPTY = memoryview(b"")
#: Payloads at least this large are assembled in place as they arrive (bulk chunks).
LARGE_PAYLOAD = 64 * 1024


@dataclass(slots=True)
class Frame:
    """One decoded frame. ``error`` is set, and ``args`` is None, when the CBOR part was
    malformed: framing is intact, so the receiver can answer that request and go on."""

    header: Header
    args: Any = None
    bulk: memoryview = field(default_factory=lambda: _EMPTY)
    error: ProtocolError | None = None

    @property
    def opcode(self) -> int:
        """Shorthand for ``header.opcode``."""
        return self.header.opcode

    @property
    def request_id(self) -> int:
        """Shorthand for ``header.request_id``."""
        return self.header.request_id

    @property
    def flags(self) -> Flags:
        """Shorthand for ``header.flags``."""
        return self.header.flags


def encode_frame_parts(
    opcode: int,
    request_id: int,
    flags: Flags = Flags.NONE,
    args: Any = None,
    bulk: bytes | bytearray | memoryview = b"",
    version: int = PROTOCOL_VERSION,
) -> list[bytes | bytearray | memoryview]:
    """The frame as buffers for one vectored write: header+args, then the bulk as given."""
    if not 0 <= request_id <= MAX_REQUEST_ID:
        raise ValueError(f"request id {request_id} does not fit in 32 bits")
    bulk_len = len(bulk) if type(bulk) is bytes else memoryview(bulk).nbytes
    if args is None and bulk_len == 0:
        return [_pack_header(MAGIC, version, opcode, request_id, flags, 0)]
    encoded = b"" if args is None else cbor2.dumps(args)
    payload_length = ARGS_LENGTH.size + len(encoded) + bulk_len
    # One pack for header and length prefix: this runs for every frame sent.
    first = (
        _pack_head(MAGIC, version, opcode, request_id, flags, payload_length, len(encoded))
        + encoded
    )
    return [first, bulk] if bulk_len else [first]


def encode_frame(
    opcode: int,
    request_id: int,
    flags: Flags = Flags.NONE,
    args: Any = None,
    bulk: bytes | bytearray | memoryview = b"",
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """The frame as one bytes object (tests and small frames)."""
    return b"".join(
        bytes(p) for p in encode_frame_parts(opcode, request_id, flags, args, bulk, version)
    )


def decode_payload(header: Header, payload: memoryview) -> Frame:
    """Split a complete payload into CBOR arguments and bulk bytes."""
    if not payload.nbytes:
        return Frame(header)
    if payload.nbytes < ARGS_LENGTH.size:
        return Frame(header, error=ProtocolError(message="payload shorter than its length prefix"))
    (args_length,) = ARGS_LENGTH.unpack_from(payload)
    end = ARGS_LENGTH.size + args_length
    if end > payload.nbytes:
        return Frame(
            header,
            error=ProtocolError(
                message=f"CBOR part of {args_length} bytes overruns a {payload.nbytes}-byte payload"
            ),
        )
    args: Any = None
    if args_length:
        try:
            args = cbor2.loads(payload[ARGS_LENGTH.size : end])
        except Exception as exc:  # cbor2 raises several types for malformed input
            return Frame(header, error=ProtocolError(message=f"malformed CBOR arguments: {exc}"))
    return Frame(header, args, payload[end:])


class FrameDecoder:
    """Incremental decoder: feed it byte slices of any size, take whole frames out.

    A bad magic or a payload over ``max_payload`` raises :class:`ProtocolError`; the
    stream can't be resynchronised after that, so the caller closes the connection.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()
        self._header: Header | None = None
        #: A large payload's pieces as they arrived, and their total size.
        self._pieces: list[bytes] | None = None
        self._filled = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer) + self._filled

    def receive_size(self, small: int = 1 << 16, large: int = 4 << 20) -> int:
        """How much to ask the transport for next: enough to finish the frame under way
        (a bulk chunk arrives in few reads), but a small read between small frames (a
        large read buffer costs an allocation of its full size on every receive)."""
        if self._header is None:
            return small
        missing = self._header.payload_length - self._filled - len(self._buffer)
        return max(small, min(missing, large))

    def take_buffered(self) -> bytes:
        """Everything received but not decoded (a relay passes it on as it is)."""
        if self._header is not None:
            raise RuntimeError("a frame header was already consumed")
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def partial_header(self) -> Header | None:
        """The header of a frame whose payload is still arriving, else None."""
        return self._header

    def take_partial(self) -> tuple[Header, bytes]:
        """Hand over the frame under way: its header and the payload bytes received so
        far. The decoder is then between frames again, and the caller reads the rest of
        the payload from the stream itself (straight into its own buffer)."""
        header = self._header
        if header is None:
            raise RuntimeError("no frame is under way")
        if self._pieces is not None:
            head = b"".join(self._pieces)
        else:
            head = bytes(self._buffer)
            self._buffer.clear()
        self._header = None
        self._pieces = None
        self._filled = 0
        return header, head

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (kept as given only when immutable ``bytes``)."""
        pieces = self._pieces
        if pieces is None:
            self._buffer += data
            return
        # A large payload's pieces are kept as they came and joined once at the end:
        # one copy in all, instead of one into the stream buffer and two to cut it out.
        assert self._header is not None
        view = memoryview(data).cast("B")
        need = self._header.payload_length - self._filled
        if view.nbytes <= need:
            pieces.append(data if type(data) is bytes else view.tobytes())
            self._filled += view.nbytes
        else:
            pieces.append(view[:need].tobytes())
            self._filled += need
            self._buffer += view[need:]

    def frames(self) -> Iterator[Frame]:
        """Every complete frame buffered so far, in order."""
        while (frame := self.next_frame()) is not None:
            yield frame

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive."""
        if self._header is None:
            if len(self._buffer) < HEADER_SIZE:
                if self._buffer and not MAGIC.startswith(bytes(self._buffer[:4])):
                    raise ProtocolError(message=f"bad magic {bytes(self._buffer[:4])!r}")
                return None
            self._header = self._parse_header()
            del self._buffer[:HEADER_SIZE]
        header = self._header
        length = header.payload_length
        if self._pieces is not None:
            if self._filled < length:
                return None
            payload = b"".join(self._pieces)
            self._pieces = None
            self._filled = 0
        elif len(self._buffer) < length:
            if length >= LARGE_PAYLOAD:
                # Memory grows with the bytes that arrive, never ahead of them.
                self._pieces = [bytes(self._buffer)]
                self._filled = len(self._buffer)
                self._buffer.clear()
            return None
        else:
            with memoryview(self._buffer) as view:
                payload = bytes(view[:length])
            del self._buffer[:length]
        self._header = None
        return decode_payload(header, memoryview(payload))

    def _parse_header(self) -> Header:
        magic, version, opcode, request_id, flags, length = HEADER.unpack_from(self._buffer)
        if magic != MAGIC:
            raise ProtocolError(message=f"bad magic {magic!r}, expected {MAGIC!r}")
        if length > self.max_payload:
            raise ProtocolError(
                message=f"frame payload of {length} bytes is over the limit of {self.max_payload}",
                limit=self.max_payload,
            )
        return Header(opcode, request_id, _flags(flags), length, version)


_FLAGS: dict[int, Flags] = {}


def _flags(value: int) -> Flags:
    """``Flags(value)``, cached: building an IntFlag costs more than the rest of a header."""
    flags = _FLAGS.get(value)
    if flags is None:
        flags = Flags(value)
        if len(_FLAGS) < 64:  # a peer's odd values never grow the cache without bound
            _FLAGS[value] = flags
    return flags
