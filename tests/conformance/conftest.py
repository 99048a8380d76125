"""Workers for the conformance suite: one per backend that loads here, per test module.

The same cases run through the real client -> unix socket -> worker -> backend stack
against every backend: the emulator always, ``cuda`` (and ``hip``) where its runtime
loads. A backend that cannot load is skipped with its one-line reason; that is the
only legitimate skip in this suite.

Each module gets a worker on its own event-loop thread (a blocking portal), so that the
async tests, which run under both trio and asyncio, all talk to the same worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hipr.backends import BackendUnavailable, load_backend
from hipr.backends.interface import Backend
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig

#: Backends the suite tries, in order. ``hip`` needs an AMD GPU: it skips elsewhere.
BACKENDS = ("emulator", "cuda", "hip")

#: The emulator's device size: room for the 64 MiB copies (source, destination, D2D)
#: while untouched pages cost no host memory.
EMULATED_MEMORY = 1 << 30


@dataclass(frozen=True, slots=True)
class Target:
    """A worker serving one backend, as the tests see it."""

    backend: str
    url: str
    #: The backend object inside the worker (its stats are checked for leaks).
    runtime: Backend

    @property
    def is_gpu(self) -> bool:
        """A real GPU (cuda or hip) rather than the emulator."""
        return self.backend != "emulator"

    @property
    def has_compiler(self) -> bool:
        """Kernels can be compiled at run time (hiprtc / NVRTC)."""
        return self.is_gpu


def short_tmpdir(prefix: str) -> Path:
    """A short directory: unix socket paths must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def load_or_skip(name: str) -> Backend:
    """The backend ``name``, or skip the module with the loader's one-line reason."""
    try:
        return load_backend(name, device_count=1, total_memory=EMULATED_MEMORY)
    except BackendUnavailable as exc:
        pytest.skip(exc.message)


@pytest.fixture(scope="module", params=BACKENDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A worker with the parametrized backend on a unix socket, for one test module."""
    name = str(request.param)
    backend = load_or_skip(name)
    tmp = short_tmpdir("hipr-c-")
    url = f"unix://{tmp}/w.sock"
    try:
        with worker_in_thread(WorkerConfig(), backend, url, loop="trio") as worker:
            yield Target(name, worker.bound_urls[0], backend)
    finally:
        backend.close()
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class WorkerProcess:
    """A ``hipr worker`` in a child process (for faults that poison a CUDA context)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def worker_process(target: Target) -> Iterator[WorkerProcess]:
    """A fresh ``hipr worker --backend <target's>`` process for one test: a CUDA context
    that has seen an illegal address is unusable for good, so such a case must not share
    the in-process worker's context."""
    tmp = short_tmpdir("hipr-p-")
    sock = tmp / "w.sock"
    log = tmp / "worker.log"
    env = dict(os.environ, HIPR_LOG_FORMAT="console")
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hipr",
                "worker",
                "--backend",
                target.backend,
                "--listen",
                f"unix://{sock}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the worker process did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield WorkerProcess(f"unix://{sock}", process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(tmp, ignore_errors=True)
