"""Memory mistakes get messages that name the mistake: an overrun says it overruns its
allocation (sizes and offset), a zero-byte malloc is HIP's null pointer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipErrorCode as E
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture
async def url(anyio_backend: str) -> AsyncIterator[str]:
    backend = EmulatorBackend(device_count=1, total_memory=16 << 20)
    async with running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker:
        yield worker.bound_urls[0]


async def test_dtod_overrun_says_it_overruns_the_destination(url: str) -> None:
    async with hipr.aconnect(url) as gpu:
        src = await gpu.malloc(1024)
        dst = await gpu.malloc(512)
        # Typed pointers: the client knows the sizes and refuses before sending.
        with pytest.raises(hipr.HipError) as err:
            await gpu.memcpy_dtod(dst, src, 1024)
        assert err.value.code == E.hipErrorInvalidValue
        assert "overruns the destination allocation" in err.value.message
        assert "512" in err.value.message and "1024" in err.value.message
        assert "not inside an allocation" not in err.value.message
        # Bare addresses: the worker checks, and says the same, with the offset.
        with pytest.raises(hipr.HipError) as err:
            # Reported by the call or, were it sent fire-and-forget, by the synchronize.
            await gpu.memcpy_dtod(int(dst) + 256, int(src), 512)
            await gpu.synchronize()
        message = err.value.message
        assert "destination" in message and "overruns its allocation" in message
        assert "holds 512 bytes" in message and "offset 256" in message
        assert "needs 512 (256 bytes too many)" in message
        # An address in no allocation still says so, as before.
        with pytest.raises(hipr.HipError, match="not inside an allocation"):
            await gpu.memcpy_dtod(0x10, int(src), 4)
            await gpu.synchronize()


async def test_malloc_zero_is_the_null_pointer(url: str) -> None:
    async with hipr.aconnect(url) as gpu:
        null = await gpu.malloc(0)
        assert (int(null), null.size) == (0, 0)
        await gpu.free(null)  # hipFree(nullptr) succeeds
        # The wire agrees, for clients that are not this one (the proxy runtimes).
        reply, _ = await gpu._conn.request(Opcode.MALLOC, {"size": 0})
        assert reply == {"ptr": 0}
        await gpu._conn.request(Opcode.FREE, {"ptr": 0})
        await gpu.synchronize()
        free, total = await gpu.mem_get_info()
        assert free == total  # nothing was allocated


@pytest.fixture
def thread_url() -> Iterator[str]:
    """A worker on a thread of its own, for synchronous clients."""
    backend = EmulatorBackend(device_count=1, total_memory=16 << 20)
    with worker_in_thread(WorkerConfig(), backend, loop="asyncio") as worker:
        yield worker.bound_urls[0]


def test_malloc_zero_sync_matches_the_facade(thread_url: str) -> None:
    from hipr import hip

    url = thread_url
    with hipr.connect(url) as gpu:
        null = gpu.malloc(0)
        assert int(null) == 0
        gpu.free(null)
    hip.connect(url)
    try:
        err, ptr = hip.hipMalloc(0)
        assert err == hip.hipError_t.hipSuccess and int(ptr) == 0
    finally:
        hip.disconnect()
