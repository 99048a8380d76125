"""The API reference builds from the docstrings with no warning, covers the public API,
and the sync objects show their methods to ``dir()`` and ``help()``."""

from __future__ import annotations

import importlib.util
import inspect
import pydoc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.client.sync import sync_class
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig

REPO = Path(__file__).resolve().parent.parent

#: Anchors the reference must have: one per object the issue names, and a method or two.
REQUIRED = [
    "hipr.connect",
    "hipr.aconnect",
    "hipr.client.sync.Gpu",
    "hipr.client.sync.Gpu.malloc",
    "hipr.client.sync.Gpu.stream_create",
    "hipr.AsyncGpu",
    "hipr.AsyncGpu.memcpy_htod",
    "hipr.MultiGpu",
    "hipr.AsyncMultiGpu",
    "hipr.Stream.wait_event",
    "hipr.Event.query",
    "hipr.Function.launch",
    "hipr.Module.function",
    "hipr.Graph",
    "hipr.errors.HipError",
    "hipr.errors.InvalidUrlError",
    "hipr.errors.SessionLostError",
    "hipr.hip.connect",
    "hipr.hip.hipMalloc",
    "hipr.hiprtc",
    "hipr.client.sync.SyncProxy",
    "hipr.client.sync.sync_class",
]


@pytest.mark.timeout(300)  # a real documentation build, slower on a loaded machine
def test_api_reference_builds_strictly(tmp_path: Path) -> None:
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[test]' installs it)")
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    assert "WARNING" not in build.stderr, build.stderr[-4000:]
    html = "".join(p.read_text() for p in site.glob("*/index.html"))
    missing = [name for name in REQUIRED if f'id="{name}"' not in html]
    assert not missing, f"the API reference lacks {missing}"
    # The real docstrings, not the proxy's.
    assert (
        "Wraps an async API object" not in html.split('id="hipr.client.sync.Gpu.malloc"')[1][:3000]
    )


def test_sync_classes_have_the_async_methods_with_their_docs() -> None:
    names = {n for n in dir(hipr.Gpu) if not n.startswith("_")}
    assert {"malloc", "memcpy_htod", "stream_create", "builtin", "synchronize", "close"} <= names
    assert inspect.getdoc(hipr.Gpu.malloc).startswith(inspect.getdoc(hipr.AsyncGpu.malloc))
    assert inspect.signature(hipr.Gpu.malloc) == inspect.signature(hipr.AsyncGpu.malloc)
    assert not inspect.iscoroutinefunction(hipr.Gpu.malloc)
    for async_cls in (hipr.Stream, hipr.Event, hipr.Function, hipr.Module, hipr.Graph):
        cls = sync_class(async_cls)
        for name, fn in inspect.getmembers(async_cls, inspect.iscoroutinefunction):
            if not name.startswith("_"):
                assert getattr(cls, name).__doc__.startswith(inspect.getdoc(fn) or ""), name
    assert "wait_event" in dir(sync_class(hipr.Stream))
    assert "query" in pydoc.render_doc(sync_class(hipr.Event), renderer=pydoc.plaintext)


@pytest.fixture
def url() -> Iterator[str]:
    with worker_in_thread(WorkerConfig(), EmulatorBackend(), loop="asyncio") as worker:
        yield worker.bound_urls[0]


def test_sync_objects_show_their_methods(url: str) -> None:
    with hipr.connect(url) as gpu:
        assert {"malloc", "stream_create", "synchronize", "worker_info"} <= set(dir(gpu))
        stream = gpu.stream_create()
        assert {"wait_event", "synchronize", "query", "destroy", "id"} <= set(dir(stream))
        text = pydoc.render_doc(stream, renderer=pydoc.plaintext)
        assert "wait_event" in text and inspect.getdoc(hipr.Stream.wait_event) in text
        event = gpu.event_create()
        event.record(stream)
        assert event.query() is True  # the method works as before
        assert type(event).__name__ == "SyncEvent"
        stream.destroy()


def test_a_method_held_from_before_its_first_call_binds_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``post = gpu.memcpy_htod_async`` taken before any call is the class's method: each
    call must reuse the instance's blocking version, made once (made per call, it halved
    the rate of fire-and-forget copies in hipr bench)."""
    from hipr.client.sync import SyncProxy

    binds: list[str] = []
    bind = SyncProxy._bind

    def counting(self: SyncProxy, name: str) -> object:
        binds.append(name)
        return bind(self, name)

    monkeypatch.setattr(SyncProxy, "_bind", counting)
    with hipr.connect(url) as gpu:
        post = gpu.memcpy_htod_async
        ptr = gpu.malloc(4)
        for _ in range(3):
            post(ptr, b"abcd")
        gpu.synchronize()
        assert gpu.memcpy_dtoh(ptr, 4) == b"abcd"
    assert binds.count("memcpy_htod_async") == 1, binds
