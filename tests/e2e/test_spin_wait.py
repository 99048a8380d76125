"""The worker's ``spin_wait``: a synchronize whose work is still running is answered by
polling from the event loop, without the GPU thread, when the work ends within the
window; otherwise it blocks on the GPU thread as before. Errors, order and results are
the same either way, under trio and asyncio."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipErrorCode as E
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker
from tests.e2e.conftest import EMULATED_MEMORY, Endpoint

pytestmark = pytest.mark.anyio


class RunningKernelEmulator(EmulatorBackend):
    """The emulator with a kernel that runs until :attr:`finished` is set: the session's
    work, streams and events are not done meanwhile, and a blocking synchronize waits
    for it. Its queries may run inline (the worker then polls them)."""

    inline_calls = EmulatorBackend.inline_calls | {"stream_query", "event_query"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finished = threading.Event()
        self.finished.set()
        #: When the kernel of :meth:`run_for` ends (None: no such kernel runs; a test
        #: may also clear :attr:`finished` itself, and set it when it likes).
        self._ends_at: float | None = None
        self._kernels_started = 0
        #: Synchronizes that blocked on the GPU thread.
        self.blocking_syncs = 0
        #: Asks of ``work_done`` while the kernel ran.
        self.polls_while_running = 0

    def run_for(self, seconds: float) -> None:
        """Start a 'kernel' that ends after ``seconds``."""
        self.finished.clear()
        self._ends_at = time.monotonic() + seconds
        self._kernels_started += 1
        # The timer ends it for a blocked synchronize; a poll sees the end by the clock
        # itself, so that a timer thread starved on a loaded 2-core CI runner cannot
        # stretch the 'kernel' past the polling window.
        threading.Timer(seconds, self._end, args=(self._kernels_started,)).start()

    def _end(self, kernel: int) -> None:
        # An earlier kernel's late timer must not end this one.
        if kernel == self._kernels_started:
            self._ends_at = None
            self.finished.set()

    def _end_if_due(self) -> None:
        ends_at = self._ends_at
        if ends_at is not None and time.monotonic() >= ends_at:
            self._ends_at = None
            self.finished.set()

    def _running(self) -> bool:
        self._end_if_due()
        if self.finished.is_set():
            return False
        self.polls_while_running += 1
        return True

    def _block(self) -> None:
        self.blocking_syncs += 1
        self.finished.wait(30)  # bounded: a failing test must not hang the worker

    def work_done(self, streams: Any) -> bool:
        return not self._running() and super().work_done(streams)

    def stream_query(self, stream: Any) -> bool:
        return not self._running() and super().stream_query(stream)

    def event_query(self, event: Any) -> bool:
        return not self._running() and super().event_query(event)

    def synchronize(self) -> None:
        self._block()
        super().synchronize()

    def stream_synchronize(self, stream: Any) -> None:
        self._block()
        super().stream_synchronize(stream)

    def event_synchronize(self, event: Any) -> None:
        self._block()
        super().event_synchronize(event)


async def gpu_threads_idle(worker: Worker) -> None:
    """Until no session's GPU thread has work: the worker polls only then, so a test of
    polling starts there (a reply can reach the client before its thread's bookkeeping)."""
    with anyio.fail_after(5):
        while any(session.gpu_busy for session in worker.sessions.values()):
            await anyio.sleep(0.001)


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spin_wait() -> float:
    """The worker's spin window; tests parametrize it where they need another."""
    return 5.0


@pytest.fixture
def worker_config(spin_wait: float) -> WorkerConfig:
    return WorkerConfig(max_frame_bytes=8 << 20, spin_wait=min(spin_wait, 1.0))


@pytest.fixture
def backend() -> RunningKernelEmulator:
    return RunningKernelEmulator(device_count=1, total_memory=EMULATED_MEMORY)


@pytest.mark.parametrize("spin_wait", [1.0])
async def test_a_synchronize_is_answered_by_polling_within_the_window(
    endpoint: Endpoint, backend: RunningKernelEmulator, worker: Worker
) -> None:
    async with endpoint.aconnect() as gpu:
        p = await gpu.malloc(16)
        await gpu.memset(p, 7, 16)
        await gpu.synchronize()  # the memset has left the GPU thread
        await gpu_threads_idle(worker)
        backend.blocking_syncs = 0
        backend.run_for(0.2)
        started = time.monotonic()
        await gpu.synchronize()
        assert time.monotonic() - started >= 0.15  # it did wait for the 'kernel'
        assert backend.polls_while_running > 1
        # Never blocked on the GPU thread (a rare CI failure here: the reason says why).
        assert backend.blocking_syncs == 0, f"polling gave up: {worker.busy_poll.gave_up}"
        assert await gpu.memcpy_dtoh(p) == b"\7" * 16
    assert worker.busy_poll.enabled


@pytest.mark.parametrize("spin_wait", [0.05])
async def test_a_longer_wait_blocks_on_the_gpu_thread_after_the_window(
    endpoint: Endpoint, backend: RunningKernelEmulator
) -> None:
    async with endpoint.aconnect() as gpu:
        backend.run_for(0.5)
        await gpu.synchronize()
        assert backend.finished.is_set()
        assert backend.blocking_syncs == 1
        await gpu.synchronize()  # done now: answered at once, no second block
        assert backend.blocking_syncs == 1


@pytest.mark.parametrize("spin_wait", [1.0])
async def test_a_kernel_fault_found_while_polling_is_reported_once(
    endpoint: Endpoint, backend: RunningKernelEmulator, worker: Worker
) -> None:
    async with endpoint.aconnect() as gpu:
        fill = await gpu.builtin("fill_f32")
        p = await gpu.malloc(64)
        await gpu_threads_idle(worker)
        backend.run_for(0.1)
        # n is past the allocation: the emulator faults as a GPU would. Small enough
        # to run inline: the GPU thread stays idle, so the synchronize polls.
        await fill.launch(1, 64, [p, np.float32(1), np.uint64(16384)])
        with pytest.raises(hipr.HipError) as err:
            await gpu.synchronize()
        assert err.value.code == E.hipErrorIllegalAddress
        await gpu.synchronize()  # reported once, then cleared
        await fill.launch(1, 16, [p, np.float32(2), np.uint64(16)])
        await gpu.synchronize()
        got = np.frombuffer(await gpu.memcpy_dtoh(p), dtype=np.float32)
        assert np.all(got[:16] == 2)
        assert backend.blocking_syncs == 0


@pytest.mark.parametrize("spin_wait", [1.0])
async def test_stream_and_event_synchronizes_poll_too(
    endpoint: Endpoint, backend: RunningKernelEmulator, worker: Worker
) -> None:
    """A backend whose queries run inline has them polled like the device's work."""
    async with endpoint.aconnect() as gpu:
        stream = await gpu.stream_create()
        event = await gpu.event_create()
        p = await gpu.malloc(8)
        await gpu.memcpy_htod_async(p, b"spinning", stream=stream)
        await event.record(stream)
        # The copy may still be on the GPU thread, and a busy GPU thread is never polled
        # for (this one may block there); afterwards the thread is idle.
        await gpu.synchronize()
        await gpu_threads_idle(worker)
        backend.blocking_syncs = 0
        for wait in (stream.synchronize, event.synchronize):
            await gpu_threads_idle(worker)
            backend.run_for(0.2)
            started = time.monotonic()
            await wait()
            assert time.monotonic() - started >= 0.15
        assert await gpu.memcpy_dtoh(p) == b"spinning"
        assert backend.blocking_syncs == 0
        assert backend.polls_while_running > 2


def test_spin_wait_is_checked_and_read_from_toml(tmp_path: Any) -> None:
    from hipr.worker.config import ConfigError, load_config

    good = tmp_path / "good.toml"
    good.write_text("spin_wait = 0.002\n")
    assert load_config(good).spin_wait == 0.002
    for bad, why in (("-0.001", "between 0"), ("2.0", "between 0"), ('"fast"', '"auto"')):
        path = tmp_path / "bad.toml"
        path.write_text(f"spin_wait = {bad}\n")
        with pytest.raises(ConfigError, match=f"spin_wait.*{why}"):
            load_config(path)
    assert dataclasses.replace(WorkerConfig(), spin_wait=1.0).spin_wait == 1.0


def test_spin_wait_is_automatic_by_default_as_the_clients_is(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset or "auto": 200 µs where the worker has 4 or more usable CPUs, else 0; a
    number is taken as it is, 0 included."""
    import hipr.cpus
    from hipr.worker.config import load_config, spin_seconds

    path = tmp_path / "auto.toml"
    path.write_text('spin_wait = "Auto"\n')
    assert load_config(path).spin_wait is None
    assert WorkerConfig().spin_wait is None
    for cpus, expected in ((16, hipr.cpus.AUTO_SPIN_SECONDS), (4, 200e-6), (2, 0.0), (1, 0.0)):
        monkeypatch.setattr(hipr.cpus, "usable_cpus", lambda cpus=cpus: cpus)
        assert spin_seconds(WorkerConfig()) == expected
        assert spin_seconds(WorkerConfig(spin_wait=0.0)) == 0.0
        assert spin_seconds(WorkerConfig(spin_wait=0.003)) == 0.003
        assert Worker(WorkerConfig(), EmulatorBackend()).busy_poll.seconds == expected


@pytest.mark.parametrize("spin_wait", [0.25])
async def test_a_reply_after_a_wait_on_the_gpu_thread_keeps_the_loop_awake(
    endpoint: Endpoint, backend: RunningKernelEmulator, worker: Worker
) -> None:
    """A synchronize that outlasted the window and waited on the GPU thread: its reply
    restarts the window, so the client's next call finds the loop awake."""
    async with endpoint.aconnect() as gpu:
        backend.run_for(0.4)
        await gpu.synchronize()
        assert backend.blocking_syncs == 1
        replied = time.perf_counter()
        # The request arrived 0.4 s ago, its window long over: only the reply renews it,
        # right after its send (which may reach this client first); heartbeats, which
        # renew it too, are seconds apart.
        with anyio.fail_after(0.5):
            while worker.busy_poll._until < replied + 0.1:
                await anyio.sleep(0.001)
