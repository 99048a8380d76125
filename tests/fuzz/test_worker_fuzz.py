"""Fuzzing a live worker: a bounded share of ``scripts/fuzz`` on every change.

The campaign's oracles (hipr.testing.fuzz_campaign): no crash, no hang, every request
answered or the connection closed, the well-behaved client always right, no leak.
"""

from __future__ import annotations

import tempfile
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError
from hipr.protocol import Flags, Opcode
from hipr.testing import LogWatch, leaks, wait_for_no_sessions
from hipr.testing.fuzz_campaign import FuzzOptions, run_fuzz_campaign
from hipr.testing.harness import RawClient
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

pytestmark = pytest.mark.anyio

#: Frames per event loop: trio takes the larger share, asyncio a smaller one.
CI_FRAMES = {"trio": 8000, "asyncio": 3000}


async def test_fuzz_campaign(anyio_backend: str) -> None:
    report = await run_fuzz_campaign(
        FuzzOptions(seed=20240, frames=CI_FRAMES[anyio_backend], concurrency=6, bound=5.0)
    )
    assert report.ok, report.summary()
    assert report.frames >= CI_FRAMES[anyio_backend]
    assert report.good_verified > 0
    assert all(report.by_stage[stage] > 0 for stage in ("pre_hello", "post_hello", "mid_copy"))


async def test_fuzz_campaign_over_a_unix_socket(anyio_backend: str) -> None:
    with tempfile.TemporaryDirectory(prefix="hipr-", dir="/tmp") as short:
        report = await run_fuzz_campaign(
            FuzzOptions(seed=7, frames=600, concurrency=4, listen=f"unix://{short}/w.sock")
        )
    assert report.ok, report.summary()


opcodes = st.sampled_from([int(op) for op in Opcode if op not in (Opcode.GOODBYE, Opcode.DATA)])
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**66), max_value=2**66)
    | st.floats()
    | st.text(max_size=16)
    | st.binary(max_size=64),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["size", "ptr", "dst", "src", "stream", "event", "graph", "function"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=10,
)


async def test_hypothesis_arguments_against_a_live_worker(anyio_backend: str) -> None:
    """Hypothesis drives the arguments; one worker and one session serve every example."""
    backend = EmulatorBackend(total_memory=64 << 20)
    watch = LogWatch()
    with watch.installed():
        async with running_worker(
            WorkerConfig(resume_grace=0.0, max_frame_bytes=1 << 20),
            backend,
            ["tcp://127.0.0.1:0"],
        ) as worker:
            client = await RawClient.open(worker.bound_urls[0])
            answered = 0

            @settings(
                max_examples=150 if anyio_backend == "trio" else 60,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(opcodes, values, st.sampled_from([Flags.NONE, Flags.NO_REPLY]))
            def example(opcode: int, args: Any, flags: Flags) -> None:
                nonlocal answered
                portal_call(opcode, args, flags)
                answered += 1

            async def one(opcode: int, args: Any, flags: Flags) -> None:
                await client.send(opcode, args, flags=flags)
                # Every example ends with a synchronising probe that must be answered.
                probe = await client.send(Opcode.SYNC_ERRORS)
                with anyio.fail_after(5):
                    await client.reply(probe)

            def portal_call(opcode: int, args: Any, flags: Flags) -> None:
                anyio.from_thread.run(one, opcode, args, flags)

            await anyio.to_thread.run_sync(example)
            assert answered > 0
            await client.call(Opcode.GOODBYE)
            await client.aclose()
            assert await wait_for_no_sessions(worker)
            assert leaks(backend, worker) == []
    assert watch.crashes == []


async def test_a_worker_answers_after_every_kind_of_garbage(anyio_backend: str) -> None:
    """The smallest end-to-end check: garbage, then a normal session, on one worker."""
    backend = EmulatorBackend()
    async with running_worker(
        WorkerConfig(resume_grace=0.0), backend, ["tcp://127.0.0.1:0"]
    ) as worker:
        url = worker.bound_urls[0]
        for junk in (b"\0" * 24, b"HIPR" + b"\xff" * 20, b"GET / HTTP/1.1\r\n\r\n", b"H"):
            raw = await RawClient.open(url, hello=False)
            await raw.stream.send(junk)
            await raw.stream.send_eof()
            assert await raw.closed_by_peer(timeout=5)
            await raw.aclose()
        client = await RawClient.open(url)
        ptr = (await client.call(Opcode.MALLOC, {"size": 16}))["ptr"]
        await client.call(Opcode.MEMCPY_HTOD, {"dst": ptr, "size": 4}, b"abcd")
        with pytest.raises(HipError):
            await client.call(Opcode.MEMCPY_HTOD, {"dst": ptr + 16, "size": 1}, b"x")
        await client.call(Opcode.GOODBYE)
        await client.aclose()
        assert await wait_for_no_sessions(worker)
        assert leaks(backend, worker) == []
