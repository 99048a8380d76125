"""An idle worker gives freed memory back to the OS (glibc's malloc_trim)."""

from __future__ import annotations

import sys

import anyio
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import RawClient, rss_bytes, wait_for_no_sessions
from hipr.worker import heap_trim
from hipr.worker.config import WorkerConfig
from hipr.worker.server import IDLE_TRIM_DELAY, running_worker

#: The worker's idle delay before a trim, shortened for the test (the default is a second).
TRIM_DELAY = 0.3

pytestmark = pytest.mark.anyio


def test_trim_heap_where_glibc_has_it() -> None:
    assert heap_trim.trim_heap() is (heap_trim._trim is not None)
    if sys.platform.startswith("linux") and "musl" not in sys.version:
        assert heap_trim._trim is not None


async def test_the_last_session_ending_trims_the_heap(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []
    monkeypatch.setattr("hipr.worker.server.trim_heap", lambda: trims.append(rss_bytes()))
    assert TRIM_DELAY < IDLE_TRIM_DELAY
    monkeypatch.setattr("hipr.worker.server.IDLE_TRIM_DELAY", TRIM_DELAY)
    config = WorkerConfig(resume_grace=0.0)
    with anyio.fail_after(30):
        async with running_worker(config, EmulatorBackend(), ["tcp://127.0.0.1:0"]) as worker:
            url = worker.bound_urls[0]
            first, second = await RawClient.open(url), await RawClient.open(url)
            await first.call(Opcode.MALLOC, {"size": 1 << 20})
            await first.aclose()
            await anyio.sleep(TRIM_DELAY + 0.5)
            assert trims == []  # a session is still open
            await second.aclose()
            assert await wait_for_no_sessions(worker)
            while not trims:
                await anyio.sleep(0.05)
            assert len(trims) == 1
