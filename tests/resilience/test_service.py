"""The worker as a service process: SIGTERM drains, a killed worker is a clean
session-lost error, and the systemd notify and socket-activation protocols work
(against a fake NOTIFY_SOCKET and LISTEN_FDS: there is no systemd in CI)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest

import hipr
from hipr.client.connection import LinkOptions

pytestmark = pytest.mark.anyio

LINK = LinkOptions(
    heartbeat_interval=0.2,
    heartbeat_timeout=1.0,
    reconnect_delay=0.05,
    reconnect_max_delay=0.2,
    reconnect_timeout=2.0,
    reconnect_attempts=20,
    connect_timeout=5.0,
)


def worker_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "hipr", "worker", "--backend", "emulator", *extra]


def wait_for_path(path: Path, process: subprocess.Popen[bytes], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(
                f"worker exited early: {process.stdout.read() if process.stdout else ''}"
            )
        if time.monotonic() > deadline:
            raise AssertionError("worker did not start listening")
        time.sleep(0.05)


@pytest.fixture
def worker_process(short_tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A `hipr worker` process on a unix socket; killed at the end if still running."""
    sock = short_tmp / "w.sock"
    process = subprocess.Popen(
        worker_command("--listen", f"unix://{sock}", "--log-format", "json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_path(sock, process)
        yield process, f"unix://{sock}"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stdout:
            process.stdout.close()


async def test_sigterm_drains_and_tells_the_client(
    worker_process: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = worker_process
    events: list[str] = []
    async with hipr.aconnect(url, link=LINK, on_event=lambda k, _: events.append(k)) as gpu:
        p = await gpu.malloc(1 << 20)
        await gpu.memcpy_htod(p, b"\1" * (1 << 20))
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15), pytest.raises(hipr.SessionLostError, match="shutting down"):
            while True:
                await gpu.memcpy_dtoh(p, 16)
                await anyio.sleep(0.01)
    assert await anyio.to_thread.run_sync(process.wait, 15) == 0
    assert process.stdout is not None
    log = process.stdout.read().decode()
    assert '"session ended"' in log and '"stopped"' in log


async def test_killed_worker_gives_session_lost_not_a_hang(
    worker_process: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = worker_process
    async with hipr.aconnect(url, link=LINK) as gpu:
        p = await gpu.malloc(32 << 20)
        payload = np.zeros(32 << 20, dtype=np.uint8)

        async def kill_soon() -> None:
            await anyio.sleep(0.2)
            process.kill()

        started = time.monotonic()
        lost: list[hipr.SessionLostError] = []

        async def copy_until_lost() -> None:
            try:
                while True:  # copies in flight when the worker dies
                    await gpu.memcpy_htod(p, payload)
            except hipr.SessionLostError as exc:
                lost.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_soon)
                tg.start_soon(copy_until_lost)
        assert lost and "could not reconnect" in lost[0].message
        # reconnect_timeout bounds it; allow for the copy that was running.
        assert time.monotonic() - started < 10
        assert gpu.lost


async def test_notify_and_socket_activation(short_tmp: Path) -> None:
    notify_path = short_tmp / "notify"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(20)
    activated_path = short_tmp / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(activated_path))
    listener.listen(16)
    fd = listener.fileno()
    # As systemd does: the socket at fd 3 (SD_LISTEN_FDS_START), and LISTEN_PID naming
    # the pid the worker has after exec.
    shim = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); "
        "os.environ['LISTEN_PID'] = os.environ['WATCHDOG_PID'] = str(os.getpid()); "
        "os.execv(sys.argv[2], sys.argv[2:])"
    )
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(notify_path),
        "LISTEN_FDS": "1",
        "LISTEN_FDNAMES": "hipr",
        "WATCHDOG_USEC": "200000",
    }
    process = subprocess.Popen(
        [sys.executable, "-c", shim, str(fd), *worker_command("--log-format", "json")],
        env=env,
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    listener.close()
    try:
        messages: list[str] = []

        def receive_until(wanted: str) -> None:
            while not any(wanted in m for m in messages):
                messages.append(notify.recv(4096).decode())

        try:
            await anyio.to_thread.run_sync(receive_until, "READY=1")
        except TimeoutError:
            process.kill()
            assert process.stdout is not None
            raise AssertionError(process.stdout.read().decode()[-2000:]) from None
        assert any("STATUS=serving on fd://3 (hipr)" in m for m in messages)
        await anyio.to_thread.run_sync(receive_until, "WATCHDOG=1")
        async with hipr.aconnect(f"unix://{activated_path}", link=LINK) as gpu:
            assert await gpu.device_count() == 1
        process.send_signal(signal.SIGHUP)
        await anyio.to_thread.run_sync(receive_until, "RELOADING=1")
        process.send_signal(signal.SIGTERM)
        await anyio.to_thread.run_sync(receive_until, "STOPPING=1")
        assert await anyio.to_thread.run_sync(process.wait, 15) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        notify.close()
        if process.stdout:
            process.stdout.close()
