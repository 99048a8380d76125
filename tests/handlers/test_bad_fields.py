"""A request that breaks its declaration (a required field missing, a field of the wrong
type) gets a clear hipErrorInvalidValue naming the field, and the worker keeps serving;
fire-and-forget, the error comes with the next synchronising call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import cbor2
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.protocol import messages as m
from hipr.transports import connect
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker
from tests.e2e.raw import RawSession

pytestmark = pytest.mark.anyio

#: What each wire type is not: a value of another type.
WRONG: dict[str, Any] = {
    "uint": "one",
    "size": "one",
    "address": "one",
    "handle": "one",
    "dim3": "one",
    "text": 5,
    "bytes": "one",
    "bool": "one",
    "float": "one",
    "map": "one",
    "[uint]": "one",
    "[bytes]": "one",
    "[text]": "one",
}
#: Answered by the connection, or continuations: not requests a session's handler reads.
NOT_READ = {Opcode.HELLO, Opcode.RESUME, Opcode.DATA_LINK, Opcode.DATA}
CHECKED = [d for d in m.MESSAGES.values() if d.opcode not in NOT_READ and d.required_keys()]


@pytest.fixture
async def raw(anyio_backend: str) -> AsyncIterator[RawSession]:
    """A raw session with a fresh emulator worker, past its HELLO."""
    backend = EmulatorBackend(device_count=1, total_memory=16 << 20)
    async with running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker:
        stream = await connect(worker.bound_urls[0])
        session = RawSession(stream)
        await session.replies(encode_frame(Opcode.HELLO, 0, Flags.NONE, {m.Hello.client: "t"}), 1)
        yield session
        await stream.aclose()


async def _refusal(raw: RawSession, opcode: Opcode, args: Any) -> HipError:
    with pytest.raises(HipError) as caught:
        await raw.call(opcode, args)
    return caught.value


async def test_a_missing_required_field_is_named_and_the_session_goes_on(
    raw: RawSession,
) -> None:
    for declaration in CHECKED:
        error = await _refusal(raw, declaration.opcode, {})
        assert error.code == HipErrorCode.hipErrorInvalidValue, (declaration, error)
        assert error.kind == "hip"
        named = [k for k in declaration.required_keys() if f"'{k}'" in str(error)]
        assert named, f"{declaration.opcode.name}: {error}"
    assert await raw.call(Opcode.DEVICE_COUNT, {}) == {"count": 1}


async def test_a_wrong_typed_field_is_named_and_the_session_goes_on(raw: RawSession) -> None:
    for declaration in CHECKED:
        wire = {f.name: WRONG[f.type] for f in declaration.fields if f.type in WRONG}
        error = await _refusal(raw, declaration.opcode, wire)
        assert error.code == HipErrorCode.hipErrorInvalidValue, (declaration, error)
        named = [k for k in wire if f"'{k}'" in str(error)]
        assert named, f"{declaration.opcode.name}: {error}"
    # Out of range is as clear: a memset byte of 256, a negative size.
    ptr = (await raw.call(Opcode.MALLOC, {m.Malloc.size: 64}))["ptr"]
    error = await _refusal(raw, Opcode.MEMSET, {"ptr": ptr, "value": 256, "size": 64})
    assert "argument 'value' must be in [0, 255], got 256" in str(error)
    error = await _refusal(raw, Opcode.MALLOC, {m.Malloc.size: -1})
    assert "argument 'size'" in str(error)
    # A map that is no map, and a boolean where an integer is due.
    error = await _refusal(raw, Opcode.MALLOC, [64])  # type: ignore[arg-type]
    assert "MALLOC: arguments must be a map" in str(error)
    error = await _refusal(raw, Opcode.MALLOC, {m.Malloc.size: True})
    assert "argument 'size' must be an integer, got True" in str(error)
    assert await raw.call(Opcode.MEM_GET_INFO, {}) == {"free": (16 << 20) - 64, "total": 16 << 20}


async def test_a_fire_and_forget_bad_field_is_reported_by_the_next_synchronising_call(
    raw: RawSession,
) -> None:
    builtin = await raw.call(Opcode.MODULE_BUILTIN, {m.ModuleBuiltin.name: "fill_f32"})
    function = builtin["function"]
    bad_launch = {m.LaunchKernel.function: function, m.LaunchKernel.grid: "abc", "block": 1}
    await raw.stream.send(raw.frame(Opcode.LAUNCH_KERNEL, bad_launch, no_reply=True))
    launch_id = raw.next_id
    error = await _refusal(raw, Opcode.DEVICE_SYNCHRONIZE, {})
    assert error.code == HipErrorCode.hipErrorInvalidValue
    assert "argument 'grid' must be 1 to 3 positive integers" in str(error)
    assert f"from an earlier asynchronous LAUNCH_KERNEL, request {launch_id}" in str(error)
    # Reported once: the session is healthy again.
    assert await raw.call(Opcode.DEVICE_SYNCHRONIZE, {}) == {}


async def test_self_described_cbor_and_unknown_keys_are_accepted(raw: RawSession) -> None:
    tagged = cbor2.CBORTag(55799, {m.Malloc.size: 64, "from_a_newer_client": True})
    reply = await raw.call(Opcode.MALLOC, tagged)
    assert m.Malloc.problems(reply, reply=True) == [] and reply["ptr"]
