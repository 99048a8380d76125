"""A small MEMCPY_DTOH (PyTorch's ``item()``: four bytes after a tiny kernel) on a GPU
backend: copied on the worker's loop when the stream's work ends within a short poll
(``Backend.memcpy_dtoh_if_quick``), from the I/O callback in push mode and from the
executor otherwise, never through the session's GPU thread; a larger copy, or one whose
stream is still busy when the poll ends, is the usual copy, with the same bytes. On the
simulated runtimes here, on the real CUDA backend with ``HIPR_TEST_BACKEND=cuda``."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hipr.errors import HipError
from hipr.handlers.memory import quick_copy_back
from hipr.protocol import Opcode
from hipr.worker import express
from tests.e2e.raw import RawSession
from tests.e2e.test_fused_launch_sync import _args, _axpy, _y
from tests.e2e.test_fused_launch_sync_native import backend, rate_limited_session, transport_kind

pytestmark = pytest.mark.anyio

__all__ = ["backend", "transport_kind"]


async def test_a_small_copy_back_never_goes_through_the_gpu_thread(
    raw_session: RawSession, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[int] = []
    usual = type(backend).memcpy_dtoh

    def record(self: Any, dst: Any, src: int, stream: Any = None) -> None:
        waited.append(memoryview(dst).nbytes)
        usual(self, dst, src, stream)

    monkeypatch.setattr(type(backend), "memcpy_dtoh", record)
    y, x, function = await _axpy(raw_session)
    for expected in (1.0, 2.0, 3.0):
        assert await raw_session.call(Opcode.LAUNCH_KERNEL, _args(function, y, x)) == {}
        assert await _y(raw_session, y) == expected  # 64 bytes, right after the kernel
    assert waited == []
    # Larger than the loop copies: the usual copy, on the GPU thread.
    size = backend.quick_dtoh_bytes + 4
    big = (await raw_session.call(Opcode.MALLOC, {"size": size}))["ptr"]
    await raw_session.call(Opcode.MEMSET, {"ptr": big, "value": 7, "size": size})
    await raw_session.call(Opcode.MEMCPY_DTOH, {"src": big, "size": size})
    assert bytes(raw_session.last_bulk) == b"\7" * size
    assert waited == [size]


async def test_a_copy_not_ended_within_the_poll_is_the_usual_copy(
    raw_session: RawSession, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream still busy when the poll ends: nothing of the quick copy reaches the
    reply; the usual copy reads the same bytes, the loop polls for the request once
    (the I/O callback's try is not repeated by the executor), and the quick copy's
    pinned block goes back once its fence has passed."""
    waited: list[int] = []
    usual = type(backend).memcpy_dtoh
    quick = type(backend).memcpy_dtoh_if_quick

    def record(self: Any, dst: Any, src: int, stream: Any = None) -> None:
        waited.append(memoryview(dst).nbytes)
        usual(self, dst, src, stream)

    polls: list[int] = []

    @functools.wraps(quick)  # its name is what lets the session run it on the loop
    def still_busy(self: Any, dst: Any, src: int, stream: Any, spin: float) -> bool:
        polls.append(src)
        with monkeypatch.context() as patched:
            patched.setattr(self, "_query", lambda fn, handle: False)
            return bool(quick(self, dst, src, stream, spin))

    monkeypatch.setattr(type(backend), "memcpy_dtoh", record)
    monkeypatch.setattr(type(backend), "memcpy_dtoh_if_quick", still_busy)
    y, x, function = await _axpy(raw_session)
    assert await raw_session.call(Opcode.LAUNCH_KERNEL, _args(function, y, x)) == {}
    # The session's GPU thread idle, so that the loop tries the quick copy at all.
    await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {})
    await raw_session.call(Opcode.MEMCPY_DTOH, {"src": y, "size": 64})
    values = np.frombuffer(bytes(raw_session.last_bulk), np.float32)
    assert (values == 1.0).all()
    assert waited == [64]
    assert polls == [y]  # polled for once: the executor does not poll again
    await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {})
    backend._staging.reclaim()
    assert backend._staging.outstanding == 0


