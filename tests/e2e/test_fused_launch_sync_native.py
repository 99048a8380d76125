"""LAUNCH_KERNEL with ``synchronize`` on a GPU backend whose launch and wait are one
native call (``hipr.backends._launch_wait``): the worker runs on the simulated CUDA and
HIP runtimes of :mod:`tests.backends.test_gpu_backends_nogpu`, whose C entry points the
native call reaches. Its replies, errors and values must be the emulator's (the tests
of :mod:`tests.e2e.test_fused_launch_sync`, run again here), a resend must not launch
again, and a kernel still running when the poll ends is waited for by the executor
without a second launch, on both event loops (the I/O callback's path and the
executor's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hipr.errors import HipError
from hipr.protocol import Opcode
from hipr.worker.request_executor import RequestExecutor
from tests.backends.test_gpu_backends_nogpu import SimGpu, _make
from tests.e2e.raw import RawSession
from tests.e2e.test_fused_launch_sync import (
    _args,
    _axpy,
    _y,
    test_a_launch_with_synchronize_replies_after_the_kernel_ran,
    test_a_resent_fused_request_does_not_launch_again,
    test_fused_replies_are_those_of_the_two_requests_inline_or_not,
)

pytestmark = pytest.mark.anyio

__all__ = [
    "test_a_launch_with_synchronize_replies_after_the_kernel_ran",
    "test_a_resent_fused_request_does_not_launch_again",
    "test_fused_replies_are_those_of_the_two_requests_inline_or_not",
]

_SIMULATED: dict[int, SimGpu] = {}


@pytest.fixture(params=["unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["cuda", "hip"])
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A simulated GPU backend with the native launch-and-wait (the worker's)."""
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
    return _SIMULATED[id(backend)]


async def test_the_native_call_takes_the_fused_request(
    raw_session: RawSession, sim_gpu: SimGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polled from C, and its reply sent from there (the unix stream takes writes from
    outside the loop on both event loops), kept for a resend all the same."""
    native = sim_gpu.native
    assert native is not None
    sent: list[int] = []
    reply_written = RequestExecutor.reply_written

    def record(self: RequestExecutor, request: Any, target: Any, count: int) -> None:
        sent.append(count)
        reply_written(self, request, target, count)

    monkeypatch.setattr(RequestExecutor, "reply_written", record)
    y, x, function = await _axpy(raw_session)
    native.queries = 0
    fused = raw_session.frame(Opcode.LAUNCH_KERNEL, _args(function, y, x, synchronize=True))
    assert await raw_session.replies(fused, 1) == [{}]
    assert native.queries >= 1  # polled from C, not through the binding
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
