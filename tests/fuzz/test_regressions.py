"""Bugs the fuzzer found, each pinned by the frames that exposed it."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import anyio
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.handlers.args import Args
from hipr.protocol import Flags, Opcode
from hipr.testing import LogWatch, leaks, wait_for_no_sessions
from hipr.testing.harness import RawClient
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def watched(anyio_backend: str) -> AsyncIterator[tuple[Worker, LogWatch]]:
    """A worker whose logs are watched for crashes; checked clean at the end."""
    backend = EmulatorBackend(total_memory=64 << 20)
    watch = LogWatch()
    with watch.installed():
        async with running_worker(
            WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]
        ) as worker:
            yield worker, watch
            assert await wait_for_no_sessions(worker)
            assert leaks(backend, worker) == []
    assert watch.crashes == []


async def test_an_integer_too_long_to_print_is_an_invalid_value(
    watched: tuple[Worker, LogWatch],
) -> None:
    """repr() refuses ints of more than 4300 digits: the error message itself raised
    ValueError, logged as a handler crash and answered as hipErrorUnknown."""
    worker, _ = watched
    client = await RawClient.open(worker.bound_urls[0])
    for args in ({"size": 10**5000}, {"size": -(10**5000)}, {"size": 2**64}):
        with pytest.raises(HipError) as info:
            await client.call(Opcode.MALLOC, args)
        assert info.value.code == HipErrorCode.hipErrorInvalidValue
        assert len(info.value.message) < 200
    await client.call(Opcode.GOODBYE)
    await client.aclose()


def test_a_number_argument_must_be_finite() -> None:
    for value in (10**400, math.inf, -math.inf, math.nan):
        with pytest.raises(HipError):
            Args({"x": value}, "TEST").number("x")
    assert Args({"x": 2}, "TEST").number("x") == 2.0


async def test_a_copy_cut_short_by_end_of_stream_is_not_a_crash(
    watched: tuple[Worker, LogWatch],
) -> None:
    """The link dying under a streaming handler was logged as 'handler failed'."""
    worker, _ = watched
    client = await RawClient.open(worker.bound_urls[0])
    ptr = (await client.call(Opcode.MALLOC, {"size": 4096}))["ptr"]
    await client.send(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 4096}, b"x" * 100, Flags.MORE)
    await client.stream.send_eof()
    assert await client.closed_by_peer()
    await client.aclose()


async def test_a_read_cut_short_by_a_reset_is_not_a_crash(
    watched: tuple[Worker, LogWatch],
) -> None:
    """A reply chunk sent to a reset link raised inside the handler: 'handler failed'."""
    worker, _ = watched
    client = await RawClient.open(worker.bound_urls[0])
    ptr = (await client.call(Opcode.MALLOC, {"size": 32 << 20}))["ptr"]
    await client.send(Opcode.MEMCPY_DTOH, {"src": ptr, "size": 32 << 20})
    await client.stream.receive()
    await client.reset()
    await anyio.sleep(0.1)


async def test_a_stray_data_frame_closes_with_a_protocol_error(
    watched: tuple[Worker, LogWatch],
) -> None:
    """_Closing escaped the connection's task group wrapped in an ExceptionGroup: no
    error frame, and 'connection task failed' logged as a crash."""
    worker, _ = watched
    client = await RawClient.open(worker.bound_urls[0])
    await client.send(Opcode.DATA, None, b"junk")
    frame = await client.reply(0)
    assert Flags.ERROR in frame.flags
    assert "does not continue a request" in HipError.from_wire(frame.args).message
    assert await client.closed_by_peer()
    await client.aclose()
