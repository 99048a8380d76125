"""The report's one table: every figure the issue asks for, and an honest verdict."""

from __future__ import annotations

from typing import Any

import pytest

from hipr.testing import report
from hipr.testing.faults import FaultReport
from hipr.testing.fuzz_campaign import FuzzReport
from hipr.testing.load import LoadReport
from hipr.testing.report import plan_for, render

ROWS = (
    "frames fuzzed",
    "crashes",
    "hangs",
    "faults injected",
    "leaks found",
    "sessions held",
    "requests verified",
    "errors",
    "worker RSS start/end",
    "p50/p99 latency",
    "verdict",
)


def test_the_table_has_every_row_and_a_verdict() -> None:
    fuzz = FuzzReport(frames=1_000_001, connections=10)
    faults = FaultReport(injected=1234)
    load = LoadReport(sessions=256, sessions_held=256, rss_start=1 << 20, rss_end=2 << 20)
    text = render(fuzz, faults, load, title="# t")
    for row in ROWS:
        assert f"| {row}" in text
    assert "1,000,001" in text and "1,234" in text and "| PASS |" in text.replace("  ", " ")
    load.errors.append("wrong result: memset")
    assert "FAIL" in render(fuzz, faults, load, title="# t")


def test_the_long_plan_meets_the_issue_figures() -> None:
    plan = plan_for(long=True, seed=0, loop="trio")
    assert plan.fuzz.frames >= 1_000_000
    assert plan.load.sessions == 256 and plan.load.processes >= 1
    bounded = plan_for(long=False, seed=0, loop="trio")
    assert bounded.fuzz.frames < plan.fuzz.frames


@pytest.mark.anyio
async def test_rounds_run_each_campaign_again_and_carry_later_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--rounds``: each campaign runs once a round on a fresh backend of the same process;
    the table's reports are the first round's, with a later round's failures named in them."""
    calls: list[str] = []

    async def fuzz(options: Any, backend: Any, trace: bool = False) -> FuzzReport:
        calls.append("fuzz")
        return FuzzReport(leaks=["backend holds more"] if len(calls) > 2 else [])

    async def faults(options: Any, inner: Any, trace: bool = False) -> FaultReport:
        calls.append("faults")
        return FaultReport()

    monkeypatch.setattr(report, "run_fuzz_campaign", fuzz)
    monkeypatch.setattr(report, "run_fault_campaign", faults)
    plan = plan_for(long=False, seed=0, loop="trio")
    fuzzed, faulted, loaded = await report._run_all(plan, "emulator", load=False, rounds=2)
    assert calls == ["fuzz", "faults", "fuzz", "faults"]
    assert fuzzed.leaks == ["round 2: backend holds more"]
    assert not faulted.leaks and loaded is None
