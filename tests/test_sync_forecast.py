"""SyncForecast, the worker's expected wait of a session's device synchronizes, and the
longer polling window it gives BusyPoll.wait_until."""

from __future__ import annotations

import time

import pytest

from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.sync_forecast import FORECAST_MAX, MARGIN_MAX, SyncForecast


def test_nothing_learnt_gives_no_window() -> None:
    assert SyncForecast(200e-6).window() == 0.0


def test_a_long_wait_gives_its_length_and_a_margin() -> None:
    forecast = SyncForecast(200e-6)
    forecast.record(2.7e-3)
    assert forecast.window() == pytest.approx(2.7e-3 + MARGIN_MAX)
    forecast.record(1.3e-3)  # half the weight on the newest
    assert forecast.window() == pytest.approx(2.0e-3 + MARGIN_MAX)
    short = SyncForecast(200e-6)
    short.record(800e-6)
    assert short.window() == pytest.approx(800e-6 + 100e-6)  # an eighth


def test_waits_the_spin_catches_or_too_long_forget() -> None:
    forecast = SyncForecast(200e-6)
    forecast.record(2e-3)
    forecast.record(50e-6)
    assert forecast.window() == 0.0
    forecast.record(2e-3)
    forecast.record(FORECAST_MAX * 2)
    assert forecast.window() == 0.0


def test_a_worker_that_never_spins_never_forecasts() -> None:
    forecast = SyncForecast(0.0)
    forecast.record(2e-3)
    assert forecast.window() == 0.0


@pytest.mark.anyio
async def test_wait_until_polls_for_the_longer_window() -> None:
    poll = BusyPoll(0.001, lambda: False)
    started = time.perf_counter()
    assert not await poll.wait_until(lambda: False, window=0.03)
    assert 0.03 <= time.perf_counter() - started < 2.0
    assert poll.gave_up == "window"
    # Never shorter than the worker's own window, and nothing where spinning is off.
    off = BusyPoll(0.0, lambda: False)
    assert not await off.wait_until(lambda: True, window=0.03)
