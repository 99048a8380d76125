"""One async client over three workers (1, 2 and 3 emulated devices): numbering,
routing, mixing errors, copies across workers, placement; under trio and asyncio."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

import hipr
from hipr.client import multi
from hipr.errors import HipErrorCode
from tests.multi.conftest import ADMIN, FAST, Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_devices_are_one_list_in_url_order(fleet: Fleet) -> None:
    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls) as gpu:
            assert isinstance(gpu, hipr.AsyncMultiGpu)
            assert await gpu.device_count() == 6
            owners = [gpu.worker_of(d).url for d in range(6)]
            assert owners == [fleet.urls[0]] + [fleet.urls[1]] * 2 + [fleet.urls[2]] * 3
            for device in range(6):
                await gpu.set_device(device)
                assert await gpu.get_device() == device
                props = await gpu.device_properties(device)
                assert props.name
            with pytest.raises(hipr.HipError) as err:
                await gpu.set_device(6)
            assert err.value.code == HipErrorCode.hipErrorInvalidDevice
            assert "6 devices" in str(err.value)


async def test_comma_string_and_hipr_url(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    with anyio.fail_after(30):
        async with hipr.aconnect(",".join(fleet.urls[:2])) as gpu:
            assert await gpu.device_count() == 3
        monkeypatch.setenv("HIPR_URL", f"{fleet.urls[2]}, {fleet.urls[0]}")
        async with hipr.aconnect() as gpu:
            assert await gpu.device_count() == 4
            assert gpu.worker_of(0).url == fleet.urls[2]
        monkeypatch.setenv("HIPR_URL", fleet.urls[1])
        async with hipr.aconnect() as single:
            assert isinstance(single, hipr.AsyncGpu)


async def test_calls_go_to_the_current_devices_worker(fleet: Fleet) -> None:
    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls) as gpu:
            ptrs = []
            for device in range(6):
                await gpu.set_device(device)
                ptrs.append(await gpu.malloc_htod(np.full(64, device, dtype=np.uint8)))
            # Each allocation is in its worker's session, on the right local device.
            for device, ptr in enumerate(ptrs):
                slot = gpu.worker_of(ptr)
                assert slot is gpu.worker_of(device)
                worker = fleet.workers[slot.index]
                (session,) = worker.sessions.values()
                assert session.allocations.containing(int(ptr)) is not None
            # Calls on objects follow the object, whatever device is current.
            await gpu.set_device(0)
            for device, ptr in enumerate(ptrs):
                data = await gpu.memcpy_dtoh(ptr)
                assert data == bytes([device]) * 64
            locals_ = [s.device for w in fleet.workers for s in w.sessions.values()]
            assert locals_ == [0, 1, 2]  # each session's current device: the last one set


async def test_streams_kernels_events_and_graphs_stay_on_their_worker(fleet: Fleet) -> None:
    n = 256
    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls) as gpu:
            await gpu.set_device(4)
            p = await gpu.malloc(n * 4)
            s = await gpu.stream_create()
            fill = await gpu.builtin("fill_f32")
            scale = await gpu.builtin("scale_f32")
            start, end = await gpu.event_create(), await gpu.event_create()
            await gpu.set_device(0)  # the handles still go to device 4's worker
            await start.record(s)
            await fill.launch(1, 256, [p, np.float32(3), np.uint64(n)], stream=s)
            await end.record(s)
            await s.synchronize()
            assert await start.elapsed_ms(end) >= 0
            assert await gpu.event_elapsed_ms(start, end) >= 0
            await s.begin_capture()
            await scale.launch(1, 256, [p + 0, np.float32(2), np.uint64(n)], stream=s)
            graph = await s.end_capture()
            node = await graph.add_memset(p, 0, 0)
            assert node.worker is gpu.worker_of(4)
            exec_ = await graph.instantiate()
            await exec_.launch(s)
            await s.synchronize()
            out = np.frombuffer(await gpu.memcpy_dtoh(p), dtype=np.float32)
            assert np.all(out == 6)
            assert fleet.urls[2] in repr(s) and fleet.urls[2] in repr(p)


async def test_mixing_two_workers_objects_names_both(fleet: Fleet) -> None:
    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls) as gpu:
            a = await gpu.malloc(64)
            stream_a = await gpu.stream_create()
            fill_a = await gpu.builtin("fill_f32")
            await gpu.set_device(3)
            b = await gpu.malloc(64)
            stream_b = await gpu.stream_create()
            event_b = await gpu.event_create()
            graph_b = await gpu.graph_create()
            calls = [
                gpu.memcpy_htod_async(a, b"x" * 8, stream_b),
                gpu.memset(b, 1, 8, stream_a),
                gpu.memcpy_dtoh(a, 8, stream=stream_b),
                fill_a.launch(1, 16, [b, np.float32(1), np.uint64(16)]),
                fill_a.launch(1, 16, [a, np.float32(1), np.uint64(16)], stream=stream_b),
                event_b.record(stream_a),
                stream_a.wait_event(event_b),
                graph_b.add_memset(a, 0, 8),
                graph_b.add_kernel(fill_a, 1, 16, [b, np.float32(1), np.uint64(16)]),
                gpu.memcpy_dtod(a, b, 8, stream=await _other_stream(gpu)),
            ]
            for call in calls:
                with pytest.raises(hipr.HipError) as err:
                    await call
                assert err.value.code == HipErrorCode.hipErrorInvalidValue, err.value
                message = str(err.value)
                assert fleet.urls[0] in message and fleet.urls[2] in message, message
            # Nothing was sent: both sessions are fine.
            await gpu.memcpy_htod_async(a, b"a" * 8, stream_a)
            await gpu.memcpy_htod_async(b, b"b" * 8, stream_b)
            await stream_a.synchronize()
            await stream_b.synchronize()
            assert await gpu.memcpy_dtoh(a, 8) == b"a" * 8


async def _other_stream(gpu: hipr.AsyncMultiGpu) -> object:
    """A stream of the middle worker: neither side of a copy between the others."""
    await gpu.set_device(1)
    s = await gpu.stream_create()
    await gpu.set_device(3)
    return s


async def test_memcpy_dtod_across_workers_goes_through_the_client(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(multi, "COPY_CHUNK_BYTES", 4096)  # several chunks
    data = np.random.default_rng(1).integers(0, 255, 10_000, dtype=np.uint8)
    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls) as gpu:
            src = await gpu.malloc_htod(data)
            await gpu.set_device(5)
            dst = await gpu.malloc(10_000)
            s_dst = await gpu.stream_create()
            await gpu.memcpy_dtod(dst, src, 10_000)
            assert await gpu.memcpy_dtoh(dst) == data.tobytes()
            # Offsets, and a stream on the destination side.
            await gpu.memset(dst, 0, 10_000)
            await gpu.memcpy_dtod(dst + 100, src + 50, 5000, s_dst)
            await s_dst.synchronize()
            back = await gpu.memcpy_dtoh(dst)
            assert back[100:5100] == data.tobytes()[50:5050] and back[:100] == bytes(100)
            # Within one worker the worker copies; memcpy_peer between its devices too.
            await gpu.set_device(3)
            other = await gpu.malloc(10_000)
            await gpu.memcpy_peer(other, 3, dst, 5, 10_000)
            assert await gpu.memcpy_dtoh(other) == back
            await gpu.memcpy_peer(other, 3, src, 0, 10_000)
            assert await gpu.memcpy_dtoh(other) == data.tobytes()
            with pytest.raises(hipr.HipError, match="do not fit"):
                await gpu.memcpy_dtod(src, other, 20_000)


async def test_program_for_one_worker_runs_on_three(fleet: Fleet) -> None:
    async def program(gpu: hipr.AsyncGpu | hipr.AsyncMultiGpu) -> list[bytes]:
        results = []
        for device in range(await gpu.device_count()):
            await gpu.set_device(device)
            x = await gpu.malloc_htod(bytes(range(device, device + 64)))
            y = await gpu.malloc(64)
            s = await gpu.stream_create()
            await gpu.memset(y, 0, 64, s)
            await gpu.memcpy_dtod(y + 8, x, 32, s)
            await s.synchronize()
            results.append(await gpu.memcpy_dtoh(y))
            await gpu.free(x)
            await gpu.free(y)
        return results

    def expected(count: int) -> list[bytes]:
        return [bytes(8) + bytes(range(d, d + 32)) + bytes(24) for d in range(count)]

    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls[2]) as one:
            assert await program(one) == expected(3)
        async with hipr.aconnect(fleet.urls) as three:
            assert await program(three) == expected(6)


async def test_pick_device_by_free_memory_and_sessions(fleet: Fleet) -> None:
    with anyio.fail_after(30):
        async with hipr.aconnect(fleet.urls, link=FAST) as gpu:
            # Fill all but device 4: it has the most free memory.
            for device in (0, 1, 2, 3, 5):
                await gpu.set_device(device)
                await gpu.malloc(8 << 20)
            await gpu.set_device(1)
            assert await hipr.apick_device(gpu, select=False) == 4
            assert await gpu.get_device() == 1  # select=False leaves the current device
            loads = await hipr.client.placement.arank_devices(gpu)
            assert loads[0].device == 4 and loads[0].sessions is None
            # Another session working on device 4: with the admin token, it is avoided.
            async with hipr.aconnect(fleet.urls[2]) as other:
                await other.set_device(1)
                choice = await hipr.apick_device(gpu, admin_token=ADMIN)
                assert choice != 4 and await gpu.get_device() == choice
            with pytest.raises(hipr.HipError) as err:
                await hipr.apick_device(gpu, min_free=1 << 40)
            assert err.value.code == HipErrorCode.hipErrorOutOfMemory
        async with hipr.aconnect(fleet.urls[1]) as single:
            await single.malloc(8 << 20)
            assert await hipr.apick_device(single) == 1
            assert await single.get_device() == 1


async def test_an_unreachable_worker_fails_the_connect_naming_it(fleet: Fleet) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    with anyio.fail_after(30):
        with pytest.raises(hipr.HipConnectionError) as err:
            async with hipr.aconnect([fleet.urls[0], dead], timeout=5):
                pass  # pragma: no cover
        assert dead.removeprefix("tcp://") in str(err.value)
        # The first worker's session was closed again.
        with anyio.fail_after(5):
            while fleet.workers[0].sessions:
                await anyio.sleep(0.02)
