"""``hipr bench --quick`` checks that every benchmark runs; its tiny counts measure
nothing, so its output judges no goal (no met/MISSED) and says why."""

from __future__ import annotations

import pytest

from hipr.bench import results, suite


def _runs() -> list[results.Run]:
    rows = [
        suite.Row("rtt", "PING round trip, median", 120.0, "µs", "bare echo", 100.0,
                  goal="≤ 1.5x", met=True),
        suite.Row("copy", "memcpy_htod 64 MiB", 1.0, "GB/s", "bare stream", 2.0,
                  ratio_style="%", goal="≥ 85 %", met=False),
    ]  # fmt: skip
    return [results.Run("unix", "trio", "trio", "unix:///x", "unix:///y", rows)]


def _meta(quick: bool) -> dict[str, object]:
    return {
        "date": "2026-11-26 00:00 UTC",
        "machine": results.machine_description(),
        "backend": "emulator",
        "hipr_version": "0",
        "command": "hipr bench --local --quick",
        "quick": quick,
    }


def test_quick_markdown_judges_no_goal() -> None:
    text = results.markdown(_runs(), _meta(quick=True))
    assert "MISSED" not in text and "| met |" not in text
    assert results.QUICK_NOTE in text
    assert "| ≥ 85 % |  |" in text  # the goal is shown, with no verdict
    full = results.markdown(_runs(), _meta(quick=False))
    assert "MISSED" in full and results.QUICK_NOTE not in full


def test_quick_tables_judge_no_goal(capsys: pytest.CaptureFixture[str]) -> None:
    results.print_tables(_runs(), _meta(quick=True))
    out = capsys.readouterr().out
    assert "MISSED" not in out and "goals met" not in out
    assert "measure nothing" in out
