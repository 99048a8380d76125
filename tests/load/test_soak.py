"""Soak mode: the trend over the last half, its noise band, and a short real soak."""

from __future__ import annotations

import random
from collections.abc import Sequence

import anyio
import pytest

from hipr.testing.load import LoadOptions, LoadReport, Sample, run_load
from hipr.testing.soak import FLOORS, fit, last_half_trends, render_soak, soak_ok

MiB = 1 << 20


def _samples(rss: Sequence[float], step: float = 30.0) -> list[Sample]:
    return [
        Sample(
            t=step * (i + 1),
            rss=int(r),
            fds=10,
            threads=20,
            gc_objects=50_000,
            p50_ms=1.0,
            p99_ms=2.0,
        )
        for i, r in enumerate(rss)
    ]


def test_a_straight_line_is_fitted_exactly() -> None:
    trend = fit("x", [(0.0, 1.0), (60.0, 3.0), (120.0, 5.0)])
    assert trend.slope == pytest.approx(2.0)  # per minute
    assert trend.drift == pytest.approx(4.0)
    assert trend.noise == pytest.approx(0.0, abs=1e-9)
    assert not trend.flat


def test_noise_around_a_flat_line_is_flat_and_a_ramp_is_not() -> None:
    rng = random.Random(1)
    flat = [700 * MiB + rng.uniform(-8, 8) * MiB for _ in range(60)]
    assert soak_ok(LoadReport(sessions=1, sessions_held=1, samples=_samples(flat)))
    # 0.5 MiB a sample over a 30-sample half: 15 MiB, above both the floor and the noise.
    ramp = [700 * MiB + i * MiB / 2 + rng.uniform(-1, 1) * MiB for i in range(60)]
    report = LoadReport(sessions=1, sessions_held=1, samples=_samples(ramp))
    trends = last_half_trends(report.samples)
    assert not trends["rss"].flat and trends["fds"].flat
    assert not soak_ok(report)
    text = render_soak(report, title="# t")
    assert "GROWING" in text and "| verdict | FAIL |" in text


def test_only_the_last_half_counts() -> None:
    # Growth while warming up (the first half), flat after: the soak passes.
    rss = [100 * MiB + i * 20 * MiB for i in range(19)] + [500 * MiB] * 21
    trends = last_half_trends(_samples(rss))
    assert trends["rss"].samples == 21 and trends["rss"].flat
    assert trends["rss"].first == 500 * MiB


def test_the_floor_keeps_a_tiny_steady_rise_flat() -> None:
    trend = fit("fds", [(float(t), 10.0 + t / 1000) for t in range(0, 480, 30)], FLOORS["fds"])
    assert trend.drift < FLOORS["fds"] and trend.flat


@pytest.mark.anyio
async def test_a_short_soak_samples_every_round(anyio_backend: str) -> None:
    seen: list[Sample] = []
    options = LoadOptions(
        sessions=8, seconds=0.3, rounds=2, soak_seconds=2.0, seed=3, on_sample=seen.append
    )
    with anyio.fail_after(90):
        report = await run_load(options)
    assert report.ok, report.summary()
    assert len(report.samples) >= 2 and seen == report.samples
    assert report.samples[-1].t >= 2.0
    for sample in report.samples:
        assert sample.rss > 0 and sample.fds > 0 and sample.threads > 0
        assert sample.gc_objects > 0 and sample.p99_ms >= sample.p50_ms > 0
    assert report.rss_rounds == [s.rss for s in report.samples]
    assert "| round | t (s) |" in render_soak(report, title="# t")


def test_a_falling_figure_passes_but_is_named() -> None:
    rss = [800 * MiB - i * 4 * MiB for i in range(40)]
    report = LoadReport(sessions=1, sessions_held=1, samples=_samples(rss))
    trend = last_half_trends(report.samples)["rss"]
    assert trend.verdict == "falling" and not trend.growing
    assert soak_ok(report)
