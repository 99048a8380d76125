"""The clients' batches (``LinkOptions.batch_posts``): launches of one configuration,
or small copies on one stream, that follow each other leave as one LAUNCH_KERNELS or
MEMCPY_HTOD_MANY request, in order with everything else, from one thread or several;
an error names the launch or piece; a worker of protocol 1.0 gets a frame each."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import hipr
from hipr.client.link import BATCH_COPY_BYTES, BATCH_ITEMS, LinkOptions, LinkState
from hipr.protocol.header import PROTOCOL_VERSION
from hipr.worker.server import Worker
from tests.e2e.conftest import Endpoint

#: No flush by the delay during a test: what leaves, and when, is then exact.
HELD = LinkOptions(coalesce_delay=30.0)


def _link(gpu: Any) -> LinkState:
    """The connection under a sync ``Gpu`` or an ``AsyncGpu``."""
    target = getattr(gpu, "_target", gpu)
    link = target._conn
    assert isinstance(link, LinkState)
    return link


def _ids_taken(gpu: Any, since: int) -> int:
    return _link(gpu)._next_id - since


def test_launches_of_one_kernel_leave_as_one_request_each_in_its_place(
    threaded_worker: Worker,
) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        count = BATCH_ITEMS + 10
        out = gpu.malloc(4 * count)
        fill = gpu.builtin("fill_f32")
        gpu.synchronize()
        before = _link(gpu)._next_id
        for i in range(count):
            fill.launch(1, 1, [out + 4 * i, np.float32(i), np.uint64(1)])
        # A full batch closed itself and went at once, though coalescing would hold a
        # write for 30 s (the worker issues it while the client fills the next); the
        # rest waits in the next one.
        assert _ids_taken(gpu, before) == 2
        assert not _link(gpu)._outbox  # type: ignore[attr-defined]
        gpu.synchronize()
        assert _ids_taken(gpu, before) == 3
        got = np.frombuffer(gpu.memcpy_dtoh(out), np.float32)
        assert (got == np.arange(count, dtype=np.float32)).all()


def test_a_batch_keeps_its_place_among_other_requests(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        out = gpu.malloc(8)
        fill = gpu.builtin("fill_f32")
        for _ in range(3):
            fill.launch(1, 1, [out, np.float32(1.0), np.uint64(2)])
        # A fire-and-forget copy after the batch must land after it ...
        gpu.memcpy_htod_async(out, np.float32([5.0]))
        # ... and a launch of another geometry after the copy.
        fill.launch(1, 2, [out + 4, np.float32(2.0), np.uint64(1)])
        assert list(np.frombuffer(gpu.memcpy_dtoh(out), np.float32)) == [5.0, 2.0]


def test_a_change_of_configuration_starts_a_new_batch(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        out = gpu.malloc(4 * 8)
        fill = gpu.builtin("fill_f32")
        stream = gpu.stream_create()
        gpu.synchronize()
        before = _link(gpu)._next_id
        fill.launch(1, 1, [out, np.float32(1.0), np.uint64(8)])
        fill.launch(1, 1, [out, np.float32(2.0), np.uint64(4)])  # same configuration
        fill.launch(1, 2, [out, np.float32(3.0), np.uint64(2)])  # another block
        fill.launch(1, 2, [out, np.float32(4.0), np.uint64(1)], stream=stream)
        fill.launch(1, 2, [out, np.float32(5.0), np.uint64(1)], shared_mem=16, stream=stream)
        assert _ids_taken(gpu, before) == 4
        gpu.synchronize()
        got = np.frombuffer(gpu.memcpy_dtoh(out), np.float32)
        assert list(got) == [5.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0]


def test_threads_sharing_a_gpu_batch_their_launches_safely(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        per_thread, threads = 300, 4
        out = gpu.malloc(4 * per_thread * threads)
        fill = gpu.builtin("fill_f32")

        def work(t: int) -> None:
            for i in range(per_thread):
                index = t * per_thread + i
                fill.launch(1, 1, [out + 4 * index, np.float32(index), np.uint64(1)])

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        gpu.synchronize()
        got = np.frombuffer(gpu.memcpy_dtoh(out), np.float32)
        assert (got == np.arange(per_thread * threads, dtype=np.float32)).all()


def test_a_refused_launch_is_named_at_the_next_synchronisation(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        out = gpu.malloc(8)
        fill = gpu.builtin("fill_f32")
        stray = hipr.DevicePtr(int(out) + (1 << 40), 4)  # inside no allocation of ours
        for pointer, value in ((out, 1.0), (stray, 2.0), (out + 4, 3.0)):
            fill.launch(1, 1, [pointer, np.float32(value), np.uint64(1)])
        with pytest.raises(hipr.HipError, match="launch 2 of 3"):
            gpu.synchronize()
        assert list(np.frombuffer(gpu.memcpy_dtoh(out), np.float32)) == [1.0, 3.0]


def test_no_batches_when_turned_off_or_for_a_worker_before_protocol_1_1(
    threaded_worker: Worker,
) -> None:
    url = threaded_worker.bound_urls[0]
    with hipr.connect(url, link=LinkOptions(batch_posts=False, coalesce_delay=30.0)) as gpu:
        out = gpu.malloc(4)
        fill = gpu.builtin("fill_f32")
        before = _link(gpu)._next_id
        for _ in range(5):
            fill.launch(1, 1, [out, np.float32(1.0), np.uint64(1)])
        assert _ids_taken(gpu, before) == 5
        gpu.synchronize()
    link = LinkState("tcp://gpu:1", 1 << 20)
    link._accept_handshake({"protocol": 0x0100, "session_id": "s"})
    assert not link._batches
    link._accept_handshake({"protocol": PROTOCOL_VERSION, "session_id": "s"})
    assert link._batches


@pytest.mark.anyio
async def test_the_async_client_batches_its_launches_too(
    endpoint: Endpoint, worker: Worker
) -> None:
    async with hipr.aconnect(endpoint.url, link=HELD, **endpoint.options) as gpu:
        count = 5 * BATCH_ITEMS - 3  # four full batches, sent as they fill, and one open
        out = await gpu.malloc(4 * count)
        fill = await gpu.builtin("fill_f32")
        await gpu.synchronize()
        before = _link(gpu)._next_id
        for i in range(count):
            await fill.launch(1, 1, [out + 4 * i, np.float32(i), np.uint64(1)])
        assert _ids_taken(gpu, before) == 5
        assert not _link(gpu)._outbox  # type: ignore[attr-defined]
        await gpu.synchronize()
        got = np.frombuffer(await gpu.memcpy_dtoh(out), np.float32)
        assert (got == np.arange(count, dtype=np.float32)).all()
        before = _link(gpu)._next_id
        for i in range(count):
            await gpu.memcpy_htod_async(out + 4 * i, np.float32([-i]))
        assert _ids_taken(gpu, before) == 5
        await gpu.synchronize()
        got = np.frombuffer(await gpu.memcpy_dtoh(out), np.float32)
        assert (got == -np.arange(count, dtype=np.float32)).all()


@pytest.mark.parametrize("on_stream", [False, True])
def test_small_copies_leave_as_one_request_each_in_its_place(
    threaded_worker: Worker, on_stream: bool
) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        count = BATCH_ITEMS + 10
        out = gpu.malloc(4 * count)
        stream = gpu.stream_create() if on_stream else None
        gpu.synchronize()
        before = _link(gpu)._next_id
        word = np.zeros(1, np.uint32)
        for i in range(count):
            word[0] = i  # reused at once: each copy took its bytes when posted
            gpu.memcpy_htod_async(out + 4 * i, word, stream=stream)
        assert _ids_taken(gpu, before) == 2
        assert not _link(gpu)._outbox  # type: ignore[attr-defined]  # the full one went
        gpu.synchronize()
        got = np.frombuffer(gpu.memcpy_dtoh(out), np.uint32)
        assert (got == np.arange(count, dtype=np.uint32)).all()


def test_copies_and_launches_keep_their_order(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        out = gpu.malloc(8)
        big = gpu.malloc(BATCH_COPY_BYTES + 4)
        fill = gpu.builtin("fill_f32")
        stream = gpu.stream_create()
        gpu.synchronize()
        before = _link(gpu)._next_id
        gpu.memcpy_htod_async(out, np.float32([1.0, 1.0]))
        fill.launch(1, 1, [out, np.float32(2.0), np.uint64(1)])
        gpu.memcpy_htod_async(out + 4, np.float32([3.0]))
        gpu.memcpy_htod_async(out, np.float32([4.0]))
        gpu.memcpy_htod_async(out + 4, np.float32([5.0]), stream=stream)  # another stream
        # A copy over BATCH_COPY_BYTES goes on its own, after what was batched before it.
        gpu.memcpy_htod_async(big, np.ones(BATCH_COPY_BYTES // 4 + 1, np.float32))
        assert _ids_taken(gpu, before) == 5
        gpu.synchronize()
        assert list(np.frombuffer(gpu.memcpy_dtoh(out), np.float32)) == [4.0, 5.0]
        assert (np.frombuffer(gpu.memcpy_dtoh(big), np.float32) == 1.0).all()


def test_a_refused_copy_is_named_at_the_next_synchronisation(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0], link=HELD) as gpu:
        out = gpu.malloc(8)
        for address, value in ((int(out), 1.0), (int(out) + (1 << 40), 2.0), (int(out) + 4, 3.0)):
            gpu.memcpy_htod_async(address, np.float32([value]))
        with pytest.raises(hipr.HipError, match="piece 2 of 3"):
            gpu.synchronize()
        assert list(np.frombuffer(gpu.memcpy_dtoh(out), np.float32)) == [1.0, 3.0]


def test_a_lone_batch_leaves_after_the_delay_with_one_wake_of_the_keeper(
    threaded_worker: Worker,
) -> None:
    """Launch + synchronize pairs wake the keep-alive thread once per ``coalesce_delay``
    at most (a wake for every new batch cost each pair a thread hand-off), and a batch
    left open, even one opened while a flush was on its way, still leaves in time."""
    delay = 0.3
    with hipr.connect(threaded_worker.bound_urls[0], link=LinkOptions(coalesce_delay=delay)) as gpu:
        link = _link(gpu)
        out = gpu.malloc(4)
        fill = gpu.builtin("fill_f32")
        gpu.synchronize()
        wakes = []
        wake = link._keeper_wake  # type: ignore[attr-defined]
        real_set = wake.set
        wake.set = lambda: (wakes.append(1), real_set())[1]
        for i in range(50):
            fill.launch(1, 1, [out, np.float32(i), np.uint64(1)])
            gpu.synchronize()
        fill.launch(1, 1, [out, np.float32(99.0), np.uint64(1)])  # left open: nothing follows
        assert link._batch is not None
        # Fifty pairs on the emulator take far less than the delay: at most the first
        # pair's wake, and one more if the keeper's flush fell between the pairs.
        assert 1 <= len(wakes) <= 3
        deadline = time.monotonic() + 10
        while link._batch is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link._batch is None and not link._outbox  # type: ignore[attr-defined]
        assert list(np.frombuffer(gpu.memcpy_dtoh(out), np.float32)) == [99.0]
