"""LAUNCH_KERNEL with ``synchronize`` on a GPU backend whose launch and wait are one
native call (``hipr.backends._launch_wait``): the worker runs on the simulated CUDA and
HIP runtimes of :mod:`tests.backends.test_gpu_backends_nogpu`, whose C entry points the
native call reaches. Its replies, errors and values must be the emulator's (the tests
of :mod:`tests.e2e.test_fused_launch_sync`, run again here), a resend must not launch
again, and a kernel still running when the poll ends is waited for by the executor
without a second launch, on both event loops (the I/O callback's path and the
executor's). With ``HIPR_TEST_BACKEND=cuda`` (a GPU machine) the tests that need no
simulated counters run on the real CUDA backend instead: the express path, its rate
and its fallbacks against the driver's own launch and query."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from hipr.backends import load_backend
from hipr.backends._launch_wait import PreparedLaunchWait
from hipr.errors import HipError
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.transports import connect
from hipr.worker.config import WorkerConfig
from hipr.worker.express import ExpressLaunch
from hipr.worker.request_executor import RequestExecutor
from hipr.worker.server import Worker, running_worker
from tests.backends.test_gpu_backends_nogpu import SimGpu, _make
from tests.e2e.conftest import Endpoint
from tests.e2e.raw import RawSession
from tests.e2e.test_fused_launch_sync import (
    _args,
    _axpy,
    _y,
    test_a_launch_with_synchronize_replies_after_the_kernel_ran,
    test_a_resent_fused_request_does_not_launch_again,
    test_fused_replies_are_those_of_the_two_requests_inline_or_not,
)
from tests.tenancy.test_fused_rate import TENANTS, TOKEN

pytestmark = pytest.mark.anyio

__all__ = [
    "test_a_launch_with_synchronize_replies_after_the_kernel_ran",
    "test_a_resent_fused_request_does_not_launch_again",
    "test_fused_replies_are_those_of_the_two_requests_inline_or_not",
]

_SIMULATED: dict[int, SimGpu] = {}
#: On a GPU machine: the real CUDA backend instead of the simulated runtimes.
REAL = os.environ.get("HIPR_TEST_BACKEND") == "cuda"


@pytest.fixture(params=["unix", "tcp", "tls"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """unix and tcp: the reply sent from the native call (a plain socket's descriptor);
    tls: no descriptor to send to, so the reply goes the loop's way after the call."""
    return str(request.param)


@pytest.fixture(params=["cuda-gpu"] if REAL else ["cuda", "hip"])
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A simulated GPU backend with the native launch-and-wait (the worker's), or the
    real CUDA backend where ``HIPR_TEST_BACKEND=cuda``."""
    if REAL:
        real = load_backend("cuda")
        if getattr(real, "_launch_wait", None) is None:
            real.close()
            pytest.fail("the native launch-and-wait library could not be built or loaded")
        yield real
        real.close()
        return
    made, gpu = _make(str(request.param), native=True)
    if made._launch_wait is None:
        made.close()
        pytest.fail("the native launch-and-wait library could not be built or loaded")
    _SIMULATED[id(made)] = gpu
    yield made
    del _SIMULATED[id(made)]
    made.close()


@pytest.fixture
def sim_gpu(backend: Any) -> SimGpu:
    if REAL:
        pytest.skip("counts the simulated runtime's calls (runs without HIPR_TEST_BACKEND)")
    return _SIMULATED[id(backend)]


async def test_the_native_call_takes_the_fused_request(
    raw_session: RawSession, sim_gpu: SimGpu, monkeypatch: pytest.MonkeyPatch, transport_kind: str
) -> None:
    """Polled from C, and its reply sent from there (a plain socket takes writes from
    outside the loop on both event loops; TLS does not, and its reply goes the loop's
    way), kept for a resend all the same."""
    native = sim_gpu.native
    assert native is not None
    sent: list[int] = []
    release_reply = RequestExecutor.release_reply

    def record(self: RequestExecutor, data: bytes, count: int) -> None:
        sent.append(count)
        release_reply(self, data, count)

    monkeypatch.setattr(RequestExecutor, "release_reply", record)
    y, x, function = await _axpy(raw_session)
    native.queries = 0
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]
    assert native.queries >= 1  # polled from C, not through the binding
    if transport_kind == "tls":
        assert not sent  # no descriptor to send to: encrypted by the loop's stream
    else:
        assert sent and sent[-1] > 0  # the reply left from C
    assert await raw_session.replies(fused, 1) == [{}]  # a resend: the kept reply
    assert await _y(raw_session, y) == 1.0


async def test_a_kernel_still_running_is_waited_for_and_launched_once(
    raw_session: RawSession, sim_gpu: SimGpu
) -> None:
    """The native poll ends with the kernel still running: the executor waits for it
    (through the binding's queries), replies once, and never launches it again."""
    native = sim_gpu.native
    assert native is not None
    y, x, function = await _axpy(raw_session)
    for rounds in (1, 2, 3):
        native.not_ready_polls = 10**9  # the C poll never sees it done
        launches = len(sim_gpu.launches)
        fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
        assert await raw_session.replies(fused, 1) == [{}]
        assert len(sim_gpu.launches) == launches + 1
        native.not_ready_polls = 0
        assert await _y(raw_session, y) == float(rounds)


async def test_a_faulted_kernel_is_the_replys_error(
    raw_session: RawSession, sim_gpu: SimGpu
) -> None:
    """A kernel that faults (the simulated reduction given too little shared memory):
    the fused request's reply carries the fault, as the synchronize after it would."""
    y = (await raw_session.call(Opcode.MALLOC, {"size": 256}))["ptr"]
    out = (await raw_session.call(Opcode.MALLOC, {"size": 4}))["ptr"]
    reduce = await raw_session.call(Opcode.MODULE_BUILTIN, {"name": "reduce_sum_f32"})
    args = {
        "function": reduce["function"], "grid": [1], "block": [64], "shared_mem": 0,
        "args": y.to_bytes(8, "little") + out.to_bytes(8, "little") + (64).to_bytes(8, "little"),
        "ptrs": [0, 8], "synchronize": True,
    }  # fmt: skip
    with pytest.raises(HipError) as caught:
        await raw_session.call(Opcode.LAUNCH_KERNEL, args)
    # The context-loss recovery saw it, as after a synchronize's fault.
    assert caught.value.code == 700 and "context was lost" in str(caught.value)
    assert "StreamQuery failed" in str(caught.value)
    sim_gpu.sticky = 0


async def test_a_lone_fused_request_takes_the_express_path(
    raw_session: RawSession,
    anyio_backend: str,
    monkeypatch: pytest.MonkeyPatch,
    transport_kind: str,
) -> None:
    """Push mode (asyncio, a plain socket) answers a lone fused request from the I/O
    callback's express path; two requests in one read, or a resend, go the usual way,
    as everything does on TLS and under trio."""
    answered: list[bool] = []
    answer = ExpressLaunch.answer

    def record(self: ExpressLaunch, data: bytes) -> bool:
        answered.append(answer(self, data))
        return answered[-1]

    monkeypatch.setattr(ExpressLaunch, "answer", record)
    y, x, function = await _axpy(raw_session)
    answered.clear()
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]
    # trio, and TLS on either loop, read through the connection's reader task.
    expected = anyio_backend == "asyncio" and transport_kind != "tls"
    assert answered == ([True] if expected else [])
    answered.clear()
    assert await raw_session.replies(fused, 1) == [{}]  # a resend: the kept reply
    two = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    two += raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(two, 2) == [{}, {}]
    assert True not in answered
    assert await _y(raw_session, y) == 3.0


async def test_a_launch_the_runtime_refuses_is_the_replys_error_and_not_run_again(
    raw_session: RawSession, sim_gpu: SimGpu
) -> None:
    y, x, function = await _axpy(raw_session)
    launches = len(sim_gpu.launches)
    too_many_threads = {**_args(function, y, x, synchronize=True), "block": [2048]}
    with pytest.raises(HipError) as caught:
        await raw_session.call(Opcode.LAUNCH_KERNEL, too_many_threads)
    assert caught.value.code == 1  # hipErrorInvalidValue, the runtime's refusal
    assert "earlier" not in str(caught.value)  # the request's own launch
    assert len(sim_gpu.launches) == launches  # refused: nothing ran
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]  # the session goes on
    assert await _y(raw_session, y) == 1.0


@asynccontextmanager
async def rate_limited_session(backend: Any, directory: Path) -> AsyncIterator[RawSession]:
    """A raw session of tenant carol (``TENANTS``: 20 requests a second, a burst of 50)
    on a worker of ``backend`` listening in ``directory``."""
    tenants = directory / "tenants.toml"
    tenants.write_text(TENANTS)
    config = WorkerConfig(tenants_file=tenants, resume_grace=0.0, isolation="none")
    async with running_worker(config, backend, [f"unix://{directory}/r.sock"]) as worker:
        session = RawSession(await connect(worker.bound_urls[0]))
        try:
            await session.replies(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"token": TOKEN}), 1)
            yield session
        finally:
            await session.stream.aclose()


