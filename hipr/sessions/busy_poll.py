"""Busy polling on the worker's event loop: the ``spin_wait`` setting.

A thread that sleeps between requests, or while a kernel runs, is woken by the kernel
when the next bytes or the kernel's end arrive; on a virtual machine that wake-up
costs tens of µs, and more after a long sleep. CUDA offers the same trade for a local
program (``cudaDeviceScheduleSpin``: burn a core, answer sooner). With ``spin_wait``
set, the worker's loop does not sleep for that long after a request arrives or a reply
leaves, and a synchronize whose work is still running polls for it from the loop for
that long before it blocks on the session's GPU thread. By default (``"auto"``) the
window is 200 µs on a machine with 4 or more usable CPUs, and 0 below: the trade that
``cudaDeviceScheduleAuto`` makes for a local program, and the sync client for its wait.

The loop spins only while no session's GPU thread is busy: those threads run Python
and need the interpreter lock that a spinning loop holds, so spinning then would slow
the very work being waited for. The GPU thread's completion wakes the loop as usual.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
import anyio.lowlevel


class Idle(Protocol):
    """A session's GPU thread, as busy polling sees it."""

    @property
    def idle(self) -> bool:
        """True when nothing is queued, batched or running."""
        ...


#: Starts a task in the worker's task group (``TaskGroup.start_soon``).
StartTask = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


class BusyPoll:
    """The worker's busy polling; disabled (every method a no-op) when ``seconds`` is 0."""

    def __init__(self, seconds: float, gpu_threads_busy: Callable[[], bool] | None = None) -> None:
        """``gpu_threads_busy``: True while any session's GPU thread has work; by default
        the threads handed work since they were last seen idle (:meth:`note_gpu_work`)
        are asked, so that a spin's turn costs the same beside one session or hundreds."""
        self.seconds = max(0.0, seconds)
        self._gpu_threads_busy = gpu_threads_busy or self._noted_threads_busy
        #: GPU threads given work and not yet seen idle since (loop thread only).
        self._working: set[Idle] = set()
        self._start: StartTask | None = None
        #: The asyncio loop the spin runs on as a chain of callbacks (None: under trio,
        #: as a task).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._until = 0.0
        self._spinning = False
        #: Spins started since :meth:`attach` (one per window of activity).
        self.spins_started = 0
        #: Why the last :meth:`wait_until` stopped polling without the work done
        #: (``"window"`` or ``"gpu thread busy"``), for logs and tests; None if it never did.
        self.gave_up: str | None = None

    @property
    def enabled(self) -> bool:
        """True when the worker spins at all."""
        return self.seconds > 0

    def note_gpu_work(self, thread: Idle) -> None:
        """A session's GPU thread was handed work (``GpuThread``'s ``on_work``)."""
        self._working.add(thread)

    def _noted_threads_busy(self) -> bool:
        """True while a thread noted by :meth:`note_gpu_work` still has work; those seen
        idle are forgotten until they are handed work again."""
        working = self._working
        if working:
            for thread in [t for t in working if t.idle]:
                working.discard(thread)
        return bool(working)

    def attach(self, start: StartTask) -> None:
        """Spin on the calling task's loop from now on: under asyncio as callbacks on the
        loop, under trio as tasks started with ``start`` (the worker's task group's,
        while it serves)."""
        self._start = start
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # trio's
            self._loop = None
        self._spinning = False  # a spin of an earlier loop ended with it
        self.spins_started = 0

    def note_activity(self) -> None:
        """Bytes of a request arrived, or a reply left: keep the loop awake for
        ``seconds`` more. After a reply, a client's next call usually follows within
        tens of µs, even after a kernel that kept the loop asleep for milliseconds."""
        if not self.seconds:
            return
        self._until = time.perf_counter() + self.seconds
        if self._spinning:
            return
        if self._loop is not None:
            self._spinning = True
            self.spins_started += 1
            self._loop.call_soon(self._turn)
        elif self._start is not None:
            self._spinning = True
            self.spins_started += 1
            self._start(self._spin)

    def _turn(self) -> None:
        """One pass of the spin under asyncio: a callback that schedules itself again
        until the window closes or a GPU thread needs the interpreter. The loop polls
        its sockets without sleeping between two passes; a pass costs uvloop ~1.0 µs
        against 2.4-3.1 µs for a task's checkpoint on the 2-core test machine
        (``benchmarks/spin_pass.py``), so a request that arrives mid-pass is read
        sooner."""
        again = False
        try:
            again = time.perf_counter() < self._until and not self._gpu_threads_busy()
        finally:
            if again and self._loop is not None:
                self._loop.call_soon(self._turn)
            else:
                self._spinning = False

    async def _spin(self) -> None:
        """Yield to the loop (which then polls its sockets without sleeping) until the
        window closes or a GPU thread needs the interpreter; a new request restarts it."""
        try:
            while time.perf_counter() < self._until and not self._gpu_threads_busy():
                await anyio.lowlevel.checkpoint()
        finally:
            self._spinning = False

    async def wait_until(self, done: Callable[[], bool], window: float = 0.0) -> bool:
        """Ask ``done`` between loop passes for up to ``seconds`` (or ``window``, a
        forecast wait, where longer): True once it says so; False when time ran out or a
        GPU thread got busy (the caller then blocks on the session's GPU thread, as
        without spinning). ``done`` may raise (a failed kernel), as a synchronize would."""
        if not self.seconds:
            return False
        deadline = time.perf_counter() + max(self.seconds, window)
        while not done():
            if time.perf_counter() >= deadline:
                self.gave_up = "window"
                return False
            if self._gpu_threads_busy():
                self.gave_up = "gpu thread busy"
                return False
            await anyio.lowlevel.checkpoint()
        return True
