"""Bounded CBOR decoding: a payload over the item or depth limits is refused after a
walk bounded by the limit, before cbor2 builds anything; ordinary frames decode as
before."""

from __future__ import annotations

import struct
import time

import cbor2
import pytest

from hipr.errors import ProtocolError
from hipr.protocol.bounded_cbor import CborLimits, bounded_loads, scan
from hipr.protocol.codec import ARGS_LENGTH, FrameDecoder, decode_payload, encode_frame
from hipr.protocol.header import HEADER, MAGIC, PROTOCOL_VERSION, Flags, Header
from hipr.protocol.opcodes import Opcode

LIMITS = CborLimits(max_items=1000, max_depth=8)


def array_of(item: bytes, count: int) -> bytes:
    return b"\x9a" + struct.pack(">I", count) + item * count


@pytest.mark.parametrize(
    ("value", "items"),
    [
        (1, 1),
        ([1, 2, 3], 4),
        ({"a": 1}, 3),
        ([[], {}], 3),
        ({"a": [1, {"b": b"x" * 300}], "c": "text"}, 9),
        (cbor2.CBORTag(5, [1, 2]), 4),
        ("x" * 5000, 1),
    ],
)
def test_scan_counts_every_item(value: object, items: int) -> None:
    assert scan(cbor2.dumps(value), CborLimits(10**6)) == items


def test_scan_follows_indefinite_lengths() -> None:
    assert scan(b"\x9f\x01\x02\xff", LIMITS) == 3
    assert scan(b"\x5f\x41a\x41b\xff", LIMITS) == 3  # byte-string chunks
    assert scan(b"\xbf\x61a\x01\xff", LIMITS) == 3


@pytest.mark.parametrize(
    ("data", "refused"),
    [
        (array_of(b"\xa0", 1001), "cbor_items"),  # declared up front: refused at once
        (b"\x9f" + b"\x80" * 1001 + b"\xff", "cbor_items"),  # counted as they come
        (b"\x81" * 9 + b"\x00", "cbor_depth"),
        (b"\xd8\x1c" * 9 + b"\x00", "cbor_depth"),  # tags nest too
        (b"\xbb" + struct.pack(">Q", 1 << 40), "cbor_items"),
    ],
)
def test_scan_refuses_over_the_limits(data: bytes, refused: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        scan(data, LIMITS)
    assert caught.value.details["refused"] == refused


def test_a_bomb_is_refused_in_time_bounded_by_the_limit() -> None:
    """32 MiB of empty maps: its array head declares 32 million items; 8 MiB of empty
    arrays inside an indefinite array: walked only up to the limit."""
    limits = CborLimits()
    for bomb in (array_of(b"\xa0", 32 << 20), b"\x9f" + b"\x80" * (8 << 20) + b"\xff"):
        started = time.process_time()
        with pytest.raises(ProtocolError, match="max_cbor_items"):
            scan(bomb, limits)
        assert time.process_time() - started < 1.0


def test_malformed_input_is_left_to_cbor2() -> None:
    for data in (b"\x99\x01\x00", b"\x5a\xff\xff\xff\xff", b"\xff", b"\x1c", b""):
        scan(data, LIMITS)  # no ProtocolError: cbor2 reports what is wrong
        with pytest.raises(Exception):  # noqa: B017 - cbor2 raises several types
            bounded_loads(LIMITS)(data)


def test_map_keys_must_be_strings() -> None:
    """Integer keys chosen to share a hash make a dict's inserts quadratic."""
    loads = bounded_loads(LIMITS)
    assert loads(cbor2.dumps({"a": [1, {"b": b"x"}]})) == {"a": [1, {"b": b"x"}]}
    with pytest.raises(cbor2.CBORDecodeError):
        loads(cbor2.dumps({1: 2}))


def _frame_head(opcode: int, payload: int, args: int) -> bytes:
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, opcode, 7, 0, payload) + ARGS_LENGTH.pack(args)


def test_the_worker_decoder_refuses_a_bomb_and_decodes_the_rest() -> None:
    decoder = FrameDecoder(64 << 20, CborLimits(max_items=1000))
    ordinary = encode_frame(Opcode.MALLOC, 1, Flags.NONE, {"size": 4096, "list": list(range(900))})
    decoder.feed(ordinary)
    frame = decoder.next_frame()
    assert frame is not None and frame.args["size"] == 4096
    bomb = array_of(b"\xa0", 5000)
    decoder.feed(_frame_head(Opcode.MALLOC, 4 + len(bomb), len(bomb)) + bomb)
    with pytest.raises(ProtocolError) as caught:
        decoder.next_frame()
    assert caught.value.details == {"refused": "cbor_items", "limit": 1000}


def test_a_large_bomb_is_refused_from_its_first_bytes() -> None:
    """A frame over LARGE_PAYLOAD whose first piece already shows the bomb is refused
    before the rest of its payload is buffered."""
    decoder = FrameDecoder(64 << 20, CborLimits(max_items=1000))
    size = 8 << 20
    decoder.feed(_frame_head(Opcode.MALLOC, 4 + size, size) + b"\x9a" + struct.pack(">I", size))
    decoder.feed(b"\x80" * (128 << 10))
    with pytest.raises(ProtocolError, match="max_cbor_items"):
        decoder.next_frame()


def test_a_client_decoder_keeps_no_limits() -> None:
    decoder = FrameDecoder()
    value = {"rows": [[i, i] for i in range(2000)], 5: "int key"}
    decoder.feed(encode_frame(Opcode.ADMIN_STATUS, 1, Flags.REPLY, value))
    frame = decoder.next_frame()
    assert frame is not None and frame.args == value


def test_decode_payload_applies_the_limits() -> None:
    bomb = array_of(b"\x80", 5000)
    payload = memoryview(ARGS_LENGTH.pack(len(bomb)) + bomb + b"bulk")
    header = Header(Opcode.MEMCPY_HTOD, 1, Flags.NONE, len(payload))
    assert decode_payload(header, payload).args == [[]] * 5000
    with pytest.raises(ProtocolError):
        decode_payload(header, payload, CborLimits(max_items=1000))


def test_the_hello_limit_is_refused_from_the_header() -> None:
    decoder = FrameDecoder(64 << 10, CborLimits())
    decoder.feed(_frame_head(Opcode.HELLO, 32 << 20, (32 << 20) - 4))
    with pytest.raises(ProtocolError) as caught:
        decoder.next_frame()
    assert caught.value.details["refused"] == "frame_size"
    assert decoder.buffered <= 28
