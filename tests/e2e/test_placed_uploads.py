"""Uploads received straight into the emulator's device memory (push mode): the bytes
land whole and in order, at their destination only, after the session's earlier work,
and a chunk that cannot be placed is copied as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError
from hipr.kernels.kernel_args import pack_args
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import RawClient, leaks
from hipr.worker import payloads
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker

pytestmark = pytest.mark.anyio

CHUNK = 4 << 20
#: Several chunks and a short last one.
UPLOAD = 3 * CHUNK + 12_345
GUARD = 8192


@pytest.fixture(params=["unix", "tcp"])
async def worker(
    request: pytest.FixtureRequest, short_tmp: Path, anyio_backend: str
) -> AsyncIterator[Worker]:
    url = f"unix://{short_tmp}/w.sock" if request.param == "unix" else "tcp://127.0.0.1:0"
    backend = EmulatorBackend(total_memory=256 << 20)
    with anyio.fail_after(60):
        async with running_worker(WorkerConfig(resume_grace=0.0), backend, [url]) as served:
            yield served
    assert not leaks(backend, served)


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the payloads the worker received straight into device memory."""
    sizes: list[int] = []
    target = payloads.Placements.target

    def counted(self: payloads.Placements, header: Any, head: bytes) -> memoryview | None:
        view = target(self, header, head)
        if view is not None:
            sizes.append(view.nbytes)
        return view

    monkeypatch.setattr(payloads.Placements, "target", counted)
    return sizes


async def _read(client: RawClient, ptr: int, size: int) -> bytes:
    """Device bytes, read a chunk at a time (each chunk whole in its final reply)."""
    parts = []
    for offset in range(0, size, CHUNK):
        n = min(CHUNK, size - offset)
        read = await client.send(Opcode.MEMCPY_DTOH, {"src": ptr + offset, "size": n})
        parts.append(bytes((await client.reply(read)).bulk))
    return b"".join(parts)


