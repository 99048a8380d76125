"""Resilience tests reuse the e2e worker fixtures, with short heartbeats and grace."""

from __future__ import annotations

import os

import pytest

from hipr.backends import load_backend
from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend
from hipr.worker.config import WorkerConfig
from tests.e2e.conftest import (  # noqa: F401  (fixtures)
    threaded_worker,
    worker,
)


@pytest.fixture
def listen_url() -> str:
    """TCP only: the fault-injecting proxy sits on a TCP link (transports are covered
    separately; resume logic is the same whatever carries the bytes)."""
    return "tcp://127.0.0.1:0"


@pytest.fixture
def backend() -> Backend:
    """The emulator, or the backend ``HIPR_TEST_BACKEND`` names (``cuda`` on a GPU machine)."""
    name = os.environ.get("HIPR_TEST_BACKEND", "emulator")
    if name == "emulator":
        return EmulatorBackend(device_count=2, total_memory=64 << 20)
    return load_backend(name)


@pytest.fixture
def worker_config() -> WorkerConfig:
    """Fast heartbeats so that dead links are found in tests' time."""
    return WorkerConfig(
        max_frame_bytes=8 << 20, heartbeat_interval=0.2, heartbeat_timeout=1.0, resume_grace=5.0
    )
