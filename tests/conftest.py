"""Shared test set-up: every async test runs under both trio and asyncio; under
pytest-xdist each test process has a temporary directory of its own, and a test marked
``alone`` runs while no other test process runs a test."""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog


def _temporary_directory_per_test_process() -> None:
    """Under ``pytest -n``: point TMPDIR (this process's and its children's) at a
    directory of this test process's own. Tests check that what they made there (ssh
    forwards' private directories, tenants' socket directories) is gone afterwards, and
    another process's test must not come and go in the same place meanwhile. Short, under
    /tmp: unix socket paths inside it must stay under 108 bytes."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    own = tempfile.mkdtemp(prefix=f"hipr-{worker}-", dir="/tmp")
    os.environ["TMPDIR"] = own
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    atexit.register(shutil.rmtree, own, ignore_errors=True)


_temporary_directory_per_test_process()


#: The run's lock file (``_alone_or_beside_others``): made by the controlling process of
#: ``pytest -n`` before its test processes start, which find it in the environment.
_LOCK = "HIPR_TEST_LOCK"
_LOCK_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The controlling process of ``pytest -n N`` makes the run's lock file."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", 0):
        return
    descriptor, path = tempfile.mkstemp(prefix="hipr-tests-", suffix=".lock", dir="/tmp")
    os.close(descriptor)
    os.environ[_LOCK] = config.stash[_LOCK_KEY] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controlling process removes the lock file once every test process is done."""
    path = config.stash.get(_LOCK_KEY, None)
    if path is not None:
        Path(path).unlink(missing_ok=True)
        os.environ.pop(_LOCK, None)


@pytest.fixture(autouse=True)
def _alone_or_beside_others(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under ``pytest -n``: a test marked ``alone`` holds the run's lock file exclusively,
    every other test holds it shared. Tests that time the worker under an attack against
    its own baseline (measured moments before, in the same test) would otherwise read
    the other test processes' load on the two cores as the attack's cost."""
    path = os.environ.get(_LOCK) if os.environ.get("PYTEST_XDIST_WORKER") else None
    if not path:
        yield
        return
    exclusive = request.node.get_closest_marker("alone") is not None
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
