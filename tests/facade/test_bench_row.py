"""The facade's benchmark row (``hipr bench --only facade``): it runs, under trio and
asyncio, and reports each call beside the same call through ``hipr.connect()``."""

from __future__ import annotations

import pytest

from hipr.bench import suite
from tests.facade.conftest import FacadeTarget

pytestmark = pytest.mark.timeout(120)


@pytest.mark.anyio
async def test_facade_rows(target: FacadeTarget) -> None:
    where = suite.Target(url=target.url, baseline_url="", transport="unix", loop="asyncio")
    rows = await suite.bench_facade(where, suite.Plan.quick())
    assert [r.name for r in rows] == [
        "hipGetDevice via hipr.hip, median",
        "hipMemGetInfo via hipr.hip, median",
        "hipMemcpy 4 KiB H2D via hipr.hip, median",
    ]
    for row in rows:
        assert row.bench == "facade" and row.goal == "≤ 1.10x" and row.value > 0
        assert row.baseline_value is not None and row.baseline_value > 0
