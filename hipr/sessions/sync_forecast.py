"""How long a session's device synchronizes wait, so that the worker's loop polls through
the next one instead of sleeping.

With ``spin_wait`` on (200 µs by default where the worker has 4 or more CPUs), a
synchronize whose work is still running is polled for from the event loop for that
window, then waits on the session's GPU thread while the loop sleeps. A kernel of
milliseconds (cuBLAS's 4096² SGEMM: 2.7 ms) outlasts the window every time, and on a
virtual machine the worker then pays for having slept: the loop's wake-up and, slower
still, the next request's launch on a core that idled (docs/gpu-runs/
2026-11-26-h200-cuda-proxy-matmul.txt: a 5 ms window brought PyTorch's matmul through
the proxy from 1.14x to 1.06x of local). The sync client and the proxy already forecast
their side of such a wait (hipr/client/wait_forecast.py); this is the worker's: a session
that synchronizes after similar kernels gets a polling window of its expected wait plus a
margin, up to :data:`FORECAST_MAX`. The cost is the loop's core for that long per
synchronize (a local CUDA program's default spins through every wait on such a machine),
and none where ``spin_wait`` is 0: the operator's "never spin" stands.
"""

from __future__ import annotations

#: Waits forecast at most this long: a longer one is not polled through (the loop serves
#: every session meanwhile, and a wake-up's tens of µs are nothing beside it).
FORECAST_MAX = 10e-3
#: Polled past the expected end: an eighth of the wait, at most this (seconds).
MARGIN_MAX = 250e-6


class SyncForecast:
    """The expected length of a session's device synchronizes, from the last ones.

    Only waits longer than the spin window teach it anything; a shorter or a much longer
    one forgets, so a session whose synchronizes become quick stops holding the loop at
    once. Used from the event loop only.
    """

    __slots__ = ("_expected", "_spin")

    def __init__(self, spin: float) -> None:
        """``spin``: the worker's ``spin_wait`` in force (0: never forecast)."""
        self._spin = spin
        self._expected = 0.0

    def window(self) -> float:
        """How long to poll for the next synchronize (0.0: the plain spin window)."""
        if not self._expected:
            return 0.0
        return self._expected + min(self._expected / 8, MARGIN_MAX)

    def record(self, seconds: float) -> None:
        """A device synchronize waited ``seconds`` for its work."""
        if not self._spin:
            return
        if not self._spin < seconds <= FORECAST_MAX:
            self._expected = 0.0
            return
        # Half the weight on the newest wait: a step that changed length is followed
        # within a few waits, and one outlier moves the estimate only half way.
        self._expected = seconds if not self._expected else (self._expected + seconds) / 2
