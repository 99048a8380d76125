"""The codec's fast paths against its slow ones.

The decoder takes a whole small frame out in one step, straight from a fed ``bytes``
object or from its buffer, and leaves anything else (a frame cut short, a payload with
bulk bytes, a malformed length prefix) to ``decode_payload``. Fed a byte at a time it
goes the slow way for every frame; fed whole, the fast way: both must give what
``decode_payload`` gives for each frame, and refuse the same streams.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipr.errors import ProtocolError
from hipr.protocol import (
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_VERSION,
    Flags,
    Frame,
    FrameDecoder,
    Header,
    decode_payload,
    encode_frame,
    encode_frame_parts,
)
from hipr.protocol.codec import LARGE_PAYLOAD
from hipr.protocol.header import HEADER

MAX_PAYLOAD = 4096

#: What a frame decoded to, comparable across decoders (repr, for NaN and for objects
#: that compare by identity, less the addresses in it).
Outcome = tuple[Header, type, str, bytes, str | None]


def outcome(frame: Frame) -> Outcome:
    error = None if frame.error is None else f"{type(frame.error).__name__}: {frame.error}"
    args = re.sub(r" at 0x[0-9a-f]+", "", repr(frame.args))
    return frame.header, type(frame.header.flags), args, bytes(frame.bulk), error


def reference(data: bytes) -> tuple[list[Outcome], bool, int]:
    """The frames of ``data`` by ``decode_payload`` alone, whether the stream is
    refused after them, and how many bytes are left undecoded (-1 when refused: how
    much was buffered then depends on how the bytes came)."""
    frames: list[Outcome] = []
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        magic, version, opcode, request_id, flags, length = HEADER.unpack_from(data, pos)
        if magic != MAGIC or length > MAX_PAYLOAD:
            return frames, True, -1
        end = pos + HEADER_SIZE + length
        if end > len(data):
            return frames, False, len(data) - pos - HEADER_SIZE  # the header is taken
        header = Header(opcode, request_id, Flags(flags), length, version)
        frames.append(outcome(decode_payload(header, memoryview(data[pos + HEADER_SIZE : end]))))
        pos = end
    if len(data) - pos < HEADER_SIZE and not MAGIC.startswith(data[pos : pos + 4]):
        return frames, True, -1
    return frames, False, len(data) - pos


def decode(pieces: Iterable[bytes | bytearray | memoryview]) -> tuple[list[Outcome], bool, int]:
    """Feed ``pieces`` in turn, taking frames out after each: what ``reference`` says."""
    decoder = FrameDecoder(MAX_PAYLOAD)
    frames: list[Outcome] = []
    try:
        for piece in pieces:
            decoder.feed(piece)
            frames.extend(outcome(frame) for frame in decoder.frames())
    except ProtocolError:
        return frames, True, -1
    return frames, False, decoder.buffered


def _payload_frame(opcode: int, request_id: int, flags: int, payload: bytes) -> bytes:
    """A frame with a valid header and any payload at all (malformed ones included)."""
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, opcode, request_id, flags, len(payload)) + payload


simple_values = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.text(max_size=6)
good_frames = st.builds(
    lambda op, rid, fl, args, bulk: encode_frame(op, rid, Flags(fl), args, bulk),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**32 - 1),
    st.integers(0, 31),  # undefined flag bits too: they take the uncached way
    st.none() | st.just({}) | st.dictionaries(st.text(max_size=4), simple_values, max_size=3),
    st.binary(max_size=24),
)
# Payloads of every shape: too short for the prefix, a prefix of any value, junk CBOR.
odd_payloads = st.one_of(
    st.binary(max_size=3),
    st.builds(
        lambda n, rest: struct.pack("<I", n) + rest,
        st.integers(0, 12) | st.integers(0, 2**32 - 1),
        st.binary(max_size=12),
    ),
)
odd_frames = st.builds(
    _payload_frame,
    st.integers(0, 0xFFFF),
    st.integers(0, 2**32 - 1),
    st.integers(0, 15),
    odd_payloads,
)
# What may follow the frames: nothing, a frame cut short, a frame over the limit, junk.
tails = st.one_of(
    st.just(b""),
    st.binary(max_size=30),
    good_frames.flatmap(lambda f: st.integers(1, len(f) - 1).map(lambda n: f[:n])),
    st.just(HEADER.pack(MAGIC, PROTOCOL_VERSION, 1, 1, 0, MAX_PAYLOAD + 1)),
)
streams = st.builds(
    lambda frames, tail: b"".join(frames) + tail,
    st.lists(good_frames | odd_frames, max_size=4),
    tails,
)


def _every(feed: Callable[[bytes], Any], data: bytes) -> None:
    for cut in range(len(data) + 1):
        assert decode([feed(data[:cut]), feed(data[cut:])]) == reference(data), cut


@settings(max_examples=150, deadline=None)
@given(data=streams)
def test_fast_and_slow_paths_agree(data: bytes) -> None:
    expected = reference(data)
    assert decode([data]) == expected  # in place from the fed bytes
    assert decode([bytearray(data)]) == expected  # from the buffer
    assert decode([memoryview(data)[i : i + 1] for i in range(len(data))]) == expected
    assert decode([data[i : i + 1] for i in range(len(data))]) == expected
    _every(bytes, data)  # a frame split at every byte boundary
    _every(bytearray, data)


@pytest.mark.parametrize("kind", [bytes, bytearray])
@pytest.mark.parametrize("length", [1, 2, 3])
def test_a_payload_too_short_for_its_prefix_alone_in_the_buffer(kind: type, length: int) -> None:
    # 24 to 27 bytes buffered: the header is read without a prefix after it.
    data = _payload_frame(1, 2, 0, b"\x01" * length)
    decoder = FrameDecoder()
    decoder.feed(kind(data))
    (frame,) = decoder.frames()
    assert frame.args is None and frame.error is not None
    assert frame.error.message == "payload shorter than its length prefix"
    assert decoder.buffered == 0


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_a_frame_of_no_payload_followed_by_another(kind: type) -> None:
    # The prefix unpacked with the first header is the second frame's magic.
    data = encode_frame(1, 2) + encode_frame(3, 4, Flags.REPLY, {"a": 1})
    decoder = FrameDecoder()
    decoder.feed(kind(data))
    first, second = decoder.frames()
    assert (first.opcode, first.args, first.bulk.nbytes) == (1, None, 0)
    assert (second.opcode, second.flags, second.args) == (3, Flags.REPLY, {"a": 1})


def test_decoded_frames_keep_the_public_types() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(5, 6, Flags.REPLY | Flags.MORE, {}) + encode_frame(7, 8, Flags(64)))
    first, second = decoder.frames()
    assert type(first.header) is Header and type(first.flags) is Flags
    assert first.flags == Flags.REPLY | Flags.MORE and Flags.MORE in first.flags
    assert first.args == {} and first.header == Header(5, 6, Flags.REPLY | Flags.MORE, 5)
    assert type(second.flags) is Flags and int(second.flags) == 64
    # Each frame gets its own argument map, never a shared one.
    decoder.feed(encode_frame(5, 9, Flags.NONE, {}))
    (third,) = decoder.frames()
    assert third.args == {} and third.args is not first.args


def test_bulk_does_not_pin_the_received_bytes() -> None:
    # A bulk view of the fed bytes would keep a whole receive alive for a small chunk.
    data = encode_frame(1, 2, Flags.NONE, {"n": 1}, b"bulk") + encode_frame(3, 4)
    decoder = FrameDecoder()
    decoder.feed(data)
    first, _ = decoder.frames()
    assert bytes(first.bulk) == b"bulk" and first.bulk.obj is not data
    assert first.bulk.readonly


def test_buffered_counts_what_is_left_of_a_fed_bytes_object() -> None:
    one = encode_frame(1, 2, Flags.NONE, {"a": 1})
    two = encode_frame(3, 4, Flags.NONE, {"b": 2}, b"xyz")
    decoder = FrameDecoder()
    decoder.feed(one + two + two[:5])
    assert decoder.buffered == len(one) + len(two) + 5
    assert decoder.next_frame() is not None
    assert decoder.buffered == len(two) + 5
    assert decoder.next_frame() is not None
    assert decoder.buffered == 5
    assert decoder.next_frame() is None
    decoder.feed(two[5:])
    assert decoder.next_frame() is not None
    assert decoder.buffered == 0
    decoder.feed(one)
    assert decoder.next_frame() is not None and decoder.buffered == 0


def test_take_buffered_includes_a_fed_bytes_object() -> None:
    one = encode_frame(1, 2, Flags.NONE, {"a": 1})
    rest = encode_frame(3, 4) + b"HIP"
    decoder = FrameDecoder()
    decoder.feed(one + rest)
    assert decoder.next_frame() is not None
    assert decoder.take_buffered() == rest
    assert decoder.buffered == 0
    decoder.feed(one[:10])
    decoder.feed(one[10:])  # a second feed before any decoding
    assert decoder.take_buffered() == one


def test_frames_may_be_interleaved_with_direct_reads() -> None:
    # The worker reads a request's DATA frames with next_frame from inside its loop over
    # frames(): neither may skip or repeat a frame.
    data = b"".join(encode_frame(1, rid, Flags.NONE, {"rid": rid}) for rid in range(1, 7))
    decoder = FrameDecoder()
    decoder.feed(data[:50])
    seen = []
    for frame in decoder.frames():
        seen.append(frame.request_id)
        if frame.request_id == 1:
            decoder.feed(data[50:])
            direct = decoder.next_frame()
            assert direct is not None
            seen.append(direct.request_id)
    assert seen == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_a_large_payload_starting_in_a_fed_chunk(kind: type) -> None:
    bulk = bytes(range(256)) * (LARGE_PAYLOAD // 128)
    data = encode_frame(0x0301, 5, Flags.REPLY, {"size": len(bulk)}, bulk)
    decoder = FrameDecoder()
    decoder.feed(kind(data[:1000]))
    assert decoder.next_frame() is None
    assert decoder.partial_header() == Header(0x0301, 5, Flags.REPLY, len(data) - HEADER_SIZE)
    assert decoder.buffered == 1000 - HEADER_SIZE
    for start in range(1000, len(data), 7000):
        decoder.feed(kind(data[start : start + 7000]))
    (frame,) = decoder.frames()
    assert frame.args == {"size": len(bulk)} and bytes(frame.bulk) == bulk


def test_take_partial_after_a_header_in_a_fed_chunk() -> None:
    data = encode_frame(0x0301, 5, Flags.REPLY, {"size": 3}, b"x" * 100)
    decoder = FrameDecoder()
    decoder.feed(data[:40])
    assert decoder.next_frame() is None
    header, head = decoder.take_partial()
    assert header.payload_length == len(data) - HEADER_SIZE
    assert head == data[HEADER_SIZE:40]
    assert decoder.partial_header() is None and decoder.buffered == 0


@settings(max_examples=200, deadline=None)
@given(
    op=st.integers(0, 0xFFFF),
    rid=st.integers(0, 2**32 - 1),
    flags=st.integers(0, 15),
    args=st.none() | st.just({}) | st.dictionaries(st.text(max_size=4), simple_values),
    bulk=st.binary(max_size=40),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_encoding_is_the_documented_layout(
    op: int, rid: int, flags: int, args: Any, bulk: bytes, kind: type
) -> None:
    # header | u32 CBOR length | cbor2.dumps(args) | bulk, or the header alone.
    if args is None and not bulk:
        expected = HEADER.pack(MAGIC, PROTOCOL_VERSION, op, rid, flags, 0)
    else:
        encoded = b"" if args is None else cbor2.dumps(args)
        payload = struct.pack("<I", len(encoded)) + encoded + bulk
        expected = HEADER.pack(MAGIC, PROTOCOL_VERSION, op, rid, flags, len(payload)) + payload
    assert encode_frame(op, rid, Flags(flags), args, kind(bulk)) == expected
    parts = encode_frame_parts(op, rid, Flags(flags), args, kind(bulk))
    assert b"".join(bytes(p) for p in parts) == expected
    assert len(parts) == (2 if bulk else 1)


def test_an_empty_map_is_encoded_as_cbor2_would() -> None:
    assert encode_frame(1, 2, Flags.NONE, {}) == encode_frame(1, 2, Flags.NONE, OrderedDict())
    assert encode_frame(1, 2, Flags.NONE, {})[HEADER_SIZE:] == b"\x01\x00\x00\x00" + cbor2.dumps({})


def test_encoding_refuses_what_it_refused() -> None:
    with pytest.raises(ValueError, match="does not fit in 32 bits"):
        encode_frame(1, -1)
    with pytest.raises(TypeError):
        encode_frame(1, 2, Flags.NONE, None, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_frame_parts(1, 2, Flags.NONE, None, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(cbor2.CBOREncodeError):
        encode_frame(1, 2, Flags.NONE, {"x": object()})
