"""The export-table spy (tests/proxy/cuda/etbl_spy.c), the tool that showed what NVIDIA's
driver hands out and what cuBLAS calls: built, and put in front of the proxy's own
libcuda.so.1 as the driver it forwards to, it forwards every call (the export-table check
passes through it), describes each private table once and traces each slot's calls, and
spy_summary.py sums the log up."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

from hipr.proxy.build import CUDA_LIBRARY, CUDA_SUBDIR, LIB_DIR, WARNINGS
from tests.proxy.cuda.build_spy import main as build_spy
from tests.proxy.cuda.spy_summary import summarise
from tests.proxy.sanitized import cc, linked_to

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the forwarders are x86-64 code")
def test_spy_forwards_describes_and_traces(
    proxy_libs: None, worker_url: str, tmp_path: Path
) -> None:
    spy = build_spy(tmp_path / "spy").parent
    cuda = LIB_DIR / CUDA_SUBDIR
    program = tmp_path / "cuda_etbl_check"
    cc([
        *WARNINGS, "-std=c11", str(HERE / "c" / "cuda_etbl_check.c"), "-o", str(program),
        *linked_to(cuda, CUDA_LIBRARY),
    ])  # fmt: skip
    env = dict(
        os.environ,
        HIPR_URL=worker_url,
        LD_LIBRARY_PATH=str(spy),  # before the program's RUNPATH: the spy is libcuda.so.1
        HIPR_SPY_DRIVER=str(cuda / CUDA_LIBRARY),
        HIPR_PROXY_TRACE="2",
    )
    result = subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
    err = result.stderr
    assert f"hipr spy: forwarding to {cuda / CUDA_LIBRARY}" in err
    # Described once each, with their size slots, whoever asks again.
    assert (
        err.count("hipr spy: table 42d85a81-23f6-cb47-8298-f6e78a3aecdc: slot 0 = 0x18, 3 slots")
        == 1
    )
    assert "hipr spy: table 21318c60-9714-3248-8ca6-41ff7324c8f2: slot 0 = 0x2e8, 93 slots" in err
    assert "hipr spy:   etbl 42d85a81[2] code " in err
    summary = summarise(err.splitlines())
    calls = next(ln for ln in summary if ln.startswith("etbl 21318c60[4]: "))
    assert calls.endswith(" calls") and int(calls.split()[2]) >= 2
    # A refused slot's error comes back through the spy's trampoline unchanged.
    refused = summary[
        summary.index(next(ln for ln in summary if ln.startswith("etbl 21318c60[92]"))) + 1
    ]
    assert refused.endswith("-> 801 CUDA_ERROR_NOT_SUPPORTED"), refused