async def test_a_lone_small_copy_back_takes_the_express_path(
    raw_session: RawSession,
    backend: Any,
    anyio_backend: str,
    transport_kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In push mode (asyncio, a plain socket) a lone small MEMCPY_DTOH is answered by the
    I/O callback's express path, with the handler's own copy: the same bytes, kept for a
    resend (a resend gets them without another copy), counted as a MEMCPY_DTOH. Refused
    requests, large copies and anything under trio or TLS take the usual path, with the
    same errors and bytes as before."""
    taken: list[int] = []
    quick = quick_copy_back

    def record(session: Any, args: Any, request_id: int) -> Any:
        out = quick(session, args, request_id)
        if out is not None:
            taken.append(request_id)
        return out

    monkeypatch.setattr(express, "quick_copy_back", record)  # where the express path calls it
    y, x, function = await _axpy(raw_session)
    assert await raw_session.call(Opcode.LAUNCH_KERNEL, _args(function, y, x)) == {}
    await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {})
    copies = backend._staging.outstanding
    read = raw_session.frame(Opcode.MEMCPY_DTOH, {"src": y, "size": 64})
    assert await raw_session.replies(read, 1) == [{"size": 64}]
    assert (np.frombuffer(bytes(raw_session.last_bulk), np.float32) == 1.0).all()
    push = anyio_backend == "asyncio" and transport_kind != "tls"
    assert len(taken) == (1 if push else 0)
    # A resend of the same request: the kept reply, not another copy.
    assert await raw_session.replies(read, 1) == [{"size": 64}]
    assert (np.frombuffer(bytes(raw_session.last_bulk), np.float32) == 1.0).all()
    assert len(taken) == (1 if push else 0)
    # A source outside the session's allocations: the handler's own refusal, as before.
    with pytest.raises(HipError, match="source"):
        await raw_session.call(Opcode.MEMCPY_DTOH, {"src": y + 4096, "size": 4})
    # Larger than the loop copies: the usual copy.
    size = backend.quick_dtoh_bytes + 4
    big = (await raw_session.call(Opcode.MALLOC, {"size": size}))["ptr"]
    await raw_session.call(Opcode.MEMSET, {"ptr": big, "value": 9, "size": size})
    await raw_session.call(Opcode.MEMCPY_DTOH, {"src": big, "size": size})
    assert bytes(raw_session.last_bulk) == b"\x09" * size
    assert len(taken) == (1 if push else 0)
    await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {})
    backend._staging.reclaim()
    assert backend._staging.outstanding == copies


async def test_a_small_copy_back_spends_one_request_of_the_rate(
    backend: Any, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One at a time, each answered before the next (the express path's case): each
    small copy back spends one of the tenant's requests, wherever it is answered; once
    the bucket is empty the refusals name max_request_rate, and a refused request is
    not copied."""
    taken: list[int] = []
    quick = quick_copy_back

    def record(session: Any, args: Any, request_id: int) -> Any:
        out = quick(session, args, request_id)
        taken.append(request_id)
        return out

    monkeypatch.setattr(express, "quick_copy_back", record)  # where the express path calls it
    async with rate_limited_session(backend, short_tmp) as session:  # 20/s, a burst of 50
        y, x, function = await _axpy(session)
        await session.call(Opcode.LAUNCH_KERNEL, _args(function, y, x))
        await session.call(Opcode.DEVICE_SYNCHRONIZE, {})
        outcomes: list[str] = []
        started = time.monotonic()
        for _ in range(80):
            read = session.frame(Opcode.MEMCPY_DTOH, {"src": y, "size": 4})
            try:
                await session.replies(read, 1)
                assert bytes(session.last_bulk) == np.float32(1.0).tobytes()
                outcomes.append("ok")
            except HipError as exc:
                assert "max_request_rate" in str(exc)
                outcomes.append("refused")
        elapsed = time.monotonic() - started
    answered = outcomes.count("ok")
    # Each copy took a request: no more were answered than the burst and what refilled.
    assert 30 <= answered <= 50 + 20 * elapsed + 1, (answered, elapsed)
    assert outcomes[:30] == ["ok"] * 30 and "refused" in outcomes[-20:], outcomes
    assert len(taken) <= answered  # the express path never copied for a refused request


async def test_a_quick_copy_the_runtime_fails_is_not_tried_twice(
    raw_session: RawSession, backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime fails the quick copy (a faulted stream, say): that request's quick
    copy is not tried again on another path. Where the express path took it, the usual
    copy answers (the runtime's own word on the failure); elsewhere the failure is the
    reply. The session goes on either way."""
    quick = type(backend).memcpy_dtoh_if_quick
    tries: list[int] = []

    @functools.wraps(quick)  # its name is what lets the session run it on the loop
    def fails_once(self: Any, dst: Any, src: int, stream: Any, spin: float) -> bool:
        tries.append(src)
        if len(tries) == 1:
            raise HipError(719, "the stream failed")
        return bool(quick(self, dst, src, stream, spin))

    monkeypatch.setattr(type(backend), "memcpy_dtoh_if_quick", fails_once)
    y, x, function = await _axpy(raw_session)
    assert await raw_session.call(Opcode.LAUNCH_KERNEL, _args(function, y, x)) == {}
    await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {})
    try:
        await raw_session.call(Opcode.MEMCPY_DTOH, {"src": y, "size": 64})
        assert (np.frombuffer(bytes(raw_session.last_bulk), np.float32) == 1.0).all()
    except HipError as exc:
        assert exc.code == 719
    assert tries == [y]
    assert await _y(raw_session, y) == 1.0  # the next one is quick again
    assert len(tries) == 2
    await raw_session.call(Opcode.DEVICE_SYNCHRONIZE, {})
    backend._staging.reclaim()
    assert backend._staging.outstanding == 0
