"""The sans-I/O codec, tested with bytes alone."""

from __future__ import annotations

import contextlib
import itertools
import struct

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
    FrameDecoder,
    Header,
    encode_frame,
)
from hipr.protocol.header import HEADER


def decode_all(data: bytes, max_payload: int = 1 << 20) -> list:
    decoder = FrameDecoder(max_payload)
    decoder.feed(data)
    return list(decoder.frames())


def test_header_is_24_bytes_little_endian() -> None:
    packed = Header(0x0201, 0x01020304, Flags.NO_REPLY | Flags.MORE, 0x1122334455).pack()
    assert len(packed) == HEADER_SIZE == 24
    assert packed[:4] == MAGIC
    assert packed[4:6] == PROTOCOL_VERSION.to_bytes(2, "little")
    assert packed[6:8] == (0x0201).to_bytes(2, "little")
    assert packed[8:12] == (0x01020304).to_bytes(4, "little")
    assert packed[12:16] == (int(Flags.NO_REPLY | Flags.MORE)).to_bytes(4, "little")
    assert packed[16:24] == (0x1122334455).to_bytes(8, "little")


def test_round_trip_every_field() -> None:
    data = encode_frame(0x0512, 77, Flags.REPLY | Flags.ERROR, {"code": 2, "x": [1, 2]}, b"bulk")
    (frame,) = decode_all(data)
    assert frame.opcode == 0x0512
    assert frame.request_id == 77
    assert frame.flags == Flags.REPLY | Flags.ERROR
    assert frame.header.version == PROTOCOL_VERSION
    assert frame.args == {"code": 2, "x": [1, 2]}
    assert bytes(frame.bulk) == b"bulk"
    assert frame.error is None


def test_empty_payload_means_no_args_no_bulk() -> None:
    data = encode_frame(3, 1)
    assert len(data) == HEADER_SIZE
    (frame,) = decode_all(data)
    assert frame.args is None and frame.bulk.nbytes == 0


def test_bulk_without_args() -> None:
    (frame,) = decode_all(encode_frame(4, 9, Flags.MORE, None, b"\x00" * 1000))
    assert frame.args is None and frame.bulk.nbytes == 1000


def test_one_byte_at_a_time() -> None:
    frames_in = [(i + 1, {"i": i}, bytes([i]) * i) for i in range(20)]
    data = b"".join(encode_frame(0x0101, rid, Flags.NONE, a, b) for rid, a, b in frames_in)
    decoder = FrameDecoder()
    out = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        out.extend(decoder.frames())
    assert [(f.request_id, f.args, bytes(f.bulk)) for f in out] == frames_in
    assert decoder.buffered == 0


def test_bad_magic_is_refused_early() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"HIX")
    with pytest.raises(ProtocolError, match="bad magic"):
        decoder.next_frame()


def test_bad_magic_full_header() -> None:
    bad = HEADER.pack(b"ABCD", PROTOCOL_VERSION, 1, 1, 0, 0)
    with pytest.raises(ProtocolError, match="bad magic"):
        decode_all(bad)


def test_oversized_frame_is_refused_from_the_header_alone() -> None:
    header = Header(0x0210, 1, Flags.NONE, 2**64 - 1).pack()
    decoder = FrameDecoder(max_payload=1024)
    decoder.feed(header)
    with pytest.raises(ProtocolError, match="over the limit of 1024"):
        decoder.next_frame()


def test_malformed_cbor_keeps_framing() -> None:
    payload = struct.pack("<I", 3) + b"\xff\xff\xff"
    bad = Header(0x0201, 5, Flags.NONE, len(payload)).pack() + payload
    good = encode_frame(0x0201, 6, Flags.NONE, {"size": 1})
    first, second = decode_all(bad + good)
    assert first.request_id == 5 and first.error is not None and first.args is None
    assert second.request_id == 6 and second.args == {"size": 1}


def test_args_length_overrunning_payload() -> None:
    payload = struct.pack("<I", 100) + cbor2.dumps({})
    bad = Header(0x0201, 5, Flags.NONE, len(payload)).pack() + payload
    (frame,) = decode_all(bad)
    assert frame.error is not None and "overruns" in str(frame.error)


def test_payload_shorter_than_prefix() -> None:
    bad = Header(0x0201, 5, Flags.NONE, 2).pack() + b"\x01\x00"
    (frame,) = decode_all(bad)
    assert frame.error is not None


def test_request_id_must_fit() -> None:
    with pytest.raises(ValueError):
        encode_frame(1, 2**32)


cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | st.floats(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
frames_strategy = st.lists(
    st.tuples(
        st.integers(0, 0xFFFF),
        st.integers(0, 2**32 - 1),
        st.integers(0, 15),
        st.one_of(st.none(), st.dictionaries(st.text(max_size=8), cbor_values, max_size=5)),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(frames=frames_strategy, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_random_frames_random_splits(frames: list, cuts: list[int]) -> None:
    data = b"".join(encode_frame(op, rid, Flags(fl), a, b) for op, rid, fl, a, b in frames)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    decoder = FrameDecoder()
    out = []
    for start, end in itertools.pairwise(points):
        decoder.feed(data[start:end])
        out.extend(decoder.frames())
    assert len(out) == len(frames)
    for frame, (op, rid, fl, a, b) in zip(out, frames, strict=True):
        assert (frame.opcode, frame.request_id, int(frame.flags)) == (op, rid, fl)
        expected_args = a if (a is not None or b) else None
        assert frame.args == expected_args
        assert bytes(frame.bulk) == b


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(min_size=1, max_size=200))
def test_random_bytes_never_crash_the_decoder(junk: bytes) -> None:
    decoder = FrameDecoder(max_payload=4096)
    decoder.feed(junk)
    with contextlib.suppress(ProtocolError):
        list(decoder.frames())
