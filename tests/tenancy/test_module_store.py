"""The tenants' module stores (MODULE_LOAD by ``sha256``, protocol 1.2): a code object a
session loaded is named by its hash by the tenant's later sessions and its bytes do not
cross again; bounded, least recently used out first, never shared across tenants, keyed
by the hash the worker computed; bad input refused with the session serving on."""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

import hipr
from hipr.errors import HipErrorCode as E
from hipr.observability.module_store_metrics import module_store_metrics
from hipr.protocol import Opcode
from hipr.sessions.limits import DEFAULT_MODULE_STORE_BYTES, DEFAULT_MODULE_STORE_COUNT
from hipr.sessions.module_store import ModuleStore, sha256
from hipr.testing.module_images import ImageLoadingEmulator, emulated_fatbin
from hipr.worker.config import ConfigError, WorkerConfig
from hipr.worker.isolation import _quota_lines
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import new_token, parse_tenants, token_hash

ALICE, BOB = new_token(), new_token()
KiB = 1 << 10


# --- the store alone --------------------------------------------------------------------


def _put(store: ModuleStore, image: bytes, *, max_bytes: int = 1 << 20, n: int = 8) -> bytes:
    digest = sha256(image)
    store.add(digest, image, max_bytes=max_bytes, max_images=n)
    return digest


def test_hit_and_miss_are_counted_with_the_bytes_saved() -> None:
    store = ModuleStore()
    image = b"x" * 5000
    digest = _put(store, image)
    assert store.lookup(sha256(b"other")) is None
    assert store.lookup(digest) == image
    f = store.figures()
    assert (f.hits, f.misses, f.bytes_saved, f.held_bytes, f.held_images) == (1, 1, 5000, 5000, 1)


def test_least_recently_used_goes_first_by_count() -> None:
    store = ModuleStore()
    a, b, c = (_put(store, bytes([i]) * 100, n=2) for i in range(3))
    assert a not in store and b in store and c in store
    assert store.lookup(b) is not None  # b is now the most recently used
    d = _put(store, b"d" * 100, n=2)
    assert c not in store and b in store and d in store
    assert store.figures().evictions == 2


def test_bytes_bound_evicts_and_an_image_larger_than_it_is_not_kept() -> None:
    store = ModuleStore()
    a = _put(store, b"a" * 600, max_bytes=1000)
    b = _put(store, b"b" * 600, max_bytes=1000)
    assert a not in store and b in store and store.held_bytes == 600
    big = _put(store, b"c" * 1001, max_bytes=1000)
    assert big not in store and b in store and store.held_bytes == 600
    none = _put(store, b"e" * 10, n=0)
    assert none not in store


def test_trim_applies_lowered_bounds() -> None:
    store = ModuleStore()
    digests = [_put(store, bytes([i]) * 100) for i in range(4)]
    store.trim(max_bytes=250, max_images=8)
    assert [d in store for d in digests] == [False, False, True, True]
    assert store.held_bytes == 200


# --- over the wire ------------------------------------------------------------------------


def _tenants(path: Path, alice_count: int = 3) -> Path:
    path.write_text(
        f"""
[tenants.alice]
tokens = ["{token_hash(ALICE)}"]
module_store_count = {alice_count}
module_store_bytes = "1MiB"

[tenants.bob]
tokens = ["{token_hash(BOB)}"]
"""
    )
    return path


@pytest.fixture
async def worker(anyio_backend: str, short_tmp: Path) -> AsyncIterator[Worker]:
    config = WorkerConfig(
        tenants_file=_tenants(short_tmp / "tenants.toml"), resume_grace=0.0, isolation="none"
    )
    backend = ImageLoadingEmulator(device_count=1, total_memory=64 << 20)
    async with running_worker(config, backend, [f"unix://{short_tmp}/m.sock"]) as w:
        yield w


def _store(worker: Worker, tenant: str) -> ModuleStore:
    return worker._tenant_state[tenant].module_store


async def _works(gpu: hipr.AsyncGpu, module: hipr.Module) -> None:
    """The module's kernels run (the session serves on)."""
    fill = await module.function("fill_f32")
    buf = await gpu.malloc(64)
    await fill.launch(1, 16, (buf, np.float32(2.5), np.uint64(16)))
    out = np.zeros(16, np.float32)
    await gpu.memcpy_dtoh(buf, out=out)
    assert (out == 2.5).all()
    await gpu.free(buf)


@pytest.mark.anyio
async def test_a_second_session_loads_by_hash_without_the_bytes(worker: Worker) -> None:
    url = worker.bound_urls[0]
    image = emulated_fatbin(64 * KiB)
    async with hipr.aconnect(url, token=ALICE) as first:
        await _works(first, await first.module_load(image))
    store = _store(worker, "alice")
    after_first = store.figures()
    assert after_first.bytes_received == len(image) and after_first.misses == 1
    async with hipr.aconnect(url, token=ALICE) as second:
        module = await second.module_load(image)
        await _works(second, module)
        await module.unload()  # its own module: unloading leaves the store as it was
        assert hashlib.sha256(image).digest() in store
    after = store.figures()
    assert after.bytes_received == len(image)  # nothing more crossed
    assert (after.hits, after.bytes_saved) == (1, len(image))


