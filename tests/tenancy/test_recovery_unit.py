"""hipr.worker.recovery on its own: what a worker does when its context cannot be rebuilt."""

from __future__ import annotations

import signal
from typing import Any

import anyio
import pytest

from hipr.backends._errmap import cu_error
from hipr.backends.sticky import mark_sticky, poisons_context
from hipr.errors import ContextLostError, HipError, HipErrorCode
from hipr.worker import recovery
from hipr.worker.recovery import RESTART_EXIT_STATUS, ContextRecovery

pytestmark = pytest.mark.anyio


class _Session:
    def __init__(self, sid: str, tenant: str) -> None:
        self.id, self.tenant, self.closed, self.connection = sid, tenant, False, None


class _GpuLike:
    name = "cuda"  # no reset_context: a CUDA context cannot be rebuilt in-process


class _Host:
    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self.backend = _GpuLike()
        self.sessions: dict[str, Any] = {"a": _Session("a", "alice"), "b": _Session("b", "bob")}
        self.exit_status = 0
        self.restart_on_failure = True
        self.retires_on_fault = False
        self._tg = tg

    def spawn(self, fn: Any, *args: Any) -> bool:
        self._tg.start_soon(fn, *args)
        return True

    async def end_session(self, session: Any) -> None:
        session.closed = True


async def test_unrebuildable_context_fails_everyone_then_exits_for_a_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signals: list[int] = []
    monkeypatch.setattr(recovery.os, "kill", lambda pid, sig: signals.append(sig))
    async with anyio.create_task_group() as tg:
        host = _Host(tg)
        rec = ContextRecovery(host)  # type: ignore[arg-type]
        fault = cu_error(700, "cuCtxSynchronize")
        own = rec.check(host.sessions["b"], fault)
        assert isinstance(own, ContextLostError) and own.details["own_fault"] is True
        assert own.code == HipErrorCode.hipErrorIllegalAddress
        # Another session's request that fails meanwhile gets its own, once.
        other = rec.check(host.sessions["a"], fault)
        assert isinstance(other, ContextLostError) and other.details["own_fault"] is False
        assert rec.check(host.sessions["a"], fault) is other
        # An ordinary error is left alone.
        plain = HipError(HipErrorCode.hipErrorInvalidValue, "bad")
        assert rec.check(host.sessions["a"], plain) is plain
    assert all(s.closed for s in host.sessions.values())
    assert rec.resets == {"bob": 1}
    assert signals == [signal.SIGTERM] and host.exit_status == RESTART_EXIT_STATUS
    with pytest.raises(HipError, match="must be restarted"):
        await rec.admit()


def test_sticky_errors_are_marked_where_the_runtime_result_is_converted() -> None:
    for code in (700, 714, 715, 716, 717, 718, 719):
        assert poisons_context(cu_error(code, "cuStreamSynchronize")), code
    for code in (1, 2, 101, 201, 400):
        assert not poisons_context(cu_error(code, "cuMemAlloc")), code
    assert poisons_context(mark_sticky(HipError(HipErrorCode.hipErrorLaunchFailure, "x")))
    assert not poisons_context(ValueError("not a HipError"))
