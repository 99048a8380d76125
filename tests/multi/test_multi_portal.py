"""A sync multi-worker client over workers reached through a transport with no blocking
connect: each worker's Gpu runs on a portal thread, and the one async multi-worker
code still drives them from the caller's thread (``hipr.client.sync.inline_view``)."""

from __future__ import annotations

import pytest

import hipr
import hipr.transports
from hipr.errors import HipErrorCode
from tests.multi.conftest import ADMIN, Fleet

pytestmark = pytest.mark.timeout(90)


def test_portal_workers_route_copy_and_place(
    threaded_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_blocking_connect(*args: object, **kwargs: object) -> object:
        raise NotImplementedError("this transport has no blocking connect")

    monkeypatch.setattr(hipr.transports, "connect_blocking", no_blocking_connect)
    with hipr.connect(threaded_fleet.urls[:2]) as gpu:
        assert isinstance(gpu, hipr.MultiGpu)
        assert gpu.device_count() == 3
        src = gpu.malloc_htod(b"a" * 64)
        gpu.set_device(2)
        dst = gpu.malloc(64)
        stream = gpu.stream_create()
        assert gpu.worker_of(stream) is gpu.worker_of(dst) is gpu.workers[1]
        gpu.memcpy_dtod(dst, src, 64, stream, timeout=10)  # across workers
        stream.synchronize()
        assert gpu.memcpy_dtoh(dst) == b"a" * 64
        with pytest.raises(hipr.HipError) as mixed:
            gpu.memset(src, 0, 64, stream)
        assert mixed.value.code == HipErrorCode.hipErrorInvalidValue
        assert [d.device for d in hipr.client.placement.rank_devices(gpu, admin_token=ADMIN)]
        assert hipr.pick_device(gpu, min_free=1 << 20) in range(3)
