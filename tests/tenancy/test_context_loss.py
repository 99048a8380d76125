"""A kernel fault that poisons the GPU context (issue 35), on the emulator.

The emulator's ``copy_from_address_u8`` builtin reads an address given as a plain
integer, as a hostile or buggy kernel does: outside every allocation of its process it
poisons the context, sticky as CUDA's illegal address is. These tests check that the
default configuration with two tenants keeps them apart (bob cannot read alice's bytes,
and bob's fault leaves alice working), that the faulting session gets ContextLostError
once, and that new sessions work after the worker rebuilt the context or restarted the
tenant's process.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.client.connection import LinkOptions
from hipr.errors import HipErrorCode
from hipr.testing.harness import worker_with_children
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import new_token, token_hash

pytestmark = pytest.mark.anyio

ALICE, BOB = new_token(), new_token()
LINK = LinkOptions(
    heartbeat_interval=0.2,
    heartbeat_timeout=1.0,
    reconnect_delay=0.02,
    reconnect_max_delay=0.2,
    reconnect_timeout=5.0,
    reconnect_attempts=10,
)
SECRET = b"alice's secret bytes".ljust(64, b"!")


def _tenants(directory: Path) -> Path:
    tenants = directory / "tenants.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(ALICE)}"]\n'
        f'[tenants.bob]\ntokens = ["{token_hash(BOB)}"]\n'
    )
    return tenants


@pytest.fixture
async def default_worker(anyio_backend: str, short_tmp: Path) -> AsyncIterator[Worker]:
    """Two tenants, isolation left at its default."""
    config = WorkerConfig(tenants_file=_tenants(short_tmp), log_level="warning")
    async with worker_with_children(config) as worker:
        yield worker


@pytest.fixture
async def shared_worker(anyio_backend: str, short_tmp: Path) -> AsyncIterator[Worker]:
    """Two tenants in one process: the operator opted out of isolation."""
    config = WorkerConfig(tenants_file=_tenants(short_tmp), isolation="none", log_level="warning")
    async with running_worker(config, EmulatorBackend(), ["tcp://127.0.0.1:0"]) as worker:
        yield worker


async def _raw_read(gpu: hipr.AsyncGpu, address: int, n: int) -> bytes:
    """Bob's attempt: a kernel copies ``n`` bytes from ``address`` (a plain integer)."""
    out = await gpu.malloc(n)
    kernel = await gpu.builtin("copy_from_address_u8")
    await kernel.launch((1,), (64,), [out, np.uint64(address), np.uint64(n)])
    await gpu.synchronize()
    return await gpu.memcpy_dtoh(out, n)


async def _alice_secret(gpu: hipr.AsyncGpu) -> int:
    # A few allocations first, so that the secret does not sit at the first address of
    # a fresh process (where bob's own first allocation would be).
    for _ in range(4):
        await gpu.malloc(1 << 20)
    return int(await gpu.malloc_htod(SECRET))


async def test_default_config_isolates_two_tenants(default_worker: Worker) -> None:
    assert default_worker.isolation_mode == "process"
    assert default_worker.shared_tenants == 0


async def test_bob_cannot_read_alices_bytes_by_address(default_worker: Worker) -> None:
    url = default_worker.bound_urls[0]
    with anyio.fail_after(60):
        async with (
            hipr.aconnect(url, token=ALICE, link=LINK) as alice,
            hipr.aconnect(url, token=BOB, link=LINK) as bob,
        ):
            secret = await _alice_secret(alice)
            with pytest.raises(hipr.ContextLostError) as lost:
                stolen = await _raw_read(bob, secret, len(SECRET))
                assert stolen != SECRET  # not reached: the read faults in bob's process
            assert lost.value.code == HipErrorCode.hipErrorIllegalAddress
            assert "context was lost" in lost.value.message
            assert await alice.memcpy_dtoh(secret, len(SECRET)) == SECRET


async def test_bobs_fault_leaves_alice_working_and_bob_recovers(default_worker: Worker) -> None:
    url = default_worker.bound_urls[0]
    isolation = default_worker.isolation
    assert isolation is not None
    with anyio.fail_after(60):
        async with hipr.aconnect(url, token=ALICE, link=LINK) as alice:
            secret = await _alice_secret(alice)
            bob_stack = AsyncExitStack()
            bob = await bob_stack.enter_async_context(hipr.aconnect(url, token=BOB, link=LINK))
            bob_pid = isolation.child_pid("bob")
            kept = await bob.malloc_htod(b"bob's data")
            with pytest.raises(hipr.ContextLostError) as lost:
                await _raw_read(bob, 0x10, 16)
            assert lost.value.details.get("own_fault") is True
            # Once: later calls of that session say the same, without asking the worker.
            with pytest.raises(hipr.ContextLostError):
                await bob.memcpy_dtoh(kept, 10)
            await bob_stack.aclose()
            # Alice's open session never noticed; her new ones work too.
            assert await alice.memcpy_dtoh(secret, len(SECRET)) == SECRET
            async with hipr.aconnect(url, token=ALICE, link=LINK) as again:
                assert await again.memcpy_dtoh(await again.malloc_htod(b"new"), 3) == b"new"
            # Bob's next session works, in a fresh process.
            async with hipr.aconnect(url, token=BOB, link=LINK) as bob2:
                assert await bob2.memcpy_dtoh(await bob2.malloc_htod(b"fine"), 4) == b"fine"
                assert isolation.child_pid("bob") not in (None, bob_pid)
            assert isolation.resets == {"bob": 1}
            assert await alice.memcpy_dtoh(secret, len(SECRET)) == SECRET


