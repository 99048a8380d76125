"""Sans-I/O frame codec: bytes in, frames out, and back. No sockets here.

A frame is the 24-byte header followed by ``payload_length`` bytes of payload. A
non-empty payload is ``u32 args_length | CBOR args | raw bulk bytes``: the length
prefix lets the bulk part be used in place (no re-encoding, no copy to find where
the CBOR ends). An empty payload means "no arguments, no bulk".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cbor2

from hipr.errors import ProtocolError
from hipr.protocol.bounded_cbor import CborLimits, scan
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
_unpack_header = HEADER.unpack_from
_PREFIX = ARGS_LENGTH.size
#: The header and the CBOR part's length prefix, unpacked in one call.
_unpack_head = struct.Struct(HEADER.format + "I").unpack_from
_HEAD_SIZE = HEADER_SIZE + _PREFIX
#: The prefix of a frame too short to hold one: never ``payload_length - _PREFIX``.
_NO_PREFIX = -_PREFIX - 1
#: ``cbor2.dumps({})``: "no arguments but a map" is common on both sides, and the
#: encoder and decoder each cost a few hundred ns to produce or read this one byte.
_CBOR_EMPTY_MAP = b"\xa0"
_CBOR_EMPTY_MAP_BYTE = _CBOR_EMPTY_MAP[0]
#: ``Header`` without its Python-level ``__new__`` (the fields come straight from the
#: struct, already in range): about half the cost of ``Header(...)``.
_new_header = tuple.__new__
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
    #: A plain default, not a factory: the shared empty view is immutable, and a
    #: factory costs a call in every frame built without bulk.
    bulk: memoryview = _EMPTY
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
    if args is None:
        if not bulk_len:
            return [_pack_header(MAGIC, version, opcode, request_id, flags, 0)]
        encoded = b""
    elif type(args) is dict and not args:
        encoded = _CBOR_EMPTY_MAP
    else:
        encoded = cbor2.dumps(args)
    # One pack for header and length prefix: this runs for every frame sent.
    first = (
        _pack_head(
            MAGIC,
            version,
            opcode,
            request_id,
            flags,
            _PREFIX + len(encoded) + bulk_len,
            len(encoded),
        )
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
    # encode_frame_parts' body again rather than a call to it and a join of its list:
    # most frames sent whole are small, and the call and join were half their cost.
    if not 0 <= request_id <= MAX_REQUEST_ID:
        raise ValueError(f"request id {request_id} does not fit in 32 bits")
    if type(bulk) is not bytes:
        # Flattened as a write would; memoryview() refuses what is not a buffer, as
        # encode_frame_parts does (bytes() would take a list of ints).
        bulk = memoryview(bulk).tobytes()
    if args is None:
        if not bulk:
            return _pack_header(MAGIC, version, opcode, request_id, flags, 0)
        encoded = b""
    elif type(args) is dict and not args:
        encoded = _CBOR_EMPTY_MAP
    else:
        encoded = cbor2.dumps(args)
    head = _pack_head(
        MAGIC,
        version,
        opcode,
        request_id,
        flags,
        _PREFIX + len(encoded) + len(bulk),
        len(encoded),
    )
    return head + encoded + bulk if bulk else head + encoded


def decode_payload(header: Header, payload: memoryview, limits: CborLimits | None = None) -> Frame:
    """Split a complete payload into CBOR arguments and bulk bytes. With ``limits``,
    arguments over them raise :class:`ProtocolError` (``hipr.protocol.bounded_cbor``):
    the frame is refused, not answered."""
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
        if limits is not None and args_length > limits.max_items:
            scan(payload, limits, ARGS_LENGTH.size, end)
        part = payload[ARGS_LENGTH.size : end]
        try:
            if limits is None:
                args = cbor2.loads(part)
            else:
                args = cbor2.loads(part, strict_hashable_types=True)
        except Exception as exc:  # cbor2 raises several types for malformed input
            return Frame(header, error=ProtocolError(message=f"malformed CBOR arguments: {exc}"))
    return Frame(header, args, payload[end:])


class FrameDecoder:
    """Incremental decoder: feed it byte slices of any size, take whole frames out.

    A bad magic or a payload over ``max_payload`` raises :class:`ProtocolError`; the
    stream can't be resynchronised after that, so the caller closes the connection.
    With ``limits`` (the worker), CBOR arguments over them raise it too, before cbor2
    builds anything (``hipr.protocol.bounded_cbor``); ``max_payload`` may be changed
    between frames (the worker lowers it until the handshake is over).
    """

    def __init__(
        self, max_payload: int = DEFAULT_MAX_PAYLOAD, limits: CborLimits | None = None
    ) -> None:
        self.max_payload = max_payload
        self.limits = limits
        #: CBOR parts longer than this are scanned before they are decoded: a part of
        #: at most ``max_items`` bytes cannot hold more items than that.
        self._scan_above = limits.max_items if limits is not None else 1 << 62
        #: Map keys only strings (the hash-collision guard, ~40 ns a frame); nesting is
        #: cbor2's own limit below ``_scan_above`` bytes (the scan's above: a depth
        #: argument cost ~100 ns a frame).
        self._strict = limits is not None
        self._buffer = bytearray()
        #: A ``bytes`` object fed between frames, decoded in place from ``_offset``: a
        #: receive usually holds whole small frames, and copying it into ``_buffer``
        #: only to cut the frames out again cost more than the rest of their decoding.
        #: Non-empty only while ``_buffer`` is empty and no frame is under way; what is
        #: left of it when a frame is cut short moves to ``_buffer`` (``_spill``).
        self._chunk = b""
        self._offset = 0
        self._header: Header | None = None
        #: A large payload's pieces as they arrived, and their total size.
        self._pieces: list[bytes] | None = None
        self._filled = 0

    @property
    def scan_above(self) -> int:
        """CBOR parts longer than this many bytes are scanned against the limits before
        they are decoded."""
        return self._scan_above

    @property
    def strict(self) -> bool:
        """True when map keys must be strings (the handshake set CBOR limits)."""
        return self._strict

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        # _offset is stale once _chunk is used up (resetting it costs every frame).
        unread = len(self._chunk) - self._offset if self._chunk else 0
        return len(self._buffer) + self._filled + unread

    def next_flags(self) -> int | None:
        """The flags of the next frame, read from its header without decoding it; None
        while no whole header of a next frame is buffered (or a frame is under way)."""
        if self._header is not None:
            return None
        if self._chunk:
            data: bytes | bytearray = self._chunk
            pos = self._offset
        else:
            data = self._buffer
            pos = 0
        if len(data) - pos < HEADER_SIZE:
            return None
        return int(_unpack_header(data, pos)[4])

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
        if self._chunk:
            self._spill()
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
            if self._chunk:
                self._spill()
            elif type(data) is bytes and self._header is None and not self._buffer:
                self._chunk = data
                self._offset = 0
                return
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
        # A C-level iterator over next_frame rather than a generator: no generator frame
        # to build and resume per frame. It calls next_frame as it goes, so the decoder
        # may be fed or read directly between two frames, as with a generator.
        return iter(self.next_frame, None)

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive."""
        header = self._header
        if header is None:
            # Between frames: parse the header where the bytes lie, and when the whole
            # frame is there (the usual case for small frames), decode it in one go,
            # never passing through the "payload under way" state. This body is the
            # cost of every small frame received, hence inline rather than in helpers.
            chunk = self._chunk
            data: bytes | bytearray
            if chunk:
                data = chunk
                pos = self._offset
            else:
                data = self._buffer
                if not data:
                    return None  # the last call of every frames() loop: keep it short
                pos = 0
            available = len(data) - pos
            if available >= HEADER_SIZE:
                if available >= _HEAD_SIZE:
                    # The CBOR part's length prefix in the same unpack; it belongs to
                    # this frame only when the payload has room for it (checked below).
                    magic, version, opcode, request_id, flags, length, args_length = _unpack_head(
                        data, pos
                    )
                else:
                    magic, version, opcode, request_id, flags, length = _unpack_header(data, pos)
                    args_length = _NO_PREFIX
                if magic != MAGIC or length > self.max_payload:
                    raise self._refusal(magic, length)
                header = _new_header(
                    Header,
                    (
                        opcode,
                        request_id,
                        _FLAGS[flags] if flags < _FLAGS_KNOWN else _flags(flags),
                        length,
                        version,
                    ),
                )
                start = pos + HEADER_SIZE
                end = start + length
                if end <= len(data):
                    frame: Frame
                    if args_length == length - _PREFIX:
                        # CBOR arguments and no bulk, the usual small frame: what
                        # decode_payload gives, less its payload copy and views.
                        if not args_length:
                            frame = Frame(header)
                        elif args_length == 1 and data[end - 1] == _CBOR_EMPTY_MAP_BYTE:
                            frame = Frame(header, {})
                        else:
                            if args_length > self._scan_above:
                                self._check_limits(data, start + _PREFIX, end)
                            # cbor2 decodes a slice as it would a view (same errors too).
                            try:
                                if self._strict:
                                    value = cbor2.loads(
                                        data[start + _PREFIX : end], strict_hashable_types=True
                                    )
                                else:
                                    value = cbor2.loads(data[start + _PREFIX : end])
                                frame = Frame(header, value)
                            except Exception as exc:  # cbor2 raises several types
                                frame = Frame(
                                    header,
                                    error=ProtocolError(message=f"malformed CBOR arguments: {exc}"),
                                )
                    elif not length:
                        frame = Frame(header)
                    else:
                        # Bulk bytes follow the CBOR part, or the length prefix is
                        # malformed: decode_payload's own answer, on a payload copy.
                        if chunk:
                            payload = chunk[start:end]
                        else:
                            with memoryview(data) as view:
                                payload = bytes(view[start:end])
                        frame = decode_payload(header, memoryview(payload), self.limits)
                    if chunk:
                        if end == len(chunk):
                            self._chunk = b""
                        else:
                            self._offset = end
                    elif end == len(data):
                        self._buffer.clear()  # exactly whole frames: nothing to move
                    else:
                        del self._buffer[:end]
                    return frame
                if chunk:
                    self._spill()
                self._header = header
                del self._buffer[:HEADER_SIZE]
            else:
                if chunk:
                    self._spill()
                buffer = self._buffer
                if buffer and not MAGIC.startswith(bytes(buffer[:4])):
                    raise ProtocolError(message=f"bad magic {bytes(buffer[:4])!r}")
                return None
        buffer = self._buffer
        length = header.payload_length
        if self._pieces is not None:
            if self._filled < length:
                return None
            payload = b"".join(self._pieces)
            self._pieces = None
            self._filled = 0
        elif len(buffer) < length:
            if length >= LARGE_PAYLOAD:
                if self.limits is not None and len(buffer) > _PREFIX:
                    self._check_start(buffer)
                # Memory grows with the bytes that arrive, never ahead of them.
                self._pieces = [bytes(buffer)]
                self._filled = len(buffer)
                buffer.clear()
            return None
        else:
            with memoryview(buffer) as view:
                payload = bytes(view[:length])
            del buffer[:length]
        self._header = None
        return decode_payload(header, memoryview(payload), self.limits)

    def decode_payload(self, header: Header, payload: memoryview) -> Frame:
        """:func:`decode_payload` under this decoder's limits (a payload the caller
        received itself, straight into its own buffer)."""
        return decode_payload(header, payload, self.limits)

    def _check_limits(self, data: bytes | bytearray, start: int, end: int) -> None:
        """Refuse (ProtocolError) CBOR arguments over the limits, before decoding."""
        assert self.limits is not None
        scan(data, self.limits, start, end)

    def _check_start(self, buffer: bytearray) -> None:
        """A large frame's first bytes: refuse it now if the CBOR that has arrived is
        over the limits already (a bomb's array head declares its millions of items
        up front), before the rest of its payload is buffered."""
        assert self.limits is not None
        (args_length,) = ARGS_LENGTH.unpack_from(buffer)
        if args_length > self.limits.max_items:
            scan(buffer, self.limits, _PREFIX, min(len(buffer), _PREFIX + args_length))

    def _spill(self) -> None:
        """Move what is left of ``_chunk`` to ``_buffer`` (a frame was cut short, or
        more bytes arrived before the chunk was decoded)."""
        chunk = self._chunk
        offset = self._offset
        self._buffer += chunk if not offset else memoryview(chunk)[offset:]
        self._chunk = b""
        self._offset = 0

    def _refusal(self, magic: bytes, length: int) -> ProtocolError:
        """Why a header is refused: the stream is not one of ours, or the frame is
        larger than this decoder accepts."""
        if magic != MAGIC:
            return ProtocolError(message=f"bad magic {magic!r}, expected {MAGIC!r}")
        return ProtocolError(
            message=f"frame payload of {length} bytes is over the limit of {self.max_payload}",
            limit=self.max_payload,
            refused="frame_size",
        )


#: Every combination of the defined flag bits, by value: building an IntFlag costs more
#: than the rest of a header, and a tuple index is cheaper than a dict lookup.
_FLAGS: tuple[Flags, ...] = tuple(Flags(value) for value in range(2 * max(Flags)))
_FLAGS_KNOWN = len(_FLAGS)
_ODD_FLAGS: dict[int, Flags] = {}


def _flags(value: int) -> Flags:
    """``Flags(value)`` for values with undefined bits set, cached."""
    flags = _ODD_FLAGS.get(value)
    if flags is None:
        flags = Flags(value)
        if len(_ODD_FLAGS) < 64:  # a peer's odd values never grow the cache without bound
            _ODD_FLAGS[value] = flags
    return flags
