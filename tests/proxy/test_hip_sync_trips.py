"""Which of the HIP proxy's synchronizing calls wait for the worker
(tests/proxy/c/hip_sync_trips.c, under ASan/UBSan, counting round trips with the core's
hipr_round_trips): as the CUDA front, a synchronize or query with nothing asked of any
device since the last device synchronize is answered without the network, for a stream
or event handle only once the worker has answered for it, until it is destroyed, and only
while every thread keeps to device 0."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hipr.proxy.build import HIP_LIBRARY
from tests.proxy.conftest import start_worker, stop_worker
from tests.proxy.sanitized import (
    SANITIZED_FLAGS,
    SANITIZER_ENV,
    assert_sanitizer_clean,
    cc,
    linked_to,
)

C_FILE = Path(__file__).resolve().parent / "c" / "hip_sync_trips.c"


def test_hip_synchronize_goes_to_the_worker_only_when_something_may_be_pending(
    sanitized_libs: Path, short_tmp: Path, tmp_path: Path
) -> None:
    libs = sanitized_libs
    program = tmp_path / "hip_sync_trips"
    cc([
        *SANITIZED_FLAGS, str(C_FILE), "-o", str(program),
        *linked_to(libs, HIP_LIBRARY),
    ])  # fmt: skip
    # Two devices: the program checks what changes once another one is selected.
    worker, url = start_worker(short_tmp, "[emulator]\ndevice_count = 2\n")
    try:
        env = dict(os.environ, HIPR_URL=url, **SANITIZER_ENV)
        run = subprocess.run(
            [str(program)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        stop_worker(worker)
    assert_sanitizer_clean(run)
    assert run.stdout.strip() == "ok", run.stderr
