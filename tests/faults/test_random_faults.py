"""The backend fails at random on every method, HipErrors and GPU-thread crashes alike:
the worker answers every call, never logs an unexpected exception, never returns a wrong
result as a success, and leaks nothing once the sessions end."""

from __future__ import annotations

import pytest

from hipr.testing.faults import FaultOptions, run_fault_campaign

pytestmark = pytest.mark.anyio


async def test_random_backend_faults_on_every_method(anyio_backend: str) -> None:
    seconds = 2.0 if anyio_backend == "trio" else 1.5
    report = await run_fault_campaign(
        FaultOptions(seed=11, sessions=8, seconds=seconds, probability=0.05, crash_share=0.25)
    )
    assert report.ok, report.summary()
    assert report.injected >= 50, report.summary()
    assert report.injected_crashes > 0 and report.logged_crashes > 0
    assert len(report.by_method) >= 12
    assert report.verified > 0 and report.failed_requests > 0
