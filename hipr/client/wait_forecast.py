"""When to nap and when to poll while the sync client waits for a synchronize's reply.

The client polls its socket for a short spin window (``LinkOptions.spin_wait``), then
blocks. A synchronize that outlasts the window (a kernel of a few milliseconds) is
then answered into a sleeping thread, and on a virtual machine the kernel's wake-up of
a thread that slept for milliseconds costs tens of µs: the reply has arrived, but the
caller does not run yet. A program that synchronizes after each step pays that on
every step.

This is the shape of Linux's hybrid block polling: learn how long such waits take,
sleep through most of the next one (woken at once if the reply comes early), and poll
from shortly before the expected end until shortly after it, so that the reply finds
a running thread. The polling is bounded by :data:`MARGIN_MAX` on each side of the
expected end, so a wait costs at most twice that in CPU beyond the spin, where CUDA's
own default for a machine with cores to spare (``cudaDeviceScheduleAuto``) polls through
all of it. The forecast is per kind of synchronize, not per stream or event: a program
that alternates short and long waits of one kind gets a blurred estimate, and at worst
the old behaviour (a reply outside the polled span wakes a sleeping thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from hipr.protocol.opcodes import Opcode

#: The requests whose waits are forecast: they wait for the GPU, so a program's loop
#: repeats them with similar waits, and their replies carry nothing to prepare.
FORECAST_OPCODES = frozenset(
    {Opcode.DEVICE_SYNCHRONIZE, Opcode.STREAM_SYNCHRONIZE, Opcode.EVENT_SYNCHRONIZE}
)
#: The polling around the expected end: an eighth of the wait, at most this (seconds).
#: On the H100 host a quarter, up to 1 ms, cost the client ~0.4 ms of CPU per 2.6 ms
#: SGEMM step for the same ~30 µs (benchmarks/results/2026-11-25-h100-forecast-stages.txt).
MARGIN_MAX = 250e-6
#: Longer waits are not forecast: a wake-up's tens of µs are nothing beside them, and a
#: nap that long would go without the blocking path's checks for a silent link.
FORECAST_MAX = 0.5


@dataclass(frozen=True, slots=True)
class WaitPlan:
    """For one wait, on the ``time.monotonic`` clock: sleep until ``nap_until`` unless
    the reply comes first, then poll until ``poll_until``, then block as usual."""

    nap_until: float
    poll_until: float


class WaitForecast:
    """The expected wait of each forecast request kind, from the waits seen so far.

    Only waits longer than the spin window teach it anything (shorter ones are caught
    by the spin); a short wait forgets what was learned, so a program whose
    synchronizes become quick stops napping at once. Not thread-safe on purpose: a
    race between two waiting threads can only blur one estimate.
    """

    __slots__ = ("_expected", "_spin")

    def __init__(self, spin: float) -> None:
        self._spin = spin
        self._expected: dict[int, float] = {}

    def plan(self, opcode: int, started: float) -> WaitPlan | None:
        """The nap and poll for a wait of ``opcode`` that began at ``started``, or None
        when there is nothing to forecast (no spinning, no long wait seen)."""
        expected = self._expected.get(opcode)
        if expected is None:
            return None
        margin = min(expected / 8, MARGIN_MAX)
        end = started + expected
        return WaitPlan(end - margin, end + margin)

    def record(self, opcode: int, seconds: float) -> None:
        """A wait of ``opcode`` took ``seconds``, from sending to having the reply."""
        if opcode not in FORECAST_OPCODES or not self._spin:
            return
        if not self._spin < seconds <= FORECAST_MAX:
            self._expected.pop(opcode, None)
            return
        before = self._expected.get(opcode)
        # Half the weight on the newest wait: a step that changed length is followed
        # within a few waits, and one outlier moves the estimate only half way.
        self._expected[opcode] = seconds if before is None else (before + seconds) / 2
