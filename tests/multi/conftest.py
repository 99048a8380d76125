"""Several workers on loopback, emulator backend, with different device counts.

In-process workers (``fleet``) serve the routing and copy tests; a worker in its own
process (``worker_process``) is the one a test may SIGKILL while the others go on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from anyio.from_thread import start_blocking_portal

from hipr.backends.emulator import EmulatorBackend
from hipr.client.connection import LinkOptions
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import token_hash

#: Device counts of the in-process workers: six devices on three workers.
DEVICE_COUNTS = (1, 2, 3)
MEMORY = 16 << 20
#: The admin token of every test worker (placement reads sessions from ADMIN_STATUS).
ADMIN = "multi-admin-token"

#: Short heartbeats and a short reconnection window: a dead worker is given up on in
#: about a second, not a minute.
FAST = LinkOptions(
    heartbeat_interval=0.1,
    heartbeat_timeout=0.8,
    reconnect_delay=0.01,
    reconnect_max_delay=0.1,
    reconnect_timeout=1.5,
    reconnect_attempts=30,
    connect_timeout=5.0,
)


def worker_config() -> WorkerConfig:
    """Fast heartbeats, and a grace period long enough to resume in."""
    return WorkerConfig(
        max_frame_bytes=8 << 20,
        heartbeat_interval=0.2,
        heartbeat_timeout=1.0,
        resume_grace=5.0,
        admin_token_sha256=token_hash(ADMIN),
    )


@dataclass
class Fleet:
    """The running workers and their backends, in URL order."""

    workers: list[Worker]
    backends: list[EmulatorBackend]

    @property
    def urls(self) -> list[str]:
        return [w.bound_urls[0] for w in self.workers]


@pytest.fixture
async def fleet(anyio_backend: str) -> AsyncIterator[Fleet]:
    """Three workers with 1, 2 and 3 devices, on the test's event loop."""
    backends = [EmulatorBackend(device_count=n, total_memory=MEMORY) for n in DEVICE_COUNTS]
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                running_worker(worker_config(), b, ["tcp://127.0.0.1:0"])
            )
            for b in backends
        ]
        yield Fleet(workers, backends)


@pytest.fixture
def threaded_fleet() -> Iterator[Fleet]:
    """The same three workers on an event-loop thread, for the synchronous client."""
    backends = [EmulatorBackend(device_count=n, total_memory=MEMORY) for n in DEVICE_COUNTS]
    with start_blocking_portal("trio") as portal:
        managers = [
            portal.wrap_async_context_manager(
                running_worker(worker_config(), b, ["tcp://127.0.0.1:0"])
            )
            for b in backends
        ]
        workers = [m.__enter__() for m in managers]
        try:
            yield Fleet(workers, backends)
        finally:
            for m in reversed(managers):
                m.__exit__(None, None, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WorkerProcess:
    """A ``hipr worker`` in a process of its own."""

    url: str
    process: subprocess.Popen[bytes]

    def kill(self) -> None:
        """SIGKILL: no goodbye, no drain, as a node that dies."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def worker_process(short_tmp: Path) -> Iterator[WorkerProcess]:
    """A worker process with two emulated devices, ready when yielded."""
    port = _free_port()
    config = short_tmp / "worker.toml"
    config.write_text('[emulator]\ndevice_count = 2\ntotal_memory = "16MiB"\n')
    url = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "HIPR_LOG_LEVEL": "warning"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hipr",
            "worker",
            "--backend",
            "emulator",
            "--config",
            str(config),
            "--listen",
            url,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the worker process exited with {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield WorkerProcess(url, process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
