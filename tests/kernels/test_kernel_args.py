"""Kernel-argument packing against C layouts as ``ctypes`` computes them.

A kernel's parameter list is laid out like a struct of the same members, except that
the buffer ends with the last member: CUDA refuses trailing padding. So for any list of
arguments, each slot's offset must equal the offset of the matching field of a
``ctypes.Structure``, the bytes must equal that structure's bytes up to the end of the
last field, and the size must be that end, never ``sizeof`` of the structure.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipr.client import DevicePtr
from hipr.errors import HipError
from hipr.errors import HipErrorCode as E
from hipr.kernels.kernel_args import MAX_ARGS, MAX_ARGS_BYTES, _pack_each, pack_args


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int8), ("b", ctypes.c_double), ("c", ctypes.c_int16)]


class Small(ctypes.Structure):
    _fields_ = [("x", ctypes.c_char), ("y", ctypes.c_short)]


class Nested(ctypes.Structure):
    """A struct holding a struct: its alignment is its most aligned member's, deep down."""

    _fields_ = [("tag", ctypes.c_uint8), ("inner", Pair), ("tail", ctypes.c_uint8)]


class OnlyBytes(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint8), ("b", ctypes.c_uint8), ("c", ctypes.c_uint8)]


class Both(ctypes.Union):
    _fields_ = [("i", ctypes.c_int32), ("d", ctypes.c_double)]


#: name -> (a value to pass, the ctypes type a C compiler would see, its exact bytes)
KINDS: dict[str, tuple[Any, Any, bytes]] = {
    "ptr": (
        DevicePtr(0x7F00_1234_5000, 64),
        ctypes.c_uint64,
        (0x7F00_1234_5000).to_bytes(8, "little"),
    ),
    "i8": (np.int8(-3), ctypes.c_int8, b"\xfd"),
    "u8": (np.uint8(250), ctypes.c_uint8, b"\xfa"),
    "bool": (np.bool_(True), ctypes.c_bool, b"\x01"),
    "i16": (np.int16(-2), ctypes.c_int16, b"\xfe\xff"),
    "u16": (np.uint16(0xBEEF), ctypes.c_uint16, b"\xef\xbe"),
    "f16": (np.float16(1.5), ctypes.c_uint16, np.float16(1.5).tobytes()),
    "i32": (np.int32(-5), ctypes.c_int32, (-5).to_bytes(4, "little", signed=True)),
    "u32": (np.uint32(7), ctypes.c_uint32, (7).to_bytes(4, "little")),
    "f32": (np.float32(0.25), ctypes.c_float, np.float32(0.25).tobytes()),
    "i64": (np.int64(-(2**40)), ctypes.c_int64, (-(2**40)).to_bytes(8, "little", signed=True)),
    "u64": (np.uint64(2**63 + 1), ctypes.c_uint64, (2**63 + 1).to_bytes(8, "little")),
    "f64": (np.float64(-0.375), ctypes.c_double, np.float64(-0.375).tobytes()),
    "pair": (Pair(1, 2.5, 3), Pair, bytes(Pair(1, 2.5, 3))),
    "small": (Small(b"x", -9), Small, bytes(Small(b"x", -9))),
    "nested": (Nested(4, Pair(5, 6.0, 7), 8), Nested, bytes(Nested(4, Pair(5, 6.0, 7), 8))),
    "bytes3": (OnlyBytes(1, 2, 3), OnlyBytes, b"\x01\x02\x03"),
    "union": (Both(d=1.0), Both, bytes(Both(d=1.0))),
    "c_int": (ctypes.c_int(-1), ctypes.c_int, b"\xff\xff\xff\xff"),
    "arr3": ((ctypes.c_int16 * 3)(1, 2, 3), ctypes.c_int16 * 3, b"\x01\x00\x02\x00\x03\x00"),
}


def c_layout(kinds: list[str]) -> tuple[type[ctypes.Structure], list[int], int]:
    """The ctypes struct of ``kinds``, each field's offset, and the end of the last."""
    fields = [(f"f{i}", KINDS[k][1]) for i, k in enumerate(kinds)]
    layout = type("Params", (ctypes.Structure,), {"_fields_": fields})
    offsets = [getattr(layout, name).offset for name, _ in fields]
    end = offsets[-1] + ctypes.sizeof(fields[-1][1]) if fields else 0
    return layout, offsets, end


def check_against_ctypes(kinds: list[str]) -> None:
    packed = pack_args([KINDS[k][0] for k in kinds])
    layout, offsets, end = c_layout(kinds)
    assert [slot.offset for slot in packed.slots] == offsets
    assert [slot.size for slot in packed.slots] == [ctypes.sizeof(KINDS[k][1]) for k in kinds]
    assert len(packed.data) == end <= ctypes.sizeof(layout)
    for kind, slot in zip(kinds, packed.slots, strict=True):
        assert packed.data[slot.offset : slot.offset + slot.size] == KINDS[kind][2], kind
        assert slot.kind == ("ptr" if kind == "ptr" else "value")
    # Everything between members is zero padding.
    covered = bytearray(len(packed.data))
    for slot in packed.slots:
        covered[slot.offset : slot.offset + slot.size] = b"\x01" * slot.size
    assert all(b == 0 for b, c in zip(packed.data, covered, strict=True) if not c)
    assert packed.pointer_offsets() == [
        o for k, o in zip(kinds, offsets, strict=True) if k == "ptr"
    ]
    assert packed.to_wire() == {"args": packed.data, "ptrs": packed.pointer_offsets()}


