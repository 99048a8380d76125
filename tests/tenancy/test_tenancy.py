"""Every tenancy rule, attacked: tokens, quotas, isolation, counters, reload."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipErrorCode as E
from hipr.kernels.kernel_args import pack_args
from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
from hipr.testing.harness import RawClient
from hipr.transports import connect
from hipr.worker.config import ConfigError, WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import new_token, token_hash

pytestmark = pytest.mark.anyio

ALICE, BOB, REVOKED = new_token(), new_token(), new_token()
MiB = 1 << 20


def tenants_toml(alice_memory: str = "4MiB", alice_streams: int = 3) -> str:
    return f"""
[tenants.alice]
tokens = ["{token_hash(ALICE)}"]
revoked_tokens = ["{token_hash(REVOKED)}"]
max_sessions = 3
max_device_memory = "{alice_memory}"
max_streams = {alice_streams}
max_events = 2
max_modules = 1
max_graphs = 1

[tenants.bob]
tokens = ["{token_hash(BOB)}"]
max_request_rate = 200
max_request_burst = 50
"""


@pytest.fixture
def tenants_file(short_tmp: Path) -> Path:
    path = short_tmp / "tenants.toml"
    path.write_text(tenants_toml())
    return path


@pytest.fixture
async def tenant_worker(
    anyio_backend: str, short_tmp: Path, tenants_file: Path
) -> AsyncIterator[tuple[Worker, EmulatorBackend]]:
    backend = EmulatorBackend(device_count=1, total_memory=64 * MiB)
    config = WorkerConfig(tenants_file=tenants_file, resume_grace=0.0, isolation="none")
    async with running_worker(config, backend, [f"unix://{short_tmp}/t.sock"]) as worker:
        yield worker, backend


async def raw_hello(url: str, args: dict[str, object]) -> hipr.HipError | dict[str, object]:
    stream = await connect(url)
    decoder = FrameDecoder()
    with anyio.fail_after(5):
        await stream.send(encode_frame(Opcode.HELLO, 0, Flags.NONE, args))
        while (frame := decoder.next_frame()) is None:
            decoder.feed(await stream.receive())
    await stream.aclose()
    if Flags.ERROR in frame.flags:
        return hipr.HipError.from_wire(frame.args)
    return frame.args


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "requires a token"),
        ("hipr_not-a-real-token", "not valid"),
        (REVOKED, "revoked"),
    ],
    ids=["none", "unknown", "revoked"],  # REVOKED is random: an id of its own keeps -n stable
)
async def test_bad_tokens_are_refused_and_say_why(
    tenant_worker: tuple[Worker, EmulatorBackend], token: str | None, message: str
) -> None:
    worker, backend = tenant_worker
    with pytest.raises(hipr.AuthError, match=message) as err:
        async with hipr.aconnect(worker.bound_urls[0], token=token or ""):
            pass
    if token:
        assert token not in str(err.value)
    assert not worker.sessions and backend.stats().is_zero()


async def test_token_from_environment(
    tenant_worker: tuple[Worker, EmulatorBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, _ = tenant_worker
    monkeypatch.setenv("HIPR_TOKEN", BOB)
    async with hipr.aconnect(worker.bound_urls[0]) as gpu:
        assert gpu.worker_info()["tenant"] == "bob"


async def test_replayed_hello_is_refused_and_the_session_goes_on(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    worker, _ = tenant_worker
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        with pytest.raises(hipr.ProtocolError, match="already exchanged"):
            await gpu._conn.request(Opcode.HELLO, {"token": BOB})
        assert gpu.worker_info()["tenant"] == "alice"
        assert await gpu.device_count() == 1


async def test_memory_quota_at_and_one_byte_over(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    worker, backend = tenant_worker
    url = worker.bound_urls[0]
    async with hipr.aconnect(url, token=ALICE) as a1, hipr.aconnect(url, token=ALICE) as a2:
        p = await a1.malloc(3 * MiB)
        q = await a2.malloc(MiB)  # exactly at the quota, across two sessions
        with pytest.raises(hipr.HipError) as err:
            await a2.malloc(1)
        assert err.value.code == E.hipErrorOutOfMemory
        assert "max_device_memory" in err.value.message and str(4 * MiB) in err.value.message
        assert backend.stats().allocated_bytes == 4 * MiB  # nothing half-done
        with pytest.raises(hipr.HipError):
            await a1.malloc_htod(b"x")
        await a1.free(p)
        r = await a2.malloc(3 * MiB)  # freed memory is available again
        await a2.free(q)
        await a2.free(r)
        async with hipr.aconnect(url, token=BOB) as bob:  # bob has no memory quota
            await bob.free(await bob.malloc(32 * MiB))


async def test_handle_quotas_name_the_quota_and_limit(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    worker, _ = tenant_worker
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        streams = [await gpu.stream_create() for _ in range(3)]
        with pytest.raises(hipr.QuotaError, match="max_streams quota of 3") as err:
            await gpu.stream_create()
        assert err.value.details == {"quota": "max_streams", "limit": 3}
        await streams[0].destroy()
        await gpu.stream_create()  # back under: allowed again
        e = [await gpu.event_create() for _ in range(2)]
        with pytest.raises(hipr.QuotaError, match="max_events"):
            await gpu.event_create()
        g = await gpu.graph_create()
        with pytest.raises(hipr.QuotaError, match="max_graphs"):
            await gpu.graph_create()
        with pytest.raises(hipr.QuotaError, match="max_graphs"):
            await streams[1].begin_capture()  # a capture becomes a graph
        await g.destroy()
        await e[0].destroy()
        assert await gpu.device_count() == 1  # the session went on throughout


async def test_session_quota(tenant_worker: tuple[Worker, EmulatorBackend]) -> None:
    worker, _ = tenant_worker
    url = worker.bound_urls[0]
    async with hipr.aconnect(url, token=ALICE), hipr.aconnect(url, token=ALICE):
        async with hipr.aconnect(url, token=ALICE):
            with pytest.raises(hipr.QuotaError, match="max_sessions quota of 3"):
                async with hipr.aconnect(url, token=ALICE):
                    pass
        async with hipr.aconnect(url, token=ALICE):  # one left, so there is room again
            pass


async def test_cross_tenant_pointer_and_handle_guesses_learn_nothing(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    worker, _ = tenant_worker
    url = worker.bound_urls[0]
    async with hipr.aconnect(url, token=ALICE) as alice, hipr.aconnect(url, token=BOB) as bob:
        secret = await alice.malloc_htod(b"alice's secret".ljust(4096))
        stream = await alice.stream_create()
        freed = await bob.malloc(4096)
        await bob.free(freed)
        errors = []
        for guess in (int(secret), int(secret) + 100, int(freed), 0x1000):
            for attempt in (
                bob.memcpy_dtoh(guess, 14),
                bob.memcpy_htod(guess, b"overwrite"),
                bob.memset(guess, 0, 1),
                bob.free(guess),
            ):
                with pytest.raises(hipr.HipError) as err:
                    await attempt
                assert err.value.code == E.hipErrorInvalidValue
                errors.append(err.value.message.replace(hex(guess), "ADDR"))
        # Someone else's memory, freed memory and no memory at all look the same.
        assert len({m for m in errors if "memcpy" not in m}) <= 4
        with pytest.raises(hipr.HipError) as err:
            await bob._conn.request(Opcode.STREAM_SYNCHRONIZE, {"stream": stream.id})
        assert err.value.code == E.hipErrorInvalidHandle
        fill = await bob.builtin("fill_f32")
        import numpy as np

        with pytest.raises(hipr.HipError, match="not inside an allocation of this session"):
            await bob._conn.request(
                Opcode.LAUNCH_KERNEL,
                {
                    "function": fill.id,
                    "grid": [1],
                    "block": [1],
                    "args": int(secret).to_bytes(8, "little")
                    + np.float32(0).tobytes()
                    + b"\0" * 4
                    + np.uint64(1).tobytes(),
                    "ptrs": [0],
                },
            )
        assert (await alice.memcpy_dtoh(secret, 14)) == b"alice's secret"


async def test_counters_return_to_zero_after_100_sessions_ending_different_ways(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    worker, backend = tenant_worker
    url = worker.bound_urls[0]

    async def one(i: int) -> None:
        way = i % 4
        try:
            async with hipr.aconnect(url, token=ALICE) as gpu:
                await gpu.malloc(64 << 10)
                await gpu.stream_create()
                if way == 1:
                    await gpu.malloc(1 << 30)  # quota error, then a normal end
                elif way == 2:
                    await gpu._conn.aclose()  # the link just drops
                elif way == 3:
                    raise RuntimeError("the client program failed")
        except (hipr.HipError, RuntimeError):
            pass

    with anyio.fail_after(60):
        for i in range(100):
            await one(i)
        while worker.sessions or not backend.stats().is_zero():
            await anyio.sleep(0.01)
    gate_state = worker._tenant_state["alice"]
    assert gate_state.reserved_memory == 0 and gate_state.inflight_bytes == 0


async def test_reload_applies_new_quotas_without_dropping_sessions(
    tenant_worker: tuple[Worker, EmulatorBackend], tenants_file: Path
) -> None:
    worker, _ = tenant_worker
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        p = await gpu.malloc(3 * MiB)
        with pytest.raises(hipr.HipError):
            await gpu.malloc(2 * MiB)
        tenants_file.write_text(tenants_toml(alice_memory="8MiB"))
        worker.reload_tenants()
        q = await gpu.malloc(2 * MiB)  # the same session, under the new quota
        tenants_file.write_text("not toml [[[")
        worker.reload_tenants()  # a broken file keeps the previous tenants
        await gpu.free(q)
        await gpu.free(p)


async def test_plaintext_tokens_off_loopback_are_refused(
    short_tmp: Path, tenants_file: Path
) -> None:
    config = WorkerConfig(tenants_file=tenants_file, isolation="none")
    with pytest.raises(ConfigError, match="plain text"):
        async with running_worker(config, EmulatorBackend(), ["tcp://0.0.0.0:0"]):
            pass
    allowed = dataclasses.replace(config, allow_plaintext_tokens=True)
    async with running_worker(allowed, EmulatorBackend(), ["tcp://0.0.0.0:0"]) as worker:
        assert worker.bound_urls


async def test_unix_peer_uid_maps_to_a_tenant(short_tmp: Path) -> None:
    import os

    path = short_tmp / "uid.toml"
    path.write_text(f"[tenants.local]\nunix_uids = [{os.getuid()}]\n")
    config = WorkerConfig(tenants_file=path)
    async with (
        running_worker(config, EmulatorBackend(), [f"unix://{short_tmp}/u.sock"]) as worker,
        hipr.aconnect(worker.bound_urls[0], token="") as gpu,
    ):
        assert gpu.worker_info()["tenant"] == "local"


@pytest.mark.alone  # compares latency with a baseline of its own
async def test_a_flooding_tenant_does_not_starve_another(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    """Bob floods far past his request rate; Alice's latency stays within 2x of unloaded."""
    worker, _ = tenant_worker
    url = worker.bound_urls[0]

    async def latencies(gpu: hipr.AsyncGpu, n: int) -> list[float]:
        out = []
        for _ in range(n):
            start = time.perf_counter()
            await gpu.get_device()
            out.append(time.perf_counter() - start)
        return out

    async with hipr.aconnect(url, token=ALICE) as alice:
        await latencies(alice, 20)
        unloaded = statistics.median(await latencies(alice, 200))
        refused = 0
        stop = anyio.Event()

        async def flood(gpu: hipr.AsyncGpu) -> None:
            nonlocal refused
            while not stop.is_set():
                try:
                    await gpu.get_device()
                except hipr.QuotaError:
                    refused += 1

        async with hipr.aconnect(url, token=BOB) as bob, anyio.create_task_group() as tg:
            tg.start_soon(flood, bob)
            await anyio.sleep(0.2)
            loaded = statistics.median(await latencies(alice, 200))
            stop.set()
        assert refused > 0  # the flood hit bob's max_request_rate
        # A generous floor absorbs scheduler noise on a 2-core CI machine.
        assert loaded <= max(2 * unloaded, unloaded + 0.002), (unloaded, loaded)


