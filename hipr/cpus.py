"""How many CPUs this process may really use, and the automatic spin that follows from
it: the sync client's before it blocks for a reply, and the worker's event loop's after
a request (``spin_wait``), each of which burns a core only where cores are to spare."""

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


#: The automatic spin window: long enough for a small call's reply (a null synchronize
#: or a launch + synchronize comes back in ~40-150 µs on a GPU host), and for a worker's
#: loop to still be awake when a client's next call follows its reply; short enough
#: that an idle wait costs little CPU.
AUTO_SPIN_SECONDS = 200e-6
#: Below this many usable CPUs (affinity, and a cgroup CPU quota: a container limited
#: to 2 CPUs on a 64-core node counts 2) nothing spins by default: with the client and
#: the worker on the same small machine, a spinning side takes the core that would
#: answer it, and under a quota the spin spends the container's CPU time.
AUTO_SPIN_MIN_CPUS = 4


def auto_spin_wait(cpus: int | None = None) -> float:
    """CUDA's ``cudaDeviceScheduleAuto`` for a remote call: spin
    :data:`AUTO_SPIN_SECONDS` when the machine has cores to spare, else block at once."""
    count = cpus if cpus is not None else usable_cpus()
    return AUTO_SPIN_SECONDS if count >= AUTO_SPIN_MIN_CPUS else 0.0
