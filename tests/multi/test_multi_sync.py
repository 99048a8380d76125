"""The synchronous multi-worker client: one sync Gpu per worker, the same routing."""

from __future__ import annotations

import inspect
import time

import numpy as np
import pytest

import hipr
from hipr.client import multi
from hipr.client.api import AsyncGpu
from hipr.errors import HipErrorCode
from tests.multi.conftest import FAST, Fleet, WorkerProcess

pytestmark = pytest.mark.timeout(90)


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_multi_clients_offer_the_single_clients_names() -> None:
    names = _public(AsyncGpu)
    assert names <= _public(hipr.AsyncMultiGpu), names - _public(hipr.AsyncMultiGpu)
    assert names <= _public(hipr.MultiGpu), names - _public(hipr.MultiGpu)
    for name in names:
        single = getattr(AsyncGpu, name)
        if inspect.iscoroutinefunction(single):
            assert inspect.iscoroutinefunction(getattr(hipr.AsyncMultiGpu, name)), name
            assert not inspect.iscoroutinefunction(getattr(hipr.MultiGpu, name)), name


def test_numbering_routing_and_mixing(threaded_fleet: Fleet) -> None:
    urls = threaded_fleet.urls
    with hipr.connect(urls, link=FAST) as gpu:
        assert isinstance(gpu, hipr.MultiGpu)
        assert gpu.device_count() == 6
        assert [w.devices for w in gpu.workers] == [range(0, 1), range(1, 3), range(3, 6)]
        ptrs = []
        for device in range(6):
            gpu.set_device(device)
            assert gpu.get_device() == device
            ptrs.append(gpu.malloc_htod(bytes([device]) * 16))
        gpu.set_device(0)
        assert [gpu.memcpy_dtoh(p) for p in ptrs] == [bytes([d]) * 16 for d in range(6)]

        gpu.set_device(2)
        s = gpu.stream_create()
        e = gpu.event_create()
        e.record(s)
        s.synchronize()
        assert e.query()
        gpu.set_device(5)
        other = gpu.stream_create()
        with pytest.raises(hipr.HipError) as err:
            gpu.memset(ptrs[1], 0, 16, other)
        assert err.value.code == HipErrorCode.hipErrorInvalidValue
        assert urls[1] in str(err.value) and urls[2] in str(err.value)
        with pytest.raises(hipr.HipError, match="cannot be mixed"):
            e.record(other)
        # Across workers, through the client.
        gpu.memcpy_dtod(ptrs[5], ptrs[1], 16)
        assert gpu.memcpy_dtoh(ptrs[5]) == bytes([1]) * 16
        gpu.memcpy_dtod(ptrs[0], ptrs[4], 16, timeout=10)
        assert gpu.memcpy_dtoh(ptrs[0]) == bytes([4]) * 16


def test_cross_worker_copy_in_chunks_with_streams(
    threaded_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(multi, "COPY_CHUNK_BYTES", 1000)
    data = np.random.default_rng(3).integers(0, 255, 5555, dtype=np.uint8)
    with hipr.connect(",".join(threaded_fleet.urls)) as gpu:
        src = gpu.malloc_htod(data)
        s_src = gpu.stream_create()
        gpu.set_device(3)
        dst = gpu.malloc(5555)
        gpu.memcpy_dtod(dst, src, 5555, s_src)
        assert gpu.memcpy_dtoh(dst) == data.tobytes()
        gpu.memset(dst, 0, 5555)
        gpu.memcpy_peer(dst, 3, src, 0, 5555)
        assert gpu.memcpy_dtoh(dst) == data.tobytes()


def test_pick_device_sync(threaded_fleet: Fleet) -> None:
    with hipr.connect(threaded_fleet.urls) as gpu:
        for device in range(6):
            if device != 2:
                gpu.set_device(device)
                gpu.malloc(4 << 20)
        assert hipr.pick_device(gpu, min_free=1 << 20) == 2
        assert gpu.get_device() == 2
        with pytest.raises(hipr.HipError, match="no device has"):
            hipr.pick_device(gpu, min_free=1 << 40)


def test_killed_worker_sync(threaded_fleet: Fleet, worker_process: WorkerProcess) -> None:
    events: list[tuple[str, object]] = []
    urls = [worker_process.url, threaded_fleet.urls[0]]
    with hipr.connect(urls, link=FAST, on_event=lambda k, d: events.append((k, d))) as gpu:
        assert gpu.device_count() == 3
        p0 = gpu.malloc(16)
        gpu.set_device(2)
        p2 = gpu.malloc_htod(b"y" * 16)
        worker_process.kill()
        deadline = time.monotonic() + 20
        while not gpu.worker_of(0).lost:
            assert time.monotonic() < deadline, events
            try:
                gpu.memcpy_dtoh(p0)  # waits out the reconnection window, then fails
            except hipr.SessionLostError:
                break
            except hipr.HipConnectionError:
                pass
        with pytest.raises(hipr.SessionLostError, match="device"):
            gpu.set_device(0)
        assert ("session_lost", worker_process.url) in [
            (k, d.get("worker")) for k, d in events if isinstance(d, dict)
        ]
        assert gpu.memcpy_dtoh(p2) == b"y" * 16
        assert gpu.get_device() == 2
