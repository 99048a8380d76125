"""Which of the CUDA proxy's synchronizing calls wait for the worker, read from the
round trips HIPR_PROXY_TRACE prints per call (tests/proxy/c/cuda_sync_trips.c, under
ASan/UBSan): a synchronize with nothing asked of the device since the last one is
answered locally, one after work or after an error goes to the worker."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
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

C_FILE = Path(__file__).resolve().parent / "c" / "cuda_sync_trips.c"
_CALL = re.compile(r"^hipr trace: (\w+) -> (\d+)[^(]*(?:\((\d+) round trips?\))?$")


def _steps(stderr: str) -> dict[str, list[tuple[str, int, int]]]:
    """Each step's traced calls: (name, result, round trips)."""
    steps: dict[str, list[tuple[str, int, int]]] = {}
    current = None
    for line in stderr.splitlines():
        if line.startswith("== "):
            current = steps.setdefault(line[3:], [])
        elif current is not None and (m := _CALL.match(line)):
            current.append((m[1], int(m[2]), int(m[3] or 0)))
    return steps


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the trace's trampolines are x86-64")
def test_synchronize_goes_to_the_worker_only_when_something_may_be_pending(
    sanitized_libs: Path, worker_url: str, tmp_path: Path
) -> None:
    libs = sanitized_libs
    cuda = libs / CUDA_SUBDIR
    program = tmp_path / "cuda_sync_trips"
    cc([
        *SANITIZED_FLAGS, str(C_FILE), "-o", str(program),
        *linked_to(cuda, CUDA_LIBRARY),
    ])  # fmt: skip
    env = dict(os.environ, HIPR_URL=worker_url, HIPR_PROXY_TRACE="1", **SANITIZER_ENV)
    run = subprocess.run(
        [str(program)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert_sanitizer_clean(run)
    assert run.stdout.strip() == "ok", run.stderr
    steps = _steps(run.stderr)
    assert steps["launch then ctx sync"] == [("cuLaunchKernel", 0, 0), ("cuCtxSynchronize", 0, 1)]
    assert steps["idle ctx sync"] == [("cuCtxSynchronize", 0, 0)]
    assert steps["idle null-stream sync"] == [("cuStreamSynchronize", 0, 0)]
    # A copy back leaves nothing running: the synchronize after it stays local.
    assert steps["copy back then sync"] == [("cuMemcpyDtoH", 0, 1), ("cuCtxSynchronize", 0, 0)]
    assert steps["memset then null-stream sync"] == [
        ("cuMemsetD8", 0, 0),
        ("cuStreamSynchronize", 0, 1),
    ]
    # With a non-blocking stream the null stream is synchronized as itself, each time
    # (a STREAM_SYNCHRONIZE does not tell that the other streams are done).
    assert steps["non-blocking stream"] == [
        ("cuStreamCreate", 0, 1),
        ("cuStreamSynchronize", 0, 0),
        ("cuMemsetD8", 0, 0),
        ("cuStreamSynchronize", 0, 1),
        ("cuStreamSynchronize", 0, 1),
        ("cuStreamDestroy", 0, 0),
    ]
    # Queries and event waits go to the worker until a synchronize left the device idle.
    events = steps["events and queries"]
    assert [(name, trips) for name, _, trips in events] == [
        ("cuEventCreate", 1), ("cuEventRecord", 0), ("cuEventQuery", 1),
        *([("cuEventQuery", 1)] if len(events) == 10 else []),
        ("cuEventSynchronize", 1), ("cuCtxSynchronize", 1),
        ("cuEventQuery", 0), ("cuEventSynchronize", 0), ("cuStreamQuery", 0),
        ("cuEventDestroy", 0),
    ]  # fmt: skip
    error = steps["error then sync"]
    assert [name for name, _, _ in error] == [
        "cuCtxSynchronize", "cuMemAlloc", "cuMemFree", "cuMemsetD8",
        "cuCtxSynchronize", "cuCtxSynchronize",
    ]  # fmt: skip
    failed, after = error[4], error[5]
    assert failed[1] != 0 and failed[2] == 1
    assert after == ("cuCtxSynchronize", 0, 1)  # an error is never followed by a local answer


def test_proxy_marks_time_each_fused_synchronize(
    sanitized_libs: Path, worker_url: str, tmp_path: Path
) -> None:
    """HIPR_PROXY_MARKS (benchmarks/proxy/stages.py): each synchronize sent with its
    launches is written as when it reached the core and when its request went out, on
    the clock Python's monotonic_ns reads, when the program ends; a forked child (its
    own session, its own fused synchronize) writes nothing."""
    cuda = sanitized_libs / CUDA_SUBDIR
    program = tmp_path / "cuda_sync_trips"
    cc([*SANITIZED_FLAGS, str(C_FILE), "-o", str(program), *linked_to(cuda, CUDA_LIBRARY)])
    marks = tmp_path / "marks"
    env = dict(os.environ, HIPR_URL=worker_url, HIPR_PROXY_MARKS=str(marks), **SANITIZER_ENV)
    before = time.monotonic_ns()
    run = subprocess.run(  # "fork": a forked child's session writes no marks of its own
        [str(program), "fork"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    after = time.monotonic_ns()
    assert_sanitizer_clean(run)
    assert run.stdout.strip() == "ok", run.stderr
    pairs = [tuple(int(t) for t in line.split()) for line in marks.read_text().splitlines()]
    assert pairs  # the program's launches then cuCtxSynchronize: one fused request
    for reached, sent in pairs:
        assert before <= reached <= sent <= after
    assert pairs == sorted(pairs)
