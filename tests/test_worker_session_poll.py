"""How long a session polls a busy device before its synchronize goes to the GPU thread."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Handle
from hipr.sessions.state import Session

pytestmark = pytest.mark.anyio


class BusyEmulator(EmulatorBackend):
    """An emulator whose work is never done, counting the looks."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def work_done(self, streams: Sequence[Handle]) -> bool:
        self.looks += 1
        return False


#: The poll's window in these tests: long beside a preempted look on a loaded machine
#: (the worker's 30 µs, one descheduling of the test process, gave one look where the
#: test wanted several), so that what they check is the rule, not the machine's load.
WINDOW = 0.05


async def test_a_poll_that_just_ran_out_is_not_run_in_full_again(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("hipr.sessions.state._INLINE_POLL_SECONDS", WINDOW)
    backend = BusyEmulator()
    session = Session(backend)
    try:
        with anyio.fail_after(5):
            await session.settled_deferred_error()  # the thread has bound its device
        assert not session.work_done()
        polled = backend.looks
        assert polled > 1  # a full poll: looks until its time runs out
        assert not session.work_done()  # at once again (the executor after the callback)
        assert backend.looks == polled + 1
        await anyio.sleep(WINDOW * 1.5)
        assert not session.work_done()  # later: a full poll again
        assert backend.looks > polled + 2
    finally:
        await session.close()
