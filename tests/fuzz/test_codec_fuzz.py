"""The sans-I/O layer under arbitrary input: decoding never fails but as a ProtocolError,
argument readers never fail but as a HipError, and the generators replay by seed."""

from __future__ import annotations

import random
import struct
from typing import Any

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from hipr.errors import HipError, ProtocolError
from hipr.handlers.args import Args
from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
from hipr.protocol.codec import decode_payload
from hipr.protocol.header import HEADER_SIZE, Header
from hipr.testing.fuzz import (
    NASTY_CBOR,
    IdSource,
    Targets,
    interesting_value,
    nasty_cbor_frame,
    plausible_args,
    structured_frame,
)
from hipr.testing.fuzz_bytes import RawMutator

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)

cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def _drain(decoder: FrameDecoder) -> int:
    frames = 0
    try:
        for _ in decoder.frames():
            frames += 1
    except ProtocolError:
        pass
    return frames


@SETTINGS
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=64))
def test_decoding_arbitrary_bytes_only_raises_protocol_errors(data: bytes, step: int) -> None:
    decoder = FrameDecoder(max_payload=4096)
    try:
        for i in range(0, len(data), step):
            decoder.feed(data[i : i + step])
            for frame in decoder.frames():
                assert frame.error is None or isinstance(frame.error, ProtocolError)
    except ProtocolError:
        pass


@SETTINGS
@given(st.binary(max_size=200))
def test_a_payload_behind_a_valid_header_never_raises(payload: bytes) -> None:
    frame = decode_payload(Header(Opcode.MALLOC, 1, Flags.NONE, len(payload)), memoryview(payload))
    assert (frame.error is None) or (frame.args is None)


#: Every reader of Args, with the options handlers pass.
READERS: list[tuple[str, dict[str, Any]]] = [
    ("size", {}),
    ("address", {}),
    ("integer", {"high": 255}),
    ("handle", {"optional": True}),
    ("number", {}),
    ("text", {}),
    ("blob", {}),
    ("str_list", {}),
    ("int_list", {}),
    ("dim3", {}),
]


@SETTINGS
@given(cbor_values, st.sampled_from(["size", "ptr", "device", "grid", "name", "ptrs", "args"]))
def test_argument_readers_raise_only_hip_errors(value: Any, key: str) -> None:
    for raw in (value, {key: value}):
        try:
            args = Args(raw, "FUZZ")
        except HipError:
            continue
        for reader, options in READERS:
            try:
                getattr(args, reader)(key, **options)
            except HipError as exc:
                assert len(exc.message) < 400


def test_argument_readers_survive_every_interesting_value() -> None:
    rng = random.Random(0)
    values = [interesting_value(rng) for _ in range(2000)]
    values += [cbor2.loads(blob) for blob in NASTY_CBOR if _loads_ok(blob)]
    for value in values:
        test_argument_readers_raise_only_hip_errors.hypothesis.inner_test(value, "size")  # type: ignore[attr-defined]


def _loads_ok(blob: bytes) -> bool:
    try:
        cbor2.loads(blob)
    except Exception:
        return False
    return True


def test_the_raw_mutator_output_decodes_or_is_refused() -> None:
    rng = random.Random(1)
    mutator = RawMutator(rng, 4096)
    ids = IdSource()
    targets = Targets()
    decoded = refused = 0
    for _ in range(3000):
        frames = [structured_frame(rng, targets, ids).data for _ in range(3)]
        blob = mutator.mutate(b"".join(frames), rng.randrange(1, 4))
        decoder = FrameDecoder(4096)
        decoder.feed(blob)
        try:
            decoded += sum(1 for _ in decoder.frames())
        except ProtocolError:
            refused += 1
    assert decoded > 1000 and refused > 100


def test_generators_replay_from_their_seed() -> None:
    def run(seed: int) -> list[bytes]:
        rng = random.Random(seed)
        ids = IdSource.seeded(rng)
        out = [structured_frame(rng, Targets(), ids).data for _ in range(200)]
        out += [nasty_cbor_frame(rng, ids).data for _ in range(20)]
        mutator = RawMutator(rng, 1 << 20)
        return out + [mutator.mutate(frame, 3) for frame in out[:50]]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_structured_frames_cover_every_opcode_and_edge() -> None:
    rng = random.Random(2)
    ids = IdSource()
    seen: set[int] = set()
    sizes: set[int] = set()
    for _ in range(20000):
        frame = structured_frame(rng, Targets(), ids)
        seen.add(frame.opcode)
        header = frame.data[:HEADER_SIZE]
        assert struct.unpack_from("<I", header, 8)[0] == frame.request_id
    for _ in range(2000):
        args = plausible_args(rng, Opcode.MEMCPY_HTOD, Targets())
        sizes.add(args["size"])
    assert {int(op) for op in Opcode} - {Opcode.GOODBYE, Opcode.DATA} <= seen
    assert {2**63 - 1, 2**64 - 1, 0} <= sizes


def test_frames_with_flags_owe_replies_as_the_worker_does() -> None:
    from hipr.testing.fuzz import frame_of, with_flags

    plain = frame_of(Opcode.MALLOC, 1, Flags.NONE, {"size": 1})
    assert plain.expects_reply and not plain.ends_session
    assert not with_flags(plain, Flags.NO_REPLY).expects_reply
    streaming = with_flags(plain, Flags.MORE)
    assert streaming.ends_session and not streaming.expects_reply
    assert not frame_of(Opcode.PING, 2, Flags.REPLY).expects_reply
    assert frame_of(Opcode.GOODBYE, 3).ends_session
    assert encode_frame(Opcode.MALLOC, 1, Flags.NONE, {"size": 1}) == plain.data
