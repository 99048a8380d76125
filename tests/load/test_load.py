"""Load: many sessions at once, mixed operations, every result verified.

CI runs 64 concurrent sessions for a few seconds per event loop; the long run (256
sessions from several client processes) is ``scripts/reliability-report --long``.
"""

from __future__ import annotations

import pytest

from hipr.testing.harness import percentile
from hipr.testing.load import LoadOptions, run_load

pytestmark = pytest.mark.anyio

CI_SECONDS = {"trio": 2.0, "asyncio": 1.5}


async def test_64_sessions_of_verified_mixed_operations(anyio_backend: str) -> None:
    report = await run_load(LoadOptions(sessions=64, seconds=CI_SECONDS[anyio_backend], seed=1))
    assert report.ok, report.summary()
    assert report.sessions_held >= 64
    assert report.verified >= 64 * 4  # every session completed at least one full round
    assert report.requests > report.verified
    assert 0 < report.p50_ms <= report.p99_ms
    assert report.rss_start > 0 and report.rss_end > 0


async def test_sessions_from_client_processes(anyio_backend: str) -> None:
    """Clients in other processes (asyncio there), the worker here (both loops run)."""
    if anyio_backend == "asyncio":
        options = LoadOptions(sessions=16, processes=2, seconds=1.0, client_loop="trio")
    else:
        options = LoadOptions(sessions=16, processes=2, seconds=1.0)
    report = await run_load(options)
    assert report.ok, report.summary()
    assert report.verified >= 16 * 4


def test_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) in (50.0, 51.0)
    assert percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) == 0.0
