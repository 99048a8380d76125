"""How many CPUs this process may really use: for the sync client's automatic spin
before it blocks for a reply, which burns a core only where cores are to spare."""

from __future__ import annotations

import math
import os
from pathlib import Path

#: cgroup v2's CPU bandwidth limit of this process's group ("max 100000": none).
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on (its affinity mask), fewer when a cgroup quota
    allows less time than that (a Kubernetes CPU limit, a systemd ``CPUQuota=``): a
    process that spins under a quota of 2 CPUs on a 64-core node gets throttled."""
    if hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:  # pragma: no cover - macOS, Windows
        count = os.cpu_count() or 1
    quota = _cgroup_quota(cpu_max)
    if quota is not None:
        count = min(count, quota)
    return max(1, count)


def _cgroup_quota(cpu_max: Path) -> int | None:
    """Whole CPUs the cgroup's ``cpu.max`` grants (rounded up), or None: no limit, no
    cgroup v2, or a file that does not parse (never a reason to fail)."""
    try:
        quota, _, period = cpu_max.read_text(encoding="ascii").strip().partition(" ")
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period or "100000")))
    except (OSError, ValueError, ZeroDivisionError):
        return None
