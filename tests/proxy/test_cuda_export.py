"""The private export tables of the proxy's libcuda.so.1 called from C under ASan/UBSan
(tests/proxy/c/cuda_etbl_check.c): no slot is NULL, a slot whose meaning is not known
returns CUDA_ERROR_NOT_SUPPORTED and names itself once, the tools-TLS and tools-context
slots cuBLASLt calls give what NVIDIA's driver gave on the GPU host; with
HIPR_PROXY_TRACE=2 each slot called prints its arguments and result."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

from hipr.proxy.build import CUDA_LIBRARY, CUDA_SUBDIR
from tests.proxy.sanitized import (
    SANITIZED_FLAGS,
    SANITIZER_ENV,
    assert_sanitizer_clean,
    cc,
    linked_to,
)

C_FILE = Path(__file__).resolve().parent / "c" / "cuda_etbl_check.c"


@pytest.fixture(scope="module")
def program(sanitized_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("etbl")
    libs = sanitized_libs
    cuda = libs / CUDA_SUBDIR
    out = tmp / "cuda_etbl_check"
    cc([
        *SANITIZED_FLAGS, str(C_FILE), "-o", str(out),
        *linked_to(cuda, CUDA_LIBRARY),
    ])  # fmt: skip
    return out


def _run(program: Path, url: str, trace: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HIPR_URL=url, **SANITIZER_ENV)
    env.pop("HIPR_PROXY_TRACE", None)
    if trace:
        env["HIPR_PROXY_TRACE"] = trace
    return subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_export_tables_served_slots(proxy_libs: None, worker_url: str, program: Path) -> None:
    result = _run(program, worker_url, None)
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok"
    # Each refused slot is named once, with its table.
    assert 'slot 3 of the private driver table "runtime interface" is not served' in result.stderr
    assert result.stderr.count('slot 1 of the private driver table "tools context"') == 1
    assert 'slot 92 of the private driver table "tools context"' in result.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the trampolines are x86-64 code")
def test_traced_table_slots_print_arguments(
    proxy_libs: None, worker_url: str, program: Path
) -> None:
    result = _run(program, worker_url, "2")
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok"
    lines = result.stderr.splitlines()
    tls_get = [ln for ln in lines if ln.startswith("hipr trace: etbl 42d85a81[2](")]
    # tls_get(&none), tls_get(NULL), then two more: the NULL one fails, the others pass.
    assert len(tls_get) == 4, tls_get
    assert tls_get[1].endswith("-> 1 CUDA_ERROR_INVALID_VALUE")
    assert tls_get[0].endswith("-> 0") and " *a0=0 " in tls_get[0]
    refused = [ln for ln in lines if ln.startswith("hipr trace: etbl 21318c60[92](")]
    assert refused and refused[0].endswith("-> 801 CUDA_ERROR_NOT_SUPPORTED")