async def test_shared_process_fails_every_session_once_then_rebuilds(
    shared_worker: Worker,
) -> None:
    url = shared_worker.bound_urls[0]
    assert shared_worker.isolation is None and shared_worker.shared_tenants == 2
    with anyio.fail_after(30):
        alice_stack = AsyncExitStack()
        alice = await alice_stack.enter_async_context(hipr.aconnect(url, token=ALICE, link=LINK))
        secret = await _alice_secret(alice)
        async with hipr.aconnect(url, token=BOB, link=LINK) as bob:
            # What isolation = "none" leaves open: bob reads alice's bytes.
            assert await _raw_read(bob, secret, len(SECRET)) == SECRET
            with pytest.raises(hipr.ContextLostError) as own:
                await _raw_read(bob, 0x10, 16)
            assert own.value.details.get("own_fault") is True
        # Alice's idle session was told at once, with the cause.
        with pytest.raises(hipr.ContextLostError) as theirs:
            await alice.memcpy_dtoh(secret, 4)
        assert theirs.value.details.get("own_fault") is False
        assert "another session" in theirs.value.message
        await alice_stack.aclose()
        started = anyio.current_time()
        async with hipr.aconnect(url, token=ALICE, link=LINK) as again:
            assert await again.memcpy_dtoh(await again.malloc_htod(b"back"), 4) == b"back"
        assert anyio.current_time() - started < 5
        assert shared_worker.recovery.resets == {"bob": 1}
        assert shared_worker.backend.stats().allocations == 0


async def test_session_isolation_keeps_a_fault_to_its_session(
    anyio_backend: str, short_tmp: Path
) -> None:
    config = WorkerConfig(
        tenants_file=_tenants(short_tmp), isolation="session", log_level="warning"
    )
    async with running_worker(config, EmulatorBackend(), ["tcp://127.0.0.1:0"]) as worker:
        isolation = worker.isolation
        assert isolation is not None
        try:
            with anyio.fail_after(60):
                url = worker.bound_urls[0]
                async with (
                    hipr.aconnect(url, token=BOB, link=LINK) as steady,
                    hipr.aconnect(url, token=BOB, link=LINK) as faulty,
                ):
                    kept = await steady.malloc_htod(b"steady")
                    with pytest.raises(hipr.ContextLostError):
                        await _raw_read(faulty, 0x10, 16)
                    assert await steady.memcpy_dtoh(kept, 6) == b"steady"
                pids = {s.pid for s in await isolation.poll()}
                assert os.getpid() not in pids
        finally:
            await isolation.aclose()


async def test_opting_out_with_several_tenants_is_flagged(shared_worker: Worker) -> None:
    from prometheus_client import generate_latest

    from hipr.cli.status_view import render_status
    from hipr.handlers.admin import worker_status
    from hipr.observability.metrics import PrometheusObserver

    status = worker_status(shared_worker, None)
    assert status["isolation"] == "none" and status["shared_tenants"] == 2
    assert "read and write any other tenant's device memory" in status["isolation_warning"]
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_status(status, "tcp://x"))
    assert "WARNING" in console.export_text()
    shared_worker.recovery.resets["bob"] += 1
    text = generate_latest(PrometheusObserver(shared_worker, telemetry=False).registry).decode()
    assert "hipr_tenants_sharing_process 2.0" in text
    assert 'hipr_context_resets_total{tenant="bob"} 1.0' in text


async def test_isolated_workers_are_not_flagged(default_worker: Worker) -> None:
    from hipr.handlers.admin import worker_status

    status = worker_status(default_worker, None)
    assert status["isolation"] == "process"
    assert status["shared_tenants"] == 0 and status["isolation_warning"] is None


async def test_the_blocking_client_surfaces_context_loss(shared_worker: Worker) -> None:
    url = shared_worker.bound_urls[0]

    def bob_faults() -> tuple[str, str]:
        with hipr.connect(url, token=BOB, link=LINK) as gpu:
            out = gpu.malloc(16)
            kernel = gpu.builtin("copy_from_address_u8")
            kernel.launch((1,), (64,), [out, np.uint64(0x10), np.uint64(16)])
            with pytest.raises(hipr.ContextLostError) as first:
                gpu.synchronize()
            with pytest.raises(hipr.ContextLostError) as later:
                gpu.malloc(16)
            return first.value.message, later.value.message

    def alice_works() -> bytes:
        with hipr.connect(url, token=ALICE, link=LINK) as gpu:
            return bytes(gpu.memcpy_dtoh(gpu.malloc_htod(b"sync"), 4))

    with anyio.fail_after(30):
        first, later = await anyio.to_thread.run_sync(bob_faults)
        assert "a kernel of this session failed" in first and later == first
        assert await anyio.to_thread.run_sync(alice_works) == b"sync"
