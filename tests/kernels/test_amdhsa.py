"""Kernel parameter layouts from AMDGPU code-object metadata (hipr.kernels.amdhsa), on
synthetic code objects built here: an ELF with an NT_AMDGPU_METADATA note whose
MessagePack map has the shape the AMDGPU code object v4/v5 metadata has (LLVM's
AMDGPUUsage), alone and inside a clang offload bundle. No AMD GPU was at hand: these are
the only code objects the parser was verified on."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipr.kernels.amdhsa import (
    KernelArg,
    Layouts,
    MetadataError,
    code_object_metadata,
    kernel_layouts,
    unpackb,
)

# --- a small MessagePack encoder, independent of the decoder under test ---------------------


def packb(v: Any) -> bytes:
    if v is None:
        return b"\xc0"
    if v is True or v is False:
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        if 0 <= v <= 0x7F:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack(">b", v)
        if 0 <= v < 1 << 8:
            return b"\xcc" + struct.pack(">B", v)
        if 0 <= v < 1 << 16:
            return b"\xcd" + struct.pack(">H", v)
        if 0 <= v < 1 << 32:
            return b"\xce" + struct.pack(">I", v)
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, str):
        raw = v.encode()
        if len(raw) < 32:
            return bytes([0xA0 | len(raw)]) + raw
        return (
            b"\xd9" + bytes([len(raw)]) + raw
            if len(raw) < 256
            else b"\xda" + struct.pack(">H", len(raw)) + raw
        )
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, list):
        head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
        return head + b"".join(packb(x) for x in v)
    if isinstance(v, dict):
        head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        return head + b"".join(packb(k) + packb(x) for k, x in v.items())
    raise TypeError(v)


def note(owner: bytes, ntype: int, desc: bytes) -> bytes:
    name = owner + b"\0"

    def pad(b: bytes) -> bytes:
        return b + b"\0" * (-len(b) % 4)

    return struct.pack("<III", len(name), len(desc), ntype) + pad(name) + pad(desc)


def elf(notes: bytes, *, as_segment: bool = False) -> bytes:
    """A 64-bit little-endian ELF whose only content is ``notes``, in a SHT_NOTE section
    (or, with ``as_segment``, a PT_NOTE segment and no sections), as an amdgcn code object
    carries its metadata."""
    body_at = 64
    if as_segment:
        ph_at = body_at + len(notes)
        header = struct.pack(
            "<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 64, 3, bytes(7), 3, 224, 1, 0,
            ph_at, 0, 0x40, 64, 56, 1, 64, 0, 0,
        )  # fmt: skip
        phdr = struct.pack("<IIQQQQQQ", 4, 4, body_at, 0, 0, len(notes), len(notes), 4)
        return header + notes + phdr
    sh_at = body_at + len(notes)
    header = struct.pack(
        "<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 64, 3, bytes(7), 3, 224, 1, 0,
        0, sh_at, 0x40, 64, 0, 0, 64, 2, 0,
    )  # fmt: skip
    null = bytes(64)
    shdr = struct.pack("<IIQQQQIIQQ", 1, 7, 2, 0, body_at, len(notes), 0, 0, 4, 0)
    return header + notes + null + shdr


def bundle(entries: list[tuple[str, bytes]]) -> bytes:
    head = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(entries))
    table_len = sum(24 + len(t) for t, _ in entries)
    at = len(head) + table_len
    table, blobs = b"", b""
    for triple, blob in entries:
        table += struct.pack("<QQQ", at, len(blob), len(triple)) + triple.encode()
        blobs += blob
        at += len(blob)
    return head + table + blobs


def arg(offset: int, size: int, kind: str, **more: Any) -> dict[str, Any]:
    return {".offset": offset, ".size": size, ".value_kind": kind, **more}


#: hiprtc_launch_kernel_args.py's kernel: scale_vector(float, int, short, int, float, float*)
#: as clang lays it out, then the hidden arguments code object v5 appends.
SCALE_VECTOR = {
    ".name": "scale_vector",
    ".symbol": "scale_vector.kd",
    ".kernarg_segment_size": 288,
    ".args": [
        arg(0, 4, "by_value"),
        arg(4, 4, "by_value"),
        arg(8, 2, "by_value"),
        arg(12, 4, "by_value"),
        arg(16, 4, "by_value"),
        arg(24, 8, "global_buffer", **{".address_space": "global", ".actual_access": "read_write"}),
        arg(32, 4, "hidden_block_count_x"),
        arg(36, 4, "hidden_block_count_y"),
        arg(40, 4, "hidden_block_count_z"),
        arg(80, 8, "hidden_global_offset_x"),
        arg(104, 8, "hidden_hostcall_buffer"),
    ],
}
PRINT_TID = {".name": "print_tid", ".symbol": "print_tid.kd", ".args": []}
METADATA = {
    "amdhsa.version": [1, 2],
    "amdhsa.target": "amdgcn-amd-amdhsa--gfx90a",
    "amdhsa.kernels": [SCALE_VECTOR, PRINT_TID],
}
SCALE_LAYOUT = [
    KernelArg(0, 4, False),
    KernelArg(4, 4, False),
    KernelArg(8, 2, False),
    KernelArg(12, 4, False),
    KernelArg(16, 4, False),
    KernelArg(24, 8, True),
]


def code_object(meta: Any = METADATA, **kw: Any) -> bytes:
    other = note(b"AMD", 1, b"\x01\x00\x00\x00")  # an older note kind the parser must skip
    return elf(other + note(b"AMDGPU", 32, packb(meta)), **kw)


def test_explicit_arguments_of_each_kernel() -> None:
    layouts = kernel_layouts(code_object())
    assert layouts["scale_vector"] == SCALE_LAYOUT
    assert layouts["print_tid"] == []


def test_metadata_in_a_note_segment() -> None:
    assert kernel_layouts(code_object(as_segment=True))["scale_vector"] == SCALE_LAYOUT


def test_offload_bundle_takes_the_amdgcn_entry() -> None:
    host = b"\x7fELF" + bytes(60)  # the host entry of a bundle is empty or a stub
    image = bundle(
        [("host-x86_64-unknown-linux-gnu", b""), ("hipv4-amdgcn-amd-amdhsa--gfx90a", code_object())]
    )
    assert kernel_layouts(image)["scale_vector"] == SCALE_LAYOUT
    assert code_object_metadata(bundle([("host-x86_64-unknown-linux-gnu", host)])) is None


def test_images_that_are_not_amds_have_no_layouts() -> None:
    assert kernel_layouts(b"//\n.version 8.0\n.target sm_90\n\0") == {}
    assert kernel_layouts(elf(note(b"NVIDIA", 1, b"x"))) == {}


@pytest.mark.parametrize(
    "image",
    [
        b"\x7fELF" + bytes(10),  # truncated header
        code_object()[:100],  # note cut short
        elf(note(b"AMDGPU", 32, packb(METADATA)[:-3])),  # MessagePack cut short
        elf(note(b"AMDGPU", 32, b"\xc1")),  # a MessagePack type that is never used
        elf(note(b"AMDGPU", 32, b"\xdd\xff\xff\xff\xff")),  # array longer than the data
        code_object({"amdhsa.kernels": [{".name": "k", ".args": [arg(-1, 4, "by_value")]}]}),
        code_object({"amdhsa.kernels": [{".args": []}]}),
        code_object([1, 2]),
    ],
)
def test_malformed_code_objects_are_refused(image: bytes) -> None:
    with pytest.raises(MetadataError):
        kernel_layouts(image)


def test_layouts_registry_answers_by_function() -> None:
    layouts = Layouts()
    layouts.add_module("m1", code_object())
    layouts.add_module("m2", b"not a code object the runtime would load")
    layouts.add_function(11, "m1", "scale_vector")
    layouts.add_function(12, "m1", "print_tid")
    layouts.add_function(13, "m2", "anything")
    assert layouts.params(11) == [(a.offset, a.size, a.pointer) for a in SCALE_LAYOUT]
    assert layouts.params(12) == []
    assert layouts.params(13) is None and layouts.params(99) is None
    layouts.forget_module("m1")
    assert layouts.params(11) is None


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=40),
    st.binary(max_size=40), st.floats(allow_nan=False),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=10), inner, max_size=20)
    ),
    max_leaves=40,
)


@settings(max_examples=100, deadline=None)
@given(values)
def test_messagepack_roundtrip(value: Any) -> None:
    assert unpackb(packb(value)) == value


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_another_error(data: bytes) -> None:
    for image in (data, b"\x7fELF\x02\x01" + data, elf(note(b"AMDGPU", 32, data))):
        try:
            kernel_layouts(image)
        except MetadataError:
            pass
