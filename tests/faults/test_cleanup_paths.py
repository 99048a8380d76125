"""Every way a session can end frees everything it held (issue 6's cleanup paths).

Each test makes a session hold one of every kind of resource, ends it one way, and
checks that the backend is back at its baseline, no session is registered, and the
worker logged no crash.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError, HipErrorCode, QuotaError
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.testing import LogWatch, leaks, wait_for_no_sessions
from hipr.testing.fuzz import hello_frame
from hipr.testing.harness import RawClient, raw_connect, write_tenants
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker
from tests.faults.conftest import Faulty

pytestmark = pytest.mark.anyio


async def hold_everything(client: RawClient) -> int:
    """One of every resource, a capture left open, a graph, an executable graph; the
    address of a 4 KiB allocation."""
    ptr = (await client.call(Opcode.MALLOC, {"size": 4096}))["ptr"]
    await client.call(Opcode.MALLOC_HTOD, {"size": 5}, b"hello")
    stream = (await client.call(Opcode.STREAM_CREATE))["stream"]
    capturing = (await client.call(Opcode.STREAM_CREATE))["stream"]
    await client.call(Opcode.EVENT_CREATE)
    await client.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"})
    graph = (await client.call(Opcode.GRAPH_CREATE))["graph"]
    await client.call(
        Opcode.GRAPH_ADD_MEMSET,
        {"graph": graph, "dependencies": [], "ptr": ptr, "value": 1, "size": 64},
    )
    await client.call(Opcode.GRAPH_INSTANTIATE, {"graph": graph})
    await client.call(Opcode.STREAM_BEGIN_CAPTURE, {"stream": capturing})
    await client.call(Opcode.MEMSET, {"ptr": ptr, "value": 2, "size": 16, "stream": capturing})
    await client.call(Opcode.MEMSET, {"ptr": ptr, "value": 3, "size": 16, "stream": stream})
    return int(ptr)


async def test_connection_closed_without_goodbye(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    await hold_everything(client)
    assert faulty.backend.stats().allocations > faulty.baseline.allocations
    await client.aclose()
    await faulty.assert_clean()


async def test_end_of_stream_after_requests(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    await hold_everything(client)
    await client.stream.send_eof()
    assert await client.closed_by_peer()
    await client.aclose()
    await faulty.assert_clean()


async def test_reset_in_the_middle_of_a_copy_to_the_device(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    ptr = await hold_everything(client)
    await client.send(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 4096}, b"x" * 1000, Flags.MORE)
    await client.send(Opcode.DATA, None, b"y" * 1000, Flags.MORE, request_id=client._next_id - 1)
    await anyio.sleep(0.05)
    await client.reset()
    await faulty.assert_clean()


async def test_reset_in_the_middle_of_a_malloc_htod(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    await hold_everything(client)
    await client.send(Opcode.MALLOC_HTOD, {"size": 1 << 20}, b"x" * 4096, Flags.MORE)
    await anyio.sleep(0.05)
    await client.reset()
    await faulty.assert_clean()


async def test_reset_while_a_large_read_streams_back(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    await hold_everything(client)
    big = (await client.call(Opcode.MALLOC, {"size": 16 << 20}))["ptr"]
    await client.send(Opcode.MEMCPY_DTOH, {"src": big, "size": 16 << 20})
    await client.stream.receive()  # the first bytes of the reply
    await client.reset()
    await faulty.assert_clean()


async def test_handshake_aborted(faulty: Faulty) -> None:
    hello = RawClient(await raw_connect(faulty.url))
    # Half a HELLO, then gone.
    await hello.stream.send(hello_frame(1, None)[:30])
    await hello.aclose()
    # A whole HELLO, gone before the reply is read.
    gone = RawClient(await raw_connect(faulty.url))
    await gone.stream.send(hello_frame(1, None))
    await gone.reset()
    # A HELLO of the wrong protocol major.
    wrong = RawClient(await raw_connect(faulty.url))
    await wrong.stream.send(
        encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "x"}, version=0x0900)
    )
    assert await wrong.closed_by_peer()
    await wrong.aclose()
    # Silent until the handshake timeout.
    faulty.worker.handshake_timeout = 0.2
    silent = RawClient(await raw_connect(faulty.url))
    assert await silent.closed_by_peer(timeout=5)
    await silent.aclose()
    await faulty.assert_clean()


async def test_exception_inside_handlers_via_gpu_thread_crashes(faulty: Faulty) -> None:
    crashing = [
        ("malloc", Opcode.MALLOC, {"size": 64}),
        ("stream_create", Opcode.STREAM_CREATE, None),
        ("event_create", Opcode.EVENT_CREATE, None),
        ("graph_create", Opcode.GRAPH_CREATE, None),
        ("mem_get_info", Opcode.MEM_GET_INFO, None),
        ("device_count", Opcode.DEVICE_COUNT, None),
    ]
    client = await RawClient.open(faulty.url)
    ptr = await hold_everything(client)
    for method, opcode, args in crashing:
        faulty.backend.fail_next(method, crash=True)
        with pytest.raises(HipError) as info:
            await client.call(opcode, args)
        assert info.value.code == HipErrorCode.hipErrorUnknown
        assert "internal error" in info.value.message and "InjectedCrash" in info.value.message
        # The session goes on.
        assert (await client.call(Opcode.DEVICE_COUNT))["count"] == 2
    for method, opcode, args, bulk in [
        ("memcpy_htod", Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 8}, b"12345678"),
        ("memcpy_dtoh", Opcode.MEMCPY_DTOH, {"src": ptr, "size": 8}, b""),
        ("memset", Opcode.MEMSET, {"ptr": ptr, "value": 0, "size": 8}, b""),
        ("malloc", Opcode.MALLOC_HTOD, {"size": 8}, b"12345678"),
        ("memcpy_htod", Opcode.MALLOC_HTOD, {"size": 8}, b"12345678"),
    ]:
        faulty.backend.fail_next(method, crash=True)
        with pytest.raises(HipError, match="internal error"):
            await client.call(opcode, args, bulk)
    assert faulty.watch.expected >= len(crashing)
    await client.call(Opcode.GOODBYE)
    await client.aclose()
    await faulty.assert_clean()


async def test_a_fire_and_forget_crash_is_reported_by_the_next_call(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    ptr = await hold_everything(client)
    faulty.backend.fail_next("memset", crash=True)
    await client.send(Opcode.MEMSET, {"ptr": ptr, "value": 9, "size": 8}, flags=Flags.NO_REPLY)
    with pytest.raises(HipError, match="internal error in MEMSET"):
        await client.call(Opcode.DEVICE_SYNCHRONIZE)
    await client.call(Opcode.DEVICE_SYNCHRONIZE)
    await client.aclose()
    await faulty.assert_clean()


async def test_failed_releases_at_teardown_free_all_the_rest(faulty: Faulty) -> None:
    client = await RawClient.open(faulty.url)
    await hold_everything(client)
    faulty.backend.fail_next("free")
    faulty.backend.fail_next("stream_destroy", crash=True)
    await client.aclose()
    assert await wait_for_no_sessions(faulty.worker)
    # Exactly what the runtime refused to free is still held; nothing else.
    left = faulty.backend.stats()
    assert left.allocations == faulty.baseline.allocations + 1
    assert left.streams == faulty.baseline.streams + 1
    assert (left.events, left.graphs, left.graph_execs) == (
        faulty.baseline.events,
        faulty.baseline.graphs,
        faulty.baseline.graph_execs,
    )
    assert faulty.watch.crashes == []
    assert faulty.watch.events["release failed"] == 2


async def test_quota_refusals_leave_nothing_behind(anyio_backend: str, tmp_path: Path) -> None:
    tenants = write_tenants(
        tmp_path,
        fuzz_memory=1 << 20,
        fuzz_sessions=2,
        extra="max_device_memory = 1048576\nmax_streams = 1\nmax_events = 1\n"
        "max_graphs = 1\nmax_sessions = 1\nmax_request_rate = 1\nmax_request_burst = 30\n",
    )
    backend = EmulatorBackend(total_memory=64 << 20)
    config = WorkerConfig(resume_grace=0.0, tenants_file=tenants.path, isolation="none")
    watch = LogWatch()
    with watch.installed():
        async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as worker:
            url = worker.bound_urls[0]
            async with hipr.aconnect(url, token=tenants.good_token) as gpu:
                p = await gpu.malloc(1 << 19)
                with pytest.raises(HipError) as info:
                    await gpu.malloc(1 << 20)
                assert info.value.code == HipErrorCode.hipErrorOutOfMemory
                await gpu.stream_create()
                with pytest.raises(QuotaError):
                    await gpu.stream_create()
                await gpu.event_create()
                with pytest.raises(QuotaError):
                    await gpu.event_create()
                await gpu.graph_create()
                with pytest.raises(QuotaError):
                    await gpu.graph_create()
                with pytest.raises(QuotaError):
                    async with hipr.aconnect(url, token=tenants.good_token):
                        pass
                with pytest.raises(QuotaError):
                    for _ in range(100):
                        await gpu.get_device()
                del p
            assert await wait_for_no_sessions(worker)
            assert leaks(backend, worker) == []
            state = worker._tenant_state["good"]
            assert state.reserved_memory == 0 and state.inflight_bytes == 0
            assert watch.crashes == []


async def test_worker_shutdown_frees_every_session(anyio_backend: str) -> None:
    """Cancelling ``running_worker`` with sessions idle, mid-copy and mid-read."""
    backend = EmulatorBackend(device_count=2, total_memory=256 << 20)
    watch = LogWatch()
    clients: list[RawClient] = []
    with watch.installed():
        async with running_worker(
            WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]
        ) as worker:
            for _ in range(3):
                client = await RawClient.open(worker.bound_urls[0])
                clients.append(client)
                await hold_everything(client)
            _idle, copying, reading = clients
            ptr = (await copying.call(Opcode.MALLOC, {"size": 1 << 20}))["ptr"]
            await copying.send(
                Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 1 << 20}, b"x" * 100, Flags.MORE
            )
            big = (await reading.call(Opcode.MALLOC, {"size": 64 << 20}))["ptr"]
            await reading.send(Opcode.MEMCPY_DTOH, {"src": big, "size": 64 << 20})
            await anyio.sleep(0.05)
            assert len(worker.sessions) == 3
    for client in clients:
        await client.aclose()
    assert worker.sessions == {}
    assert backend.stats().is_zero(), backend.stats()
    assert watch.crashes == []


async def test_a_silent_link_times_out_and_frees_its_session(anyio_backend: str) -> None:
    backend = EmulatorBackend()
    config = WorkerConfig(resume_grace=0.0, heartbeat_interval=0.1, heartbeat_timeout=0.4)
    watch = LogWatch()
    with watch.installed():
        async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as worker:
            client = await RawClient.open(worker.bound_urls[0])
            await hold_everything(client)
            # Says nothing more, answers no heartbeat: the worker must give up on it.
            assert await client.closed_by_peer(timeout=5)
            await client.aclose()
            assert await wait_for_no_sessions(worker)
            assert leaks(backend, worker) == []
    assert watch.crashes == []
