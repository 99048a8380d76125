"""LAUNCH_KERNEL / LAUNCH_KERNELS with ``synchronize`` (protocol 1.3): the launches and a
DEVICE_SYNCHRONIZE after them as one request. Its replies and errors are those of the two
requests it stands for (the launch fire-and-forget, then the synchronize), whether the
connection's I/O callback or its executor takes it; a resend does not launch again; bad
values are refused."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hipr.errors import HipError
from hipr.kernels.kernel_args import pack_args
from hipr.protocol import PROTOCOL_MINOR, Opcode
from hipr.worker import request_executor
from hipr.worker.server import Worker
from tests.e2e.raw import RawSession

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _axpy(session: RawSession) -> tuple[int, int, int]:
    """y (16 zeros), x (16 ones) and the axpy_f32 kernel (y += a * x)."""
    y = (await session.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    x = (await session.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    await session.call(Opcode.MEMSET, {"ptr": y, "value": 0, "size": 64})
    ones = np.ones(16, np.float32).tobytes()
    await session.replies(session.frame(Opcode.MEMCPY_HTOD, {"dst": x, "size": 64}, bulk=ones), 1)
    function = (await session.call(Opcode.MODULE_BUILTIN, {"name": "axpy_f32"}))["function"]
    return y, x, function


def _args(function: int, y: int, x: int, **more: Any) -> dict[str, Any]:
    packed = pack_args([np.uint64(y), np.uint64(x), np.float32(1.0), np.uint64(16)])
    return {"function": function, "grid": [1], "block": [16], **packed.to_wire(), "ptrs": [0, 8],
            **more}  # fmt: skip


def _refused(session: RawSession, function: int) -> bytes:
    """A fire-and-forget launch with a pointer in no allocation of the session."""
    return session.frame(Opcode.LAUNCH_KERNEL, _args(function, 0x10, 0x10), no_reply=True)


async def _y(session: RawSession, y: int) -> float:
    await session.call(Opcode.MEMCPY_DTOH, {"src": y, "size": 64})
    values = np.frombuffer(bytes(session.last_bulk), np.float32)
    assert (values == values[0]).all()
    return float(values[0])


def test_the_worker_speaks_minor_3() -> None:
    assert PROTOCOL_MINOR >= 3


async def test_a_launch_with_synchronize_replies_after_the_kernel_ran(
    raw_session: RawSession,
) -> None:
    y, x, function = await _axpy(raw_session)
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]
    assert await _y(raw_session, y) == 1.0
    batch = _args(function, y, x, synchronize=True)
    batch["args"] = [batch["args"]] * 3
    assert await raw_session.call(Opcode.LAUNCH_KERNELS, batch) == {}
    assert await _y(raw_session, y) == 4.0
    # synchronize false (or null): a plain launch awaiting its reply.
    plain = _args(function, y, x, synchronize=False)
    assert await raw_session.call(Opcode.LAUNCH_KERNEL, plain) == {}
    assert await _y(raw_session, y) == 5.0


async def test_a_resent_fused_request_does_not_launch_again(raw_session: RawSession) -> None:
    y, x, function = await _axpy(raw_session)
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]
    # The same request id again (as after a dropped link): its first reply, no launch.
    assert await raw_session.replies(fused, 1) == [{}]
    assert await _y(raw_session, y) == 1.0


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(1, "must be true or false, got 1"), ("yes", "must be true or false"), ([True], "true or")],
)
async def test_a_synchronize_of_another_type_is_refused(
    raw_session: RawSession, value: object, fragment: str
) -> None:
    y, x, function = await _axpy(raw_session)
    with pytest.raises(HipError, match=re.escape(fragment)) as caught:
        await raw_session.call(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=value))
    assert caught.value.code == 1  # hipErrorInvalidValue
    assert "'synchronize'" in str(caught.value)
    assert await _y(raw_session, y) == 0.0  # refused: not launched


async def test_synchronize_with_no_reply_is_refused_at_the_next_synchronisation(
    raw_session: RawSession,
) -> None:
    y, x, function = await _axpy(raw_session)
    for opcode, args in ((Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True)),):
        data = raw_session.frame(opcode, args, no_reply=True)
        data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
        with pytest.raises(HipError, match="cannot be sent with NO_REPLY"):
            await raw_session.replies(data, 1)
    batch = _args(function, y, x, synchronize=True)
    batch["args"] = [batch["args"]] * 2
    data = raw_session.frame(Opcode.LAUNCH_KERNELS, batch, no_reply=True)
    data += raw_session.frame(Opcode.DEVICE_SYNCHRONIZE, {})
    with pytest.raises(HipError, match="cannot be sent with NO_REPLY"):
        await raw_session.replies(data, 1)
    assert await _y(raw_session, y) == 0.0


async def _outcomes(session: RawSession, fused: bool) -> list[str]:
    """The replies of launch + synchronize scenarios, sent as one fused request each or
    as the two requests it stands for; the value y ends with after each."""
    y, x, function = await _axpy(session)
    seen: list[str] = []

    def launch_then_sync(args: dict[str, Any], opcode: Opcode = Opcode.LAUNCH_KERNEL) -> bytes:
        if fused:
            return session.frame(opcode, {**args, "synchronize": True})
        return session.frame(opcode, args, no_reply=True) + session.frame(
            Opcode.DEVICE_SYNCHRONIZE, {}
        )

    good = _args(function, y, x)
    bad = _args(function, 0x10, 0x10)
    batch = {**good, "args": [good["args"], bad["args"], good["args"]]}
    # Built one at a time: request ids must grow (a lower one is a resend).
    scenarios: list[Callable[[], bytes]] = [
        lambda: launch_then_sync(good),
        # An earlier fire-and-forget failure: the launch still runs, the wait reports it.
        lambda: _refused(session, function) + launch_then_sync(good),
        # The launch's own refusal, reported at the synchronisation.
        lambda: launch_then_sync(bad),
        # A batch with one refused launch: the others run.
        lambda: launch_then_sync(batch, Opcode.LAUNCH_KERNELS),
        lambda: launch_then_sync({**good, "function": 999}),
        lambda: launch_then_sync(good),
    ]
    for scenario in scenarios:
        try:
            seen.append(repr(await session.replies(scenario(), 1)))
        except HipError as exc:
            text = re.sub(r"request \d+", "", str(exc))
            seen.append(f"{type(exc).__name__} {exc.code} {text}")
        seen.append(f"y={await _y(session, y)}")
    return seen


def _as_one_request(seen: list[str]) -> list[str]:
    """The two-request form's errors for the launch of its own pair (scenarios 3 to 5),
    as the fused request says them: that launch is this request, not an earlier one."""
    own = " (from an earlier asynchronous LAUNCH_KERNEL, ; reported at this synchronisation)"
    own_batch = own.replace("LAUNCH_KERNEL,", "LAUNCH_KERNELS,")
    return [
        s.replace(own_batch, "").replace(own, "") if i in (4, 6, 8) else s
        for i, s in enumerate(seen)
    ]


async def test_fused_replies_are_those_of_the_two_requests_inline_or_not(
    raw_session: RawSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    two = await _outcomes(raw_session, fused=False)
    fused = await _outcomes(raw_session, fused=True)
    # The earlier failure is reported as earlier in both; a launch's own in its words.
    assert "earlier asynchronous LAUNCH_KERNEL" in fused[2]
    assert "not inside an allocation" in fused[4] and "earlier" not in fused[4]
    assert "launch 2 of 3" in fused[6] and fused[7] == "y=4.0"
    assert fused == _as_one_request(two)
    monkeypatch.setattr(request_executor.RequestExecutor, "answer_now", lambda self, frame: False)
    assert await _outcomes(raw_session, fused=True) == fused
    assert _as_one_request(await _outcomes(raw_session, fused=False)) == fused


async def test_a_fused_request_whose_kernel_still_runs_is_launched_once(
    raw_session: RawSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The I/O callback launches, finds the work not done and leaves the wait to the
    executor (WAITING), which must not launch again; the same through the executor."""
    from hipr.sessions.state import Session

    y, x, function = await _axpy(raw_session)
    monkeypatch.setattr(Session, "work_done", lambda self: False)
    for rounds in (1, 2, 3):
        fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
        assert await raw_session.replies(fused, 1) == [{}]
        assert await _y(raw_session, y) == float(rounds)
    bad = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, 0x10, x, synchronize=True))
    with pytest.raises(HipError, match="not inside an allocation") as caught:
        await raw_session.replies(bad, 1)
    assert "earlier" not in str(caught.value)
    monkeypatch.setattr(request_executor.RequestExecutor, "answer_now", lambda self, frame: False)
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]
    assert await _y(raw_session, y) == 4.0


@pytest.mark.parametrize("mode", ["pair", "fused"])
def test_the_instruction_count_driver_runs_both_forms(mode: str) -> None:
    from benchmarks import launch_sync_count

    assert launch_sync_count.main([mode, "3"]) == 0


async def test_a_fused_request_launched_before_a_lost_link_is_only_waited_for_when_resent(
    raw_session: RawSession, worker: Worker
) -> None:
    """The I/O callback launched a fused request and left its wait to the executor; had
    the link dropped then, the request comes again on the resumed session (a new
    connection, a new executor). The session, not the connection, remembers that its
    launch ran: the request is waited for and answered, never launched twice."""
    y, x, function = await _axpy(raw_session)
    session = next(s for s in worker.sessions.values() if s.allocations.containing(y))
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    session.launched_pending = raw_session.next_id  # as the I/O callback left it
    assert await raw_session.replies(fused, 1) == [{}]
    assert session.launched_pending == 0
    assert await _y(raw_session, y) == 0.0  # its launch is not run again
