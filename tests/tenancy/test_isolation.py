"""isolation = "process": each tenant in a worker process of its own."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import hipr
from hipr.client.connection import LinkOptions
from hipr.protocol import Flags, Opcode, encode_frame
from hipr.testing.harness import worker_with_children
from hipr.transports import connect
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker
from hipr.worker.tenants import new_token, token_hash
from tests.e2e.conftest import Endpoint
from tests.e2e.data_link_client import CHUNK, Striped, chunk_frame, pattern
from tests.e2e.raw import RawSession
from tests.resilience.proxy import faulty_proxy

pytestmark = pytest.mark.anyio

ALICE, BOB = new_token(), new_token()
LINK = LinkOptions(
    heartbeat_interval=0.2,
    heartbeat_timeout=1.0,
    reconnect_delay=0.02,
    reconnect_max_delay=0.2,
    reconnect_timeout=10.0,
    reconnect_attempts=30,
)


@pytest.fixture
async def isolated_worker(anyio_backend: str, short_tmp: Path) -> AsyncIterator[Worker]:
    tenants = short_tmp / "tenants.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(ALICE)}"]\nmax_streams = 2\n'
        f'[tenants.bob]\ntokens = ["{token_hash(BOB)}"]\n'
    )
    config = WorkerConfig(
        tenants_file=tenants,
        isolation="process",
        # HIPR_TEST_BACKEND=cuda runs the same tests on a GPU machine.
        backend=os.environ.get("HIPR_TEST_BACKEND", "emulator"),
        resume_grace=10.0,
        log_level="warning",
    )
    async with worker_with_children(config) as worker:
        yield worker


async def test_tenants_run_in_separate_processes_and_cannot_see_each_other(
    isolated_worker: Worker,
) -> None:
    url = isolated_worker.bound_urls[0]
    isolation = isolated_worker.isolation
    assert isolation is not None
    with anyio.fail_after(60):
        async with (
            hipr.aconnect(url, token=ALICE, link=LINK) as alice,
            hipr.aconnect(url, token=BOB, link=LINK) as bob,
        ):
            alice_pid, bob_pid = isolation.child_pid("alice"), isolation.child_pid("bob")
            assert alice_pid and bob_pid and alice_pid != bob_pid != os.getpid()
            secret = await alice.malloc_htod(b"alice only".ljust(4096))
            # Bob's own memory, even at the same address, is another process's memory.
            mine = await bob.malloc(4096)
            assert await bob.memcpy_dtoh(mine, 10) != b"alice only"
            with pytest.raises(hipr.HipError) as err:
                await bob.memcpy_dtoh(int(secret) + 8192 * 1024, 10)
            assert err.value.name == "hipErrorInvalidValue"
            # Quotas hold inside the tenant's process.
            await alice.stream_create()
            await alice.stream_create()
            with pytest.raises(hipr.QuotaError, match="max_streams"):
                await alice.stream_create()
            assert await alice.memcpy_dtoh(secret, 10) == b"alice only"


async def test_a_crashed_tenant_process_leaves_other_tenants_running(
    isolated_worker: Worker,
) -> None:
    url = isolated_worker.bound_urls[0]
    isolation = isolated_worker.isolation
    assert isolation is not None
    with anyio.fail_after(60):
        async with (
            hipr.aconnect(url, token=ALICE, link=LINK) as alice,
            hipr.aconnect(url, token=BOB, link=LINK) as bob,
        ):
            p = await bob.malloc_htod(b"bob survives")
            alice_pid = isolation.child_pid("alice")
            assert alice_pid is not None
            os.kill(alice_pid, signal.SIGKILL)  # as a kernel fault taking the process down
            with pytest.raises(hipr.SessionLostError):
                while True:
                    await alice.device_count()
                    await anyio.sleep(0.02)
            assert await bob.memcpy_dtoh(p, 12) == b"bob survives"
        async with hipr.aconnect(url, token=ALICE, link=LINK) as again:  # a fresh process
            assert await again.device_count() == 1
            assert isolation.child_pid("alice") not in (None, alice_pid)


async def test_resume_is_routed_to_the_tenants_process(isolated_worker: Worker) -> None:
    url = isolated_worker.bound_urls[0]
    events: list[str] = []
    with anyio.fail_after(60):
        async with (
            faulty_proxy(url) as proxy,
            hipr.aconnect(
                proxy.url, token=ALICE, link=LINK, on_event=lambda k, _: events.append(k)
            ) as gpu,
        ):
            p = await gpu.malloc_htod(b"kept across the cut")
            await proxy.cut_all()
            assert await gpu.memcpy_dtoh(p, 19) == b"kept across the cut"
    assert "resumed" in events and "session_lost" not in events


async def test_bad_token_is_refused_by_the_parent(isolated_worker: Worker) -> None:
    with pytest.raises(hipr.AuthError, match="not valid"):
        async with hipr.aconnect(isolated_worker.bound_urls[0], token="hipr_nope"):
            pass
    assert isolated_worker.isolation is not None
    assert isolated_worker.isolation.child_pid("alice") is None  # nothing started for it


async def test_data_links_are_relayed_to_the_tenants_process(isolated_worker: Worker) -> None:
    """A striped upload's data links reach the tenant's process like its session."""
    url = isolated_worker.bound_urls[0]
    with anyio.fail_after(60):
        raw = RawSession(await connect(url))
        hello_frame = encode_frame(Opcode.HELLO, 0, Flags.NONE, {"client": "raw", "token": ALICE})
        (hello,) = await raw.replies(hello_frame, 1)
        striped = Striped(raw, hello, Endpoint(url))
        assert hello["data_links"] == 4
        link = await striped.open_link()
        size = CHUNK + 3
        ptr = (await raw.call(Opcode.MALLOC, {"size": size}))["ptr"]
        data = pattern(size)
        request_id = raw.next_id + 1
        await link.send(
            chunk_frame(request_id, CHUNK, data[CHUNK:]) + chunk_frame(request_id, 0, data[:CHUNK])
        )
        args = {"dst": ptr, "size": size, "striped": True}
        assert await raw.call(Opcode.MEMCPY_HTOD, args) == {}
        await raw.call(Opcode.MEMCPY_DTOH, {"src": ptr + CHUNK, "size": 3})
        assert bytes(raw.last_bulk) == data[CHUNK:]
        await link.aclose()
        await raw.stream.aclose()
