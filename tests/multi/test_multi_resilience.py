"""One worker of a multi-worker client killed or cut off: the others go on; each
worker's session resumes on its own. Under trio and asyncio, every wait bounded."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import hipr
from tests.multi.conftest import FAST, Fleet, WorkerProcess
from tests.resilience.proxy import faulty_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


class Events:
    """on_event's record, with a way to wait for one."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, kind: str, details: dict[str, Any]) -> None:
        self.seen.append((kind, str(details.get("worker", ""))))

    async def wait_for(self, kind: str, worker: str, seconds: float = 20) -> None:
        with anyio.fail_after(seconds):
            while (kind, worker) not in self.seen:
                await anyio.sleep(0.02)


async def test_killed_worker_loses_only_its_devices(
    fleet: Fleet, worker_process: WorkerProcess
) -> None:
    urls = [fleet.urls[0], worker_process.url, fleet.urls[2]]
    events = Events()
    with anyio.fail_after(60):
        async with hipr.aconnect(urls, link=FAST, on_event=events) as gpu:
            assert await gpu.device_count() == 1 + 2 + 3
            ptrs = []
            for device in range(6):
                await gpu.set_device(device)
                ptrs.append(await gpu.malloc_htod(bytes([device]) * 32))
            await gpu.set_device(2)
            doomed_stream = await gpu.stream_create()

            worker_process.kill()
            # The live workers answer at once, while the client retries the dead one.
            await gpu.set_device(0)
            assert await gpu.memcpy_dtoh(ptrs[0]) == bytes([0]) * 32
            await events.wait_for("session_lost", worker_process.url)

            lost = gpu.worker_of(1)
            assert lost.lost and not gpu.lost
            for call in (
                gpu.set_device(1),
                gpu.set_device(2),
                gpu.memcpy_dtoh(ptrs[1]),
                gpu.free(ptrs[2]),
                doomed_stream.synchronize(),
            ):
                with pytest.raises(hipr.SessionLostError) as err:
                    await call
                assert worker_process.url in str(err.value) or "lost" in str(err.value)
            with pytest.raises(hipr.SessionLostError, match="devices 1-2"):
                await gpu.device_properties(2)
            # Ordinals do not move; the other workers' devices work as before.
            assert await gpu.device_count() == 6
            for device in (0, 3, 4, 5):
                await gpu.set_device(device)
                assert await gpu.get_device() == device
                assert await gpu.memcpy_dtoh(ptrs[device]) == bytes([device]) * 32
                fresh = await gpu.malloc(64)
                await gpu.memcpy_dtod(fresh, ptrs[0], 32)  # across the live workers
                assert await gpu.memcpy_dtoh(fresh, 32) == bytes(32)
            # Placement skips the lost worker.
            assert await hipr.apick_device(gpu, select=False) in (0, 3, 4, 5)
            info = gpu.worker_info()
            assert [w["lost"] for w in info["workers"]] == [False, True, False]


async def test_each_worker_resumes_on_its_own(fleet: Fleet) -> None:
    events = Events()
    data = np.arange(4096, dtype=np.uint8)
    with anyio.fail_after(60):
        async with (
            faulty_proxy(fleet.urls[0]) as proxy_a,
            faulty_proxy(fleet.urls[2]) as proxy_c,
        ):
            urls = [proxy_a.url, fleet.urls[1], proxy_c.url]
            async with hipr.aconnect(urls, link=FAST, on_event=events) as gpu:
                src = await gpu.malloc_htod(data)
                await gpu.set_device(5)
                dst = await gpu.malloc(4096)
                sessions = gpu.session_id
                for round_ in range(3):
                    await proxy_a.cut_all()
                    await gpu.memcpy_dtod(dst, src, 4096)  # both sides, one of them cut
                    assert await gpu.memcpy_dtoh(dst) == data.tobytes()
                    await gpu.memset(dst, round_, 16)
                await events.wait_for("resumed", proxy_a.url)
                await proxy_c.cut_all()
                await gpu.set_device(4)
                assert await gpu.memcpy_dtoh(dst, 16) == bytes([2]) * 16
                await events.wait_for("resumed", proxy_c.url)
                # The same sessions, resumed: nothing was lost or repeated.
                assert gpu.session_id == sessions
                assert not any(kind == "session_lost" for kind, _ in events.seen)
                assert all(w != fleet.urls[1] for _, w in events.seen)
