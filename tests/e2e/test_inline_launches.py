"""Where the worker runs a launch: inline on its event loop when that keeps order and
costs no wait (a lone launch, or one a synchronize follows), on the session's GPU
thread in a burst of launches or when the kernel is large. Raw frames, so that which
requests arrive together is exact."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.abc
import numpy as np
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError
from hipr.protocol import Flags, Opcode
from tests.e2e.conftest import EMULATED_MEMORY
from tests.e2e.raw import RawSession, launch_frame

pytestmark = pytest.mark.anyio


class ThreadNotingEmulator(EmulatorBackend):
    """The emulator, noting which thread ran each launch (its fill value, its thread)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launch_threads: list[str] = []

    def launch(self, *args: Any, **kwargs: Any) -> None:
        self.launch_threads.append(threading.current_thread().name)
        super().launch(*args, **kwargs)


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Plain sockets: push mode under asyncio, the reader task under trio."""
    return str(request.param)


@pytest.fixture
def backend() -> ThreadNotingEmulator:
    return ThreadNotingEmulator(device_count=1, total_memory=EMULATED_MEMORY)


async def fill_launch(session: RawSession, count: int) -> tuple[int, Any]:
    """A buffer of ``count`` floats and a function to fill it (the built-in fill_f32)."""
    ptr = (await session.call(Opcode.MALLOC, {"size": 4 * count}))["ptr"]
    builtin = await session.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"})
    return ptr, builtin["function"]


async def read_floats(session: RawSession, ptr: int, count: int) -> np.ndarray:
    stream_bytes = bytearray()
    await session.stream.send(session.frame(Opcode.MEMCPY_DTOH, {"src": ptr, "size": 4 * count}))
    with anyio.fail_after(10):
        while True:
            for frame in session.decoder.frames():
                if Flags.ERROR in frame.flags:
                    raise HipError.from_wire(frame.args)
                stream_bytes += frame.bulk
                if Flags.MORE not in frame.flags:
                    return np.frombuffer(bytes(stream_bytes), dtype=np.float32)
            session.decoder.feed(await session.stream.receive())


def on_gpu_thread(name: str) -> bool:
    return name.startswith("hipr-gpu-")


async def test_a_launch_followed_by_a_synchronize_runs_inline(
    raw_session: RawSession, backend: ThreadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 4)
    data = launch_frame(raw_session, function, ptr, 2.5, 4) + raw_session.frame(
        Opcode.DEVICE_SYNCHRONIZE, {}
    )
    assert await raw_session.replies(data, 1) == [{}]
    assert len(backend.launch_threads) == 1
    assert not on_gpu_thread(backend.launch_threads[0])
    assert (await read_floats(raw_session, ptr, 4) == 2.5).all()


async def test_a_burst_of_launches_goes_to_the_gpu_thread_in_order(
    raw_session: RawSession, backend: ThreadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 8)
    burst = b"".join(launch_frame(raw_session, function, ptr, float(i), 8) for i in range(1, 65))
    data = burst + raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    assert await raw_session.replies(data, 1) == [{}]
    assert len(backend.launch_threads) == 64
    # Batched behind one another on the session's thread: the last value wins.
    assert any(on_gpu_thread(name) for name in backend.launch_threads)
    assert (await read_floats(raw_session, ptr, 8) == 64.0).all()


async def test_a_large_kernel_stays_off_the_event_loop(
    raw_session: RawSession, backend: ThreadNotingEmulator
) -> None:
    count = EmulatorBackend.INLINE_KERNEL_ELEMENTS + 1
    ptr, function = await fill_launch(raw_session, count)
    # Frames built in the order sent: a request id at or below the last one run would
    # be taken for a resent request.
    blocks = -(-count // 1024)
    for value, elements, grid in ((1.0, 1, blocks), (3.0, count, 1)):
        data = launch_frame(raw_session, function, ptr, value, elements, blocks=grid)
        synchronize = raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
        assert await raw_session.replies(data + synchronize, 1) == [{}]
    assert [on_gpu_thread(name) for name in backend.launch_threads] == [True, True]
    assert (await read_floats(raw_session, ptr, count) == 3.0).all()
