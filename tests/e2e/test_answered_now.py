"""Requests the worker answers in its I/O callback (push mode, asyncio) behave exactly as
those its executor runs: order, errors, resends, quotas; under trio all go through the
executor, and the same tests must pass."""

from __future__ import annotations

import re
from typing import Any

import anyio
import numpy as np
import pytest

from hipr.errors import HipError
from hipr.kernels.kernel_args import pack_args
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.worker import request_executor
from tests.e2e.raw import RawSession, launch_frame

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The opcodes that went through the executor task."""
    seen: list[int] = []
    execute = request_executor.RequestExecutor.execute

    async def counting(self: Any, frame: Any) -> bool:
        seen.append(frame.opcode)
        return await execute(self, frame)

    monkeypatch.setattr(request_executor.RequestExecutor, "execute", counting)
    return seen


async def fill_function(session: RawSession) -> tuple[int, int]:
    ptr = (await session.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    function = (await session.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"}))["function"]
    return ptr, function


def refused_launch(session: RawSession, function: int) -> bytes:
    """A fire-and-forget launch whose pointer argument lies in no allocation of the
    session: refused, and reported by the next request that reports earlier errors."""
    packed = pack_args([np.uint64(0x10), np.float32(1.0), np.uint64(4)])
    args = {"function": function, "grid": [1], "block": [1], **packed.to_wire(), "ptrs": [0]}
    return session.frame(Opcode.LAUNCH_KERNEL, args, no_reply=True)


async def test_lone_requests_skip_the_executor_under_asyncio(
    raw_session: RawSession, executed: list[int], anyio_backend: str
) -> None:
    ptr, function = await fill_function(raw_session)
    executed.clear()
    for _ in range(20):
        sync = raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
        assert await raw_session.replies(sync, 1) == [{}]
    data = launch_frame(raw_session, function, ptr, 1.0, 16)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    assert await raw_session.replies(data, 1) == [{}]
    if anyio_backend == "asyncio":
        assert executed == []  # answered in the I/O callback
    else:
        assert executed.count(Opcode.DEVICE_SYNCHRONIZE) == 21


async def test_a_launch_error_reaches_the_synchronize_answered_with_it(
    raw_session: RawSession,
) -> None:
    _, function = await fill_function(raw_session)
    # A pointer argument outside every allocation of the session: refused, and the
    # launch is fire-and-forget, so the next synchronisation reports it, once.
    data = refused_launch(raw_session, function)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    with pytest.raises(HipError, match="not inside an allocation.*LAUNCH_KERNEL"):
        await raw_session.replies(data, 1)
    assert await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {}) == {}


async def test_a_resent_synchronize_gets_its_first_answer(raw_session: RawSession) -> None:
    first = raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    assert await raw_session.replies(first, 1) == [{}]
    # The same request id again (as after a dropped link): answered from the reply cache.
    assert await raw_session.replies(first, 1) == [{}]
    assert await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {}) == {}


async def test_launches_answered_in_one_read_keep_their_order(
    raw_session: RawSession,
) -> None:
    ptr, function = await fill_function(raw_session)
    for rounds in (1, 2, 7, 300):
        data = b"".join(
            launch_frame(raw_session, function, ptr, float(i), 16) for i in range(1, rounds + 1)
        )
        data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
        assert await raw_session.replies(data, 1) == [{}]
        out = await raw_session.call(Opcode.MEMCPY_DTOH, {"src": ptr, "size": 64})
        assert out == {"size": 64}
        assert (np.frombuffer(bytes(raw_session.last_bulk), np.float32) == rounds).all()


async def test_a_synchronize_inside_an_upload_is_still_a_protocol_error(
    raw_session: RawSession,
) -> None:
    ptr = (await raw_session.call(Opcode.MALLOC, {"size": 1 << 20}))["ptr"]
    raw_session.next_id += 1
    upload = encode_frame(
        Opcode.MEMCPY_HTOD, raw_session.next_id, Flags.MORE, {"dst": ptr, "size": 8192}, b"x" * 4096
    )
    await raw_session.stream.send(upload)
    with anyio.fail_after(2):
        await anyio.sleep(0.05)  # the executor now waits for the upload's next chunk
    with pytest.raises(HipError, match="expected DATA"):
        await raw_session.replies(raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {}), 1)


async def test_fire_and_forget_copies_and_launches_in_one_read_run_in_order(
    raw_session: RawSession,
) -> None:
    ptr, function = await fill_function(raw_session)
    data = b""
    for i in range(50):
        data += raw_session.frame(
            Opcode.MEMCPY_HTOD,
            {"dst": ptr, "size": 64, "stream": None},
            no_reply=True,
            bulk=np.full(16, float(i), np.float32).tobytes(),
        )
        if i % 7 == 3:
            data += launch_frame(raw_session, function, ptr, -1.0, 16)
    # The last word of the read is a copy of 49s, with a wrong size after it: the error
    # waits for the synchronize, which reports it, and the copy before it has landed.
    data += raw_session.frame(
        Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 64}, no_reply=True, bulk=b"short"
    )
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    with pytest.raises(HipError, match="announced 64 bytes, received 5"):
        await raw_session.replies(data, 1)
    await raw_session.call(Opcode.MEMCPY_DTOH, {"src": ptr, "size": 64})
    assert (np.frombuffer(bytes(raw_session.last_bulk), np.float32) == 49.0).all()


async def test_event_records_waits_and_synchronizes_in_one_read(
    raw_session: RawSession,
) -> None:
    ptr, function = await fill_function(raw_session)
    stream = (await raw_session.call(Opcode.STREAM_CREATE, {}))["stream"]
    other = (await raw_session.call(Opcode.STREAM_CREATE, {}))["stream"]
    start = (await raw_session.call(Opcode.EVENT_CREATE, {}))["event"]
    end = (await raw_session.call(Opcode.EVENT_CREATE, {}))["event"]
    packed = pack_args([np.uint64(ptr), np.float32(7.0), np.uint64(16)])
    launch = {"function": function, "grid": [1], "block": [16], **packed.to_wire(), "ptrs": [0]}
    data = raw_session.frame(Opcode.EVENT_RECORD, {"event": start, "stream": stream}, no_reply=True)
    data += raw_session.frame(Opcode.LAUNCH_KERNEL, {**launch, "stream": stream}, no_reply=True)
    data += raw_session.frame(Opcode.EVENT_RECORD, {"event": end, "stream": stream}, no_reply=True)
    data += raw_session.frame(
        Opcode.STREAM_WAIT_EVENT, {"stream": other, "event": end}, no_reply=True
    )
    data += raw_session.frame(Opcode.EVENT_SYNCHRONIZE, {"event": end})
    assert await raw_session.replies(data, 1) == [{}]
    assert await raw_session.call(Opcode.STREAM_SYNCHRONIZE, {"stream": other}) == {}
    elapsed = await raw_session.call(Opcode.EVENT_ELAPSED_TIME, {"start": start, "end": end})
    assert elapsed["ms"] >= 0.0
    await raw_session.call(Opcode.MEMCPY_DTOH, {"src": ptr, "size": 64})
    assert (np.frombuffer(bytes(raw_session.last_bulk), np.float32) == 7.0).all()
    # An event of no one: refused by the synchronize answered with it, the session goes on.
    with pytest.raises(HipError, match="event"):
        await raw_session.call(Opcode.EVENT_SYNCHRONIZE, {"event": 999})
    assert await raw_session.call(Opcode.STREAM_SYNCHRONIZE, {"stream": stream}) == {}


async def test_queries_answered_in_the_callback_report_earlier_errors_first(
    raw_session: RawSession, executed: list[int], anyio_backend: str
) -> None:
    _, function = await fill_function(raw_session)
    executed.clear()
    assert await raw_session.call(Opcode.GET_DEVICE, {}) == {"device": 0}
    info = await raw_session.call(Opcode.MEM_GET_INFO, {})
    assert 0 < info["free"] <= info["total"]
    props = await raw_session.call(Opcode.DEVICE_PROPERTIES, {"device": 0})
    assert props["total_memory"] == info["total"]
    with pytest.raises(HipError, match="does not exist"):
        await raw_session.call(Opcode.DEVICE_PROPERTIES, {"device": 7})
    if anyio_backend == "asyncio":
        assert executed == []
    # A fire-and-forget launch that fails: the next query does not run, and says why.
    data = refused_launch(raw_session, function)
    data += raw_session.frame(Opcode.GET_DEVICE, {})
    with pytest.raises(HipError, match="earlier asynchronous LAUNCH_KERNEL.*did not run"):
        await raw_session.replies(data, 1)
    assert await raw_session.call(Opcode.GET_DEVICE, {}) == {"device": 0}


async def _outcomes(session: RawSession, function: int) -> list[str]:
    """Replies and errors of requests that take every branch of the request path:
    answered, refused by the handler, refused for an earlier fire-and-forget error
    (a query, which does not run) and reported by a synchronize (which waited)."""
    seen: list[str] = []
    scenarios = [
        session.frame(Opcode.GET_DEVICE, {}),
        session.frame(Opcode.DEVICE_PROPERTIES, {"device": 7}),
        refused_launch(session, function) + session.frame(Opcode.GET_DEVICE, {}),
        refused_launch(session, function) + session.frame(Opcode.DEVICE_SYNCHRONIZE, {}),
        session.frame(Opcode.DEVICE_SYNCHRONIZE, {}),
    ]
    for data in scenarios:
        try:
            seen.append(repr(await session.replies(data, 1)))
        except HipError as exc:
            # The request ids differ between the two runs; the rest must not.
            seen.append(f"{type(exc).__name__} {exc.code} " + re.sub(r"request \d+", "", str(exc)))
    return seen


async def test_the_executor_and_the_inline_answer_give_the_same_replies(
    raw_session: RawSession,
    executed: list[int],
    monkeypatch: pytest.MonkeyPatch,
    anyio_backend: str,
) -> None:
    """One request path: the same requests, answered in the I/O callback and then all
    forced through the executor task, get the same replies and the same errors."""
    _, function = await fill_function(raw_session)
    executed.clear()
    inline = await _outcomes(raw_session, function)
    if anyio_backend == "asyncio":
        assert Opcode.GET_DEVICE not in executed  # answered in the I/O callback
    monkeypatch.setattr(request_executor.RequestExecutor, "answer_now", lambda self, frame: False)
    executed.clear()
    queued = await _outcomes(raw_session, function)
    assert Opcode.GET_DEVICE in executed and Opcode.DEVICE_PROPERTIES in executed
    assert queued == inline
    assert "does not exist" in inline[1]
    assert "did not run" in inline[2] and "reported at this synchronisation" in inline[3]
