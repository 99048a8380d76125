"""Every client call, async, against a real worker; bad input gives the right HipError."""

from __future__ import annotations

from functools import partial

import anyio
import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipErrorCode as E
from hipr.worker.server import Worker
from tests.e2e.conftest import Endpoint

pytestmark = pytest.mark.anyio


async def test_device_queries(endpoint: Endpoint, worker: Worker) -> None:
    async with endpoint.aconnect() as gpu:
        info = gpu.worker_info()
        assert info["backend"] == "emulator" and info["session_id"] == gpu.session_id
        assert await gpu.device_count() == 2
        assert await gpu.get_device() == 0
        await gpu.set_device(1)
        assert await gpu.get_device() == 1
        props = await gpu.device_properties(1)
        assert props.total_memory == 64 << 20 and isinstance(props.arch, str) and props.name
        free, total = await gpu.mem_get_info()
        assert total == 64 << 20 and 0 < free <= total
        assert await gpu.ping() > 0
        with pytest.raises(hipr.HipError) as info_err:
            await gpu.set_device(2)
        assert info_err.value.code == E.hipErrorInvalidDevice
        assert info_err.value.name == "hipErrorInvalidDevice"


async def test_memory_round_trips(endpoint: Endpoint, worker: Worker) -> None:
    async with endpoint.aconnect() as gpu:
        host = np.arange(1000, dtype=np.float32)
        p = await gpu.malloc(host.nbytes)
        assert p.size == 4000 and int(p) % 4096 == 0 and int(p) != 0
        await gpu.memcpy_htod(p, host)
        back = np.frombuffer(await gpu.memcpy_dtoh(p, host.nbytes), dtype=np.float32)
        assert np.array_equal(back, host)
        out = np.zeros_like(host)
        assert await gpu.memcpy_dtoh(p, out=out) is out
        assert np.array_equal(out, host)
        await gpu.memset(p + 256, 0, 256)
        data = await gpu.memcpy_dtoh(p + 256, 256)
        assert data == b"\0" * 256
        q = await gpu.malloc(4000)
        await gpu.memcpy_dtod(q, p, 4000)
        assert await gpu.memcpy_dtoh(q, 4000) == await gpu.memcpy_dtoh(p, 4000)
        await gpu.memcpy_htod(p, bytearray(b"xyz"))
        await gpu.memcpy_htod(p + 3, memoryview(b"abc"))
        assert await gpu.memcpy_dtoh(p, 6) == b"xyzabc"
        r = await gpu.malloc_htod(b"hello")
        assert await gpu.memcpy_dtoh(r, 5) == b"hello"
        for ptr in (p, q, r):
            await gpu.free(ptr)


@pytest.mark.parametrize("size", [0, 1, 4097, (3 << 20) + 17])
async def test_copy_sizes_chunked_both_ways(endpoint: Endpoint, worker: Worker, size: int) -> None:
    async with endpoint.aconnect() as gpu:
        p = await gpu.malloc(max(size, 1) + 8)
        payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        await gpu.memcpy_htod(p + 8, payload)
        assert await gpu.memcpy_dtoh(p + 8, size) == payload
        await gpu.free(p)


async def test_downloads_of_several_chunks_reuse_buffers_without_mixing_them(
    endpoint: Endpoint, worker: Worker
) -> None:
    # Chunks of a streamed reply come from the connection's reused buffers: downloads
    # one after another, and two at once on one connection, each get their own bytes.
    size = 3 * (4 << 20) + 4099
    rng = np.random.default_rng(7)
    datas = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(3)]
    async with endpoint.aconnect() as gpu:
        ptrs = [await gpu.malloc(size) for _ in datas]
        for ptr, data in zip(ptrs, datas, strict=True):
            await gpu.memcpy_htod(ptr, data)
        for _ in range(2):
            for ptr, data in zip(ptrs, datas, strict=True):
                out = np.empty(size, np.uint8)
                await gpu.memcpy_dtoh(ptr, out=out)
                assert np.array_equal(out, data)
        outs = [np.empty(size, np.uint8) for _ in datas]
        async with anyio.create_task_group() as tasks:
            for ptr, out in zip(ptrs, outs, strict=True):
                tasks.start_soon(partial(gpu.memcpy_dtoh, ptr, out=out))
        for out, data in zip(outs, datas, strict=True):
            assert np.array_equal(out, data)


