"""The proxy's minimal libnvidia-ml.so.1: NVML's device queries answered from the worker
through the proxy's libcuda.so.1 (pynvml, as programs use it), against an emulator
worker; NVIDIA's NVML and driver are never loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hipr.proxy.build import CUDA_SUBDIR, LIB_DIR, NVML_LIBRARY

HERE = Path(__file__).resolve().parent


def test_nvml_through_the_proxy(proxy_libs: None, worker_url: str) -> None:
    pytest.importorskip("pynvml", reason="pynvml (nvidia-ml-py) drives the NVML check")
    folder = LIB_DIR / CUDA_SUBDIR
    env = dict(os.environ, HIPR_URL=worker_url, LD_LIBRARY_PATH=str(folder))
    result = subprocess.run(
        [sys.executable, str(HERE / "cuda" / "nvml_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "count 1" in lines
    assert "name hipr emulator" in lines
    assert "uuid True" in lines and "memory True" in lines and "by uuid 0" in lines
    assert "pci 00000000:00:00.0" in lines
    assert "cuda 13000" in lines
    assert "processes Not Supported" in lines
    assert "is not served (NVML_ERROR_NOT_SUPPORTED)" in result.stderr
    mapped = str(sorted({str(folder / "libcuda.so.1"), str(folder / NVML_LIBRARY)}))
    assert f"mapped {mapped}" in lines, result.stdout
