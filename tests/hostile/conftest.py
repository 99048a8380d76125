"""A worker with two tenants (alice attacks, bob is measured), its log lines counted and
its refusals counted in Prometheus counters, for the hostile-client tests."""

from __future__ import annotations

import gc
import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hipr.observability.log as log_module
from hipr.backends.emulator import EmulatorBackend
from hipr.observability.log import configure_logging, set_levels
from hipr.observability.metrics import PrometheusObserver
from hipr.testing.hostile import Target
from hipr.worker.config import WorkerConfig
from hipr.worker.heap_trim import trim_heap
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import new_token, token_hash

#: Short timeouts keep every test within seconds.
HANDSHAKE_TIMEOUT = 1.0
FRAME_TIMEOUT = 1.0


@dataclass
class Hostile:
    """The worker under attack, the attack's target, and what the worker wrote."""

    worker: Worker
    target: Target
    observer: PrometheusObserver
    log: io.StringIO

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.getvalue().splitlines() if line.strip()]

    def counter(self, name: str, **labels: str) -> float:
        """A counter's value now (0 before its first increment)."""
        value = self.observer.registry.get_sample_value(f"hipr_{name}_total", labels or None)
        return value or 0.0


@pytest.fixture
def quiet_logging(logging_restored: None) -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("info", "json", out)
    yield out
    if log_module._limiter is not None:
        log_module._limiter.close()
        log_module._limiter = None
    set_levels("info", {})


def settle_memory() -> None:
    """Free what earlier tests left, so that an RSS delta is this test's."""
    gc.collect()
    trim_heap()


@pytest.fixture
async def hostile(
    tmp_path: Path, quiet_logging: io.StringIO, request: pytest.FixtureRequest
) -> AsyncIterator[Hostile]:
    alice, bob = new_token(), new_token()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(alice)}"]\n'
        f'[tenants.bob]\ntokens = ["{token_hash(bob)}"]\n'
    )
    overrides: dict[str, Any] = getattr(request, "param", {}) or {}
    config = WorkerConfig(
        tenants_file=tenants,
        # One process for both tenants: the hard case, where attacker and victim share
        # the event loop and the heap (two tenants would otherwise get a process each).
        isolation="none",
        handshake_timeout=HANDSHAKE_TIMEOUT,
        frame_timeout=FRAME_TIMEOUT,
        heartbeat_interval=0.5,
        heartbeat_timeout=10.0,
        **overrides,
    )
    backend = EmulatorBackend(device_count=1, total_memory=256 << 20)
    settle_memory()
    # As hipr.worker.service.run_worker does once started: what exists now stays out of
    # full collections (here: the test session's objects, which would make each a
    # pause of 100 ms on this machine).
    gc.freeze()
    async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as worker:
        observer = PrometheusObserver(worker, telemetry=False)
        worker.observer = observer
        target = Target(
            worker.bound_urls[0],
            alice,
            bob,
            max_frame_bytes=config.max_frame_bytes,
            max_hello_bytes=config.max_hello_bytes,
            handshake_timeout=HANDSHAKE_TIMEOUT,
            frame_timeout=FRAME_TIMEOUT,
            idle_connections=300,
            flood_seconds=2.0,
            flood_connections=300,
        )
        yield Hostile(worker, target, observer, quiet_logging)
    backend.close()
    gc.unfreeze()
