"""The sync and the async client put the same frames on the wire: each scenario runs
through both, behind a proxy that records what the worker is sent, and the records are
compared (the decisions live once, in ``LinkState``; these were drifts between twins)."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.client import link, objects
from hipr.client.options import LinkOptions
from hipr.protocol import Flags, FrameDecoder, Opcode
from hipr.protocol.codec import Frame
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker

pytestmark = pytest.mark.timeout(60)

#: Heartbeats due quickly; a dead link only after long silence (nothing here is dead).
QUICK_BEATS = LinkOptions(
    heartbeat_interval=0.03,
    heartbeat_timeout=10.0,
    reconnect_attempts=1,
    connect_timeout=5.0,
    spin_wait=0.0,
)


class RecordingProxy:
    """A loopback TCP proxy that decodes every frame a client sends to the worker."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self.frames: list[Frame] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            worker = socket.create_connection(self._target)
            self._sockets += [client, worker]
            threading.Thread(target=self._pump, args=(client, worker, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(worker, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        decoder = FrameDecoder(64 << 20)
        try:
            while data := src.recv(1 << 16):
                if record:
                    decoder.feed(data)
                    with self._lock:
                        self.frames.extend(decoder.frames())
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def take(self) -> list[Frame]:
        """The frames recorded so far, forgotten here."""
        with self._lock:
            frames, self.frames = self.frames, []
        return frames

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def worker() -> Iterator[Worker]:
    """A worker on its own thread (the sync client blocks the test's thread), that
    pings nobody during a test and cuts uploads into 4 KiB chunks."""
    config = WorkerConfig(heartbeat_interval=30.0, heartbeat_timeout=60.0)
    with worker_in_thread(config, EmulatorBackend(), loop="trio") as running:
        running.chunk_bytes = 4096
        yield running


@pytest.fixture
def proxy(worker: Worker) -> Iterator[RecordingProxy]:
    host, port = worker.bound_urls[0].removeprefix("tcp://").rsplit(":", 1)
    recording = RecordingProxy((host, int(port)))
    yield recording
    recording.close()


def _heartbeats(frames: list[Frame]) -> list[Flags]:
    return [f.flags for f in frames if f.opcode == Opcode.PING and f.request_id == 0]


def _wait_for(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


# --- heartbeats of an idle link ------------------------------------------------------------
@pytest.mark.anyio
async def test_idle_heartbeats_ask_for_an_answer_on_both_clients(proxy: RecordingProxy) -> None:
    """Both clients send the one heartbeat LinkState decides: a PING answered at once
    (the blocking keep-alive thread's used to be NO_REPLY, which proves nothing)."""
    with hipr.connect(proxy.url, link=QUICK_BEATS) as gpu:
        gpu.device_count()
        proxy.take()
        time.sleep(0.4)  # idle: only the keep-alive thread talks
        sync_beats = _heartbeats(proxy.take())
    async with hipr.aconnect(proxy.url, link=QUICK_BEATS) as agpu:
        await agpu.device_count()
        proxy.take()
        await _sleep(0.4)
        async_beats = _heartbeats(proxy.take())
    assert sync_beats and async_beats, (sync_beats, async_beats)
    assert set(sync_beats) == set(async_beats) == {Flags.NONE}


# --- heartbeats between the chunks of a long upload -------------------------------------------
def _pings_inside_upload(frames: list[Frame]) -> tuple[int, int]:
    """(DATA frames of the upload, heartbeats written between its first and last frame)."""
    start = next(i for i, f in enumerate(frames) if f.opcode == Opcode.MEMCPY_HTOD)
    end = max(i for i, f in enumerate(frames) if f.opcode == Opcode.DATA)
    inside = frames[start : end + 1]
    data = sum(1 for f in inside if f.opcode == Opcode.DATA)
    return data, len(_heartbeats(inside))


@pytest.mark.anyio
async def test_a_long_upload_carries_heartbeats_between_its_chunks_on_both_clients(
    proxy: RecordingProxy,
) -> None:
    """The upload holds the link and hears nothing back: both clients slip a PING
    between chunks when one is due (only the async client used to)."""
    payload = np.arange(16 * 1024, dtype=np.uint32)  # 64 KiB: 16 chunks of 4 KiB

    def slow(done: int, total: int) -> None:
        time.sleep(0.01)  # a slow route: each chunk takes a while to leave

    with hipr.connect(proxy.url, link=QUICK_BEATS) as gpu:
        ptr = gpu.malloc(payload.nbytes)
        proxy.take()
        gpu.memcpy_htod(ptr, payload, progress=slow)
        assert gpu.memcpy_dtoh(ptr) == payload.tobytes()
        sync_data, sync_pings = _pings_inside_upload(proxy.take())
    async with hipr.aconnect(proxy.url, link=QUICK_BEATS) as agpu:
        aptr = await agpu.malloc(payload.nbytes)
        proxy.take()
        await agpu.memcpy_htod(aptr, payload, progress=slow)
        assert await agpu.memcpy_dtoh(aptr) == payload.tobytes()
        async_data, async_pings = _pings_inside_upload(proxy.take())
    assert sync_data == async_data == 15
    assert sync_pings >= 1 and async_pings >= 1, (sync_pings, async_pings)


# --- launch plans --------------------------------------------------------------------------------
@pytest.fixture
def key_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every build of a batch key (a launch plan makes one; a launch sent as a
    dict used to make one per launch)."""
    builds: list[int] = []
    real = link.launch_key

    def counting(wire: dict[str, Any]) -> tuple[Any, ...]:
        builds.append(1)
        return real(wire)

    monkeypatch.setattr(link, "launch_key", counting)
    monkeypatch.setattr(objects, "launch_key", counting)
    return builds


def _launch_frames(frames: list[Frame]) -> list[tuple[int, int]]:
    """(opcode, launches carried) of each launch frame, in wire order."""
    found = []
    for f in frames:
        if f.opcode == Opcode.LAUNCH_KERNELS:
            found.append((f.opcode, len(f.args["args"])))
        elif f.opcode == Opcode.LAUNCH_KERNEL:
            found.append((f.opcode, 1))
    return found


LAUNCHES = 150  # more than one batch frame holds (link.BATCH_ITEMS)


@pytest.mark.anyio
async def test_launches_reuse_their_plan_and_batch_alike_on_both_clients(
    proxy: RecordingProxy, key_builds: list[int]
) -> None:
    args = (np.float32(2.0), np.uint64(64))
    # No heartbeat, and no delayed flush of a batch mid-loop on a slow machine: the
    # frames depend on the clients' decisions alone.
    quiet = dataclasses.replace(QUICK_BEATS, heartbeat_interval=5.0, coalesce_delay=2.0)
    with hipr.connect(proxy.url, link=quiet) as gpu:
        fill = gpu.builtin("fill_f32")
        out = gpu.malloc(256)
        proxy.take()
        key_builds.clear()
        for _ in range(LAUNCHES):
            fill.launch(1, 64, [out, *args])
        gpu.synchronize()
        sync_keys = len(key_builds)
        _wait_for(lambda: any(f.opcode == Opcode.DEVICE_SYNCHRONIZE for f in proxy.frames))
        sync_frames = _launch_frames(proxy.take())
    async with hipr.aconnect(proxy.url, link=quiet) as agpu:
        afill = await agpu.builtin("fill_f32")
        aout = await agpu.malloc(256)
        proxy.take()
        key_builds.clear()
        for _ in range(LAUNCHES):
            await afill.launch(1, 64, [aout, *args])
        await agpu.synchronize()
        async_keys = len(key_builds)
        async_frames = _launch_frames(proxy.take())
    assert sync_keys == async_keys == 1  # one plan, its key made once
    assert sync_frames == async_frames
    assert sum(n for _, n in sync_frames) == LAUNCHES
    assert [n for _, n in sync_frames[:2]] == [link.BATCH_ITEMS] * 2


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)
