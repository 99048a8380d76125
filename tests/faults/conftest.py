"""A worker over a :class:`FaultBackend`, with its logs watched and a leak baseline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import BackendStats
from hipr.testing import FaultBackend, InjectedCrash, LogWatch, leaks, wait_for_no_sessions
from hipr.testing.harness import warm_up
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker


@dataclass
class Faulty:
    """A running worker, its failing backend, its log watch, and what it held at start."""

    worker: Worker
    backend: FaultBackend
    watch: LogWatch
    baseline: BackendStats

    @property
    def url(self) -> str:
        """Where the worker listens."""
        return self.worker.bound_urls[0]

    async def assert_clean(self) -> None:
        """Every session gone, the backend back to its baseline, no crash logged."""
        assert await wait_for_no_sessions(self.worker, timeout=10)
        assert leaks(self.backend, self.worker, self.baseline) == []
        assert self.watch.crashes == []


@pytest.fixture
def worker_config() -> WorkerConfig:
    """Sessions end as soon as their link does (no resume grace)."""
    return WorkerConfig(max_frame_bytes=8 << 20, resume_grace=0.0)


@pytest.fixture
async def faulty(anyio_backend: str, worker_config: WorkerConfig) -> AsyncIterator[Faulty]:
    """A worker on loopback over an emulator wrapped in a FaultBackend (not failing yet)."""
    backend = FaultBackend(EmulatorBackend(device_count=2, total_memory=64 << 20), seed=1)
    watch = LogWatch(expected_types=(InjectedCrash,))
    with watch.installed():
        async with running_worker(worker_config, backend, ["tcp://127.0.0.1:0"]) as worker:
            await warm_up(worker.bound_urls[0])
            await wait_for_no_sessions(worker)
            yield Faulty(worker, backend, watch, backend.stats())
