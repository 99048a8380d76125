"""Code objects sent once, through the native proxies: a C program (the CUDA driver API,
and the HIP module API) run twice under ASan/UBSan against one worker; the worker's
metrics show that the second process named its large code object by hash alone (only
the 1 KiB one, under the proxies' 4 KiB threshold, crossed again). Against a worker that
answers HELLO as protocol 1.1 the proxy sends the bytes every time."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.proxy.module_bytes import HASH_REQUEST_BYTES, ModuleFigures, free_port, scrape
from benchmarks.proxy.module_bytes import wait_for as wait_for_socket
from hipr.proxy.build import CUDA_LIBRARY, CUDA_SUBDIR, HIP_LIBRARY
from tests.proxy.sanitized import (
    SANITIZED_FLAGS,
    SANITIZER_ENV,
    assert_sanitizer_clean,
    cc,
    linked_to,
)

C_DIR = Path(__file__).resolve().parent / "c"
LARGE = 256 << 10
SMALL = 1024


@pytest.fixture(scope="module")
def sanitized_programs(
    sanitized_libs: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """module_store_check built for each API against the sanitized proxy libraries."""
    tmp = Path(tmp_path_factory.mktemp("msc"))
    libs = sanitized_libs
    cuda = libs / CUDA_SUBDIR
    source = str(C_DIR / "module_store_check.c")
    programs = {"cuda": tmp / "check_cuda", "hip": tmp / "check_hip"}
    cc(
        [
            *SANITIZED_FLAGS, source, "-o", str(programs["cuda"]),
            *linked_to(cuda, CUDA_LIBRARY),
        ]
    )  # fmt: skip
    cc(
        [
            *SANITIZED_FLAGS, "-DHIP_API", source, "-o", str(programs["hip"]),
            *linked_to(libs, HIP_LIBRARY),
        ]
    )  # fmt: skip
    return programs


def _worker(directory: Path, *extra: str) -> Iterator[tuple[str, str]]:
    sock = directory / "w.sock"
    metrics = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "hipr.testing.module_images", "--listen", f"unix://{sock}"]
    process = subprocess.Popen(
        [*cmd, "--metrics", metrics, *extra],
        stdout=subprocess.DEVNULL,
        stderr=open(directory / "worker.log", "wb"),  # noqa: SIM115 - the worker's lifetime
    )
    try:
        wait_for_socket(sock, metrics, process, 30)
        yield f"unix://{sock}", metrics
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def worker(short_tmp: Path) -> Iterator[tuple[str, str]]:
    """A worker of the emulator that loads emulated fat binaries: (url, metrics)."""
    yield from _worker(short_tmp)


@pytest.fixture
def old_worker(short_tmp: Path) -> Iterator[tuple[str, str]]:
    """The same, answering HELLO as a protocol 1.1 worker (no loads by hash)."""
    yield from _worker(short_tmp, "--announce-minor", "1")


def _start(program: Path, url: str, metrics: str) -> ModuleFigures:
    """Run the program once; what its code objects cost the wire, by the worker's count."""
    before = scrape(metrics)
    env = dict(os.environ, HIPR_URL=url, **SANITIZER_ENV)
    result = subprocess.run(
        [str(program), str(LARGE), "7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok"
    return scrape(metrics) - before


@pytest.mark.parametrize("api", ["cuda", "hip"])
def test_the_second_process_sends_the_hash_only(
    sanitized_programs: dict[str, Path], worker: tuple[str, str], api: str
) -> None:
    first = _start(sanitized_programs[api], *worker)
    assert first == ModuleFigures(received=LARGE + SMALL, hits=0, misses=1, saved=0)
    second = _start(sanitized_programs[api], *worker)
    assert second == ModuleFigures(received=SMALL, hits=1, misses=0, saved=LARGE)
    assert second.wire_bytes == SMALL + HASH_REQUEST_BYTES
    assert second.wire_bytes < 0.01 * first.wire_bytes


def test_an_older_worker_gets_the_bytes_every_time(
    sanitized_programs: dict[str, Path], old_worker: tuple[str, str]
) -> None:
    for _ in range(2):
        start = _start(sanitized_programs["cuda"], *old_worker)
        assert start == ModuleFigures(received=LARGE + SMALL, hits=0, misses=0, saved=0)
