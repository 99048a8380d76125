"""Dropped links: reconnection, RESUME, exactly-once, heartbeats, timeouts."""

from __future__ import annotations

import dataclasses

import anyio
import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.client.connection import LinkOptions
from hipr.worker.server import Worker
from tests.resilience.proxy import faulty_proxy

pytestmark = pytest.mark.anyio

FAST = LinkOptions(
    heartbeat_interval=0.1,
    heartbeat_timeout=0.6,
    reconnect_delay=0.01,
    reconnect_max_delay=0.1,
    reconnect_timeout=10.0,
    reconnect_attempts=50,
    connect_timeout=5.0,
)
N = 1024
#: Enough for about 20 cuts at ``cut_every`` (bytes), each mid-frame somewhere else.
REQUESTS = 5_000


async def workload(gpu: hipr.AsyncGpu) -> tuple[bytes, bytes, int]:
    """REQUESTS mixed requests whose result shows any lost or repeated request."""
    rng = np.random.default_rng(7)
    x = np.arange(N, dtype=np.float32) / 64
    px = await gpu.malloc_htod(x)
    py = await gpu.malloc(N * 4)
    scratch = await gpu.malloc(N * 4)
    await gpu.memset(py, 0, N * 4)
    axpy = await gpu.builtin("axpy_f32")
    issued = 6
    scalars = rng.integers(1, 5, REQUESTS).astype(np.float32)
    verified = 0
    for i in range(REQUESTS - issued - 3):
        kind = i % 10
        if kind < 6:  # not idempotent: running one twice changes y
            await axpy.launch(4, 256, [py, px, scalars[i], np.uint64(N)])
        elif kind == 6:
            await gpu.memset(scratch + (i % N) * 4, i % 251, 4)
        elif kind == 7:
            await gpu.memcpy_htod(scratch, np.full(16, i, dtype=np.int32))
        elif kind == 8:
            back = np.frombuffer(await gpu.memcpy_dtoh(scratch, 64), dtype=np.int32)
            assert np.all(back == (i - 1)), (i, back[:4])
            verified += 1
        else:  # not idempotent either: a second malloc would leak
            await gpu.free(await gpu.malloc(4096)) if i % 20 == 9 else await gpu.synchronize()
    await gpu.synchronize()
    y = await gpu.memcpy_dtoh(py, N * 4)
    s = await gpu.memcpy_dtoh(scratch, N * 4)
    return y, s, verified


def expected_y() -> bytes:
    rng = np.random.default_rng(7)
    x = np.arange(N, dtype=np.float32) / 64
    y = np.zeros(N, dtype=np.float32)
    scalars = rng.integers(1, 5, REQUESTS).astype(np.float32)
    for i in range(REQUESTS - 9):
        if i % 10 < 6:
            y += scalars[i] * x
    return y.tobytes()


async def test_cut_link_workload_matches_uncut_run(
    worker: Worker, backend: EmulatorBackend
) -> None:
    url = worker.bound_urls[0]
    events: list[str] = []
    async with hipr.aconnect(url, link=FAST) as gpu:
        uncut = await workload(gpu)
    async with faulty_proxy(url) as proxy:
        proxy.cut_every = 20_000  # bytes: a cut every couple of hundred requests, mid-frame
        with anyio.fail_after(120):
            async with hipr.aconnect(
                proxy.url, link=FAST, on_event=lambda kind, _: events.append(kind)
            ) as gpu:
                cut = await workload(gpu)
                proxy.cut_every = None
                # A cut that falls just after the workload's last reply is resumed after
                # the workload returns: wait for it before the client closes.
                while events.count("resumed") < proxy.cuts:
                    await anyio.sleep(0.01)
        assert proxy.cuts >= 10, proxy.cuts
    assert cut[0] == uncut[0] == expected_y()
    assert cut[1] == uncut[1]
    assert cut[2] == uncut[2] > 0
    assert events.count("resumed") == proxy.cuts
    assert "session_lost" not in events
    with anyio.move_on_after(10):
        while not backend.stats().is_zero():
            await anyio.sleep(0.01)
    assert backend.stats().is_zero(), backend.stats()


