"""NVIDIA's CUDA runtime (libcudart, which CuPy and PyTorch load) initialises and runs
through the proxy's libcuda.so.1 against an emulator worker: its private export tables
(runtime interface, tools hooks, context-local storage, context checks, the keyed
integrity check) and context-independent loading are served well enough for device
queries, memory, copies, memsets, streams and events. Needs a libcudart on this machine
(a CUDA toolkit, or the nvidia-cuda-runtime wheel); the test says where it looked when
there is none."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hipr.proxy.build import CUDA_SUBDIR, LIB_DIR

HERE = Path(__file__).resolve().parent
_PLACES = (
    "/usr/local/cuda/lib64/libcudart.so.1[23]",
    "/usr/local/cuda-1[23]*/lib64/libcudart.so.1[23]",
    f"{sys.prefix}/lib/python3*/site-packages/nvidia/cu*/lib/libcudart.so.1[23]",
    f"{sys.prefix}/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.1[23]",
)


def _libcudart() -> str | None:
    for pattern in (os.environ.get("HIPR_TEST_LIBCUDART", ""), *_PLACES):
        found = sorted(glob.glob(pattern)) if pattern else []
        if found:
            return found[-1]
    return None


def test_cuda_runtime_through_the_proxy(proxy_libs: None, worker_url: str) -> None:
    libcudart = _libcudart()
    if libcudart is None:
        pytest.skip(f"no libcudart.so.12/13 here (looked in {', '.join(_PLACES)})")
    env = dict(
        os.environ,
        HIPR_URL=worker_url,
        LD_LIBRARY_PATH=str(LIB_DIR / CUDA_SUBDIR),
    )
    result = subprocess.run(
        [sys.executable, str(HERE / "cuda" / "cudart_check.py"), libcudart],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "count 1" in lines
    assert "copy True" in lines
    assert "memset True elapsed True" in lines
    # Only the proxy's libcuda.so.1 is mapped: NVIDIA's driver is never loaded.
    assert f"libcuda ['{LIB_DIR / CUDA_SUBDIR / 'libcuda.so.1'}']" in lines, result.stdout


def test_hipr_run_api_cuda(proxy_libs: None, worker_url: str) -> None:
    """`hipr run --api cuda` puts libcuda.so.1 first on the library path."""
    libcudart = _libcudart()
    if libcudart is None:
        pytest.skip(f"no libcudart.so.12/13 here (looked in {', '.join(_PLACES)})")
    script = str(HERE / "cuda" / "cudart_check.py")
    cmd = [sys.executable, "-m", "hipr", "run", "--url", worker_url, "--api", "cuda", "--"]
    result = subprocess.run(
        [*cmd, sys.executable, script, libcudart],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "copy True" in result.stdout.splitlines()


def test_hipr_run_default_api_follows_the_worker(proxy_libs: None, worker_url: str) -> None:
    """Without --api the worker's backend decides: the emulator gets the HIP proxy."""
    code = "import os; print(os.environ['LD_LIBRARY_PATH'].split(':')[0])"
    cmd = [sys.executable, "-m", "hipr", "run", "--url", worker_url, "--", sys.executable]
    result = subprocess.run(
        [*cmd, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(LIB_DIR)