@pytest.mark.parametrize("kind", ["launches", "pieces"])
async def test_each_call_of_a_batch_counts_against_the_request_rate(
    tenant_worker: tuple[Worker, EmulatorBackend], kind: str
) -> None:
    """A batch of 200 launches (LAUNCH_KERNELS) or copies (MEMCPY_HTOD_MANY) from bob
    (200 requests/s, a burst of 50): the calls the bucket covers run, in order; the
    rest are refused with the quota error, which names them, at the next
    synchronisation."""
    worker, _ = tenant_worker
    async with hipr.aconnect(worker.bound_urls[0], token=BOB) as bob:
        out = await bob.malloc(4 * 200)
        dsts = [int(out) + 4 * i for i in range(200)]
        if kind == "launches":
            fill = await bob.builtin("fill_f32")
            blobs = [pack_args([np.uint64(d), np.float32(1.0), np.uint64(1)]).data for d in dsts]
            opcode = Opcode.LAUNCH_KERNELS
            args: dict[str, object] = {"function": fill._check(), "grid": [1], "block": [1]}
            args.update(ptrs=[0], args=blobs)
            data = b""
        else:
            opcode = Opcode.MEMCPY_HTOD_MANY
            args, data = {"dst": dsts, "size": [4] * 200}, np.ones(200, np.float32).tobytes()
        await anyio.sleep(0.3)  # a full bucket: 50 requests
        await bob._post(opcode, args, data)
        await anyio.sleep(0.3)  # the synchronize's own request must not be the one refused
        with pytest.raises(hipr.QuotaError) as refused:
            await bob.synchronize()
        await anyio.sleep(0.3)
        done = np.frombuffer(await bob.memcpy_dtoh(out), np.float32)
    admitted = int(done.sum())
    assert 0 < admitted <= 51
    assert (done[:admitted] == 1.0).all() and (done[admitted:] == 0.0).all()
    assert f"{kind} {admitted + 1} to 200 of {opcode.name} were refused" in str(refused.value)


async def test_builtin_module_variables_are_refused_where_tenants_share_a_context(
    tenant_worker: tuple[Worker, EmulatorBackend],
) -> None:
    """The built-in module is loaded once for every session of the process: with two
    tenants in one GPU context, its variable would carry one tenant's writes into the
    other's kernels, so MODULE_GET_GLOBAL refuses it and says what keeps tenants apart."""
    worker, _ = tenant_worker
    client = await RawClient.open(worker.bound_urls[0], ALICE)
    try:
        got = await client.call(Opcode.MODULE_BUILTIN, {"name": "add_bias_f32"})
        with pytest.raises(hipr.HipError) as refused:
            await client.call(
                Opcode.MODULE_GET_GLOBAL, {"module": got["module"], "name": "hipr_builtin_bias"}
            )
        assert refused.value.code == E.hipErrorNotSupported
        assert 'isolation = "process"' in refused.value.message
        # The session serves on.
        assert (await client.call(Opcode.MALLOC, {"size": 16}))["ptr"]
    finally:
        await client.aclose()
