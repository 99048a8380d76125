"""Data links (protocol 1.4): a striped upload's chunks on further connections of its
session, each read by a thread of the worker, in any order, before or after the request,
some twice; what a data link refuses, and that nothing it does harms the session or the
worker. Hand-made frames against the emulator worker, over tcp and unix (and TLS, which
offers none)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.admin import session_status
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.protocol.header import HEADER, MAGIC, PROTOCOL_VERSION
from hipr.transports import connect
from hipr.worker.config import TlsConfig, WorkerConfig
from hipr.worker.server import Worker, running_worker
from tests.e2e.conftest import Endpoint
from tests.e2e.data_link_client import CHUNK, Striped, chunk_frame, pattern, receive_chunks
from tests.e2e.raw import RawSession
from tests.transports.conftest import Pki

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["tcp", "unix"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Data links are offered on plain sockets."""
    return str(request.param)


@pytest.fixture
def worker_config(transport_kind: str, request: pytest.FixtureRequest) -> WorkerConfig:
    """Chunks of 4 MiB; a stalled upload fails within a second."""
    config = WorkerConfig(max_frame_bytes=8 << 20, frame_timeout=1.0)
    if transport_kind == "tls":
        certs: Pki = request.getfixturevalue("pki")
        tls = TlsConfig(certfile=Path(certs.server_cert), keyfile=Path(certs.server_key))
        config = dataclasses.replace(config, tls=tls)
    return config


@pytest.fixture
async def striped(endpoint: Endpoint, worker: Worker) -> AsyncIterator[Striped]:
    stream = await endpoint.raw()
    raw = RawSession(stream)
    (hello,) = await raw.replies(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "raw"}), 1)
    session = Striped(raw, hello, endpoint)
    yield session
    for link in session.links:
        await link.aclose()
    await stream.aclose()


async def _upload(s: Striped, size: int) -> tuple[int, int]:
    """An allocation of ``size`` bytes and the id the striped request will have."""
    ptr = (await s.raw.call(Opcode.MALLOC, {"size": size}))["ptr"]
    return ptr, s.raw.next_id + 1


async def _read(s: Striped, ptr: int, size: int) -> bytes:
    """The bytes at ``ptr``, read a chunk at a time (a larger read comes in parts)."""
    parts = []
    for offset in range(0, size, CHUNK):
        n = min(CHUNK, size - offset)
        await s.raw.call(Opcode.MEMCPY_DTOH, {"src": ptr + offset, "size": n})
        parts.append(bytes(s.raw.last_bulk))
    return b"".join(parts)


def _session(worker: Worker) -> Any:
    (session,) = worker.sessions.values()
    return session