@pytest.mark.anyio
async def test_small_images_are_sent_as_they_are(worker: Worker) -> None:
    image = emulated_fatbin(2 * KiB)
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        await gpu.module_load(image)
        await gpu.module_load(image)
    f = _store(worker, "alice").figures()
    assert (f.hits, f.misses, f.held_images, f.bytes_received) == (0, 0, 0, 2 * len(image))


@pytest.mark.anyio
async def test_another_tenant_offering_the_hash_is_told_not_held(worker: Worker) -> None:
    url = worker.bound_urls[0]
    image = emulated_fatbin(16 * KiB, seed=7)
    async with hipr.aconnect(url, token=ALICE) as alice:
        await alice.module_load(image)
    async with hipr.aconnect(url, token=BOB) as bob:
        reply = await bob._call(Opcode.MODULE_LOAD, {"sha256": sha256(image)})
        assert reply == {"held": False}
        await bob.module_load(image)  # then sends the bytes, and keeps its own copy
    assert _store(worker, "bob").figures().bytes_received == len(image)
    assert _store(worker, "alice").figures().hits == 0


@pytest.mark.anyio
async def test_bytes_not_matching_their_hash_are_refused_and_not_kept(worker: Worker) -> None:
    image, other = emulated_fatbin(8 * KiB, seed=1), emulated_fatbin(8 * KiB, seed=2)
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        with pytest.raises(hipr.HipError) as caught:
            await gpu._call(Opcode.MODULE_LOAD, {"sha256": sha256(other)}, image)
        assert caught.value.code == E.hipErrorInvalidValue
        assert "SHA-256" in str(caught.value)
        store = _store(worker, "alice")
        assert sha256(other) not in store and sha256(image) not in store
        assert (await gpu._call(Opcode.MODULE_LOAD, {"sha256": sha256(other)})) == {"held": False}
        await _works(gpu, await gpu.module_load(image))


@pytest.mark.anyio
async def test_an_image_the_worker_refuses_is_not_kept(worker: Worker) -> None:
    """Kept only once loaded: bytes that match their hash but do not load take no store
    space, and a later offer of that hash is told "not held"."""
    junk = bytes(range(256)) * 32  # 8 KiB, no code object of any kind
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        with pytest.raises(hipr.HipError):
            await gpu._call(Opcode.MODULE_LOAD, {"sha256": sha256(junk)}, junk)
        store = _store(worker, "alice")
        assert sha256(junk) not in store and store.figures().held_bytes == 0
        assert (await gpu._call(Opcode.MODULE_LOAD, {"sha256": sha256(junk)})) == {"held": False}
        await _works(gpu, await gpu.module_load(emulated_fatbin(8 * KiB)))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "value",
    [b"\x01" * 31, b"\x01" * 33, b"\x01" * (1 << 20), "ab" * 32, 7, [1, 2], True],
    ids=["short", "long", "huge", "text", "int", "list", "bool"],
)
async def test_a_malformed_hash_is_refused_and_the_session_serves_on(
    worker: Worker, value: object
) -> None:
    image = emulated_fatbin(8 * KiB)
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        for data in (b"", image):
            with pytest.raises(hipr.HipError) as caught:
                await gpu._call(Opcode.MODULE_LOAD, {"sha256": value}, data)
            assert caught.value.code == E.hipErrorInvalidValue
            assert "'sha256' must be a byte string of exactly 32 bytes" in str(caught.value)
        with pytest.raises(hipr.HipError, match="empty"):
            await gpu._call(Opcode.MODULE_LOAD, {}, b"")
        await _works(gpu, await gpu.module_load(image))


@pytest.mark.anyio
async def test_the_tenant_bound_evicts_the_least_recently_used(worker: Worker) -> None:
    images = [emulated_fatbin(8 * KiB, seed=i) for i in range(4)]
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        for image in images:  # alice keeps 3
            await gpu.module_load(image)
    store = _store(worker, "alice")
    assert [sha256(i) in store for i in images] == [False, True, True, True]
    assert store.figures().evictions == 1
    families = {f.name: f for f in module_store_metrics(worker)}
    samples = {(s.name, s.labels["tenant"]): s.value for f in families.values() for s in f.samples}
    assert samples[("hipr_module_store_images", "alice")] == 3
    assert samples[("hipr_module_store_bytes", "alice")] == 3 * 8 * KiB
    assert samples[("hipr_module_store_evictions_total", "alice")] == 1
    assert samples[("hipr_module_load_received_bytes_total", "alice")] == 4 * 8 * KiB


