"""A real worker on loopback, over tcp or a unix socket, with the emulator backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal

from hipr.backends.emulator import EmulatorBackend
from hipr.config import WorkerConfig
from hipr.server import Worker, running_worker

EMULATED_MEMORY = 64 << 20


@pytest.fixture(params=["tcp", "unix"])
def listen_url(request: pytest.FixtureRequest, short_tmp: Path) -> str:
    """Where the test worker listens."""
    if request.param == "tcp":
        return "tcp://127.0.0.1:0"
    return f"unix://{short_tmp}/worker.sock"


@pytest.fixture
def backend() -> EmulatorBackend:
    """A fresh emulator with two devices."""
    return EmulatorBackend(device_count=2, total_memory=EMULATED_MEMORY)


@pytest.fixture
def worker_config() -> WorkerConfig:
    """The worker's configuration (tests override what they need)."""
    return WorkerConfig(max_frame_bytes=8 << 20)


@pytest.fixture
async def worker(
    anyio_backend: str, listen_url: str, backend: EmulatorBackend, worker_config: WorkerConfig
) -> AsyncIterator[Worker]:
    """A worker serving on loopback for the test's duration."""
    async with running_worker(worker_config, backend, [listen_url]) as running:
        yield running


@pytest.fixture
def threaded_worker(
    listen_url: str, backend: EmulatorBackend, worker_config: WorkerConfig
) -> Iterator[Worker]:
    """A worker on its own event-loop thread, for tests of the synchronous client."""
    with (
        start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(
            running_worker(worker_config, backend, [listen_url])
        ) as running,
    ):
        yield running
