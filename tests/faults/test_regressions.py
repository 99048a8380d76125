"""Bugs that fault injection found, each pinned by the scenario that exposed it."""

from __future__ import annotations

import errno
import io
import time
from typing import Any

import anyio
import numpy as np
import pytest
import structlog

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.observability.log import SafePrintLogger, configure_logging, install_library_default
from hipr.protocol import Flags, Opcode
from hipr.testing import LogWatch, leaks, wait_for_no_sessions
from hipr.testing.harness import RawClient
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker
from tests.faults.conftest import Faulty

pytestmark = pytest.mark.anyio


async def test_a_failed_destroy_keeps_the_handle_for_the_teardown(faulty: Faulty) -> None:
    """Destroys popped the handle first: a refused destroy leaked the object for good."""
    client = await RawClient.open(faulty.url)
    kinds = [
        ("stream_destroy", Opcode.STREAM_CREATE, "stream", Opcode.STREAM_DESTROY, "stream"),
        ("event_destroy", Opcode.EVENT_CREATE, "event", Opcode.EVENT_DESTROY, "event"),
        ("graph_destroy", Opcode.GRAPH_CREATE, "graph", Opcode.GRAPH_DESTROY, "graph"),
    ]
    for method, create, key, destroy, arg in kinds:
        for crash in (False, True):
            handle = (await client.call(create))[key]
            faulty.backend.fail_next(method, crash=crash)
            # Fire-and-forget: the failure comes back with the next synchronising call.
            await client.send(destroy, {arg: handle}, flags=Flags.NO_REPLY)
            with pytest.raises(HipError):
                await client.call(Opcode.DEVICE_SYNCHRONIZE)
            # The handle is still this session's: destroying it again works.
            await client.call(destroy, {arg: handle})
            handle = (await client.call(create))[key]
            faulty.backend.fail_next(method, crash=crash)
            with pytest.raises(HipError):
                await client.call(destroy, {arg: handle})
    ptr = (await client.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    graph = (await client.call(Opcode.GRAPH_CREATE))["graph"]
    await client.call(
        Opcode.GRAPH_ADD_MEMSET,
        {"graph": graph, "dependencies": [], "ptr": ptr, "value": 1, "size": 64},
    )
    exe = (await client.call(Opcode.GRAPH_INSTANTIATE, {"graph": graph}))["exec"]
    faulty.backend.fail_next("graph_exec_destroy", crash=True)
    with pytest.raises(HipError):
        await client.call(Opcode.GRAPH_EXEC_DESTROY, {"exec": exe})
    # The graph still writes ptr: its free waits for the graph (hipr.sessions.graph_memory),
    # so a free that fails is shown on memory no graph writes.
    loose = (await client.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    faulty.backend.fail_next("free", crash=True)
    with pytest.raises(HipError, match="internal error"):
        await client.call(Opcode.FREE, {"ptr": loose})
    await client.aclose()
    await faulty.assert_clean()


async def test_malloc_htod_whose_copy_and_free_both_fail_leaks_nothing(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    faulty.backend.fail_next("memcpy_htod")
    faulty.backend.fail_next("free", crash=True)
    with pytest.raises(HipError):
        await client.call(Opcode.MALLOC_HTOD, {"size": 8}, b"12345678")
    await client.aclose()
    await faulty.assert_clean()


class _SlowFailingLaunch(EmulatorBackend):
    """A launch that takes a while on the GPU thread and then fails."""

    def launch(self, *args: Any) -> None:
        time.sleep(0.2)
        raise HipError(HipErrorCode.hipErrorLaunchFailure, "the kernel failed")


async def test_a_read_after_a_failed_launch_reports_the_failure(anyio_backend: str) -> None:
    """The deferred-error check ran before earlier fire-and-forget calls had run: a read
    queued behind a failing launch replied success with the unkernelled bytes."""
    backend = _SlowFailingLaunch()
    async with running_worker(
        WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]
    ) as worker:
        async with hipr.aconnect(worker.bound_urls[0]) as gpu:
            fill = await gpu.builtin("fill_f32")
            p = await gpu.malloc(64)
            await fill.launch(1, 16, [p, np.float32(1.0), np.uint64(16)])
            with pytest.raises(HipError) as info:
                await gpu.memcpy_dtoh(p, 64)
            assert info.value.code == HipErrorCode.hipErrorLaunchFailure
            assert await gpu.memcpy_dtoh(p, 64) == bytes(64)  # reported once, then clear


class _SlowCreation(EmulatorBackend):
    def malloc(self, size: int) -> int:
        time.sleep(0.002)
        return super().malloc(size)

    def stream_create(self) -> Any:
        time.sleep(0.002)
        return super().stream_create()


async def _busy_client(url: str) -> None:
    """Raw frames (the client library would try to reconnect once the worker is gone)."""
    try:
        client = await RawClient.open(url)
        while True:
            ptr = (await client.call(Opcode.MALLOC, {"size": 4096}))["ptr"]
            await client.call(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 4096}, b"x" * 4096)
            await client.call(Opcode.STREAM_CREATE)
    except (HipError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
        pass


@pytest.mark.parametrize("delay", [0.15, 0.2, 0.25])
async def test_cancelling_the_worker_mid_creation_leaks_nothing(
    anyio_backend: str, delay: float
) -> None:
    """A malloc or stream_create under way when the worker was cancelled finished on the
    GPU thread, but its result was dropped: never recorded, never freed."""
    backend = _SlowCreation(total_memory=1 << 30)
    watch = LogWatch()
    with watch.installed():
        async with anyio.create_task_group() as clients:
            async with running_worker(
                WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]
            ) as worker:
                for _ in range(8):
                    clients.start_soon(_busy_client, worker.bound_urls[0])
                await anyio.sleep(delay)
            clients.cancel_scope.cancel()
    assert worker.sessions == {}
    assert backend.stats().is_zero(), backend.stats()
    assert watch.crashes == []


class _FullDisk(io.TextIOBase):
    """A log file on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def writable(self) -> bool:
        return True


async def _serve_while_logging_fails(url: str) -> None:
    for _ in range(3):
        async with hipr.aconnect(url) as gpu:
            p = await gpu.malloc(100)
            await gpu.memcpy_htod(p, b"x" * 100)
            assert await gpu.memcpy_dtoh(p, 100) == b"x" * 100
            with pytest.raises(HipError):
                await gpu.free(12345)  # an error: a warning to log
        bad = await RawClient.open(url, hello=False)
        await bad.stream.send(b"XXXX" * 10)  # a protocol error: a warning to log
        assert await bad.closed_by_peer()
        await bad.aclose()


async def _serves_with_logging_failing() -> None:
    """A worker whose log writes fail serves a client through it, then frees everything."""
    backend = EmulatorBackend()
    async with running_worker(
        WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]
    ) as worker:
        await _serve_while_logging_fails(worker.bound_urls[0])
        assert await wait_for_no_sessions(worker)
        assert leaks(backend, worker) == []


async def test_disk_full_for_logs_through_the_stdlib_handler(anyio_backend: str) -> None:
    old = structlog.get_config()
    configure_logging("debug", "json", stream=_FullDisk())
    try:
        await _serves_with_logging_failing()
    finally:
        configure_logging("info", "json")
        structlog.configure(**old)


async def test_disk_full_for_logs_with_logging_left_unconfigured(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """structlog's default logger prints to stdout and raised OSError into the worker:
    the connection task died, then the listener, then the worker."""
    old = structlog.get_config()
    structlog.reset_defaults()
    install_library_default()
    monkeypatch.setattr("sys.stdout", _FullDisk())
    try:
        await _serves_with_logging_failing()
    finally:
        structlog.configure(**old)


def test_the_safe_logger_drops_what_it_cannot_write() -> None:
    logger = SafePrintLogger(_FullDisk())
    logger.info("lost")
    logger.exception("lost too")
    closed = io.StringIO()
    closed.close()
    SafePrintLogger(closed).error("closed file")
