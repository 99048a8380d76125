"""BusyPoll, the worker's ``spin_wait``: when it spins, for how long, and that it gives
way to busy GPU threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

from hipr.sessions.busy_poll import BusyPoll

pytestmark = pytest.mark.anyio


class Starter:
    """Records the spinners a BusyPoll starts, and runs them in a task group."""

    def __init__(self, group: anyio.abc.TaskGroup) -> None:
        self.group = group
        self.started = 0

    def __call__(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.started += 1
        self.group.start_soon(fn)


async def test_disabled_it_never_spins_nor_polls() -> None:
    asked: list[int] = []
    poll = BusyPoll(0.0, lambda: False)
    assert not poll.enabled
    async with anyio.create_task_group() as tg:
        starter = Starter(tg)
        poll.attach(starter)
        poll.note_activity()
    assert starter.started == 0
    assert not await poll.wait_until(lambda: asked.append(1) or True)
    assert asked == []


async def test_wait_until_polls_until_done_or_the_window_ends() -> None:
    poll = BusyPoll(0.5, lambda: False)
    looks = iter([False, False, False, True])
    assert await poll.wait_until(lambda: next(looks))
    assert poll.gave_up is None
    started = time.perf_counter()
    short = BusyPoll(0.02, lambda: False)
    assert not await short.wait_until(lambda: False)
    assert 0.02 <= time.perf_counter() - started < 1.0
    assert short.gave_up == "window"


async def test_wait_until_gives_way_to_a_busy_gpu_thread() -> None:
    looks: list[int] = []

    def never() -> bool:
        looks.append(1)
        return False

    started = time.perf_counter()
    poll = BusyPoll(5.0, lambda: True)
    assert not await poll.wait_until(never)
    assert time.perf_counter() - started < 1.0  # at once, not after the 5 s window
    assert looks == [1]
    assert poll.gave_up == "gpu thread busy"


async def test_wait_until_passes_on_the_error_a_poll_raises() -> None:
    def fails() -> bool:
        raise RuntimeError("kernel fault")

    with pytest.raises(RuntimeError, match="kernel fault"):
        await BusyPoll(1.0, lambda: False).wait_until(fails)


async def test_one_spinner_per_window_and_it_ends_when_the_window_does(
    anyio_backend: str,
) -> None:
    poll = BusyPoll(0.05, lambda: False)
    async with anyio.create_task_group() as tg:
        starter = Starter(tg)
        poll.attach(starter)
        for _ in range(20):
            poll.note_activity()
            await anyio.lowlevel.checkpoint()
        assert poll.spins_started == 1
        # Under asyncio the spin is a chain of the loop's callbacks, under trio a task.
        assert starter.started == (0 if anyio_backend == "asyncio" else 1)
        with anyio.fail_after(3):
            while poll._spinning:  # ends by itself once the window closes
                await anyio.sleep(0.01)
        poll.note_activity()  # a request after the window starts a new one
        assert poll.spins_started == 2
    # Attached anew (the worker's next start): spins begin again on that loop.
    async with anyio.create_task_group() as tg:
        poll.attach(Starter(tg))
        poll.note_activity()
        assert poll.spins_started == 1


async def test_the_spinner_stops_while_a_gpu_thread_is_busy() -> None:
    busy = False
    poll = BusyPoll(5.0, lambda: busy)
    with anyio.fail_after(3):
        async with anyio.create_task_group() as tg:
            poll.attach(Starter(tg))
            poll.note_activity()
            await anyio.sleep(0.01)
            assert poll._spinning
            busy = True  # the spinner sees it at its next pass and ends
            while poll._spinning:
                await anyio.sleep(0.001)


class _Thread:
    """A GPU thread as busy polling sees it, counting how often it is asked."""

    def __init__(self) -> None:
        self.busy = False
        self.asked = 0

    @property
    def idle(self) -> bool:
        self.asked += 1
        return not self.busy


async def test_only_gpu_threads_handed_work_are_asked() -> None:
    """By default a spin's turn asks only the threads handed work since they were last
    seen idle: the idle sessions of a busy worker cost it nothing."""
    poll = BusyPoll(0.5)
    idle_ones = [_Thread() for _ in range(100)]
    worker = _Thread()
    assert not poll._gpu_threads_busy()
    worker.busy = True
    poll.note_gpu_work(worker)
    assert poll._gpu_threads_busy() and poll._gpu_threads_busy()
    worker.busy = False
    assert not poll._gpu_threads_busy()
    asked = worker.asked
    assert not poll._gpu_threads_busy()
    assert worker.asked == asked  # seen idle once: forgotten until handed work again
    assert all(thread.asked == 0 for thread in idle_ones)


async def test_a_sessions_gpu_thread_reports_its_work() -> None:
    """``GpuThread(on_work=...)``: posting or submitting work notes the thread, and busy
    polling sees it busy until that work has run."""
    from hipr.sessions.gpu_thread import GpuThread

    poll = BusyPoll(0.5)
    thread = GpuThread("spin-test", on_work=poll.note_gpu_work)
    try:
        assert not poll._gpu_threads_busy()
        thread.post(lambda: None, on_error=lambda exc: None)
        assert poll._gpu_threads_busy()  # posted, not yet flushed: not idle
        thread.flush()
        with anyio.fail_after(5):
            while poll._gpu_threads_busy():
                await anyio.sleep(0.001)
        gate = threading.Event()
        pending = thread.submit(gate.wait, 5)
        assert poll._gpu_threads_busy()
        gate.set()
        assert await pending.result() is True
        with anyio.fail_after(5):
            while poll._gpu_threads_busy():
                await anyio.sleep(0.001)
    finally:
        await thread.close()
