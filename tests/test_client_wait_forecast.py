"""The sync client's forecast of a synchronize's wait (hipr.client.wait_forecast)."""

from __future__ import annotations

import pytest

from hipr.client.wait_forecast import FORECAST_MAX, MARGIN_MAX, WaitForecast, WaitPlan
from hipr.protocol.opcodes import Opcode

pytestmark = pytest.mark.timeout(10)

SPIN = 200e-6
SYNC = Opcode.DEVICE_SYNCHRONIZE


def test_nothing_is_forecast_before_a_long_wait_was_seen() -> None:
    forecast = WaitForecast(SPIN)
    assert forecast.plan(SYNC, 100.0) is None
    forecast.record(SYNC, SPIN / 2)  # caught by the spin: nothing to learn
    assert forecast.plan(SYNC, 100.0) is None


def test_a_long_wait_plans_a_nap_then_polling_around_its_expected_end() -> None:
    forecast = WaitForecast(SPIN)
    forecast.record(SYNC, 0.002)
    plan = forecast.plan(SYNC, 100.0)
    assert plan == WaitPlan(100.0 + 0.002 - 0.00025, 100.0 + 0.002 + 0.00025)
    forecast.record(SYNC, 0.004)  # half the weight on the newest wait
    plan = forecast.plan(SYNC, 0.0)
    assert plan is not None and plan.nap_until == pytest.approx(0.003 - MARGIN_MAX)
    forecast.record(SYNC, 0.0008)  # a short one: an eighth of it each side
    plan = forecast.plan(SYNC, 0.0)
    assert plan is not None
    assert plan.poll_until - plan.nap_until == pytest.approx((0.003 + 0.0008) / 2 / 4)


def test_polling_is_bounded_each_side_of_a_long_expected_end() -> None:
    forecast = WaitForecast(SPIN)
    forecast.record(Opcode.STREAM_SYNCHRONIZE, 0.2)
    plan = forecast.plan(Opcode.STREAM_SYNCHRONIZE, 0.0)
    assert plan is not None
    assert plan.nap_until == pytest.approx(0.2 - MARGIN_MAX)
    assert plan.poll_until - plan.nap_until == pytest.approx(2 * MARGIN_MAX)
    assert forecast.plan(Opcode.EVENT_SYNCHRONIZE, 0.0) is None  # learned per kind


def test_a_short_or_very_long_wait_forgets_the_forecast() -> None:
    forecast = WaitForecast(SPIN)
    forecast.record(SYNC, 0.002)
    forecast.record(SYNC, SPIN / 2)  # the program's synchronizes became quick
    assert forecast.plan(SYNC, 0.0) is None
    forecast.record(SYNC, 0.002)
    forecast.record(SYNC, FORECAST_MAX * 2)  # a wake-up is nothing beside such a wait
    assert forecast.plan(SYNC, 0.0) is None


def test_only_synchronizes_are_forecast_and_only_where_the_client_spins() -> None:
    forecast = WaitForecast(SPIN)
    forecast.record(Opcode.MEMCPY_DTOH, 0.002)
    assert forecast.plan(Opcode.MEMCPY_DTOH, 0.0) is None
    idle = WaitForecast(0.0)  # spin_wait 0 (or forecast_waits off): block as before
    idle.record(SYNC, 0.002)
    assert idle.plan(SYNC, 0.0) is None
