"""isolation = "process" over a worker's life: children die with their parent, a dead
parent's socket directory goes at the next start, and status and metrics count what the
children hold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from prometheus_client.samples import Sample

from hipr.observability.metrics import WorkerCollector
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import RawClient, worker_with_children
from hipr.worker.config import WorkerConfig
from hipr.worker.isolation import (
    DIR_PREFIX,
    UNLOCKED_AGE,
    TenantProcesses,
    remove_stale_dirs,
)
from hipr.worker.server import Worker
from hipr.worker.tenants import new_token, token_hash

pytestmark = pytest.mark.anyio

ALICE, BOB, ADMIN = new_token(), new_token(), new_token()
#: A killed parent's children must be gone within this (the kernel sends the signal at
#: once; the rest is a loaded 2-core machine scheduling the exit).
GONE_WITHIN = 10.0


def _tenants(directory: Path) -> Path:
    path = directory / "tenants.toml"
    path.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(ALICE)}"]\n'
        f'[tenants.bob]\ntokens = ["{token_hash(BOB)}"]\n'
    )
    return path


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_children_die_with_a_killed_parent_and_the_next_start_removes_their_dir(
    anyio_backend: str, short_tmp: Path
) -> None:
    runtime = short_tmp / "run"
    runtime.mkdir()
    socket = short_tmp / "w.sock"
    config = short_tmp / "worker.toml"
    config.write_text(
        f'listen = ["unix://{socket}"]\nbackend = "emulator"\nisolation = "process"\n'
        f'tenants_file = "{_tenants(short_tmp)}"\nlog_level = "warning"\n'
    )
    env = {**os.environ, "RUNTIME_DIRECTORY": str(runtime)}
    children: list[int] = []
    # No pipes: nothing reads them, and an asyncio pipe transport left for the garbage
    # collector breaks a later test's loop (``Event loop is closed``).
    parent = await anyio.open_process(
        [sys.executable, "-m", "hipr", "worker", "--config", str(config)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None,
    )
    try:
        with anyio.fail_after(60):
            while not socket.exists():
                assert parent.returncode is None, "the worker did not start"
                await anyio.sleep(0.05)
            clients = [await RawClient.open(f"unix://{socket}", t) for t in (ALICE, BOB)]
            children = _children_of(parent.pid)
            assert len(children) == 2, children
            [directory] = [p for p in runtime.iterdir() if p.name.startswith(DIR_PREFIX)]
            parent.kill()  # SIGKILL: no cleanup of its own
            await parent.wait()
        started = time.monotonic()
        with anyio.fail_after(GONE_WITHIN):
            while any(_alive(pid) for pid in children):
                await anyio.sleep(0.05)
        print(f"children gone {time.monotonic() - started:.2f} s after the parent")
        for client in clients:
            await client.aclose()
        assert directory.exists()  # nobody removed it: the parent had no chance to
        # The next worker to start removes it (and only it).
        successor = TenantProcesses(WorkerConfig(isolation="process"), base=runtime)
        try:
            assert not directory.exists()
            assert successor.directory.exists()
        finally:
            await successor.aclose()
        assert not successor.directory.exists()
    finally:
        if parent.returncode is None:
            parent.kill()
        await parent.aclose()  # waits, and closes its transport on this test's loop
        for pid in children:  # only if the test failed: they should be gone
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_a_live_workers_directory_is_kept(anyio_backend: str, short_tmp: Path) -> None:
    """Its lock is held: another worker starting beside it leaves it alone. Without a
    lock, only a directory named for a dead pid, and old, counts as stale (a worker may
    be between mkdtemp and its lock; an older version names no pid)."""
    first = TenantProcesses(WorkerConfig(isolation="process"), base=short_tmp)
    second = TenantProcesses(WorkerConfig(isolation="process"), base=short_tmp)
    gone = await anyio.run_process([sys.executable, "-c", "import os; print(os.getpid())"])
    dead = int(gone.stdout)
    then = time.time() - UNLOCKED_AGE - 10
    try:
        assert first.directory.exists() and second.directory.exists()
        young = short_tmp / f"{DIR_PREFIX}{dead}-young"
        old = short_tmp / f"{DIR_PREFIX}{dead}-old"
        live = short_tmp / f"{DIR_PREFIX}{os.getpid()}-unlocked"
        unnamed = short_tmp / f"{DIR_PREFIX}x1y2z3"
        for path in (young, old, live, unnamed):
            path.mkdir()
            if path is not young:
                os.utime(path, (then, then))
        elsewhere = short_tmp / "not-ours"
        elsewhere.mkdir()
        assert remove_stale_dirs(short_tmp) == [old]
        for kept in (young, live, unnamed, elsewhere, first.directory):
            assert kept.exists(), kept
    finally:
        await first.aclose()
        await second.aclose()


@pytest.fixture
async def isolated_worker(anyio_backend: str, short_tmp: Path) -> AsyncIterator[Worker]:
    config = WorkerConfig(
        tenants_file=_tenants(short_tmp),
        isolation="process",
        backend="emulator",
        admin_token_sha256=token_hash(ADMIN),
        log_level="warning",
    )
    async with worker_with_children(config) as worker:
        yield worker


async def test_status_and_metrics_count_the_childrens_sessions_and_memory(
    isolated_worker: Worker,
) -> None:
    url = isolated_worker.bound_urls[0]
    with anyio.fail_after(60):
        alice = await RawClient.open(url, ALICE)
        bob = await RawClient.open(url, BOB)
        try:
            await alice.call(Opcode.MALLOC, {"size": 1 << 20})
            await bob.call(Opcode.MALLOC, {"size": 4096})
            # The admin call lands in bob's child, which asks the parent for the whole.
            status = await bob.call(Opcode.ADMIN_STATUS, {"admin_token": ADMIN})
            by_tenant = {t["name"]: t for t in status["tenants"]}
            assert by_tenant["alice"]["sessions"] == 1
            assert by_tenant["alice"]["memory"] >= 1 << 20
            assert by_tenant["bob"]["sessions"] == 1 and by_tenant["bob"]["memory"] >= 4096
            sessions = {s["tenant"]: s for s in status["sessions"]}
            assert set(sessions) == {"alice", "bob"}
            assert sessions["bob"]["current"] and not sessions["alice"]["current"]
            assert sessions["alice"]["memory"] >= 1 << 20
            children = {c["tenant"]: c for c in status["children"]}
            assert set(children) == {"alice", "bob"}
            assert children["alice"]["rss"] > 0 and children["alice"]["error"] is None
            assert sessions["alice"]["worker_pid"] == children["alice"]["pid"]
            assert status["devices"]  # the child adds the device telemetry

            # /metrics reads the figures the parent polled last.
            await isolated_worker.poll_children()
            metrics = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in WorkerCollector(isolated_worker, telemetry=False).collect()
                for s in family.samples
                if isinstance(s, Sample)
            }
            assert metrics[("hipr_sessions", (("tenant", "alice"),))] == 1
            assert metrics[("hipr_tenant_device_memory_bytes", (("tenant", "alice"),))] >= 1 << 20
            assert metrics[("hipr_sessions", (("tenant", "bob"),))] == 1
            rss = [v for (name, _), v in metrics.items() if name == "hipr_tenant_worker_rss_bytes"]
            up = [v for (name, _), v in metrics.items() if name == "hipr_tenant_worker_up"]
            assert len(rss) == 2 and all(v > 0 for v in rss) and up == [1, 1]
        finally:
            await alice.aclose()
            await bob.aclose()
