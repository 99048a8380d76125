"""Tools that prove hipr's reliability claims: fuzzing, fault injection, load.

- :mod:`hipr.testing.fault_backend`: :class:`FaultBackend` wraps any backend and fails
  its calls on purpose (HipErrors or simulated GPU-thread crashes), deterministically.
- :mod:`hipr.testing.fuzz`: frame generators and a raw byte mutator (sans-I/O).
- :mod:`hipr.testing.fuzz_campaign`, :mod:`hipr.testing.faults`, :mod:`hipr.testing.load`:
  campaigns against a live worker, each with its oracles (no crash, no hang, every
  request answered, correct results, nothing leaked).
- :mod:`hipr.testing.harness`: what they share (log watch, leak check, RSS).

``scripts/fuzz`` and ``scripts/reliability-report`` run them from the command line.
"""

from hipr.testing.fault_backend import (
    BACKEND_METHODS,
    RELEASE_METHODS,
    FaultBackend,
    InjectedCrash,
    InjectedFault,
)
from hipr.testing.harness import LogWatch, leaks, rss_bytes, wait_for_no_sessions

__all__ = [
    "BACKEND_METHODS",
    "RELEASE_METHODS",
    "FaultBackend",
    "InjectedCrash",
    "InjectedFault",
    "LogWatch",
    "leaks",
    "rss_bytes",
    "wait_for_no_sessions",
]
