"""Where the worker runs a copy back (MEMCPY_DTOH): a small one whose stream has no work
left runs in the I/O callback (PyTorch's ``item()``: launches, then a 4-byte read), a
large one, or one behind unfinished work, on the session's GPU thread as before. The
bytes, the errors and the order are the same either way. Raw frames, so that which
requests arrive together is exact."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hipr.errors import HipError
from hipr.errors import HipErrorCode as E
from hipr.handlers.memory import INLINE_DTOH_BYTES
from hipr.protocol import Opcode
from tests.e2e.conftest import EMULATED_MEMORY
from tests.e2e.raw import RawSession, launch_frame
from tests.e2e.test_inline_launches import fill_launch, on_gpu_thread, read_floats, receive_floats
from tests.e2e.test_spin_wait import RunningKernelEmulator

pytestmark = pytest.mark.anyio


class ReadNotingEmulator(RunningKernelEmulator):
    """The emulator with a 'kernel' that can be left running (:meth:`run_for`), noting
    which thread ran each copy back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_threads: list[str] = []

    def memcpy_dtoh(self, *args: Any, **kwargs: Any) -> None:
        self.read_threads.append(threading.current_thread().name)
        super().memcpy_dtoh(*args, **kwargs)


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend() -> ReadNotingEmulator:
    return ReadNotingEmulator(device_count=1, total_memory=EMULATED_MEMORY)


async def test_a_small_read_after_launches_runs_inline(
    raw_session: RawSession, backend: ReadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 4)
    for value in (1.5, 2.5, 3.5):
        # The launch and the read in one write, as the proxy sends item()'s launch + copy.
        data = launch_frame(raw_session, function, ptr, value, 4) + raw_session.frame(
            Opcode.MEMCPY_DTOH, {"src": ptr, "size": 4}
        )
        await raw_session.stream.send(data)
        reply = await receive_floats(raw_session)
        assert reply.tolist() == [value]
    assert backend.read_threads and not any(on_gpu_thread(t) for t in backend.read_threads)


async def test_a_large_read_goes_to_the_gpu_thread(
    raw_session: RawSession, backend: ReadNotingEmulator
) -> None:
    count = INLINE_DTOH_BYTES // 4 + 1
    ptr, function = await fill_launch(raw_session, count)
    await raw_session.stream.send(launch_frame(raw_session, function, ptr, 7.0, count, blocks=2))
    floats = await read_floats(raw_session, ptr, count)
    assert floats.size == count and bool((floats == 7.0).all())
    assert backend.read_threads and all(on_gpu_thread(t) for t in backend.read_threads)


async def test_a_read_behind_unfinished_work_goes_to_the_gpu_thread(
    raw_session: RawSession, backend: ReadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 2)
    await raw_session.stream.send(launch_frame(raw_session, function, ptr, 4.0, 2))
    assert (await read_floats(raw_session, ptr, 2)).tolist() == [4.0, 4.0]
    backend.read_threads.clear()
    backend.run_for(0.3)  # the session's work is not done: no look says so in time
    assert (await read_floats(raw_session, ptr, 2)).tolist() == [4.0, 4.0]
    assert len(backend.read_threads) == 1 and on_gpu_thread(backend.read_threads[0])


async def test_a_bad_small_read_is_refused_inline_and_the_session_goes_on(
    raw_session: RawSession, backend: ReadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 4)
    for args in (
        {"src": ptr + 4, "size": 16},  # past the allocation's end
        {"src": 0x10, "size": 4},  # not this session's
        {"src": ptr, "size": -1},  # not a size
        {"src": ptr, "size": 4, "stream": 999},  # no such stream
    ):
        with pytest.raises(HipError) as info:
            await raw_session.call(Opcode.MEMCPY_DTOH, args)
        assert info.value.code in (E.hipErrorInvalidValue, E.hipErrorInvalidHandle)
    assert backend.read_threads == []  # nothing refused reached the backend
    await raw_session.stream.send(launch_frame(raw_session, function, ptr, 9.0, 4))
    assert (await read_floats(raw_session, ptr, 4)).tolist() == [9.0] * 4


async def test_an_earlier_fire_and_forget_error_is_reported_by_an_inline_read(
    raw_session: RawSession, backend: ReadNotingEmulator
) -> None:
    ptr, function = await fill_launch(raw_session, 4)
    # A fire-and-forget launch of a function this session does not have fails; the next
    # reply-awaiting request reports it, as before.
    bad = launch_frame(raw_session, function + 1000, ptr, 1.0, 4)
    await raw_session.stream.send(bad)
    with pytest.raises(HipError):
        await read_floats(raw_session, ptr, 4)
    assert (await read_floats(raw_session, ptr, 1)).size == 1  # reported once


def test_the_inline_bound_is_small() -> None:
    """The copy runs on the worker's loop: it must stay a few µs of memory traffic."""
    assert 4 <= INLINE_DTOH_BYTES <= 1 << 20
    assert EMULATED_MEMORY > INLINE_DTOH_BYTES