@pytest.mark.anyio
async def test_a_worker_without_the_feature_gets_the_bytes(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1.1 worker (HELLO says so) is never offered a hash: every load sends its bytes."""
    import hipr.worker.client_link as client_link

    monkeypatch.setattr(client_link, "PROTOCOL_VERSION", 0x0101)
    image = emulated_fatbin(32 * KiB)
    for _ in range(2):
        async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
            assert gpu.worker_info()["protocol"] == 0x0101
            await _works(gpu, await gpu.module_load(image))
    f = _store(worker, "alice").figures()
    assert (f.hits, f.misses, f.held_images, f.bytes_received) == (0, 0, 0, 2 * len(image))


# --- the tenants file's keys ----------------------------------------------------------------


def test_store_bounds_parse_default_and_reach_a_tenant_child() -> None:

    path = Path("tenants.toml")
    registry = parse_tenants(
        {"tenants": {"a": {"module_store_bytes": "64MiB", "module_store_count": 0}, "b": {}}},
        path,
    )
    a, b = registry.tenants["a"].quotas, registry.tenants["b"].quotas
    assert (a.module_store_bytes, a.module_store_count) == (64 << 20, 0)
    assert (b.module_store_bytes, b.module_store_count) == (
        DEFAULT_MODULE_STORE_BYTES,
        DEFAULT_MODULE_STORE_COUNT,
    )
    # A tenant's child worker is configured from these lines: they parse back the same.
    child = tomllib.loads("\n".join(_quota_lines(a)))
    assert parse_tenants({"tenants": {"a": child}}, path).tenants["a"].quotas == a


@pytest.mark.parametrize("value", [-1, "lots", 1.5, True])
def test_bad_store_bounds_are_refused(value: object) -> None:

    for key in ("module_store_bytes", "module_store_count"):
        with pytest.raises(ConfigError, match=key):
            parse_tenants({"tenants": {"a": {key: value}}}, Path("t.toml"))


# --- isolation = "process": the store lives in the tenant's child -------------------------


@pytest.mark.anyio
async def test_a_tenant_child_keeps_the_store_and_the_parent_reports_it(
    anyio_backend: str, short_tmp: Path
) -> None:
    """The child workers run the plain emulator, which loads no code object: each load
    fails with hipErrorInvalidImage, so nothing is kept (an image is kept only once it
    loaded) and each start sends the bytes again; the figures, polled from the child into
    the parent's metrics, show exactly that."""
    config = WorkerConfig(
        tenants_file=_tenants(short_tmp / "tenants.toml"),
        isolation="process",
        backend="emulator",
        log_level="warning",
    )
    image = emulated_fatbin(16 * KiB)
    async with running_worker(config, ImageLoadingEmulator(), ["tcp://127.0.0.1:0"]) as worker:
        isolation = worker.isolation
        assert isolation is not None
        try:
            url = worker.bound_urls[0]
            with anyio.fail_after(60):
                for _ in range(2):
                    async with hipr.aconnect(url, token=ALICE) as alice:
                        with pytest.raises(hipr.HipError, match="hipErrorInvalidImage"):
                            await alice.module_load(image)
                async with hipr.aconnect(url, token=BOB) as bob:
                    reply = await bob._call(Opcode.MODULE_LOAD, {"sha256": sha256(image)})
                    assert reply == {"held": False}
                await isolation.poll()
            figures = worker.module_store_figures()
            assert figures["alice"].hits == 0 and figures["alice"].misses == 2
            assert figures["alice"].bytes_received == 2 * len(image)
            assert figures["alice"].held_images == 0
            assert figures["bob"].misses == 1 and figures["bob"].held_images == 0
            samples = {
                (s.name, s.labels["tenant"]): s.value
                for f in module_store_metrics(worker)
                for s in f.samples
            }
            assert samples[("hipr_module_store_misses_total", "alice")] == 2
            assert samples[("hipr_module_load_received_bytes_total", "alice")] == 2 * len(image)
        finally:
            await isolation.aclose()


@pytest.mark.anyio
async def test_a_reload_trims_to_lowered_bounds_and_drops_a_removed_tenant(
    worker: Worker,
) -> None:
    url = worker.bound_urls[0]
    images = [emulated_fatbin(8 * KiB, seed=i) for i in range(3)]
    async with hipr.aconnect(url, token=ALICE) as alice, hipr.aconnect(url, token=BOB) as bob:
        for image in images:
            await alice.module_load(image)
        await bob.module_load(images[0])
    tenants = worker.config.tenants_file
    assert tenants is not None
    text = tenants.read_text()
    # alice keeps 1 image; bob is gone
    tenants.write_text(
        text.split("[tenants.bob]")[0].replace("module_store_count = 3", "module_store_count = 1")
    )
    worker.reload_tenants()
    alice_store, bob_store = _store(worker, "alice"), _store(worker, "bob")
    assert [sha256(i) in alice_store for i in images] == [False, False, True]
    assert len(bob_store) == 0 and bob_store.held_bytes == 0
