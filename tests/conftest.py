"""Shared test set-up: every async test runs under both trio and asyncio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """anyio's pytest plugin runs each ``@pytest.mark.anyio`` test once per event loop."""
    return str(request.param)
