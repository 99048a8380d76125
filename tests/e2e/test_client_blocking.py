"""The synchronous client does its own blocking I/O: nothing about it may be weaker than
the async client. Each test runs the worker on its own event-loop thread (a blocking
call must never run on the worker's loop) and reaches it over every transport where the
transport can matter: tcp, unix, tls, mutual TLS and ssh through a real sshd."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.client.blocking import BlockingConnection
from hipr.client.link import LinkOptions
from hipr.client.stream_io import SocketIO
from hipr.cpus import AUTO_SPIN_SECONDS, auto_spin_wait, usable_cpus
from hipr.errors import HipErrorCode as E
from hipr.worker.server import Worker
from tests.e2e.conftest import EMULATED_MEMORY, BlockingEndpoint
from tests.resilience.proxy import faulty_proxy
from tests.resilience.test_resume import REQUESTS, N, expected_y
from tests.resilience.test_service import worker_process  # noqa: F401  (fixture)

#: Short enough that a dead link is found in a test's time, long enough for a busy CI box.
FAST = LinkOptions(
    heartbeat_interval=0.2,
    heartbeat_timeout=2.0,
    reconnect_delay=0.01,
    reconnect_max_delay=0.1,
    reconnect_timeout=10.0,
    reconnect_attempts=50,
    connect_timeout=5.0,
)
#: One transport per way the sync client moves bytes (hipr/client/stream_io.py): a plain
#: socket (SocketIO: tcp; unix is the same class and calls), a TLS stream (PolledIO: tls;
#: mutual TLS differs only in its handshake) and ssh's forwarded socket (a process in
#: between). For the slow tests whose claim is about those ways, not about connecting.
IO_PATHS = ["tcp", "tls", "ssh"]
#: Bigger than the worker's chunk (4 MiB), and not a multiple of it.
BIG = (9 << 20) + 12_345


class GatedEmulator(EmulatorBackend):
    """The emulator whose ``memset`` waits while :attr:`gate` is clear: a replied call
    that cannot finish in time, on demand (``synchronize`` may be answered without the
    backend when the session's work is done)."""

    #: The gate blocks: memset must never run inline on the worker's event loop.
    inline_calls = EmulatorBackend.inline_calls - {"memset"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()

        #: While True, a synchronize also waits for the gate (a kernel running till then).
        self.gate_synchronize = False

    def memset(self, *args: Any, **kwargs: Any) -> None:
        self.gate.wait(30)  # bounded: a failing test must not keep the worker stuck
        super().memset(*args, **kwargs)

    def work_done(self, streams: Any) -> bool:
        return not (self.gate_synchronize and not self.gate.is_set()) and super().work_done(streams)

    def synchronize(self) -> None:
        if self.gate_synchronize:
            self.gate.wait(30)
        super().synchronize()


@pytest.fixture
def backend() -> GatedEmulator:
    """A fresh gated emulator with two devices."""
    return GatedEmulator(device_count=2, total_memory=EMULATED_MEMORY)


@pytest.fixture
def events() -> list[str]:
    """What ``on_event`` heard, in order."""
    return []


def recorder(events: list[str]) -> Callable[[str, dict[str, Any]], None]:
    return lambda kind, _details: events.append(kind)


def connect_one(url: str, **options: Any) -> hipr.Gpu:
    """``hipr.connect`` to one worker (typed as the single-worker client)."""
    gpu = hipr.connect(url, **options)
    assert isinstance(gpu, hipr.Gpu)
    return gpu


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- 1. the README session, chunked copies, timeout=, deferred errors, on every transport


def test_readme_session(blocking_endpoint: BlockingEndpoint) -> None:
    with blocking_endpoint.connect() as gpu:
        assert gpu.device_count() == 2
        gpu.set_device(0)
        n = 1024
        a = np.arange(n, dtype=np.float32)
        b = np.full(n, 0.5, dtype=np.float32)
        pa, pb, pc = gpu.malloc(n * 4), gpu.malloc(n * 4), gpu.malloc(n * 4)
        gpu.memcpy_htod(pa, a)
        gpu.memcpy_htod(pb, b)
        out = np.empty(n, dtype=np.float32)
        assert gpu.memcpy_dtoh(pa, out=out) is out
        np.testing.assert_array_equal(out, a)
        raw = bytearray(n * 4)
        gpu.memcpy_dtoh(pb, n * 4, out=raw)
        assert bytes(raw) == b.tobytes()
        gpu.memset(pc, 0xFF, n * 4)
        assert gpu.memcpy_dtoh(pc, 8) == b"\xff" * 8
        gpu.memcpy_dtod(pc, pa, n * 4)
        assert gpu.memcpy_dtoh(pc) == a.tobytes()

        s = gpu.stream_create()
        e0, e1 = gpu.event_create(), gpu.event_create()
        e0.record(s)
        add = gpu.builtin("vector_add_f32")
        add.launch(n // 256, 256, [pc, pa, pb, np.uint64(n)], stream=s)
        e1.record(s)
        e1.synchronize()
        assert e1.query()
        assert gpu.event_elapsed_ms(e0, e1) >= 0
        s.synchronize()
        gpu.synchronize()
        np.testing.assert_array_equal(gpu.memcpy_dtoh(pc, out=out), a + b)

        gpu.memcpy_htod_async(pc, np.zeros(n, dtype=np.float32), stream=s)
        assert s.query() in (True, False)
        s.synchronize()
        assert gpu.memcpy_dtoh(pc, 16) == b"\0" * 16
        s.destroy()
        for p in (pa, pb, pc):
            gpu.free(p)
        with pytest.raises(hipr.HipError) as err:
            gpu.free(pa)
        assert err.value.code == E.hipErrorInvalidValue
        assert gpu.mem_get_info()[0] > 0  # still usable after an error


def test_chunked_copies_with_progress(blocking_endpoint: BlockingEndpoint) -> None:
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, BIG, dtype=np.uint8)
    with blocking_endpoint.connect() as gpu:
        p = gpu.malloc(BIG)
        up: list[tuple[int, int]] = []
        gpu.memcpy_htod(p, data, progress=lambda done, total: up.append((done, total)))
        down: list[tuple[int, int]] = []
        out = np.zeros(BIG, dtype=np.uint8)
        gpu.memcpy_dtoh(p, out=out, progress=lambda done, total: down.append((done, total)))
        np.testing.assert_array_equal(out, data)
        into = bytearray(BIG)
        gpu.memcpy_dtoh(p, BIG, out=into)
        assert bytes(into) == data.tobytes()
    for calls in (up, down):
        assert len(calls) >= 3, calls  # 9 MiB in chunks of at most 4 MiB
        assert calls[-1] == (BIG, BIG)
        assert all(total == BIG for _, total in calls)
        done = [d for d, _ in calls]
        assert done == sorted(done) and done[0] > 0


def test_timeout_raises_and_the_session_stays_usable(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator, events: list[str]
) -> None:
    with blocking_endpoint.connect(link=FAST, on_event=recorder(events)) as gpu:
        p = gpu.malloc_htod(b"kept across the timeout")
        backend.gate.clear()
        try:
            started = time.monotonic()
            with pytest.raises(hipr.HipTimeoutError, match="within 0.3 s"):
                gpu.memset(p, ord("K"), 4, timeout=0.3)
            assert time.monotonic() - started < 3
            # A call behind the stuck one waits for it, and obeys its own timeout too.
            with pytest.raises(hipr.HipTimeoutError):
                gpu.device_count(timeout=0.2)
        finally:
            backend.gate.set()
        # The abandoned replies come and are dropped; each call gets its own answer.
        # The timed-out memset still ran, once, in its place in the session's order.
        assert gpu.memcpy_dtoh(p, timeout=10) == b"KKKK across the timeout"
        gpu.synchronize(timeout=10)
        assert gpu.get_device() == 0
    assert "disconnected" not in events


def test_deferred_errors_surface_at_the_next_synchronize(
    blocking_endpoint: BlockingEndpoint,
) -> None:
    with blocking_endpoint.connect() as gpu:
        fill = gpu.builtin("fill_f32")
        p = gpu.malloc(64)
        # n is larger than the allocation: the emulator faults as a GPU would.
        fill.launch(1, 64, [p, np.float32(1), np.uint64(1 << 20)])
        with pytest.raises(hipr.HipError) as err:
            gpu.synchronize()
        assert err.value.code == E.hipErrorIllegalAddress
        gpu.synchronize()  # reported once, then cleared

        gone = gpu.malloc(64)
        gpu.free(gone)
        gpu.memcpy_htod_async(gone, b"\1" * 64)  # fire-and-forget to a freed pointer
        with pytest.raises(hipr.HipError) as err:
            gpu.synchronize()
        assert err.value.code == E.hipErrorInvalidValue
        gpu.synchronize()

        fill.launch(1, 16, [p, np.float32(2), np.uint64(16)])
        gpu.synchronize()
        assert np.all(np.frombuffer(gpu.memcpy_dtoh(p), dtype=np.float32) == 2)


def _refuse(monkeypatch: pytest.MonkeyPatch, method: str, what: str) -> Callable[[], None]:
    """Make the blocking connection's coroutine ``method`` fail the test (a call that
    should have gone the direct way did not); returns what puts it back."""
    general = getattr(BlockingConnection, method)

    async def refused(*_: object, **__: object) -> None:
        raise AssertionError(f"{what} without timeout= went through {method}()")

    monkeypatch.setattr(BlockingConnection, method, refused)
    return lambda: monkeypatch.setattr(BlockingConnection, method, general)


def test_posts_skip_the_coroutines_and_keep_streams_and_timeouts(
    blocking_endpoint: BlockingEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launches and asynchronous copies go through their blocking twins (no coroutine,
    no notify()), with a stream given as the proxy the client returned, by keyword or
    by position; a ``timeout=`` takes the general path; every post lands in order."""
    with blocking_endpoint.connect() as gpu:
        fill = gpu.builtin("fill_f32")
        p = gpu.malloc(64)
        s = gpu.stream_create()
        restore = _refuse(monkeypatch, "notify", "a post")
        fill.launch(1, 16, [p, np.float32(3), np.uint64(16)], stream=s)
        gpu.memcpy_htod_async(p, np.float32([5]).tobytes(), s)
        restore()
        fill.launch(1, 8, [p + 8, np.float32(4), np.uint64(2)], 0, s, timeout=5)
        gpu.memcpy_htod_async(p + 4, np.float32([6]).tobytes(), stream=s, timeout=5)
        s.synchronize()
        got = np.frombuffer(gpu.memcpy_dtoh(p), dtype=np.float32)
        assert got[:4].tolist() == [5, 6, 4, 4] and got[4:16].tolist() == [3] * 12


def test_synchronizes_skip_the_coroutines_and_keep_errors_and_timeouts(
    blocking_endpoint: BlockingEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device's, a stream's and an event's ``synchronize()`` send their request
    straight on the blocking connection (no coroutine, no request()); the errors they
    report are the same; a ``timeout=`` takes the general path."""
    with blocking_endpoint.connect() as gpu:
        fill = gpu.builtin("fill_f32")
        p = gpu.malloc(64)
        s = gpu.stream_create()
        e = gpu.event_create()
        restore = _refuse(monkeypatch, "request", "a synchronize")
        fill.launch(1, 16, [p, np.float32(3), np.uint64(16)], stream=s)
        e.record(s)
        e.synchronize()
        s.synchronize()
        gpu.synchronize()
        # The kernel overruns its buffer: its fault comes with the next synchronize.
        fill.launch(1, 64, [p, np.float32(1), np.uint64(1 << 20)], stream=s)
        with pytest.raises(hipr.HipError) as err:
            s.synchronize()
        assert err.value.code == E.hipErrorIllegalAddress
        restore()
        gpu.synchronize(timeout=5)
        s.synchronize(timeout=5)
        e.synchronize(timeout=5)
        e.destroy()
        with pytest.raises(hipr.HipError) as err:
            e.synchronize()  # the worker no longer knows the event
        assert err.value.code == E.hipErrorInvalidHandle


# --- 2. several threads sharing one Gpu


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport_kind", IO_PATHS)
def test_threads_share_one_gpu(blocking_endpoint: BlockingEndpoint, backend: GatedEmulator) -> None:
    threads, rounds = 8, 100

    def work(gpu: hipr.Gpu, me: int) -> int:
        rng = np.random.default_rng(me)
        for i in range(rounds):
            size = int(rng.integers(1, 5000))
            data = rng.integers(0, 256, size, dtype=np.uint8)
            p = gpu.malloc(size)
            gpu.memcpy_htod(p, data)
            if i % 2:
                back = np.empty(size, dtype=np.uint8)
                gpu.memcpy_dtoh(p, out=back)
                np.testing.assert_array_equal(back, data)
            else:
                assert gpu.memcpy_dtoh(p, size) == data.tobytes()
            gpu.free(p)
        return me

    with blocking_endpoint.connect() as gpu, ThreadPoolExecutor(threads) as pool:
        done = [f.result(timeout=200) for f in [pool.submit(work, gpu, t) for t in range(threads)]]
        assert done == list(range(threads))
        assert gpu.mem_get_info()[0] == EMULATED_MEMORY  # every allocation was freed
    assert wait_until(lambda: backend.stats().is_zero())


def test_fire_and_forget_from_threads_then_one_synchronize(
    blocking_endpoint: BlockingEndpoint,
) -> None:
    threads, per_thread = 8, 200
    n = 64
    with blocking_endpoint.connect() as gpu:
        fill = gpu.builtin("fill_f32")
        slots = gpu.malloc(threads * per_thread * n * 4)

        def post(me: int) -> None:
            for j in range(per_thread):
                slot = slots + ((me * per_thread + j) * n * 4)
                if j % 2:
                    fill.launch(1, n, [slot, np.float32(me * 1000 + j), np.uint64(n)])
                else:
                    gpu.memcpy_htod_async(slot, np.full(n, me * 1000 + j, dtype=np.float32))

        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(post, t) for t in range(threads)]:
                f.result(timeout=60)
        gpu.synchronize()
        got = np.frombuffer(gpu.memcpy_dtoh(slots), dtype=np.float32)
    got = got.reshape(threads, per_thread, n)
    want = (np.arange(threads)[:, None] * 1000 + np.arange(per_thread)[None, :]).astype(np.float32)
    np.testing.assert_array_equal(got, np.broadcast_to(want[:, :, None], got.shape))


# --- 2b. a waiter that spins before it blocks (LinkOptions.spin_wait)


def test_a_spinning_waiter_blocks_once_its_window_is_over(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator
) -> None:
    """A reply slower than the spin window is waited for asleep: the waiting thread's
    CPU time stays near the window, not the wait (a spin that never stopped would burn
    the whole 0.6 s)."""
    spin = 0.02
    with blocking_endpoint.connect(link=dataclasses.replace(FAST, spin_wait=spin)) as gpu:
        p = gpu.malloc_htod(b"spin")
        gpu.synchronize()  # quick replies come back while spinning
        backend.gate.clear()
        threading.Timer(0.6, backend.gate.set).start()
        cpu_before, started = time.thread_time(), time.monotonic()
        gpu.memset(p, ord("s"), 2, timeout=10)
        cpu_used, waited = time.thread_time() - cpu_before, time.monotonic() - started
        assert waited >= 0.5
        assert cpu_used < 0.25, f"{cpu_used:.3f} s of CPU for a {waited:.2f} s wait"
        assert gpu.memcpy_dtoh(p) == b"ssin"


def test_a_spinning_waiter_keeps_timeouts_and_shares_the_gpu_with_threads(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator
) -> None:
    """A spin window longer than ``timeout=`` ends at the deadline; threads sharing one
    spinning Gpu each get their own replies (one reads for all, the others wait)."""
    link = dataclasses.replace(FAST, spin_wait=5.0)
    with blocking_endpoint.connect(link=link) as gpu:
        p = gpu.malloc_htod(b"kept")
        backend.gate.clear()
        try:
            started = time.monotonic()
            with pytest.raises(hipr.HipTimeoutError):
                gpu.memset(p, ord("K"), 1, timeout=0.3)
            assert time.monotonic() - started < 3
        finally:
            backend.gate.set()
        assert gpu.memcpy_dtoh(p, timeout=10) == b"Kept"

        def work(me: int) -> bytes:
            q = gpu.malloc(64)
            for i in range(20):
                gpu.memcpy_htod(q, bytes([me, i]) * 32)
                assert gpu.memcpy_dtoh(q, 2) == bytes([me, i])
            gpu.free(q)
            return bytes([me])

        with ThreadPoolExecutor(4) as pool:
            done = [f.result(timeout=60) for f in [pool.submit(work, t) for t in range(4)]]
        assert done == [bytes([t]) for t in range(4)]


def _gated_synchronize(gpu: Any, backend: GatedEmulator, seconds: float) -> tuple[float, float]:
    """A synchronize whose work runs ``seconds``: (wall time, this thread's CPU time)."""
    backend.gate.clear()
    threading.Timer(seconds, backend.gate.set).start()
    cpu_before, started = time.thread_time(), time.monotonic()
    gpu.synchronize()
    return time.monotonic() - started, time.thread_time() - cpu_before


def test_a_synchronize_like_the_last_ones_naps_then_polls_around_its_forecast_end(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a long synchronize, the next one sleeps through most of its expected wait
    and polls only around the expected end (LinkOptions.forecast_waits), so its CPU time
    stays far below the wait; a reply that comes before the forecast wakes the nap at
    once; and ``timeout=`` still ends a wait that naps."""
    naps: list[float] = []
    real_nap = BlockingConnection._nap

    def counted(self: BlockingConnection, plan: Any, deadline: float | None) -> float:
        naps.append(plan.nap_until - time.monotonic())
        return real_nap(self, plan, deadline)

    monkeypatch.setattr(BlockingConnection, "_nap", counted)
    monkeypatch.setattr("hipr.client.wait_forecast.FORECAST_MAX", 5.0)
    link = dataclasses.replace(FAST, heartbeat_interval=2.0, heartbeat_timeout=10.0)
    with blocking_endpoint.connect(link=dataclasses.replace(link, spin_wait=0.005)) as gpu:
        backend.gate_synchronize = True
        waited, _ = _gated_synchronize(gpu, backend, 0.3)  # learns a wait of ~0.3 s
        assert waited >= 0.25 and not naps
        waited, cpu = _gated_synchronize(gpu, backend, 0.3)
        assert len(naps) == 1 and naps[0] > 0.15  # slept through most of it
        assert waited >= 0.25
        assert cpu < 0.15, f"{cpu:.3f} s of CPU for a {waited:.2f} s forecast wait"
        waited, _ = _gated_synchronize(gpu, backend, 0.05)  # earlier than forecast
        assert len(naps) == 2 and waited < 0.25, f"a nap overran an early reply: {waited:.2f} s"
        backend.gate.clear()
        try:
            started = time.monotonic()
            with pytest.raises(hipr.HipTimeoutError):
                gpu.synchronize(timeout=0.1)
            assert time.monotonic() - started < 1.0
        finally:
            backend.gate.set()
        backend.gate_synchronize = False
        gpu.synchronize()


def test_without_forecasts_a_long_synchronize_blocks_after_the_spin(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``forecast_waits=False`` (or no spinning) keeps the old wait: spin, then block."""
    monkeypatch.setattr("hipr.client.wait_forecast.FORECAST_MAX", 5.0)
    naps: list[object] = []
    monkeypatch.setattr(BlockingConnection, "_nap", lambda *args: naps.append(args) or 0.0)
    link = dataclasses.replace(FAST, spin_wait=0.005, forecast_waits=False)
    with blocking_endpoint.connect(link=link) as gpu:
        backend.gate_synchronize = True
        for _ in range(2):
            waited, _ = _gated_synchronize(gpu, backend, 0.1)
            assert waited >= 0.05
        assert not naps


def test_spin_wait_is_automatic_by_cpu_count() -> None:
    """CUDA's schedule-auto rule for the client: spin where cores are to spare."""
    assert auto_spin_wait(cpus=16) == AUTO_SPIN_SECONDS > 0
    assert auto_spin_wait(cpus=2) == 0.0
    assert LinkOptions(spin_wait=-1.0).spin_seconds() == 0.0
    assert LinkOptions(spin_wait=0.003).spin_seconds() == 0.003
    assert LinkOptions().spin_seconds() == auto_spin_wait()


@pytest.mark.parametrize(
    ("cpu_max", "cap"),
    [
        ("max 100000\n", None),  # no quota: the affinity mask decides
        ("200000 100000\n", 2),  # a Kubernetes limit of 2 CPUs
        ("150000 100000\n", 2),  # 1.5 CPUs: rounded up
        ("50000 100000\n", 1),
        ("100000\n", 1),  # the period may be left out (100 ms)
        ("garbage\n", None),  # unreadable: no cap, never an error
        ("0 0\n", None),
        (None, None),  # no cgroup v2 file at all
    ],
)
def test_usable_cpus_honour_a_cgroup_quota(
    tmp_path: Path, cpu_max: str | None, cap: int | None
) -> None:
    """A client in a container limited to 2 CPUs does not spin on a 64-core node."""
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    uncapped = usable_cpus(tmp_path / "absent")
    assert uncapped >= 1
    assert usable_cpus(path) == (uncapped if cap is None else min(uncapped, cap))


# --- 3. an idle client is never taken for dead


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport_kind", IO_PATHS)
def test_idle_client_keeps_its_session(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator, events: list[str]
) -> None:
    worker = blocking_endpoint.worker
    worker.config = dataclasses.replace(
        worker.config, heartbeat_interval=0.2, heartbeat_timeout=1.0
    )
    link = dataclasses.replace(FAST, heartbeat_interval=0.1, heartbeat_timeout=1.0)
    with blocking_endpoint.connect(link=link, on_event=recorder(events)) as gpu:
        session = gpu.session_id
        p = gpu.malloc_htod(b"idle")
        for _ in range(2):
            # More than two heartbeat timeouts of both sides without a call (each spell;
            # the link would have been taken for dead after one without heartbeats).
            time.sleep(2.2)
            # The first call after the idle spell is slower than a heartbeat interval:
            # still no reason to take the link for dead.
            backend.gate.clear()
            threading.Timer(0.6, backend.gate.set).start()
            gpu.memset(p, ord("i"), 1, timeout=10)
            assert gpu.memcpy_dtoh(p) == b"idle"
            assert gpu.session_id == session
            assert list(worker.sessions) == [session]
    assert "disconnected" not in events, events


# --- 4. reconnect + RESUME exactly once


def sync_workload(gpu: hipr.Gpu) -> tuple[bytes, bytes, int]:
    """tests/resilience/test_resume.py's workload, through the synchronous API."""
    rng = np.random.default_rng(7)
    x = np.arange(N, dtype=np.float32) / 64
    px = gpu.malloc_htod(x)
    py = gpu.malloc(N * 4)
    scratch = gpu.malloc(N * 4)
    gpu.memset(py, 0, N * 4)
    axpy = gpu.builtin("axpy_f32")
    issued = 6
    scalars = rng.integers(1, 5, REQUESTS).astype(np.float32)
    verified = 0
    for i in range(REQUESTS - issued - 3):
        kind = i % 10
        if kind < 6:  # not idempotent: running one twice changes y
            axpy.launch(4, 256, [py, px, scalars[i], np.uint64(N)])
        elif kind == 6:
            gpu.memset(scratch + (i % N) * 4, i % 251, 4)
        elif kind == 7:
            gpu.memcpy_htod(scratch, np.full(16, i, dtype=np.int32))
        elif kind == 8:
            back = np.frombuffer(gpu.memcpy_dtoh(scratch, 64), dtype=np.int32)
            assert np.all(back == (i - 1)), (i, back[:4])
            verified += 1
        elif i % 20 == 9:  # not idempotent either: a second malloc would leak
            gpu.free(gpu.malloc(4096))
        else:
            gpu.synchronize()
    gpu.synchronize()
    return gpu.memcpy_dtoh(py, N * 4), gpu.memcpy_dtoh(scratch, N * 4), verified


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport_kind", ["tcp"])
def test_cut_links_resume_exactly_once(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator, events: list[str]
) -> None:
    with blocking_endpoint.connect(link=FAST) as gpu:
        uncut = sync_workload(gpu)
    assert uncut[0] == expected_y()
    with blocking_endpoint.portal.wrap_async_context_manager(
        faulty_proxy(blocking_endpoint.url)
    ) as proxy:
        proxy.cut_every = 20_000  # bytes: a cut every couple of hundred requests, mid-frame
        with connect_one(proxy.url, link=FAST, on_event=recorder(events)) as gpu:
            cut = sync_workload(gpu)
            proxy.cut_every = None
            # A cut just after the workload's last reply is resumed after it returns.
            assert wait_until(lambda: events.count("resumed") >= proxy.cuts), events
        assert proxy.cuts >= 10, proxy.cuts
    assert cut == uncut
    assert events.count("resumed") == proxy.cuts, events
    assert "session_lost" not in events
    assert wait_until(lambda: backend.stats().is_zero()), backend.stats()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport_kind", ["tcp"])
def test_a_long_upload_keeps_its_link_alive(
    blocking_endpoint: BlockingEndpoint, events: list[str]
) -> None:
    """An upload longer than heartbeat_timeout is not taken for a dead link."""
    link = dataclasses.replace(FAST, heartbeat_interval=0.2, heartbeat_timeout=1.5)
    with blocking_endpoint.portal.wrap_async_context_manager(
        faulty_proxy(blocking_endpoint.url)
    ) as proxy:
        with connect_one(proxy.url, link=link, on_event=recorder(events)) as gpu:
            size = 24 << 20
            p = gpu.malloc(size)
            started = time.monotonic()
            proxy.throttle = 8 << 20  # bytes per second: about 3 s, two timeouts
            gpu.memcpy_htod(p, b"\x01" * size)
            proxy.throttle = None
            assert time.monotonic() - started > 2.5
            assert gpu.memcpy_dtoh(p + (size - 4), 4) == b"\x01" * 4
    assert "disconnected" not in events, events


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport_kind", ["tcp"])
def test_threads_through_cut_links_run_exactly_once(
    blocking_endpoint: BlockingEndpoint, events: list[str]
) -> None:
    """Several threads on one Gpu while links are cut: whichever thread finds the dead
    link reconnects, the others wait for it, and nothing runs twice or never."""
    threads, rounds, n = 4, 150, 256
    ones = np.ones(n, dtype=np.float32)
    with blocking_endpoint.portal.wrap_async_context_manager(
        faulty_proxy(blocking_endpoint.url)
    ) as proxy:
        proxy.cut_every = 30_000  # per link, from its start: a cut every few hundred calls
        with connect_one(proxy.url, link=FAST, on_event=recorder(events)) as gpu:
            axpy = gpu.builtin("axpy_f32")
            px = gpu.malloc_htod(ones)
            sums = [gpu.malloc(n * 4) for _ in range(threads)]
            for p in sums:
                gpu.memset(p, 0, n * 4)

            def work(me: int) -> None:
                rng = np.random.default_rng(me)
                scratch = gpu.malloc(4096)
                for i in range(rounds):
                    axpy.launch(1, n, [sums[me], px, np.float32(1), np.uint64(n)])
                    data = rng.integers(0, 256, 4096, dtype=np.uint8)
                    gpu.memcpy_htod(scratch, data)
                    if i % 3 == 0:
                        assert gpu.memcpy_dtoh(scratch) == data.tobytes()
                gpu.free(scratch)

            with ThreadPoolExecutor(threads) as pool:
                for f in [pool.submit(work, t) for t in range(threads)]:
                    f.result(timeout=150)
            gpu.synchronize()
            proxy.cut_every = None
            for p in sums:  # each thread's launches ran exactly once
                got = np.frombuffer(gpu.memcpy_dtoh(p), dtype=np.float32)
                np.testing.assert_array_equal(got, np.full(n, rounds, dtype=np.float32))
        assert proxy.cuts >= 3, proxy.cuts
        links = proxy.links
    assert events.count("disconnected") == events.count("resumed") >= 3, events
    assert links == 1 + events.count("reconnecting"), (links, events)
    assert "session_lost" not in events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport_kind", ["tcp", "unix"])
def test_bytes_read_from_a_link_replaced_meanwhile_never_reach_the_new_one(
    blocking_endpoint: BlockingEndpoint, events: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread finds the link dead under a send and installs a new one while the
    reader waits in a read of the old one. What that read returns (here the first 10
    bytes of a reply: a frame cut short) belongs to the old link: fed to the new link's
    decoder it would misread every frame after it (a ProtocolError), and a reply in it
    would reach a request already reset and sent again. Both links' bytes stay apart,
    and the request is answered once, on the new link."""
    real_read = SocketIO.read
    armed = threading.Event()

    def read(self: SocketIO, buffer: Any, timeout: float | None) -> int | None:
        if not armed.is_set():
            return real_read(self, buffer, timeout)
        n = real_read(self, memoryview(buffer)[:10], timeout)
        if n:
            armed.clear()
            # "Another thread": the sender that found the link dead, reconnecting now.
            other = threading.Thread(target=conn._link_failed, args=(generation,))
            other.start()
            other.join(30)
        return n

    monkeypatch.setattr(SocketIO, "read", read)
    with connect_one(blocking_endpoint.url, link=FAST, on_event=recorder(events)) as gpu:
        conn = gpu._target._conn
        assert isinstance(conn, BlockingConnection)
        p = gpu.malloc_htod(b"before")
        generation = conn._generation
        armed.set()
        assert gpu.memcpy_dtoh(p, 6) == b"before"  # its reply cut at 10 bytes, then resent
        assert not armed.is_set() and conn._generation > generation
        gpu.memcpy_htod(p, b"after!")
        assert gpu.memcpy_dtoh(p, 6) == b"after!"
    assert events.count("resumed") == 1, events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport_kind", ["tcp"])
def test_a_stalled_route_is_found_by_heartbeat_and_resumed(
    blocking_endpoint: BlockingEndpoint, events: list[str]
) -> None:
    with blocking_endpoint.portal.wrap_async_context_manager(
        faulty_proxy(blocking_endpoint.url)
    ) as proxy:
        link = dataclasses.replace(FAST, heartbeat_interval=0.1, heartbeat_timeout=0.8)
        with connect_one(proxy.url, link=link, on_event=recorder(events)) as gpu:
            p = gpu.malloc_htod(b"before the stall".ljust(64))
            proxy.stalled = True
            with pytest.raises(hipr.HipTimeoutError):
                gpu.memcpy_dtoh(p, 64, timeout=0.3)
            # Without timeout=: the link's silence ends the wait, and a new route works.
            threading.Timer(1.5, lambda: setattr(proxy, "stalled", False)).start()
            started = time.monotonic()
            assert gpu.memcpy_dtoh(p, 16) == b"before the stall"
            assert time.monotonic() - started < 20
    assert "disconnected" in events and "resumed" in events, events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport_kind", ["tcp"])
def test_an_upload_into_a_stalled_route_is_resumed_not_hung(
    blocking_endpoint: BlockingEndpoint, events: list[str]
) -> None:
    """A route that stops moving mid-upload (open, silent): the blocked send gives up
    after heartbeat_timeout, the session resumes over a new link and the bytes arrive
    exactly once."""
    with blocking_endpoint.portal.wrap_async_context_manager(
        faulty_proxy(blocking_endpoint.url)
    ) as proxy:
        link = dataclasses.replace(FAST, heartbeat_interval=0.1, heartbeat_timeout=0.8)
        with connect_one(proxy.url, link=link, on_event=recorder(events)) as gpu:
            size = 32 << 20
            data = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8)
            p = gpu.malloc(size)
            proxy.stalled = True
            threading.Timer(2.0, lambda: setattr(proxy, "stalled", False)).start()
            started = time.monotonic()
            gpu.memcpy_htod(p, data)
            assert time.monotonic() - started < 30
            out = np.empty_like(data)
            gpu.memcpy_dtoh(p, size, out=out)
            np.testing.assert_array_equal(out, data)
    assert "disconnected" in events and "resumed" in events, events
    assert "session_lost" not in events


# --- tokens


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport_kind", ["tcp"])
def test_tokens_are_sent_and_checked_and_survive_a_resume(
    blocking_endpoint: BlockingEndpoint,
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    events: list[str],
) -> None:
    from hipr.worker.tenants import new_token, token_hash

    alice, revoked = new_token(), new_token()
    tenants = short_tmp / "tenants.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(alice)}"]\n'
        f'revoked_tokens = ["{token_hash(revoked)}"]\nmax_device_memory = "4MiB"\n'
    )
    worker = blocking_endpoint.worker
    worker.config = dataclasses.replace(worker.config, tenants_file=tenants)
    blocking_endpoint.portal.call(worker.reload_tenants)
    for token, message in ((None, "requires a token"), (revoked, "revoked"), ("x", "not valid")):
        monkeypatch.delenv("HIPR_TOKEN", raising=False)
        with pytest.raises(hipr.AuthError, match=message):
            blocking_endpoint.connect(token=token or "")
    monkeypatch.setenv("HIPR_TOKEN", alice)
    with blocking_endpoint.portal.wrap_async_context_manager(
        faulty_proxy(blocking_endpoint.url)
    ) as proxy:
        proxy.cut_every = 20_000
        with connect_one(proxy.url, link=FAST, on_event=recorder(events)) as gpu:
            assert gpu.worker_info()["tenant"] == "alice"
            p = gpu.malloc(4 << 20)  # the whole quota
            with pytest.raises(hipr.HipError) as err:
                gpu.malloc(1)
            assert err.value.code == E.hipErrorOutOfMemory
            # Each request must fit between two cuts, or its resend is cut again forever.
            for i in range(300):
                data = np.full(1024, i, dtype=np.uint32)
                gpu.memcpy_htod(p + (i % 64) * 4096, data)
                assert gpu.memcpy_dtoh(p + (i % 64) * 4096, 4096) == data.tobytes()
            proxy.cut_every = None
            with pytest.raises(hipr.HipError):  # still alice's session, still her quota
                gpu.malloc(1)
        assert proxy.cuts >= 1
    assert "resumed" in events and "session_lost" not in events, events


# --- 5. a dead or stopped worker is SessionLostError within the reconnect bound

LOST = LinkOptions(
    heartbeat_interval=0.2,
    heartbeat_timeout=1.0,
    reconnect_delay=0.05,
    reconnect_max_delay=0.2,
    reconnect_timeout=2.0,
    reconnect_attempts=20,
    connect_timeout=5.0,
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_dead_worker_is_session_lost_not_a_hang(
    request: pytest.FixtureRequest, how: str, events: list[str]
) -> None:
    started_worker: tuple[subprocess.Popen[bytes], str] = request.getfixturevalue("worker_process")
    process, url = started_worker
    gpu = connect_one(url, link=LOST, on_event=recorder(events))
    try:
        p = gpu.malloc(1 << 20)
        gpu.memcpy_htod(p, b"\1" * (1 << 20))
        process.send_signal(getattr(signal, how))
        started = time.monotonic()
        with pytest.raises(hipr.SessionLostError):
            gpu.memcpy_dtoh(p, 4)  # no timeout=: only the link's bounds may end it
        # heartbeat timeout (a stopped worker is silent) + reconnect bound + slack
        assert time.monotonic() - started < 1.0 + 2.0 + 4.0
        assert gpu.lost
        started = time.monotonic()
        with pytest.raises(hipr.SessionLostError):
            gpu.synchronize()
        assert time.monotonic() - started < 1
    finally:
        if how == "SIGSTOP":
            process.send_signal(signal.SIGCONT)
        gpu.close()
    assert "session_lost" in events


# --- 6. close()


def test_close_frees_the_session_and_later_use_fails(
    blocking_endpoint: BlockingEndpoint, backend: GatedEmulator
) -> None:
    worker: Worker = blocking_endpoint.worker
    gpu = blocking_endpoint.connect(link=FAST)
    p = gpu.malloc(1 << 20)
    s = gpu.stream_create()
    assert len(worker.sessions) == 1
    gpu.close()
    assert wait_until(lambda: not worker.sessions), worker.sessions
    assert wait_until(lambda: backend.stats().is_zero()), backend.stats()
    gpu.close()  # harmless
    started = time.monotonic()
    with pytest.raises(hipr.HipError):
        gpu.malloc(4)
    with pytest.raises(hipr.HipError):
        gpu.memcpy_htod(p, b"\0" * 4)
    with pytest.raises(hipr.HipError):
        s.synchronize()
    with pytest.raises(hipr.HipError):
        gpu.memcpy_htod_async(p, b"\0" * 4)
    assert time.monotonic() - started < 1
    with blocking_endpoint.connect() as again:  # the worker is fine
        assert again.device_count() == 2
