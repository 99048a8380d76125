"""Gauges and counters of runaway GPU work (see hipr/worker/runaway.py), read from the
worker's ``runaway_status()`` at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def runaway_metrics(worker: object) -> Iterator[Metric]:
    """``hipr_runaway_work``, ``hipr_runaway_seconds`` and ``hipr_runaway_stopped``
    (nothing for a worker without a runaway watch)."""
    status_of = getattr(worker, "runaway_status", None)
    if status_of is None:
        return
    status: dict[str, Any] = status_of()
    work = GaugeMetricFamily(
        "hipr_runaway_work",
        "Sessions whose GPU work runs past its rules now: after its session ended "
        "(reason 'session ended', past runaway_grace) or past max_kernel_seconds.",
        labels=["tenant", "reason"],
    )
    seconds = GaugeMetricFamily(
        "hipr_runaway_seconds",
        "How long the tenant's oldest runaway work has held the device, per reason.",
        labels=["tenant", "reason"],
    )
    counts: dict[tuple[str, str], int] = {}
    longest: dict[tuple[str, str], float] = {}
    for row in status.get("active", []):
        key = (str(row["tenant"]), str(row["reason"]))
        counts[key] = counts.get(key, 0) + 1
        longest[key] = max(longest.get(key, 0.0), float(row["seconds"]))
    for key, n in sorted(counts.items()):
        work.add_metric(list(key), n)
        seconds.add_metric(list(key), longest[key])
    stopped = CounterMetricFamily(
        "hipr_runaway_stopped",
        "Runaway work that ended: 'tenant process ended' (the worker stopped it) or "
        "'finished on its own'.",
        labels=["tenant", "reason", "how"],
    )
    for row in status.get("stopped_total", []):
        stopped.add_metric([str(row["tenant"]), str(row["reason"]), str(row["how"])], row["count"])
    yield from (work, seconds, stopped)