async def test_streams_events_async_copies(endpoint: Endpoint, worker: Worker) -> None:
    async with endpoint.aconnect() as gpu:
        p = await gpu.malloc(1 << 20)
        s = await gpu.stream_create()
        e0, e1 = await gpu.event_create(), await gpu.event_create()
        await e0.record(s)
        await gpu.memcpy_htod_async(p, b"\x07" * (1 << 20), stream=s)
        await e1.record(s)
        await e1.synchronize()
        await s.synchronize()
        assert await s.query() and await e1.query()
        ms = await gpu.event_elapsed_ms(e0, e1)
        assert ms >= 0 and await e0.elapsed_ms(e1) >= 0
        assert await gpu.memcpy_dtoh(p, 16, stream=s) == b"\x07" * 16
        await s.wait_event(e1)
        await gpu.synchronize()
        await e0.destroy()
        await e1.destroy()
        await s.destroy()
        await gpu.free(p)
        await gpu.synchronize()


async def test_builtin_kernel(endpoint: Endpoint, worker: Worker) -> None:
    async with endpoint.aconnect() as gpu:
        n = 1000
        a = np.arange(n, dtype=np.float32)
        b = np.full(n, 2.5, dtype=np.float32)
        pa, pb, pc = await gpu.malloc_htod(a), await gpu.malloc_htod(b), await gpu.malloc(a.nbytes)
        add = await gpu.builtin("vector_add_f32")
        await add.launch((n // 256 + 1,), (256,), [pc, pa, pb, np.uint64(n)])
        await gpu.synchronize()
        c = np.frombuffer(await gpu.memcpy_dtoh(pc, a.nbytes), dtype=np.float32)
        assert np.array_equal(c, a + b)


async def test_bad_input_gives_the_right_error_and_the_session_goes_on(
    endpoint: Endpoint, worker: Worker
) -> None:
    async with endpoint.aconnect() as gpu:
        p = await gpu.malloc(100)

        async def expect(code: int, coro: object) -> hipr.HipError:
            with pytest.raises(hipr.HipError) as err:
                await coro  # type: ignore[misc]
            assert err.value.code == code, err.value
            return err.value

        await expect(E.hipErrorInvalidValue, gpu.free(0xDEAD000))
        await expect(E.hipErrorInvalidValue, gpu.memcpy_dtoh(int(p) + 50, 51))
        await expect(E.hipErrorInvalidValue, gpu.memcpy_htod(int(p) + 99, b"ab"))
        await expect(E.hipErrorInvalidValue, gpu.memcpy_htod(int(p) - 1, b"a"))
        await expect(E.hipErrorInvalidValue, gpu.memset(int(p), 0, 2**64 - 1))
        await expect(E.hipErrorInvalidValue, gpu.malloc(-1))
        null = await gpu.malloc(0)  # HIP's answer to a zero-byte malloc: the null pointer
        assert (int(null), null.size) == (0, 0)
        await gpu.free(null)
        await expect(E.hipErrorOutOfMemory, gpu.malloc(1 << 40))
        await expect(E.hipErrorInvalidValue, gpu.memcpy_dtod(int(p), 0x1000, 4))
        # The client's own checks are bypassed by calling the wire directly.
        conn = gpu._conn
        from hipr.protocol.opcodes import Opcode

        await expect(E.hipErrorInvalidValue, conn.request(Opcode.MALLOC, {"size": -5}))
        await expect(E.hipErrorInvalidValue, conn.request(Opcode.MALLOC, {"size": "ten"}))
        await expect(E.hipErrorInvalidValue, conn.request(Opcode.MALLOC, {"size": 2**64}))
        await expect(E.hipErrorInvalidValue, conn.request(Opcode.MALLOC, [1, 2]))
        await expect(E.hipErrorInvalidValue, conn.request(Opcode.MEMSET, {"ptr": int(p)}))
        await expect(
            E.hipErrorInvalidValue,
            conn.request(Opcode.MEMCPY_HTOD, {"dst": int(p), "size": 10}, b"12345"),
        )
        await expect(
            E.hipErrorInvalidValue,
            conn.request(Opcode.MEMCPY_HTOD, {"dst": int(p), "size": 2}, b"12345"),
        )
        await expect(
            E.hipErrorInvalidHandle, conn.request(Opcode.STREAM_SYNCHRONIZE, {"stream": 99})
        )
        await expect(E.hipErrorInvalidHandle, conn.request(Opcode.EVENT_RECORD, {"event": 7}))
        await expect(E.hipErrorNotSupported, conn.request(0x7F01))  # type: ignore[arg-type]
        await expect(E.hipErrorNotFound, gpu.builtin("no_such_kernel"))
        await expect(E.hipErrorNotSupported, gpu.compile("__global__ void k() {}"))
        err = await expect(E.hipErrorInvalidValue, conn.request(Opcode.HELLO, {}))
        assert isinstance(err, hipr.ProtocolError)
        # ...and the session still works, with its memory intact.
        await gpu.memcpy_htod(p, b"still here")
        assert await gpu.memcpy_dtoh(p, 10) == b"still here"


async def test_plain_python_numbers_are_refused_as_kernel_args(
    endpoint: Endpoint, worker: Worker
) -> None:
    async with endpoint.aconnect() as gpu:
        fill = await gpu.builtin("fill_f32")
        p = await gpu.malloc(64)
        with pytest.raises(hipr.HipError, match="argument 1.*ambiguous C width"):
            await fill.launch(1, 16, [p, 1.0, np.uint64(16)])


async def test_fire_and_forget_error_surfaces_at_next_sync(
    endpoint: Endpoint, worker: Worker
) -> None:
    async with endpoint.aconnect() as gpu:
        fill = await gpu.builtin("fill_f32")
        p = await gpu.malloc(64)
        # n is larger than the allocation: the emulator faults like a GPU would.
        await fill.launch(1, 64, [p, np.float32(1), np.uint64(1 << 20)])
        with pytest.raises(hipr.HipError) as err:
            await gpu.synchronize()
        assert err.value.code == E.hipErrorIllegalAddress
        await gpu.synchronize()  # reported once, then cleared


async def test_graph_capture_and_explicit(endpoint: Endpoint, worker: Worker) -> None:
    async with endpoint.aconnect() as gpu:
        n = 256
        p = await gpu.malloc(n * 4)
        s = await gpu.stream_create()
        fill = await gpu.builtin("fill_f32")
        scale = await gpu.builtin("scale_f32")
        await s.begin_capture()
        await fill.launch(1, 256, [p, np.float32(3), np.uint64(n)], stream=s)
        await scale.launch(1, 256, [p, np.float32(2), np.uint64(n)], stream=s)
        g = await s.end_capture()
        ge = await g.instantiate()
        await ge.launch(s)
        await s.synchronize()
        out = np.frombuffer(await gpu.memcpy_dtoh(p, n * 4), dtype=np.float32)
        assert np.all(out == 6)
        g2 = await gpu.graph_create()
        a = await g2.add_memset(p, 0, n * 4)
        b = await g2.add_kernel(
            fill, 1, 256, [p, np.float32(5), np.uint64(n // 2)], dependencies=[a]
        )
        await g2.add_kernel(scale, 1, 256, [p, np.float32(2), np.uint64(n)], dependencies=[b])
        ge2 = await g2.instantiate()
        await ge2.launch()
        await gpu.synchronize()
        out = np.frombuffer(await gpu.memcpy_dtoh(p, n * 4), dtype=np.float32)
        assert np.all(out[: n // 2] == 10) and np.all(out[n // 2 :] == 0)
        for obj in (ge, ge2, g, g2):
            await obj.destroy()


async def test_vanished_client_is_freed_after_resume_grace(
    endpoint: Endpoint, worker: Worker, backend: EmulatorBackend
) -> None:
    """A client that drops its link and never comes back: after resume_grace, all is freed."""
    import dataclasses

    from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame

    worker.config = dataclasses.replace(worker.config, resume_grace=0.3)
    stream = await endpoint.raw()
    requests = [
        encode_frame(Opcode.HELLO, 0, Flags.NONE, {"client": "vanishing"}),
        encode_frame(Opcode.MALLOC, 1, Flags.NONE, {"size": 1000}),
        encode_frame(Opcode.STREAM_CREATE, 2),
        encode_frame(Opcode.EVENT_CREATE, 3),
        encode_frame(Opcode.GRAPH_CREATE, 4),
        encode_frame(Opcode.STREAM_CREATE, 5),
        encode_frame(Opcode.STREAM_BEGIN_CAPTURE, 6, Flags.NONE, {"stream": 2}),
    ]
    decoder = FrameDecoder()
    replies = 0
    with anyio.fail_after(10):
        await stream.send(b"".join(requests))
        while replies < len(requests):
            decoder.feed(await stream.receive())
            replies += len(list(decoder.frames()))
    assert not backend.stats().is_zero()
    await stream.aclose()
    with anyio.fail_after(10):
        while not backend.stats().is_zero() or worker.sessions:
            await anyio.sleep(0.01)


async def test_many_concurrent_sessions_are_isolated(
    endpoint: Endpoint, worker: Worker, backend: EmulatorBackend
) -> None:
    seen: dict[int, bytes] = {}

    async def client(i: int) -> None:
        async with endpoint.aconnect() as gpu:
            p = await gpu.malloc(4096)
            payload = bytes([i]) * 4096
            await gpu.memcpy_htod(p, payload)
            await anyio.sleep(0.01)
            seen[i] = await gpu.memcpy_dtoh(p, 4096)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(client, i)
    assert all(seen[i] == bytes([i]) * 4096 for i in range(16))
    with anyio.fail_after(5):
        while not backend.stats().is_zero():
            await anyio.sleep(0.01)


async def test_errors_in_the_block_reach_the_caller_unwrapped(
    endpoint: Endpoint, worker: Worker
) -> None:
    with pytest.raises(hipr.HipError) as err:
        async with endpoint.aconnect() as gpu:
            await gpu.free(0x1234)
    assert err.value.code == E.hipErrorInvalidValue
    with pytest.raises(KeyError):
        async with endpoint.aconnect():
            raise KeyError("the caller's own")


async def test_progress_callbacks_report_large_copies(endpoint: Endpoint, worker: Worker) -> None:
    size = (9 << 20) + 5  # more than two chunks
    seen_up: list[tuple[int, int]] = []
    seen_down: list[tuple[int, int]] = []
    async with endpoint.aconnect() as gpu:
        p = await gpu.malloc(size)
        await gpu.memcpy_htod(p, b"\x05" * size, progress=lambda d, t: seen_up.append((d, t)))
        data = await gpu.memcpy_dtoh(p, size, progress=lambda d, t: seen_down.append((d, t)))
    assert data == b"\x05" * size
    for seen in (seen_up, seen_down):
        assert seen and seen[-1] == (size, size)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)


async def test_closing_is_not_mistaken_for_a_dropped_link(
    endpoint: Endpoint, worker: Worker
) -> None:
    events: list[str] = []
    for _ in range(5):
        async with endpoint.aconnect(on_event=lambda kind, _: events.append(kind)) as gpu:
            await gpu.device_count()
    assert events == []


async def test_builtin_kernels_on_each_device(endpoint: Endpoint, worker: Worker) -> None:
    # The built-in module is loaded per device: a kernel loaded for device 0 cannot run
    # on device 1 (hipErrorInvalidDeviceFunction on a real GPU).
    async with endpoint.aconnect() as gpu:
        for device in range(await gpu.device_count()):
            await gpu.set_device(device)
            fill = await gpu.builtin("fill_f32")
            p = await gpu.malloc(64)
            await fill.launch(1, 16, [p, np.float32(device + 2), np.uint64(16)])
            await gpu.synchronize()
            out = np.frombuffer(await gpu.memcpy_dtoh(p, 64), dtype=np.float32)
            assert np.all(out == device + 2)
            await gpu.free(p)