async def test_silent_link_is_detected_by_heartbeat_and_resumed(worker: Worker) -> None:
    url = worker.bound_urls[0]
    events: list[str] = []
    async with faulty_proxy(url) as proxy:
        async with hipr.aconnect(
            proxy.url, link=FAST, on_event=lambda k, _: events.append(k)
        ) as gpu:
            p = await gpu.malloc(64)
            await gpu.memcpy_htod(p, b"before the stall".ljust(64))
            proxy.stalled = True
            with pytest.raises(hipr.HipTimeoutError):
                await gpu.memcpy_dtoh(p, 64, timeout=0.3)
            await proxy.cut_all()  # the stalled route is gone ...
            proxy.stalled = False  # ... and a new one works
            with anyio.fail_after(10):
                assert (await gpu.memcpy_dtoh(p, 16)) == b"before the stall"
    assert "disconnected" in events and "resumed" in events


async def test_timeout_leaves_the_session_usable(worker: Worker) -> None:
    async with hipr.aconnect(worker.bound_urls[0], link=FAST) as gpu:
        s = await gpu.stream_create()
        with pytest.raises(hipr.HipTimeoutError, match="within 1e-09 s"):
            await gpu.device_count(timeout=1e-9)
        assert await gpu.device_count(timeout=5) == worker.backend.device_count()
        await s.synchronize(timeout=5)


async def test_resume_after_grace_is_session_lost_and_handles_invalid(worker: Worker) -> None:
    url = worker.bound_urls[0]
    worker.config = dataclasses.replace(worker.config, resume_grace=0.05)
    events: list[str] = []
    async with (
        faulty_proxy(url) as proxy,
        hipr.aconnect(proxy.url, link=FAST, on_event=lambda k, _: events.append(k)) as gpu,
    ):
        s = await gpu.stream_create()
        proxy.stalled = True
        await proxy.cut_all()
        await anyio.sleep(0.3)  # longer than the grace: the worker frees the session
        proxy.stalled = False
        with anyio.fail_after(10), pytest.raises(hipr.SessionLostError):
            await gpu.device_count()
        assert gpu.lost
        with pytest.raises(hipr.SessionLostError):
            await s.synchronize()
    assert "session_lost" in events


async def test_wrong_resume_token_is_refused(worker: Worker) -> None:
    from hipr.errors import AuthError, HipError
    from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
    from hipr.transports import connect

    async with hipr.aconnect(worker.bound_urls[0]) as gpu:
        stream = await connect(worker.bound_urls[0])
        await stream.send(
            encode_frame(
                Opcode.RESUME, 0, Flags.NONE, {"session_id": gpu.session_id, "resume_token": "x"}
            )
        )
        decoder = FrameDecoder()
        with anyio.fail_after(5):
            while (frame := decoder.next_frame()) is None:
                decoder.feed(await stream.receive())
        await stream.aclose()
        assert isinstance(HipError.from_wire(frame.args), AuthError)
        assert await gpu.device_count() >= 1  # the real owner is undisturbed


async def test_a_long_upload_keeps_its_link_alive(worker: Worker) -> None:
    """An upload longer than heartbeat_timeout is not mistaken for a dead link."""
    # One 4 MiB chunk takes ~0.5 s at the throttled rate, well inside the heartbeat
    # timeout; the whole upload ~3 s, two timeouts.
    slow = dataclasses.replace(FAST, heartbeat_interval=0.2, heartbeat_timeout=1.5)
    events: list[str] = []
    async with faulty_proxy(worker.bound_urls[0]) as proxy:
        async with hipr.aconnect(
            proxy.url, link=slow, on_event=lambda kind, _: events.append(kind)
        ) as gpu:
            size = 24 << 20
            p = await gpu.malloc(size)
            started = anyio.current_time()
            # Throttle the upload so that it lasts several heartbeat timeouts.
            proxy.throttle = 8 << 20  # bytes per second
            await gpu.memcpy_htod(p, b"\x01" * size)
            proxy.throttle = None
            assert anyio.current_time() - started > 2.5
            assert await gpu.memcpy_dtoh(p + (size - 4), 4) == b"\x01" * 4
    assert "disconnected" not in events
