"""Whether tenants share one process (and GPU context), and the warning when they do.

A kernel is code: inside one process it can read any device address of that process,
whatever the worker checks on the wire (pointer arguments are checked; addresses a
kernel computes, or receives as plain integers, cannot be), and one kernel's illegal
address poisons the context for every session in it. Tenants are therefore kept in
processes of their own by default whenever there are several (``isolation = "auto"``);
an operator who opts out (``isolation = "none"``) is told, loudly and repeatedly, what
that leaves open.
"""

from __future__ import annotations

import structlog

from hipr.observability.isolation_figures import SHARED_RISK

log = structlog.get_logger("hipr.isolation")


def resolve_isolation(configured: str, tenants: int) -> str:
    """The isolation in force: ``auto`` is ``process`` with more than one tenant,
    else ``none``; any other value stands as configured."""
    if configured == "auto":
        return "process" if tenants > 1 else "none"
    return configured


def warn_if_shared(shared_tenants: int) -> None:
    """Log the shared-context warning when ``shared_tenants`` (> 1) share a process."""
    if shared_tenants > 1:
        log.warning(
            "tenants are not isolated",
            tenants=shared_tenants,
            risk=SHARED_RISK,
        )
