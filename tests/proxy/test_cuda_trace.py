"""HIPR_PROXY_TRACE=1 on the proxy's libcuda.so.1: every call made through a pointer
from cuGetProcAddress prints its name and result, with arguments (the stack arguments of
cuLaunchKernel included) and results passed through unchanged, under ASan/UBSan; unset,
cuGetProcAddress hands out the entry points themselves and prints nothing."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

from hipr.proxy.build import (
    CUDA_LIBRARY,
    CUDA_SUBDIR,
    LIB_DIR,
    SANITIZE,
    WARNINGS,
)
from tests.proxy.sanitized import SANITIZER_ENV, assert_sanitizer_clean, cc, linked_to

C_FILE = Path(__file__).resolve().parent / "c" / "cuda_trace_check.c"


def _program(tmp_path: Path, sanitized_libs: Path | None) -> Path:
    """The check program, against the sanitized libraries where given, else the built ones."""
    sanitize = sanitized_libs is not None
    libs = sanitized_libs if sanitized_libs is not None else LIB_DIR
    cuda = libs / CUDA_SUBDIR
    program = tmp_path / "cuda_trace_check"
    cc([
        *(SANITIZE if sanitize else ()), *WARNINGS, "-std=c11", str(C_FILE), "-o", str(program),
        *linked_to(cuda, CUDA_LIBRARY),
    ])  # fmt: skip
    return program


def _run(
    program: Path, url: str, trace: str | None, *args: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HIPR_URL=url, **SANITIZER_ENV)
    env.pop("HIPR_PROXY_TRACE", None)
    if trace is not None:
        env["HIPR_PROXY_TRACE"] = trace
    return subprocess.run(
        [str(program), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the trampolines are x86-64 code")
def test_trace_prints_each_call_and_passes_it_through(
    sanitized_libs: Path, worker_url: str, tmp_path: Path
) -> None:
    program = _program(tmp_path, sanitized_libs)
    traced = _run(program, worker_url, "1")
    assert_sanitizer_clean(traced)
    assert traced.stdout.strip() == "ok"
    lines = [ln for ln in traced.stderr.splitlines() if ln.startswith("hipr trace: ")]
    # A call that waited for the worker says how many times: a copy back always does.
    assert "hipr trace: cuMemcpyDtoH -> 0 (1 round trip)" in lines
    calls = [
        re.sub(r" \(\d+ round trips?\)$", "", ln.removeprefix("hipr trace: "))
        for ln in lines
        if "cuGetProcAddress(" not in ln
    ]
    assert "cuGetProcAddress(cuLaunchKernel, 12000, 0) -> found" in traced.stderr
    assert calls[:3] == [
        "cuInit -> 1 CUDA_ERROR_INVALID_VALUE",
        "cuInit -> 0",
        "cuDeviceGetCount -> 0",
    ]
    assert calls.count("cuLaunchKernel -> 0") == 1, calls
    assert any(c.startswith("cuLaunchKernel -> ") and c != "cuLaunchKernel -> 0" for c in calls)
    assert "cuMemAllocManaged -> 801 CUDA_ERROR_NOT_SUPPORTED" in calls
    assert calls[-1] == "cuDevicePrimaryCtxRelease -> 0"

    plain = _run(program, worker_url, None)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "hipr trace:" not in plain.stderr
    off = _run(program, worker_url, "0")
    assert off.returncode == 0 and "hipr trace:" not in off.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the trampolines are x86-64 code")
def test_a_crash_under_the_trace_names_the_last_call(
    proxy_libs: None, worker_url: str, tmp_path: Path
) -> None:
    # Without sanitizers: AddressSanitizer handles SIGSEGV itself, and the report then
    # stands aside (it installs itself only over the default action).
    program = _program(tmp_path, None)
    crashed = _run(program, worker_url, "1", "crash")
    assert crashed.returncode == -11, crashed.stdout + crashed.stderr
    assert "hipr trace: signal 11 (fault address 0) after cuInit" in crashed.stderr
    assert "called from 0x" in crashed.stderr and str(program) in crashed.stderr