async def test_a_fused_request_spends_the_rate_of_two_requests(
    backend: Any, short_tmp: Path
) -> None:
    """One at a time, each answered before the next (the express path's case): each
    fused request spends two of the tenant's requests, and once the bucket is empty the
    refusals name max_request_rate."""
    async with rate_limited_session(backend, short_tmp) as session:
        y, x, function = await _axpy(session)
        await anyio.sleep(0.1)
        outcomes: list[str] = []
        for _ in range(40):
            fused = session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
            try:
                await session.replies(fused, 1)
                outcomes.append("ok")
            except HipError as exc:
                assert "max_request_rate" in str(exc)
                outcomes.append("refused")
    answered = outcomes.count("ok")
    assert 18 <= answered <= 30, outcomes  # ~(50 - setup) / 2, plus what refilled
    assert outcomes[-1] == "refused"


async def test_a_repeated_payload_is_checked_again_after_a_removal(
    raw_session: RawSession, sim_gpu: SimGpu, worker: Worker
) -> None:
    """The express path skips checking a payload equal to the last one it checked, but
    not once anything it named may have gone: a freed allocation, or a function gone
    from the session (its module unloaded), is refused as on the usual path, never
    launched."""
    y, x, function = await _axpy(raw_session)
    session = next(s for s in worker.sessions.values() if s.allocations.containing(y))
    same = _args(function, y, x, synchronize=True)
    for _ in range(3):
        assert await raw_session.call(Opcode.LAUNCH_KERNEL, same) == {}
    await raw_session.call(Opcode.FREE, {"ptr": x})
    launches = len(sim_gpu.launches)
    with pytest.raises(HipError, match="not inside an allocation"):
        await raw_session.call(Opcode.LAUNCH_KERNEL, same)
    assert len(sim_gpu.launches) == launches
    x = (await raw_session.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    again = _args(function, y, x, synchronize=True)
    for _ in range(2):
        assert await raw_session.call(Opcode.LAUNCH_KERNEL, again) == {}
    entry = session.functions.pop(function)  # as MODULE_UNLOAD takes its functions
    with pytest.raises(HipError, match="is not a function of this session"):
        await raw_session.call(Opcode.LAUNCH_KERNEL, again)
    assert len(sim_gpu.launches) == launches + 2
    session.functions.restore(function, entry)
    assert await raw_session.call(Opcode.LAUNCH_KERNEL, again) == {}
    assert len(sim_gpu.launches) == launches + 3


async def test_a_bug_in_the_express_path_ends_only_its_connection(
    raw_session: RawSession,
    endpoint: Endpoint,
    anyio_backend: str,
    monkeypatch: pytest.MonkeyPatch,
    transport_kind: str,
) -> None:
    """A failure inside the express path (a bug) is logged and ends that connection, as
    one in the decoder's pump does; the loop serves the next connection."""
    y, x, function = await _axpy(raw_session)

    def broken(self: ExpressLaunch, data: bytes) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ExpressLaunch, "answer", broken)
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    if anyio_backend == "asyncio" and transport_kind != "tls":
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, HipError)):
            await raw_session.replies(fused, 1)
    else:  # a reader task (trio, TLS) hands frames to the executor: express is not asked
        assert await raw_session.replies(fused, 1) == [{}]
    monkeypatch.undo()
    other = RawSession(await endpoint.raw())
    try:
        await other.replies(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "raw"}), 1)
        assert (await other.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    finally:
        await other.stream.aclose()


async def test_a_repeated_launch_is_made_again_from_its_packed_call(
    raw_session: RawSession,
    anyio_backend: str,
    monkeypatch: pytest.MonkeyPatch,
    transport_kind: str,
) -> None:
    """From the third time the express path takes the same launch, it makes the call it
    packed once (``Session.launch_waited_again``) and the replies and values are the
    usual path's. A stream made since is not in that call: the next launch goes the
    usual way, waits for the stream's work too, and is packed anew."""
    again: list[int] = []
    made_again = PreparedLaunchWait.again

    def record(self: PreparedLaunchWait, fd: int, request_id: int) -> int:
        again.append(request_id)
        return made_again(self, fd, request_id)

    monkeypatch.setattr(PreparedLaunchWait, "again", record)
    y, x, function = await _axpy(raw_session)
    z = (await raw_session.call(Opcode.MALLOC, {"size": 64}))["ptr"]
    await raw_session.call(Opcode.MEMSET, {"ptr": z, "value": 0, "size": 64})
    same = _args(function, y, x, synchronize=True)
    for _ in range(4):
        assert await raw_session.call(Opcode.LAUNCH_KERNEL, same) == {}
    express = anyio_backend == "asyncio" and transport_kind != "tls"
    assert len(again) == (2 if express else 0)
    stream = (await raw_session.call(Opcode.STREAM_CREATE, {}))["stream"]
    on_stream = {**_args(function, z, x), "stream": stream}
    await raw_session.replies(raw_session.frame(Opcode.LAUNCH_KERNEL, on_stream, no_reply=True), 0)
    assert await raw_session.call(Opcode.GET_DEVICE, {}) == {"device": 0}
    for _ in range(2):
        assert await raw_session.call(Opcode.LAUNCH_KERNEL, same) == {}
        assert await _y(raw_session, z) == 1.0  # the stream's kernel ran before the reply
    # The first after the stream went the usual way; the second made the new packing.
    assert len(again) == (3 if express else 0)
    assert await _y(raw_session, y) == 6.0
