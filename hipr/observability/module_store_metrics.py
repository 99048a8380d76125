"""Metrics of the tenants' module stores (code objects kept so that a later session loads
them by hash: ``hipr.sessions.module_store``), read from the worker's
``module_store_figures()`` at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def module_store_metrics(worker: object) -> Iterator[Metric]:
    """``hipr_module_store_hits``, ``_misses``, ``_saved_bytes``, ``_evictions``,
    ``hipr_module_load_received_bytes`` (counters) and ``hipr_module_store_bytes``,
    ``_images`` (gauges), per tenant (nothing for a worker without module stores)."""
    figures_of = getattr(worker, "module_store_figures", None)
    if figures_of is None:
        return
    figures: dict[str, Any] = figures_of()
    counters = {
        "hits": CounterMetricFamily(
            "hipr_module_store_hits",
            "MODULE_LOADs by sha256 alone that the tenant's module store held: loaded "
            "without the code object's bytes crossing the wire.",
            labels=["tenant"],
        ),
        "misses": CounterMetricFamily(
            "hipr_module_store_misses",
            "MODULE_LOADs by sha256 alone that the store did not hold (answered held: "
            "false; the client then sends the bytes).",
            labels=["tenant"],
        ),
        "bytes_saved": CounterMetricFamily(
            "hipr_module_store_saved_bytes",
            "Bytes of code objects loaded from the store instead of received again.",
            labels=["tenant"],
        ),
        "bytes_received": CounterMetricFamily(
            "hipr_module_load_received_bytes",
            "Bytes of code objects MODULE_LOAD received over the wire (with a sha256 or "
            "without): what the store's savings compare with.",
            labels=["tenant"],
        ),
        "evictions": CounterMetricFamily(
            "hipr_module_store_evictions",
            "Code objects dropped from the store to keep it within module_store_bytes "
            "and module_store_count (least recently used first).",
            labels=["tenant"],
        ),
    }
    held_bytes = GaugeMetricFamily(
        "hipr_module_store_bytes",
        "Bytes of code objects the tenant's module store holds (worker host memory).",
        labels=["tenant"],
    )
    held_images = GaugeMetricFamily(
        "hipr_module_store_images",
        "Code objects the tenant's module store holds.",
        labels=["tenant"],
    )
    for tenant, row in sorted(figures.items()):
        for name, family in counters.items():
            family.add_metric([tenant], getattr(row, name))
        held_bytes.add_metric([tenant], row.held_bytes)
        held_images.add_metric([tenant], row.held_images)
    yield from counters.values()
    yield from (held_bytes, held_images)
