"""Shared test set-up: every async test runs under both trio and asyncio."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """anyio's pytest plugin runs each ``@pytest.mark.anyio`` test once per event loop."""
    return str(request.param)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="hipr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """For a test that configures logging: the root logger's handlers and level as they
    were, and structlog's defaults, once it ends."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
