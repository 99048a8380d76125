"""A worker for the facade's tests, and ``from hipr import hip, hiprtc`` connected to it.

The backend is the emulator, or the one ``HIPR_TEST_BACKEND`` names: on the H100,
``HIPR_TEST_BACKEND=cuda python -m pytest tests/facade -q`` runs every case on the GPU.
The emulator has no device compiler, so here it gets a stand-in (:class:`CompilingEmulator`):
a source whose kernels are hipr's built-ins (same names, same signatures) "compiles" to an
image that loads as the built-in kernels, and ``#error`` fails with a compiler-style log.
The test programs are real HIP C++, so on a GPU backend the same sources compile for real.
Cases that need a real compiler are marked ``gpu`` and skip on the emulator.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from hipr import hip
from hipr.backends import emulator as emu
from hipr.backends import load_backend
from hipr.backends._emulator_objects import Module
from hipr.backends._errmap import rtc_error
from hipr.backends.interface import Backend
from hipr.kernels.builtins import BUILTINS
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig

BACKEND = os.environ.get("HIPR_TEST_BACKEND", "emulator")
_IMAGE = b"HIPR-EMULATED-CODE-OBJECT\0"
HIPRTC_ERROR_COMPILATION = 6
HIPRTC_ERROR_LINKING = 100


class CompilingEmulator(emu.EmulatorBackend):
    """The emulator with a stand-in compiler for sources made of built-in kernels."""

    def compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """``#error text`` fails as a compiler would, with a log, and so does an
        ``#include "name"`` of a header the program did not give; anything else
        "compiles"."""
        given = {n for n, _ in headers}
        for missing in re.findall(r'^\s*#\s*include\s*"([^"]+)"', source, re.M):
            if missing not in given:
                log = f"{name}:1:10: fatal error: '{missing}' file not found"
                raise rtc_error(HIPRTC_ERROR_COMPILATION, "hiprtcCompileProgram", log)
        failed = re.search(r"^\s*#error\s+(.*)$", source, re.M)
        if failed:
            line = source[: failed.start()].count("\n") + 1
            log = f'{name}:{line}:2: error: "{failed.group(1)}"'
            raise rtc_error(HIPRTC_ERROR_COMPILATION, "hiprtcCompileProgram", log)
        return _IMAGE + ",".join(options).encode()

    def program_link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """Images from :meth:`compile` link into one (which loads as they do); anything
        else fails as a linker would."""
        for _, code, name in inputs:
            if not code.startswith(_IMAGE):
                raise rtc_error(HIPRTC_ERROR_LINKING, "hiprtcLinkComplete", f"{name}: not code")
        return _IMAGE + b"linked:" + b",".join(n.encode() for _, _, n in inputs), "2 inputs"

    def module_load(self, image: bytes) -> Module:
        """Images from :meth:`compile` load as a fresh module of the built-in kernels."""
        if not bytes(image).startswith(_IMAGE):
            return super().module_load(image)
        module = Module(self._current(), dict(BUILTINS))
        with self._lock:
            self._modules.add(module)
        return module


@dataclass(frozen=True)
class FacadeTarget:
    """The worker the facade tests use."""

    backend: str
    url: str
    runtime: Backend

    @property
    def is_gpu(self) -> bool:
        """A real GPU backend (kernels compile for real)."""
        return self.backend != "emulator"


def make_backend() -> Backend:
    """The backend of this run."""
    if BACKEND == "emulator":
        return CompilingEmulator(device_count=2, total_memory=256 << 20)
    return load_backend(BACKEND)


@pytest.fixture(scope="module")
def target() -> Iterator[FacadeTarget]:
    """A worker on a unix socket, on its own event-loop thread, for one test module."""
    backend = make_backend()
    tmp = Path(tempfile.mkdtemp(prefix="hipr-f-", dir="/tmp"))
    try:
        url = f"unix://{tmp}/w.sock"
        with worker_in_thread(WorkerConfig(), backend, url, loop="trio") as worker:
            yield FacadeTarget(BACKEND, worker.bound_urls[0], backend)
    finally:
        backend.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def facade(target: FacadeTarget) -> Iterator[FacadeTarget]:
    """``hipr.hip`` connected to the test worker; disconnected (its session freed) after."""
    hip.connect(target.url)
    try:
        yield target
    finally:
        hip.disconnect()
        hip.hipGetLastError()


@pytest.fixture
def gpu_only(target: FacadeTarget) -> None:
    """Skip unless the backend compiles kernels for real (HIPR_TEST_BACKEND=cuda or hip)."""
    if not target.is_gpu:
        pytest.skip("needs a real device compiler: run with HIPR_TEST_BACKEND=cuda (or hip)")


def hip_check(result: tuple[object, ...]) -> object:
    """hip-python's documented helper: raise on a failing result, return the rest."""
    err = result[0]
    rest = result[1:]
    if int(err) != 0:  # type: ignore[call-overload]
        raise RuntimeError(f"{err!r}: {hip.last_error_message()}")
    if len(rest) == 1:
        return rest[0]
    return rest if rest else None