@pytest.mark.parametrize(
    "kinds",
    [
        [],
        ["ptr", "i8", "i32", "f32", "f64", "i16", "pair", "u64"],  # mixed_args_probe: 72
        ["i8", "ptr", "i16", "small", "i32", "i64", "f32", "f64", "pair", "ptr", "u64"],
        ["u8", "nested"],
        ["nested", "u8"],
        ["f16", "f16", "f64", "f16"],
        ["bytes3", "i32", "bytes3"],
        ["bool", "union", "c_int", "arr3", "i8"],
        ["f64", "i8"],  # ends 7 bytes short of sizeof: no trailing padding
    ],
    ids=lambda kinds: "-".join(kinds) or "empty",
)
def test_layouts_match_ctypes(kinds: list[str]) -> None:
    check_against_ctypes(kinds)


def test_mixed_args_probe_layout() -> None:
    packed = pack_args(
        [KINDS[k][0] for k in ("ptr", "i8", "i32", "f32", "f64", "i16", "pair", "u64")]
    )
    assert [s.offset for s in packed.slots] == [0, 8, 12, 16, 24, 32, 40, 64]
    assert len(packed.data) == 72


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(KINDS)), max_size=24))
def test_any_argument_list_matches_ctypes(kinds: list[str]) -> None:
    check_against_ctypes(kinds)


def test_no_trailing_padding() -> None:
    packed = pack_args([np.float64(1.0), np.int8(2)])
    assert len(packed.data) == 9  # sizeof of the same struct would be 16
    assert len(pack_args([Pair(1, 2.0, 3)]).data) == ctypes.sizeof(Pair) == 24


def test_nested_struct_alignment() -> None:
    # A struct whose only double is two levels down is still 8-aligned.
    assert ctypes.alignment(Nested) == 8
    packed = pack_args([np.int8(1), Nested(4, Pair(5, 6.0, 7), 8)])
    assert packed.slots[1].offset == 8
    assert packed.data[8:] == bytes(Nested(4, Pair(5, 6.0, 7), 8))
    # A struct of bytes is 1-aligned: it follows a char with no gap.
    packed = pack_args([np.int8(1), OnlyBytes(1, 2, 3), np.int16(9)])
    assert [s.offset for s in packed.slots] == [0, 1, 4]


def test_float16() -> None:
    packed = pack_args([np.int8(1), np.float16(-2.5)])
    assert packed.slots[1].offset == 2 and packed.slots[1].size == 2
    assert np.frombuffer(packed.data[2:4], np.float16)[0] == np.float16(-2.5)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (3, ["argument 2", "int", "np.int32(3)"]),
        (2.5, ["argument 2", "float", "np.float32(2.5)"]),
        (True, ["argument 2", "bool"]),
        ("x", ["argument 2", "str"]),
        (np.complex64(1j), ["argument 2", "complex64"]),
        (np.str_("x"), ["argument 2"]),
        (object(), ["argument 2", "object"]),
    ],
    ids=["int", "float", "bool", "str", "complex", "np-str", "object"],
)
def test_untyped_arguments_are_refused_by_index(value: object, words: list[str]) -> None:
    with pytest.raises(HipError) as info:
        pack_args([np.int32(1), DevicePtr(0x1000, 4), value])
    assert info.value.code == E.hipErrorInvalidValue
    for word in words:
        assert word in info.value.message, info.value.message


def test_too_many_arguments() -> None:
    pack_args([np.int8(0)] * MAX_ARGS)
    with pytest.raises(HipError) as info:
        pack_args([np.int8(0)] * (MAX_ARGS + 1))
    assert info.value.code == E.hipErrorInvalidValue
    assert str(MAX_ARGS) in info.value.message


def test_too_many_bytes() -> None:
    big = (ctypes.c_uint8 * (MAX_ARGS_BYTES - 8))()
    assert len(pack_args([big, np.uint64(1)]).data) == MAX_ARGS_BYTES
    with pytest.raises(HipError) as info:
        pack_args([big, np.uint8(1), np.uint64(1)])
    assert info.value.code == E.hipErrorInvalidValue
    assert str(MAX_ARGS_BYTES) in info.value.message


def test_device_pointer_is_eight_bytes_whatever_its_size() -> None:
    p = DevicePtr(0xDEAD_BEEF_000, 1 << 40)
    packed = pack_args([np.int8(1), p + 16])
    assert packed.slots[1].offset == 8 and packed.slots[1].kind == "ptr"
    assert int.from_bytes(packed.data[8:16], "little") == 0xDEAD_BEEF_010


#: The kinds a launch packs through a cached layout (one struct per sequence of types).
LAID_OUT = sorted(k for k in KINDS if k == "ptr" or isinstance(KINDS[k][0], np.generic))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LAID_OUT), max_size=24))
def test_cached_layouts_pack_as_the_walk_does(kinds: list[str]) -> None:
    """The layout a sequence of types gets on first use, and on every use after it,
    packs exactly what the argument-by-argument walk packs."""
    values = [KINDS[k][0] for k in kinds]
    walked = _pack_each(values)
    assert pack_args(values) == walked
    assert pack_args(values) == walked  # the cached layout, this time


@pytest.mark.parametrize(
    ("kind", "bits"),
    [(np.float16, 0x7D01), (np.float32, 0x7F800001), (np.float64, 0x7FF0_0000_0000_0001)],
)
def test_signalling_nans_keep_their_bits(kind: Any, bits: int) -> None:
    """A float argument arrives bit for bit, even a signalling NaN (which a conversion
    through a C double would quiet)."""
    size = np.dtype(kind).itemsize
    value = np.frombuffer(bits.to_bytes(size, "little"), dtype=kind)[0]
    for _ in range(2):
        packed = pack_args([np.int8(1), value])
        assert packed.data[size:] == bits.to_bytes(size, "little")
