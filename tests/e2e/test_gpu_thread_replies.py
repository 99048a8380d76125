"""A synchronize that waits on the session's GPU thread is answered by that thread: it
writes the reply to the socket the moment the wait returns, without waking the event
loop first. Order, errors, the reply kept for a resend and the frames' integrity stay
as they were, under trio and asyncio, over tcp and unix."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

import hipr
from hipr.errors import HipError
from hipr.errors import HipErrorCode as E
from hipr.transports.thread_writes import ThreadWrites
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker
from tests.e2e.conftest import EMULATED_MEMORY, Endpoint
from tests.e2e.test_spin_wait import RunningKernelEmulator

pytestmark = pytest.mark.anyio

#: A host-to-device copy of these bytes fails in the backend (a fire-and-forget error).
FAILING_BYTES = b"fail me!"


class FailingCopyEmulator(RunningKernelEmulator):
    """:class:`RunningKernelEmulator` whose copies of :data:`FAILING_BYTES` fail."""

    def memcpy_htod(self, dst: int, src: memoryview, stream: Any = None) -> None:
        if bytes(src) == FAILING_BYTES:
            raise HipError(E.hipErrorLaunchFailure, "injected copy failure")
        super().memcpy_htod(dst, src, stream)


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def worker_config() -> WorkerConfig:
    # No spinning: every synchronize below waits on the GPU thread.
    return WorkerConfig(max_frame_bytes=8 << 20, spin_wait=0.0)


@pytest.fixture
def backend() -> FailingCopyEmulator:
    return FailingCopyEmulator(device_count=1, total_memory=EMULATED_MEMORY)


class ThreadWriteLog:
    """Each write a thread tried: [the thread's name, whether it sent]. The try is noted
    before it writes (the client may see the reply before the write returns) and its
    outcome after: :meth:`outcomes` waits for them."""

    def __init__(self) -> None:
        self.tries: list[list[Any]] = []

    def clear(self) -> None:
        self.tries.clear()

    async def outcomes(self) -> list[tuple[str, bool]]:
        with anyio.fail_after(5):
            while any(sent is None for _, sent in self.tries):
                await anyio.sleep(0.001)
        return [(name, sent) for name, sent in self.tries]


@pytest.fixture
def thread_writes(monkeypatch: pytest.MonkeyPatch) -> ThreadWriteLog:
    """Records each write that a thread tries."""
    log = ThreadWriteLog()
    write = ThreadWrites.write

    def recorded(self: ThreadWrites, data: bytes, busy: Any, queued: Any) -> bool:
        entry: list[Any] = [threading.current_thread().name, None]
        log.tries.append(entry)
        entry[1] = sent = write(self, data, busy, queued)
        return sent

    monkeypatch.setattr(ThreadWrites, "write", recorded)
    return log


async def start_blocked(backend: FailingCopyEmulator, tg: Any, wait: Any) -> None:
    """Start ``wait()`` (a synchronize) in ``tg`` over a 'kernel' that ends only once the
    wait has blocked on the session's GPU thread: no timing decides which way it goes."""
    backend.finished.clear()
    blocked = backend.blocking_syncs
    tg.start_soon(wait)
    try:
        with anyio.fail_after(10):
            while backend.blocking_syncs == blocked:
                await anyio.sleep(0.001)
    finally:
        backend.finished.set()


async def wait_while_blocked(backend: FailingCopyEmulator, wait: Any) -> None:
    """``wait()`` as :func:`start_blocked` runs it, to its end; its error raised here."""
    error: BaseException | None = None

    async def run() -> None:
        nonlocal error
        try:
            await wait()
        except Exception as exc:
            error = exc

    async with anyio.create_task_group() as tg:
        await start_blocked(backend, tg, run)
    if error is not None:
        raise error


def only_session(worker: Worker) -> Any:
    (session,) = worker.sessions.values()
    return session


async def test_each_kind_of_wait_is_answered_from_the_gpu_thread(
    endpoint: Endpoint,
    backend: FailingCopyEmulator,
    worker: Worker,
    thread_writes: ThreadWriteLog,
) -> None:
    async with endpoint.aconnect() as gpu:
        stream = await gpu.stream_create()
        event = await gpu.event_create()
        p = await gpu.malloc(16)
        waited: list[int] = []
        for wait in (gpu.synchronize, stream.synchronize, event.synchronize):
            await event.record(stream)
            thread_writes.clear()
            backend.blocking_syncs = 0
            waited.append(gpu._conn._next_id)  # the request id the wait will take
            await wait_while_blocked(backend, wait)
            assert backend.blocking_syncs == 1
            ((name, sent),) = await thread_writes.outcomes()
            assert name.startswith("hipr-gpu-")
            assert sent
        # The session goes on as before, and kept each reply for a resend (once the
        # executor's bookkeeping, which may follow the client's next call, is done).
        await gpu.memset(p, 3, 16)
        assert await gpu.memcpy_dtoh(p) == b"\3" * 16
        session = only_session(worker)
        with anyio.fail_after(5):
            while session.last_executed_id < waited[-1]:
                await anyio.sleep(0.001)
        for request_id in waited:
            assert session.replies.get(request_id) is not None


async def test_a_pending_fire_and_forget_error_is_reported_by_the_loop(
    endpoint: Endpoint,
    backend: FailingCopyEmulator,
    thread_writes: ThreadWriteLog,
) -> None:
    async with endpoint.aconnect() as gpu:
        stream = await gpu.stream_create()
        p = await gpu.malloc(16)
        await gpu.memcpy_htod_async(p, FAILING_BYTES, stream=stream)
        thread_writes.clear()
        with pytest.raises(hipr.HipError, match="injected copy failure") as err:
            await wait_while_blocked(backend, gpu.synchronize)
        assert err.value.code == E.hipErrorLaunchFailure
        assert await thread_writes.outcomes() == []  # the thread left this reply to the loop
        await gpu.synchronize()  # reported once
        await gpu.memset(p, 5, 16)
        assert await gpu.memcpy_dtoh(p) == b"\5" * 16


async def test_a_wait_that_fails_is_answered_by_the_loop(
    endpoint: Endpoint,
    backend: FailingCopyEmulator,
    thread_writes: ThreadWriteLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing_synchronize() -> None:
        backend._block()
        raise HipError(E.hipErrorIllegalAddress, "injected kernel fault")

    async with endpoint.aconnect() as gpu:
        monkeypatch.setattr(backend, "synchronize", failing_synchronize)
        with pytest.raises(hipr.HipError, match="injected kernel fault"):
            await wait_while_blocked(backend, gpu.synchronize)
        assert await thread_writes.outcomes() == []
        monkeypatch.undo()
        await gpu.synchronize()


async def test_the_thread_gives_way_while_the_loop_writes_a_frame(
    endpoint: Endpoint,
    backend: FailingCopyEmulator,
    worker: Worker,
    thread_writes: ThreadWriteLog,
) -> None:
    """With the connection's send lock held (a frame half-written), the GPU thread does
    not write: the loop sends the reply once the lock is free."""
    async with endpoint.aconnect() as gpu:
        await gpu.synchronize()
        (connection,) = worker.connections
        with anyio.fail_after(5):  # the executor has finished that request too
            while connection.executor is None or not connection.executor.between_requests:
                await anyio.sleep(0.001)
        release = anyio.Event()

        async def hold_the_send_lock(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            async with connection.writer.lock:
                task_status.started()
                await release.wait()

        answered = anyio.Event()

        async def synchronize() -> None:
            await gpu.synchronize()
            answered.set()

        thread_writes.clear()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(hold_the_send_lock)
                await start_blocked(backend, tg, synchronize)
                while not thread_writes.tries:  # the GPU thread's try, refused
                    await anyio.sleep(0.001)
                await anyio.sleep(0.05)
                assert not answered.is_set()
                release.set()
            assert answered.is_set()
        assert [sent for _, sent in await thread_writes.outcomes()] == [False]


async def test_many_waits_and_heartbeats_keep_every_frame_whole(
    endpoint: Endpoint, backend: FailingCopyEmulator, worker: Worker
) -> None:
    """Replies from the GPU thread and the loop's heartbeats and replies, interleaved
    many times over two clients: every reply reaches its own request, whole."""
    # Set before the clients connect: each connection reads it once. The worker PINGs a
    # client silent for 10 ms: the 12 ms waits below.
    worker.config = WorkerConfig(max_frame_bytes=8 << 20, spin_wait=0.0, heartbeat_interval=0.01)

    async def client(seed: int) -> None:
        async with endpoint.aconnect() as gpu:
            stream = await gpu.stream_create()
            p = await gpu.malloc(64)
            for i in range(60):
                backend.run_for(0.012 if i % 4 == 0 else 0.001)
                data = bytes([(seed + i) & 0x7F]) * 8
                await gpu.memcpy_htod_async(p, data, stream=stream)
                await (gpu.synchronize() if i % 2 else stream.synchronize())
                assert await gpu.memcpy_dtoh(p, 8) == data

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client, 1)
            tg.start_soon(client, 50)
