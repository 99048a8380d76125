"""Payload buffers: reused only once nothing refers to them, let go on release."""

from __future__ import annotations

import gc

from hipr.protocol.codec import Frame
from hipr.protocol.header import Flags, Header
from hipr.protocol.opcodes import Opcode
from hipr.worker.payloads import PayloadBuffers, Placements


def test_a_buffer_is_reused_only_when_its_views_are_gone() -> None:
    buffers = PayloadBuffers(keep=4)
    first = buffers.take(1 << 20)
    first[:3] = b"abc"
    second = buffers.take(1 << 20)
    assert first.obj is not second.obj  # the first is still in use
    held = first[10:20]  # a slice keeps the buffer in use too
    del first
    third = buffers.take(1 << 20)
    assert third.obj is not held.obj and third.obj is not second.obj
    del held
    fourth = buffers.take(1 << 20)
    assert len(buffers) == 3  # the first buffer came back
    assert fourth.nbytes == 1 << 20


def test_other_sizes_get_their_own_buffer_and_keep_bounds_the_list() -> None:
    buffers = PayloadBuffers(keep=2)
    views = [buffers.take(size) for size in (300_000, 400_000, 500_000)]
    assert [v.nbytes for v in views] == [300_000, 400_000, 500_000]
    assert len(buffers) == 2
    views[0][-1:] = b"x"  # a dropped buffer stays valid while its view lives
    assert bytes(views[0][-1:]) == b"x"


def test_release_lets_everything_go_and_views_stay_valid() -> None:
    buffers = PayloadBuffers()
    view = buffers.take(1 << 18)
    view[:4] = b"data"
    buffers.release()
    gc.collect()
    assert len(buffers) == 0
    assert bytes(view[:4]) == b"data"


def test_pinned_buffers_come_first_and_pageable_ones_when_none_is_free() -> None:
    pinned_pool = [memoryview(bytearray(1 << 20))]
    lent: list[int] = []

    def pinned(size: int) -> memoryview | None:
        lent.append(size)
        return pinned_pool.pop()[:size] if pinned_pool else None

    buffers = PayloadBuffers(pinned=pinned)
    first = buffers.take(1 << 19)
    assert first.nbytes == 1 << 19 and len(buffers) == 0  # the pinned one, no mapping
    second = buffers.take(1 << 19)
    assert second.nbytes == 1 << 19 and len(buffers) == 1  # none free: a mapping
    assert lent == [1 << 19, 1 << 19]


# --- placements: a streamed upload's chunks received straight into their destination ---


def _head(request_id: int, size: int, flags: Flags = Flags.MORE) -> Frame:
    return Frame(Header(Opcode.MEMCPY_HTOD, request_id, flags, size), {}, memoryview(bytes(size)))


def _data(request_id: int, size: int, flags: Flags = Flags.MORE) -> Frame:
    return Frame(Header(Opcode.DATA, request_id, flags, size + 4), None, memoryview(bytes(size)))


def test_a_placed_chunk_goes_at_its_offset_in_the_request() -> None:
    placements = Placements()
    window = memoryview(bytearray(100))
    placements.note(_head(7, 30))  # the request's first 30 bytes came with its head
    placements.note(_data(7, 20))  # and 20 more, read ahead before the handler ran
    assert placements.place(7, window)
    head = b"\0\0\0\0" + b"abc"  # the empty arguments' length prefix, then bulk
    target = placements.target(Header(Opcode.DATA, 7, Flags.MORE, 4 + 40), head)
    assert target is not None and target.nbytes == 40
    assert bytes(window[50:53]) == b"abc"  # at 30 + 20, the bytes already here copied
    target[3:] = b"z" * 37
    placements.note(Frame(Header(Opcode.DATA, 7, Flags.NONE, 44), None, target))
    last = placements.target(Header(Opcode.DATA, 7, Flags.NONE, 4 + 10), b"\0\0\0\0")
    assert last is not None and last.nbytes == 10
    last[:] = b"L" * 10
    assert bytes(window) == bytes(50) + b"abc" + b"z" * 37 + b"L" * 10  # at 90 now
    placements.stop()
    assert placements.target(Header(Opcode.DATA, 7, Flags.NONE, 14), b"\0\0\0\0") is None


def test_only_the_streaming_request_with_an_expected_shape_is_placed() -> None:
    placements = Placements()
    window = memoryview(bytearray(64))
    assert not placements.place(3, window)  # not streaming
    placements.note(_head(3, 8))
    assert placements.place(3, window)
    empty = b"\0\0\0\0"
    assert placements.target(Header(Opcode.DATA, 4, Flags.MORE, 14), empty) is None  # other id
    assert placements.target(Header(Opcode.MEMCPY_HTOD, 3, Flags.MORE, 14), empty) is None
    assert (
        placements.target(Header(Opcode.DATA, 3, Flags.MORE, 14), b"\0\0") is None
    )  # no prefix yet
    args = b"\1\0\0\0\xa0"  # a DATA frame that carries arguments: its bytes are not all bulk
    assert placements.target(Header(Opcode.DATA, 3, Flags.MORE, 20), args) is None
    # More than the window holds (a client that sends past what it announced).
    assert placements.target(Header(Opcode.DATA, 3, Flags.MORE, 4 + 57), empty) is None
    assert placements.target(Header(Opcode.DATA, 3, Flags.MORE, 4 + 56), empty) is not None
    # Another streamed request starts: the window was the previous one's.
    placements.note(_head(9, 8))
    assert placements.target(Header(Opcode.DATA, 9, Flags.MORE, 14), empty) is None
    assert placements.target(Header(Opcode.DATA, 3, Flags.MORE, 14), empty) is None
