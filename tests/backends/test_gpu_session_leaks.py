"""Issue 34: what the cuda and hip backends leaked when clients misbehaved, on the
simulated runtimes of :mod:`tests.backends.test_gpu_backends_nogpu`.

The simulation runs in *poisoning* mode here: once a kernel or a copy touches memory
that is not allocated, every later driver call fails with the sticky error, frees and
destroys included, as a real CUDA or HIP context does. That is how the leaks showed on
the H200 host: a graph launched after its memory was freed wrote unmapped memory, the
context was lost, and every session's teardown was refused from then on.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import hipr
from hipr.testing.fault_backend import FaultBackend
from hipr.testing.fuzz_campaign import FuzzOptions, run_fuzz_campaign
from hipr.testing.harness import wait_for_no_sessions
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker
from tests.backends.test_gpu_backends_nogpu import SimGpu, _make

pytestmark = pytest.mark.anyio

#: Bytes of the buffers the tests write.
SIZE = 4096


@pytest.fixture(params=["cuda", "hip"])
def poisoning_sim(request: pytest.FixtureRequest) -> Iterator[tuple[Any, SimGpu]]:
    """A GPU backend over a simulated runtime whose faults poison the context."""
    backend, gpu = _make(str(request.param))
    gpu.poisoning = True
    yield backend, gpu


def _serving(backend: Any, where: Path) -> Any:
    return running_worker(WorkerConfig(resume_grace=0.0), backend, [f"unix://{where}/w.sock"])


def _assert_clean(backend: Any, gpu: SimGpu) -> None:
    """Nothing poisoned, nothing held: by the backend's books and by the runtime's own."""
    assert gpu.sticky == 0, f"a fault poisoned the simulated context ({gpu.sticky})"
    assert backend.stats().is_zero(), backend.stats()
    assert not gpu.mem, f"device memory still allocated: {sorted(gpu.mem)}"
    assert gpu.streams == [gpu.ptds], f"streams never destroyed: {gpu.streams[1:]}"


async def test_a_graph_launched_after_its_memory_was_freed_writes_memory_still_held(
    poisoning_sim: tuple[Any, SimGpu], anyio_backend: str, short_tmp: Path
) -> None:
    """The free of memory a graph writes waits for the graph: launched afterwards, it
    writes memory the session still holds (not another tenant's, not unmapped memory,
    whose fault poisoned the context and refused every session's releases)."""
    backend, gpu = poisoning_sim
    pattern = bytes(range(256)) * (SIZE // 256)
    with anyio.fail_after(30):
        async with _serving(backend, short_tmp) as worker:
            url = worker.bound_urls[0]
            async with hipr.aconnect(url) as alice, hipr.aconnect(url) as bob:
                a = await alice.malloc(SIZE)
                graph = await alice.graph_create()
                await graph.add_memset(a, 7, SIZE)
                exe = await graph.instantiate()
                await alice.free(a)
                assert int(a) in gpu.mem, "freed at once: the graph would write freed memory"
                b = await bob.malloc(SIZE)
                await bob.memcpy_htod(b, pattern)
                await exe.launch()
                await alice.synchronize()
                assert await bob.memcpy_dtoh(b, SIZE) == pattern
                assert gpu.read(int(a), SIZE) == bytes([7]) * SIZE
                await exe.destroy()
                await alice.synchronize()
                assert int(a) in gpu.mem, "the graph itself still writes it"
                await graph.destroy()
                await alice.synchronize()
                assert int(a) not in gpu.mem, "freed once no graph writes it"
                await bob.free(b)
            assert await wait_for_no_sessions(worker)
            _assert_clean(backend, gpu)


async def test_a_captured_graph_keeps_the_memory_it_recorded(
    poisoning_sim: tuple[Any, SimGpu], anyio_backend: str, short_tmp: Path
) -> None:
    """The same through a stream capture, and a free made while the capture ran (it may
    be recording work on that memory): both wait for the graph, and the session's end
    frees them even though the client never destroyed its graph."""
    backend, gpu = poisoning_sim
    with anyio.fail_after(30):
        async with _serving(backend, short_tmp) as worker:
            async with hipr.aconnect(worker.bound_urls[0]) as gpu_client:
                a = await gpu_client.malloc(SIZE)
                b = await gpu_client.malloc(SIZE)
                stream = await gpu_client.stream_create()
                await stream.begin_capture()
                await gpu_client.memset(a, 3, SIZE, stream=stream)
                await gpu_client.free(b)  # during the capture
                graph = await stream.end_capture()
                assert int(b) in gpu.mem
                exe = await graph.instantiate()
                await gpu_client.free(a)
                await exe.launch(stream)
                await stream.synchronize()
                assert gpu.read(int(a), SIZE) == bytes([3]) * SIZE
                assert int(a) in gpu.mem and int(b) in gpu.mem
                await stream.destroy()
                # No destroy of the graph or its instantiation: the teardown frees all.
            assert await wait_for_no_sessions(worker)
            _assert_clean(backend, gpu)


async def test_a_failed_capture_lets_go_of_what_was_freed_during_it(
    poisoning_sim: tuple[Any, SimGpu], anyio_backend: str, short_tmp: Path
) -> None:
    backend, gpu = poisoning_sim
    with anyio.fail_after(30):
        async with _serving(backend, short_tmp) as worker:
            async with hipr.aconnect(worker.bound_urls[0]) as client:
                a = await client.malloc(SIZE)
                stream = await client.stream_create()
                await stream.begin_capture()
                await client.free(a)
                assert int(a) in gpu.mem
                # The runtime loses the capture (as an invalidated one ends in an error).
                next(s for s in gpu.streams if s.capture is not None).capture = None
                with pytest.raises(hipr.HipError):
                    await stream.end_capture()
                assert int(a) not in gpu.mem
                await stream.destroy()
            assert await wait_for_no_sessions(worker)
            _assert_clean(backend, gpu)


async def test_a_session_over_a_fault_injecting_backend_destroys_its_default_stream(
    poisoning_sim: tuple[Any, SimGpu], anyio_backend: str, short_tmp: Path
) -> None:
    """FaultBackend hid the GPU backend's release_thread, so every session of a fault
    campaign left its thread's default stream behind in the runtime (not in stats())."""
    backend, gpu = poisoning_sim
    faulty = FaultBackend(backend, probability=0.0)
    with anyio.fail_after(30):
        async with _serving(faulty, short_tmp) as worker:
            for _ in range(3):
                async with hipr.aconnect(worker.bound_urls[0]) as client:
                    a = await client.malloc(SIZE)
                    await client.memset(a, 1, SIZE)  # on the thread's default stream
                    assert await client.memcpy_dtoh(a, 4) == b"\1" * 4
                    await client.free(a)
            assert await wait_for_no_sessions(worker)
            _assert_clean(backend, gpu)


#: Frames per event loop: a bounded share of the GPU campaign, on every change.
CI_FRAMES = {"trio": 3000, "asyncio": 1500}


async def test_the_fuzz_campaign_leaves_a_gpu_backend_as_it_found_it(
    poisoning_sim: tuple[Any, SimGpu], anyio_backend: str, short_tmp: Path
) -> None:
    """The campaign that found the leaks on the H200, against the simulated runtime: its
    well-behaved client shares the one device with the fuzzers, whose kernels stay in
    their allocations; no fault, no leak in the backend's books or the runtime's."""
    backend, gpu = poisoning_sim
    report = await run_fuzz_campaign(
        FuzzOptions(
            seed=34,
            frames=CI_FRAMES[anyio_backend],
            concurrency=4,
            listen=f"unix://{short_tmp}/f.sock",
        ),
        backend,
        trace=True,
    )
    assert report.ok, report.summary() + "\n" + "\n".join(report.trace)
    assert (report.devices, report.good_device, report.kernel_faults) == (1, 0, False)
    assert report.good_verified > 0
    assert gpu.sticky == 0
    assert not gpu.mem and gpu.streams == [gpu.ptds]
    backend.close()
    assert not gpu.host, "pinned host memory left after the backend closed"


def test_sim_poisoning_refuses_every_release_as_a_real_context_does(
    poisoning_sim: tuple[Any, SimGpu],
) -> None:
    """What made the leak: the mode the tests above run in, shown on the backend alone."""
    backend, gpu = poisoning_sim
    backend.bind_thread(0)
    a = backend.malloc(SIZE)
    stream = backend.stream_create()
    fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
    backend.launch(fill, (1, 1, 1), (32, 1, 1), 0, None, struct.pack("<Qf4xQ", 0x10, 1.0, 4))
    with pytest.raises(hipr.HipError):
        backend.synchronize()
    assert gpu.sticky
    with pytest.raises(hipr.HipError):
        backend.free(a)
    with pytest.raises(hipr.HipError):
        backend.stream_destroy(stream)
    assert backend.stats().allocations == 1 and backend.stats().streams == 1
