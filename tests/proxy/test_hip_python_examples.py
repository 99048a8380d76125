"""hip-python's own examples (tests/proxy/hip_python_examples/, verbatim) with their
original imports, through ``hipr run`` against an emulator worker: those that need no
compiler run to their ``ok``; those that compile reach the compile, which the emulator
refuses cleanly (a cuda worker runs them: scripts/proxy-gpu-check). They are written for
hip-python 6.x, so they run with hip-python 6.3.3 (the ``hip-python-fork`` wheel),
installed once into a cache directory beside the test environment's hip-python 10."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.proxy.conftest import run_python

EXAMPLES = Path(__file__).resolve().parent / "hip_python_examples"
#: hip-python 6.3.3 as a wheel on PyPI (AMD publishes 6.x on its own index only).
HIP_PYTHON_6 = "hip-python-fork==6.3.3.540.31.1"
#: What the examples import; the rest of the wheel (hipBLAS, hipSPARSE, ... bindings,
#: a few hundred MB) is removed after the install.
_KEEP = ("__init__", "_version", "_util", "hip", "chip", "hiprtc", "chiprtc", "hiprtc_pyext",
         "_hip_helpers", "_hiprtc_helpers")  # fmt: skip


def _install(target: Path) -> None:
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--target", str(staging), HIP_PYTHON_6],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"installing {HIP_PYTHON_6} failed: {result.stderr[-2000:]}"
    for entry in (staging / "hip").iterdir():
        if entry.name.split(".")[0] not in _KEEP:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    staging.rename(target)


@pytest.fixture(scope="session")
def hip_python_6() -> Iterator[Path]:
    """A directory to put first on PYTHONPATH: hip-python 6.3.3's ``hip`` package."""
    given = os.environ.get("HIPR_HIP_PYTHON6")
    if given:
        yield Path(given)
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hipr-tests"
    version = f"py{sys.version_info[0]}{sys.version_info[1]}"
    target = cache / f"{HIP_PYTHON_6.replace('==', '-')}-{version}"
    if not (target / "hip" / "__init__.py").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        _install(target)
    yield target


def _example(name: str, url: str, site: Path) -> subprocess.CompletedProcess[str]:
    code = (EXAMPLES / name).read_text()
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return run_python(code, url=url, via_cli=True, env=env, timeout=120)


@pytest.mark.parametrize(
    "name", ["hip_deviceattributes.py", "hip_deviceproperties.py", "hip_stream.py"]
)
def test_examples_without_a_compiler_run(name: str, worker_url: str, hip_python_6: Path) -> None:
    result = _example(name, worker_url, hip_python_6)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "ok"
    if name == "hip_deviceproperties.py":
        # The worker's values, in hip-python 6's types (char arrays as bytes).
        assert "props.name=b'hipr emulator'" in result.stdout
        assert "props.gcnArchName=b'emu'" in result.stdout
        assert "props.warpSize=64" in result.stdout
    if name == "hip_deviceattributes.py":
        assert "hipDeviceAttributeWarpSize: 64" in result.stdout


@pytest.mark.parametrize(
    "name",
    ["hiprtc_launch_kernel_args.py", "hiprtc_launch_kernel_no_args.py", "hip_jacobi.py"],
)
def test_examples_with_a_compiler_reach_the_compile(
    name: str, worker_url: str, hip_python_6: Path
) -> None:
    """Everything up to hiprtcCompileProgram is served (properties, `b"--offload-arch=" +
    props.gcnArchName`, program creation); the emulator has no compiler, and the example
    raises the worker's log, as it would for any failed compile."""
    result = _example(name, worker_url, hip_python_6)
    assert result.returncode == 1
    assert "RuntimeError: the emulator has no device compiler" in result.stderr, result.stderr
    if name != "hip_jacobi.py":
        assert "Compiling kernel for b'emu'" in result.stdout
