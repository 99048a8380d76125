"""How a worker keeps tenants apart, as status pages and ``/metrics`` show it.

Read from the worker with ``getattr`` (this layer never imports the worker):
``isolation_mode`` (``auto`` resolved), ``shared_tenants`` (tenants sharing one
process, 0 when isolated) and ``context_resets()`` (GPU contexts rebuilt, or tenant
processes retired, after a kernel fault, by the tenant whose kernel faulted).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

#: What a shared process does not protect: logged at start, shown by ``hipr status``.
SHARED_RISK = (
    "tenants share one GPU context: a tenant's kernel can read and write any other "
    "tenant's device memory (a kernel may use any address), and one faulting kernel "
    'breaks every session on the device; set isolation = "auto" or "process"'
)


def isolation_figures(worker: object) -> dict[str, Any]:
    """The status reply's isolation fields."""
    shared = int(getattr(worker, "shared_tenants", 0))
    resets = getattr(worker, "context_resets", None)
    return {
        "isolation": str(getattr(worker, "isolation_mode", "none")),
        "shared_tenants": shared,
        "isolation_warning": SHARED_RISK if shared > 1 else None,
        "context_resets": dict(resets()) if callable(resets) else {},
    }


def isolation_metrics(worker: object) -> Iterator[Metric]:
    """``hipr_tenants_sharing_process`` and ``hipr_context_resets_total``."""
    figures = isolation_figures(worker)
    yield GaugeMetricFamily(
        "hipr_tenants_sharing_process",
        "Tenants whose sessions share one worker process and GPU context (isolation = "
        '"none" with several tenants): each can read the others\' device memory, and one '
        "fault fails them all. 0 when tenants are isolated.",
        value=figures["shared_tenants"],
    )
    resets = CounterMetricFamily(
        "hipr_context_resets",
        "GPU contexts rebuilt (or tenant worker processes restarted) after a kernel "
        "fault that poisoned the context, by the tenant whose kernel faulted.",
        labels=["tenant"],
    )
    for tenant, count in sorted(figures["context_resets"].items()):
        resets.add_metric([tenant], count)
    yield resets
