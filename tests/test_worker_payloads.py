"""Payload buffers: reused only once nothing refers to them, let go on release."""

from __future__ import annotations

import gc

from hipr.worker.payloads import PayloadBuffers


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