def _pattern(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


async def test_an_upload_lands_whole_at_its_destination_only(
    worker: Worker, placed: list[int], anyio_backend: str
) -> None:
    data = _pattern(UPLOAD, 1)
    guard = _pattern(UPLOAD + 2 * GUARD, 2)
    async with hipr.aconnect(worker.bound_urls[0]) as gpu:
        ptr = await gpu.malloc(guard.nbytes)
        await gpu.memcpy_htod(ptr, guard)  # bytes on both sides of the destination
        await gpu.memcpy_htod(int(ptr) + GUARD, data)
        back = np.frombuffer(await gpu.memcpy_dtoh(ptr, guard.nbytes), np.uint8)
        await gpu.free(ptr)
    assert np.array_equal(back[GUARD:-GUARD], data)
    assert np.array_equal(back[:GUARD], guard[:GUARD])
    assert np.array_equal(back[-GUARD:], guard[-GUARD:])
    if anyio_backend == "asyncio":
        # Some of the DATA frames after the first: the first chunk comes with the
        # request's head, before its handler asked for the destination, and on a loaded
        # machine (CI's two cores) the handler may ask only after the next chunk or two
        # were read, which are then copied as before (seen once: one of three placed).
        # The client cannot push all 12 MiB into the socket before the worker reads.
        assert placed and all(size <= CHUNK for size in placed)
    else:
        assert placed == []  # trio's stream hands over bytes objects: copied as before


async def test_concurrent_uploads_on_one_connection_each_land_whole(worker: Worker) -> None:
    """Several tasks uploading at once over one async client: however their frames
    share the link, each upload's bytes land at its own destination only."""
    patterns = [_pattern(UPLOAD - 1000 * i, 10 + i) for i in range(3)]
    async with hipr.aconnect(worker.bound_urls[0]) as gpu:
        ptrs = [await gpu.malloc(p.nbytes) for p in patterns]

        async def upload(ptr: Any, data: np.ndarray) -> None:
            await gpu.memcpy_htod(ptr, data)

        async with anyio.create_task_group() as tg:
            for ptr, data in zip(ptrs, patterns, strict=True):
                tg.start_soon(upload, ptr, data)
        for ptr, data in zip(ptrs, patterns, strict=True):
            back = np.frombuffer(await gpu.memcpy_dtoh(ptr, data.nbytes), np.uint8)
            assert np.array_equal(back, data)
            await gpu.free(ptr)


async def test_an_upload_after_queued_kernels_lands_after_them(worker: Worker) -> None:
    count = UPLOAD // 4
    data = _pattern(4 * count, 3)
    async with hipr.aconnect(worker.bound_urls[0]) as gpu:
        ptr = await gpu.malloc(4 * count)
        fill = await gpu.builtin("fill_f32")
        args = [ptr, np.float32(2.5), np.uint64(count)]
        # Large enough to run on the session's GPU thread, posted without a wait, and
        # many: the GPU thread is still busy with them while the upload's chunks arrive,
        # which must not land before the last kernel has written.
        scratch = await gpu.malloc(64)
        for _ in range(30):
            await fill.launch((count + 255) // 256, 256, args)
        # A fire-and-forget call behind them: the worker then queues the launches on
        # the session's thread, where alone before a reply-awaiting request they would
        # run at once on its loop.
        await gpu.memcpy_htod_async(scratch, b"x" * 64)
        await gpu.memcpy_htod(ptr, data)
        after_upload = np.frombuffer(await gpu.memcpy_dtoh(ptr, 4 * count), np.uint8)
        await gpu.memcpy_htod(ptr, data)
        await fill.launch((count + 255) // 256, 256, args)
        after_kernel = np.frombuffer(await gpu.memcpy_dtoh(ptr, 4 * count), np.float32)
        await gpu.free(ptr)
        await gpu.free(scratch)
    assert np.array_equal(after_upload, data)
    assert np.all(after_kernel == np.float32(2.5))


async def test_a_fire_and_forget_upload_lands_after_the_kernels_queued_before_it(
    worker: Worker,
) -> None:
    """A fire-and-forget upload waits for nothing on the executor (no earlier error to
    report first): its chunks may be placed only once the session's queued kernels,
    which write the same bytes, have run."""
    count = UPLOAD // 4
    data = _pattern(4 * count, 5).tobytes()
    client = await RawClient.open(worker.bound_urls[0])
    try:
        ptr = (await client.call(Opcode.MALLOC, {"size": 4 * count}))["ptr"]
        function = (await client.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"}))["function"]
        packed = pack_args([np.uint64(ptr), np.float32(2.5), np.uint64(count)]).to_wire()
        launch = {"function": function, "grid": [-(-count // 1024)], "block": [1024], **packed}
        launch["ptrs"] = [0]
        for _ in range(30):
            await client.send(Opcode.LAUNCH_KERNEL, launch, flags=Flags.NO_REPLY)
        pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        request_id = await client.send(
            Opcode.MEMCPY_HTOD,
            {"dst": ptr, "size": len(data)},
            pieces[0],
            Flags.MORE | Flags.NO_REPLY,
        )
        for index, piece in enumerate(pieces[1:], start=2):
            more = Flags.MORE if index < len(pieces) else Flags.NONE
            await client.send(Opcode.DATA, None, piece, more, request_id=request_id)
        assert await _read(client, ptr, len(data)) == data
        await client.call(Opcode.FREE, {"ptr": ptr})
        await client.call(Opcode.GOODBYE)
    finally:
        await client.aclose()


async def test_data_frames_that_carry_arguments_are_copied_not_placed(
    worker: Worker, placed: list[int]
) -> None:
    """A hand-made upload whose DATA frames carry (empty) CBOR arguments: legal, but its
    payloads are not bulk alone, so none is placed and every byte still arrives."""
    client = await RawClient.open(worker.bound_urls[0])
    try:
        ptr = (await client.call(Opcode.MALLOC, {"size": UPLOAD}))["ptr"]
        data = _pattern(UPLOAD, 4).tobytes()
        pieces = [data[i : i + CHUNK] for i in range(0, UPLOAD, CHUNK)]
        request_id = await client.send(
            Opcode.MEMCPY_HTOD, {"dst": ptr, "size": UPLOAD}, pieces[0], Flags.MORE
        )
        for index, piece in enumerate(pieces[1:], start=2):
            last = index == len(pieces)
            flags = Flags.NONE if last else Flags.MORE
            await client.send(Opcode.DATA, {}, piece, flags, request_id=request_id)
        reply = await client.reply(request_id)
        assert not reply.flags & Flags.ERROR
        assert await _read(client, ptr, UPLOAD) == data
        await client.call(Opcode.FREE, {"ptr": ptr})
        await client.call(Opcode.GOODBYE)
    finally:
        await client.aclose()
    assert placed == []


async def test_an_upload_longer_than_announced_is_refused_and_spills_nowhere(
    worker: Worker,
) -> None:
    """Bytes past the announced size are never placed beyond the destination: the
    request fails, the memory after it keeps its bytes, and the session goes on."""
    client = await RawClient.open(worker.bound_urls[0])
    try:
        size = 2 * CHUNK
        ptr = (await client.call(Opcode.MALLOC, {"size": size + GUARD}))["ptr"]
        await client.call(Opcode.MEMSET, {"ptr": ptr, "value": 0x5A, "size": size + GUARD})
        request_id = await client.send(
            Opcode.MEMCPY_HTOD, {"dst": ptr, "size": size}, bytes(CHUNK), Flags.MORE
        )
        await client.send(Opcode.DATA, None, bytes(CHUNK), Flags.MORE, request_id=request_id)
        await client.send(Opcode.DATA, None, b"\xff" * CHUNK, request_id=request_id)
        reply = await client.reply(request_id)
        assert reply.flags & Flags.ERROR
        assert "more than the announced" in HipError.from_wire(reply.args).message
        assert await _read(client, ptr + size, GUARD) == b"\x5a" * GUARD
        await client.call(Opcode.FREE, {"ptr": ptr})
        await client.call(Opcode.GOODBYE)
    finally:
        await client.aclose()


async def test_each_data_frame_after_the_first_payload_is_read_head_first(
    worker: Worker, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """Once a payload with more to follow has arrived, the loop reads the next frame's
    head alone (header and arguments' length), so no bulk byte of an upload's DATA
    frames passes through the read buffer and is copied out of it again."""
    heads: list[int] = []
    target = payloads.Placements.target

    def recorded(self: payloads.Placements, header: Any, head: bytes) -> memoryview | None:
        if header.opcode == Opcode.DATA:
            heads.append(len(head))
        return target(self, header, head)

    monkeypatch.setattr(payloads.Placements, "target", recorded)
    data = _pattern(UPLOAD, 4)
    async with hipr.aconnect(worker.bound_urls[0]) as gpu:
        ptr = await gpu.malloc(UPLOAD)
        for _ in range(2):
            await gpu.memcpy_htod(ptr, data)
        back = np.frombuffer(await gpu.memcpy_dtoh(ptr, UPLOAD), np.uint8)
        await gpu.free(ptr)
    assert np.array_equal(back, data)
    if anyio_backend == "asyncio":
        # Two whole-chunk DATA frames per upload (the first chunk travels with the
        # request, and the short last one is too small to be received into); a head
        # read may come back short on tcp, never longer.
        assert len(heads) == 4 and all(size <= 4 for size in heads)
        if worker.bound_urls[0].startswith("unix"):
            assert heads == [4] * 4
    else:
        assert heads == []  # trio's stream: no push mode, nothing received into
