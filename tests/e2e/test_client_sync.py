"""The synchronous API, written exactly as the README shows it."""

from __future__ import annotations

import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.worker.server import Worker


def test_readme_client_section(threaded_worker: Worker, backend: EmulatorBackend) -> None:
    url = threaded_worker.bound_urls[0]
    with hipr.connect(url) as gpu:
        assert gpu.device_count() == 2
        gpu.set_device(0)
        assert gpu.get_device() == 0
        props = gpu.device_properties(0)
        assert props.name and props.total_memory > 0 and props.multiprocessor_count > 0
        free, total = gpu.mem_get_info()
        assert 0 < free <= total
        n = 4096
        buf = np.arange(n // 4, dtype=np.float32)
        p = gpu.malloc(n)
        assert int(p) and p.size == n
        gpu.memcpy_htod(p, buf)
        data = gpu.memcpy_dtoh(p, n)
        assert data == buf.tobytes()
        out = bytearray(n)
        gpu.memcpy_dtoh(p, n, out=out)
        assert bytes(out) == data
        dst = gpu.malloc(n)
        gpu.memcpy_dtod(dst, p, n)
        gpu.memset(p, 0, n)
        assert gpu.memcpy_dtoh(p, 8) == b"\0" * 8
        assert gpu.memcpy_dtoh(dst, n) == data
        s = gpu.stream_create()
        gpu.memcpy_htod_async(p, buf, stream=s)
        s.synchronize()
        e0, e1 = gpu.event_create(), gpu.event_create()
        e0.record(s)
        e1.record(s)
        e1.synchronize()
        assert gpu.event_elapsed_ms(e0, e1) >= 0
        gpu.synchronize()
        s.destroy()
        gpu.free(p)
        gpu.free(dst)
        with pytest.raises(hipr.HipError) as err:
            gpu.free(p)
        assert err.value.name == "hipErrorInvalidValue"
        with pytest.raises(hipr.HipError):
            gpu.memcpy_dtoh(int(p) + 1 << 30, 4)
        gpu.malloc(100)


def test_sync_session_end_frees_everything(
    threaded_worker: Worker, backend: EmulatorBackend
) -> None:
    import time

    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        gpu.malloc(1 << 20)
        gpu.stream_create()
    deadline = time.monotonic() + 10
    while not backend.stats().is_zero() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.stats().is_zero()


def test_connection_refused_says_what_to_do() -> None:
    with pytest.raises(hipr.HipConnectionError, match="is `hipr worker` running"):
        hipr.connect("tcp://127.0.0.1:1")
