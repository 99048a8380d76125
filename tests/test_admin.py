"""ADMIN_STATUS: the admin token, and what the status reply says about a live worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.cpus import auto_spin_wait
from hipr.errors import AuthError
from hipr.handlers.admin import HOW_TO_CONFIGURE, check_admin_token
from hipr.protocol.header import PROTOCOL_VERSION
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import token_hash

MiB = 1 << 20
ADMIN = "admin-token-for-tests"
ALICE = "alice-token-for-tests"


def test_check_admin_token() -> None:
    check_admin_token(token_hash(ADMIN), ADMIN)
    for wrong in ("", "nope", ADMIN + " "):
        with pytest.raises(AuthError) as err:
            check_admin_token(token_hash(ADMIN), wrong)
        assert "check the admin token (HIPR_ADMIN_TOKEN or --admin-token)" in err.value.message
        assert err.value.details == {"admin": True}
    with pytest.raises(AuthError) as err:
        check_admin_token(None, ADMIN)
    assert err.value.message == HOW_TO_CONFIGURE
    assert "admin_token_sha256" in HOW_TO_CONFIGURE and "hipr token new" in HOW_TO_CONFIGURE


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(ALICE)}"]\n'
        'max_device_memory = "4MiB"\nmax_sessions = 3\n'
        "[tenants.idle]\n"
        f'tokens = ["{token_hash("idle-token")}"]\n'
    )
    return path


@pytest.fixture
async def worker(anyio_backend: str, tenants_file: Path) -> AsyncIterator[Worker]:
    config = WorkerConfig(
        tenants_file=tenants_file,
        admin_token_sha256=token_hash(ADMIN),
        max_clients=10,
        isolation="none",  # status of sessions in this process
    )
    backend = EmulatorBackend(device_count=2, total_memory=64 * MiB)
    async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as running:
        yield running


@pytest.mark.anyio
async def test_status_of_a_live_worker(worker: Worker) -> None:
    url = worker.bound_urls[0]
    async with hipr.aconnect(url, token=ALICE) as holder, hipr.aconnect(url, token=ALICE) as gpu:
        await holder.set_device(1)
        await holder.malloc(MiB)
        await holder.malloc(2 * MiB)
        await holder.stream_create()
        status = await gpu.admin_status(ADMIN)

    assert status["backend"] == "emulator"
    assert status["worker_version"] == hipr.__version__
    assert status["protocol"] == PROTOCOL_VERSION
    assert 0 <= status["uptime_s"] < 60 and status["started_at"] == worker.started_at
    assert status["listen"] == [url]
    assert status["max_clients"] == 10

    sessions = {s["id"]: s for s in status["sessions"]}
    assert set(sessions) == {holder.session_id, gpu.session_id}
    held = sessions[holder.session_id]
    assert held["tenant"] == "alice" and held["peer"].startswith("tcp 127.0.0.1:")
    assert held["memory"] == 3 * MiB and held["allocations"] == 2 and held["device"] == 1
    assert held["handles"]["streams"] == 1 and held["handles"]["events"] == 0
    assert held["current"] is False and sessions[gpu.session_id]["current"] is True

    tenants = {t["name"]: t for t in status["tenants"]}
    assert tenants["alice"] == {
        "name": "alice",
        "sessions": 2,
        "memory": 3 * MiB,
        "max_sessions": 3,
        "max_device_memory": 4 * MiB,
    }
    assert tenants["idle"]["sessions"] == 0 and tenants["idle"]["max_device_memory"] is None

    devices = status["devices"]
    assert [d["index"] for d in devices] == [0, 1]
    assert devices[1]["memory_used"] >= 3 * MiB and devices[1]["memory_total"] == 64 * MiB
    assert devices[0]["source"] == "emulator" and devices[0]["name"] == "hipr emulator"
    assert devices[0]["temperature_c"] is None


@pytest.mark.anyio
async def test_admin_token_is_required(worker: Worker) -> None:
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        with pytest.raises(AuthError) as err:
            await gpu.admin_status("wrong")
        assert "check the admin token" in str(err.value)
        assert err.value.details.get("admin") is True
        # The refusal does not end the session.
        assert await gpu.ping() > 0


@pytest.mark.anyio
async def test_admin_token_from_the_environment(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HIPR_ADMIN_TOKEN", ADMIN)
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        status = await gpu.admin_status()
    assert [s["tenant"] for s in status["sessions"]] == ["alice"]
    monkeypatch.delenv("HIPR_ADMIN_TOKEN")
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        with pytest.raises(AuthError):
            await gpu.admin_status()


@pytest.mark.anyio
async def test_without_an_admin_token_admin_calls_are_refused(anyio_backend: str) -> None:
    backend = EmulatorBackend(device_count=1, total_memory=64 * MiB)
    async with (
        running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker,
        hipr.aconnect(worker.bound_urls[0]) as gpu,
    ):
        with pytest.raises(AuthError) as err:
            await gpu.admin_status(ADMIN)
    assert "admin_token_sha256" in str(err.value)


@pytest.fixture
def threaded_worker() -> Iterator[Worker]:
    config = WorkerConfig(admin_token_sha256=token_hash(ADMIN))
    backend = EmulatorBackend(device_count=1, total_memory=64 * MiB)
    with worker_in_thread(config, backend, loop="trio") as running:
        yield running


def test_sync_client_admin_status(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        gpu.malloc(4096)
        status = gpu.admin_status(ADMIN)
    [session] = status["sessions"]
    assert session["memory"] == 4096 and session["tenant"] == "anonymous"
    assert status["tenants"][0]["name"] == "anonymous"
    assert status["pinned_payload_buffers"] is None  # the emulator pins nothing
    # The loop's spin window in force: "auto" resolved for this machine's CPUs.
    assert status["spin_wait"] == threaded_worker.busy_poll.seconds == auto_spin_wait()