async def test_a_striped_upload_lands_whole_from_chunks_in_any_order(
    striped: Striped, worker: Worker
) -> None:
    assert striped.hello["data_links"] == 4
    assert striped.hello["protocol"] == PROTOCOL_VERSION
    links = [await striped.open_link() for _ in range(3)]
    size = 2 * CHUNK + 12345
    ptr, request_id = await _upload(striped, size)
    data = pattern(size)
    offsets = [2 * CHUNK, 0, CHUNK]
    request = striped.raw.frame(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": size, "striped": True})
    await striped.raw.stream.send(request)
    for link, offset in zip(links, offsets, strict=True):
        await link.send(chunk_frame(request_id, offset, data[offset : offset + CHUNK]))
    # One chunk again (a resend after a broken link): copied once, harmless.
    await links[2].send(chunk_frame(request_id, 0, data[:CHUNK]))
    assert await striped.raw.replies(b"", 1) == [{}]
    assert await _read(striped, ptr, size) == data
    assert _session(worker).stripes.links == 3
    assert session_status(_session(worker), None)["data_links"] == 3  # hipr status


async def test_chunks_that_come_before_their_request_are_held(
    striped: Striped, worker: Worker
) -> None:
    link = await striped.open_link()
    size = CHUNK + 7
    ptr, request_id = await _upload(striped, size)
    data = pattern(size)
    await link.send(chunk_frame(request_id, CHUNK, data[CHUNK:]))
    await link.send(chunk_frame(request_id, 0, data[:CHUNK]))
    inbox = _session(worker).stripes
    with anyio.fail_after(10):
        while inbox.chunks_delivered < 2:
            await anyio.sleep(0.01)
    reply = await striped.raw.call(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": size, "striped": True})
    assert reply == {}
    assert await _read(striped, ptr, size) == data


async def test_a_stalled_upload_fails_clearly_and_the_session_goes_on(
    striped: Striped, worker: Worker
) -> None:
    link = await striped.open_link()
    size = 2 * CHUNK
    ptr, request_id = await _upload(striped, size)
    await link.send(chunk_frame(request_id, 0, pattern(CHUNK)))
    with pytest.raises(HipError, match="stalled: 1 of its 2 chunks") as failed:
        await striped.raw.call(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": size, "striped": True})
    assert failed.value.code == HipErrorCode.hipErrorInvalidValue
    # The chunk that comes late is dropped; the next upload is whole.
    await link.send(chunk_frame(request_id, CHUNK, pattern(CHUNK)))
    ptr2, request_id = await _upload(striped, CHUNK)
    await link.send(chunk_frame(request_id, 0, b"\5" * CHUNK))
    assert (
        await striped.raw.call(Opcode.MEMCPY_HTOD, {"dst": ptr2, "size": CHUNK, "striped": True})
        == {}
    )
    assert await _read(striped, ptr2, CHUNK) == b"\5" * CHUNK


async def test_a_chunk_that_does_not_fit_its_upload_fails_it(striped: Striped) -> None:
    link = await striped.open_link()
    size = CHUNK + 10
    ptr, request_id = await _upload(striped, size)
    await link.send(chunk_frame(request_id, CHUNK, b"x" * 11))  # one byte too many
    with pytest.raises(HipError, match="does not fit an upload of"):
        await striped.raw.call(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": size, "striped": True})
    assert await striped.raw.call(Opcode.PING, {}) == {}


async def test_a_striped_upload_outside_the_sessions_memory_is_refused(striped: Striped) -> None:
    await striped.open_link()
    with pytest.raises(HipError) as refused:
        await striped.raw.call(
            Opcode.MEMCPY_HTOD, {"dst": 0xDEAD0000, "size": CHUNK, "striped": True}
        )
    assert refused.value.code == HipErrorCode.hipErrorInvalidValue


@pytest.mark.parametrize(
    ("override", "kind"),
    [
        ({"resume_token": "not-the-token"}, "auth"),
        ({"session_id": "0123456789abcdef"}, "session_lost"),
        ({"session_id": 5}, "hip"),
    ],
    ids=["wrong-token", "no-such-session", "malformed"],
)
async def test_a_data_link_with_wrong_credentials_is_refused(
    striped: Striped, worker: Worker, override: dict[str, Any], kind: str
) -> None:
    with pytest.raises(HipError) as refused:
        await striped.open_link(**override)
    assert refused.value.kind == kind
    assert _session(worker).stripes.links == 0
    assert await striped.raw.call(Opcode.PING, {}) == {}


async def test_a_session_attaches_at_most_its_data_links(striped: Striped, worker: Worker) -> None:
    for _ in range(4):
        await striped.open_link()
    with pytest.raises(HipError, match="holds its 4 data links already") as refused:
        await striped.open_link()
    assert refused.value.kind == "quota"
    # One ends: its place is free again.
    await striped.links.pop().aclose()
    inbox = _session(worker).stripes
    with anyio.fail_after(10):
        while inbox.links > 3:
            await anyio.sleep(0.01)
    await striped.open_link()


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\n\r\n" + bytes(10),
        HEADER.pack(MAGIC, PROTOCOL_VERSION, Opcode.MALLOC, 2, 0, 12) + bytes(12),
        HEADER.pack(MAGIC, PROTOCOL_VERSION, Opcode.DATA, 2, 0, (1 << 64) - 1) + bytes(4),
        HEADER.pack(MAGIC, PROTOCOL_VERSION, Opcode.DATA, 2, 0, 4 + 9 + CHUNK + 1)
        + (9).to_bytes(4, "little"),
        encode_frame(Opcode.DATA, 2, Flags.NONE, {"offset": 3}, b"abc"),
        encode_frame(Opcode.DATA, 2, Flags.NONE, {"offset": -CHUNK}, b"abc"),
        encode_frame(Opcode.DATA, 2, Flags.NONE, [1, 2], b"abc"),
        encode_frame(Opcode.DATA, 2, Flags.MORE, {"offset": 0}, b"abc"),
        encode_frame(Opcode.DATA, 2, Flags.NONE, {"offset": 0}),
        # {"offset": <a byte follows>} with the byte missing: cbor2's end-of-input error.
        HEADER.pack(MAGIC, PROTOCOL_VERSION, Opcode.DATA, 2, 0, 4 + 9 + 3)
        + (9).to_bytes(4, "little")
        + b"\xa1\x66offset\x18"
        + bytes(3),
    ],
    ids=[
        "not-hipr",
        "not-data",
        "size-near-2**64",
        "over-a-chunk",
        "unaligned",
        "negative",
        "not-a-map",
        "flags",
        "empty",
        "cbor-cut-short",
    ],
)
async def test_a_malformed_chunk_ends_its_link_only(
    striped: Striped, worker: Worker, garbage: bytes
) -> None:
    link = await striped.open_link()
    await link.send(garbage)
    with anyio.fail_after(10):
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            while True:
                await link.receive()
    inbox = _session(worker).stripes
    with anyio.fail_after(10):
        while inbox.links:
            await anyio.sleep(0.01)
    assert await striped.raw.call(Opcode.PING, {}) == {}
    await striped.open_link()  # another comes in its place


async def test_a_chunk_trickling_in_is_given_up_on(striped: Striped, worker: Worker) -> None:
    link = await striped.open_link()
    frame = chunk_frame(7, 0, pattern(1 << 20))
    await link.send(frame[:100])  # and no more: the frame never completes
    inbox = _session(worker).stripes
    with anyio.fail_after(15):
        while inbox.links:
            await anyio.sleep(0.05)
    assert await striped.raw.call(Opcode.PING, {}) == {}


async def test_data_links_end_with_their_session(striped: Striped, worker: Worker) -> None:
    links = [await striped.open_link() for _ in range(2)]
    with anyio.fail_after(10):  # each thread starts just after its link's reply
        while (threads := _data_link_threads()) < 2:
            await anyio.sleep(0.01)
    await striped.raw.stream.send(striped.raw.frame(Opcode.GOODBYE, {}))
    for link in links:
        with anyio.fail_after(10):
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                while True:
                    await link.receive()
    deadline = time.monotonic() + 10
    while _data_link_threads() > threads - 2 and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    assert _data_link_threads() <= threads - 2


async def test_a_data_link_survives_a_resume_of_its_session(
    striped: Striped, worker: Worker
) -> None:
    link = await striped.open_link()
    await striped.raw.stream.aclose()  # the main link drops; the session waits
    stream = await striped.endpoint.raw()
    striped.raw = RawSession(stream)
    resume = {
        "session_id": striped.hello["session_id"],
        "resume_token": striped.hello["resume_token"],
    }
    (answer,) = await striped.raw.replies(encode_frame(Opcode.RESUME, 0, Flags.NONE, resume), 1)
    assert answer["data_links"] == 4
    striped.raw.next_id = answer["last_executed_id"] + 1
    size = CHUNK + 1
    ptr, request_id = await _upload(striped, size)
    data = pattern(size)
    await link.send(
        chunk_frame(request_id, 0, data[:CHUNK]) + chunk_frame(request_id, CHUNK, data[CHUNK:])
    )
    reply = await striped.raw.call(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": size, "striped": True})
    assert reply == {}
    assert await _read(striped, ptr, size) == data


async def _filled(s: Striped, size: int) -> tuple[int, bytes]:
    """An allocation holding ``pattern(size)``, uploaded the usual way."""
    ptr = (await s.raw.call(Opcode.MALLOC, {"size": size}))["ptr"]
    data = pattern(size)
    for offset in range(0, size, CHUNK):
        piece = data[offset : offset + CHUNK]
        args = {"dst": ptr + offset, "size": len(piece)}
        await s.raw.replies(s.raw.frame(Opcode.MEMCPY_HTOD, args, bulk=piece), 1)
    return ptr, data


async def test_a_striped_download_comes_in_chunks_over_every_link(striped: Striped) -> None:
    links = [await striped.open_link() for _ in range(2)]
    size = 2 * CHUNK + 99
    ptr, data = await _filled(striped, size)
    request_id = striped.raw.next_id + 1
    args = {"src": ptr, "size": size, "striped": True}
    async with anyio.create_task_group() as tg:
        got: dict[int, bytes] = {}

        async def take(link: anyio.abc.ByteStream, count: int) -> None:
            got.update(await receive_chunks(link, request_id, count))

        tg.start_soon(take, links[0], 2)  # chunks 0 and 2
        tg.start_soon(take, links[1], 1)  # chunk 1
        assert await striped.raw.call(Opcode.MEMCPY_DTOH, args) == {"size": size}
    assert sorted(got) == [0, CHUNK, 2 * CHUNK]
    assert b"".join(got[offset] for offset in sorted(got)) == data


async def test_a_striped_download_without_a_data_link_is_refused(striped: Striped) -> None:
    ptr, _ = await _filled(striped, CHUNK)
    with pytest.raises(HipError, match="no data link") as refused:
        await striped.raw.call(Opcode.MEMCPY_DTOH, {"src": ptr, "size": CHUNK, "striped": True})
    assert refused.value.code == HipErrorCode.hipErrorInvalidValue
    with pytest.raises(HipError, match="outside|not .*allocation|invalid"):
        await striped.raw.call(
            Opcode.MEMCPY_DTOH, {"src": 0xDEAD0000, "size": CHUNK, "striped": True}
        )


@pytest.mark.parametrize("transport_kind", ["tcp"], indirect=True)  # the larger buffers
async def test_a_download_to_a_client_that_never_reads_fails_in_bounded_time(
    striped: Striped, worker: Worker
) -> None:
    await striped.open_link()  # never read
    size = 12 * CHUNK  # more than loopback's socket buffers hold (tcp: up to 36 MiB)
    ptr, data = await _filled(striped, size)
    started = time.monotonic()
    with pytest.raises(HipError, match="lost a data link"):
        await striped.raw.call(Opcode.MEMCPY_DTOH, {"src": ptr, "size": size, "striped": True})
    # One chunk's frame timeout: 1 s, and a second per MiB.
    assert time.monotonic() - started < 30
    # The read changed nothing: asked again without striped, the bytes come.
    await striped.raw.call(Opcode.MEMCPY_DTOH, {"src": ptr + CHUNK, "size": CHUNK})
    assert bytes(striped.raw.last_bulk) == data[CHUNK : 2 * CHUNK]


@pytest.mark.parametrize("transport_kind", ["tls"], indirect=True)
async def test_tls_offers_no_data_links(striped: Striped, worker: Worker) -> None:
    """A thread reading the socket would skip the encryption: over TLS, none."""
    assert striped.hello["data_links"] == 0
    with pytest.raises(HipError, match="offers no data links") as refused:
        await striped.open_link()
    assert refused.value.code == HipErrorCode.hipErrorNotSupported
    assert await striped.raw.call(Opcode.PING, {}) == {}


async def test_a_worker_with_no_data_links_offers_none(
    worker_config: WorkerConfig, backend: Any
) -> None:
    config = dataclasses.replace(worker_config, data_links=0)
    async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as other:
        url = other.bound_urls[0]
        s = Striped(RawSession(await connect(url)), {}, Endpoint(url))
        (s.hello,) = await s.raw.replies(encode_frame(Opcode.HELLO, 1, Flags.NONE, {}), 1)
        assert s.hello["data_links"] == 0
        with pytest.raises(HipError, match="offers no data links"):
            await s.open_link()
        await s.raw.stream.aclose()


def _data_link_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "hipr-data-link")


async def test_a_fire_and_forget_striped_upload_is_refused(striped: Striped) -> None:
    """A striped upload must wait for its reply: sent fire-and-forget, the next call
    reports the refusal, and nothing of it was copied."""
    ptr, _ = await _upload(striped, CHUNK)
    await striped.raw.call(Opcode.MEMSET, {"ptr": ptr, "value": 3, "size": CHUNK})
    args = {"dst": ptr, "size": CHUNK, "striped": True}
    await striped.raw.stream.send(striped.raw.frame(Opcode.MEMCPY_HTOD, args, no_reply=True))
    with pytest.raises(HipError, match="must wait for its reply"):
        await striped.raw.call(Opcode.SYNC_ERRORS, {})
    assert await _read(striped, ptr, CHUNK) == b"\3" * CHUNK
