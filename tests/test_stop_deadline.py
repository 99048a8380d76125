"""The systemd units' TimeoutStopSec agrees with the worker's own stop deadline: the
worker exits by itself (``shutdown_timeout`` + ``EXIT_MARGIN``) before systemd kills it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hipr.worker.config import WorkerConfig
from hipr.worker.deadline import EXIT_MARGIN

CONFIG = Path(__file__).parents[1] / "config"


@pytest.mark.parametrize("unit", ["hipr-worker.service", "hipr-worker@.service"])
def test_timeout_stop_sec_leaves_the_worker_time_to_exit_by_itself(unit: str) -> None:
    text = (CONFIG / unit).read_text()
    [value] = re.findall(r"^TimeoutStopSec=(\d+)$", text, re.MULTILINE)
    deadline = WorkerConfig().shutdown_timeout + EXIT_MARGIN
    # Above the worker's deadline (it reports what it cut short), yet not so far above
    # that a stuck stop is left hanging much longer than the worker itself allows.
    assert deadline < int(value) <= 2 * deadline
