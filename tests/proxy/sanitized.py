"""What every sanitized C test of the proxy shares: the compiler call, the sanitizers'
settings (leak checking on, a distinct exit code per sanitizer) and the verdict on a run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hipr.proxy.build import SANITIZE, WARNINGS, compiler

#: The compiler flags of every sanitized test program.
SANITIZED_FLAGS = (*SANITIZE, *WARNINGS, "-std=c11")

SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=23",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=24",
    "LSAN_OPTIONS": "exitcode=25",
}


def linked_to(folder: Path, *libraries: str) -> list[str]:
    """The flags that link a program to ``libraries`` (file names) of ``folder`` and let it
    find them there when it runs."""
    return [f"-L{folder}", *(f"-l:{name}" for name in libraries), f"-Wl,-rpath,{folder}"]


def cc(args: list[str]) -> None:
    """Compile with the build's compiler; the test fails with the compiler's message."""
    found = compiler()
    assert found is not None
    result = subprocess.run([found, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def assert_sanitizer_clean(result: subprocess.CompletedProcess[str]) -> None:
    """The run exited 0 and no sanitizer reported anything."""
    assert result.returncode == 0, result.stdout + result.stderr
    for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        assert marker not in result.stderr, result.stderr


def run_clean(program: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a test program built with :data:`SANITIZED_FLAGS`, with the sanitizers'
    settings and ``env`` added to the environment: it must exit 0, no sanitizer may
    report anything, and its verdict (``check.h``'s) must be "ok"."""
    result = subprocess.run(
        [str(program)],
        env={**os.environ, **SANITIZER_ENV, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok", result.stdout
    return result
