"""The proxy's libcuda.so.1, checked from C: a program calling the CUDA driver API (init,
devices, contexts, memory, copies, memsets, streams, events, errors, cuGetProcAddress,
launches of the built-in kernels) against an emulator worker, built with the library
under AddressSanitizer (leak checking on) and UndefinedBehaviorSanitizer; and the
library's own facts (exported names, stubs, no worker)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from hipr.proxy.build import (
    CUDA_LIBRARY,
    CUDA_SOURCES,
    CUDA_SUBDIR,
    CUDA_SYMBOLS,
    LIB_DIR,
    NATIVE,
    SANITIZE,
    WARNINGS,
)
from tests.proxy.sanitized import SANITIZER_ENV, assert_sanitizer_clean, cc, linked_to

C_DIR = Path(__file__).resolve().parent / "c"


def _check_program(libs: Path, tmp_path: Path, flags: tuple[str, ...]) -> Path:
    program = tmp_path / "cuda_check"
    cuda = libs / CUDA_SUBDIR
    cc(
        [
            *flags, *WARNINGS, "-std=c11", str(C_DIR / "cuda_check.c"), "-o", str(program),
            *linked_to(cuda, CUDA_LIBRARY),
        ]
    )  # fmt: skip
    return program


def test_driver_api_under_sanitizers(sanitized_libs: Path, worker_url: str, tmp_path: Path) -> None:
    libs = sanitized_libs
    program = _check_program(libs, tmp_path, SANITIZE)
    env = dict(os.environ, HIPR_URL=worker_url, **SANITIZER_ENV)
    result = subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok"
    # The stub the program called named itself once; the refused launch attribute too.
    assert result.stderr.count("cuMemAllocManaged is not served") == 1, result.stderr
    assert "launch attribute 2 with this value is not served" in result.stderr


def test_no_worker_is_an_error_not_an_abort(proxy_libs: None, tmp_path: Path) -> None:
    program = _check_program(LIB_DIR, tmp_path, ())
    env = dict(os.environ, HIPR_URL=f"unix://{tmp_path}/nobody.sock", HIPR_CONNECT_TIMEOUT="1")
    result = subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    # cuInit fails with CUDA_ERROR_NO_DEVICE; the program reports it and exits on its own.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no worker answered" in result.stderr
    assert "cuInit(0) -> CUDA_ERROR_NO_DEVICE" in result.stderr


def test_exports_every_driver_symbol(proxy_libs: None) -> None:
    lib = LIB_DIR / CUDA_SUBDIR / CUDA_LIBRARY
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines()}
    wanted = {
        n.strip()
        for n in CUDA_SYMBOLS.read_text().splitlines()
        if n.strip() and not n.startswith("#")
    }
    assert wanted <= exported
    # Only the driver's names: the core's own stay inside.
    assert all(name.startswith("cu") for name in exported), sorted(
        n for n in exported if not n.startswith("cu")
    )
    # NVIDIA's versioned spellings are what programs built with cuda.h link against.
    for name in ("cuMemAlloc_v2", "cuCtxCreate_v2", "cuMemcpyHtoD_v2", "cuGetProcAddress_v2",
                 "cuLaunchKernel_ptsz", "cuMemcpyDtoH_v2_ptds"):  # fmt: skip
        assert name in exported
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True)
    assert re.search(r"SONAME.*\[libcuda\.so\.1\]", dyn.stdout)


def test_served_table_names_defined_functions() -> None:
    served = re.findall(
        r"^X\((\w+), (\d+), (\w+)\)", (NATIVE / "cuda_served.def").read_text(), re.M
    )
    sources = "".join((NATIVE / n).read_text() for n in CUDA_SOURCES if n.startswith("cuda_"))
    for _, _, symbol in served:
        assert re.search(rf"\b{symbol}\s*\(", sources), symbol
