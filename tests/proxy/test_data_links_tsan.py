"""The proxy's data links under ThreadSanitizer: each link has a thread of its own that
sends an upload's chunks, reads a download's and opens links, beside the caller's thread
and the heartbeat thread. The proxy and core_check built with ``-fsanitize=thread``,
``core_check striped`` (uploads and downloads, a forked child's too) against the emulator
worker, once as it is and once through relays that cut the data links under an upload
and under a download: no race reported, every byte lands."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import hipr.proxy.build as proxy_build
from hipr.proxy.build import HIP_LIBRARY, WARNINGS, compiler
from tests.proxy.conftest import stop_worker
from tests.proxy.sanitized import linked_to
from tests.proxy.test_core import C_DIR, Worker, _start, short_dir  # noqa: F401
from tests.proxy.test_data_links import DataLinkRelay, _asked_again, _striped, _striped_down

THREAD_SANITIZER = ("-fsanitize=thread", "-fno-omit-frame-pointer", "-g", "-O1")
#: Go on after a report (all of them are counted); the forked child starts threads of
#: its own, which TSan allows only when told.
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=0:die_after_fork=0:exitcode=26"}


@pytest.fixture(scope="module")
def tsan_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """core_check against the proxy libraries, both built with ThreadSanitizer."""
    found = compiler()
    if found is None:
        pytest.skip("no C compiler")
    root = tmp_path_factory.mktemp("tsan")
    probe = root / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    tried = subprocess.run(
        [found, *THREAD_SANITIZER, str(probe), "-o", str(root / "probe")],
        capture_output=True,
        text=True,
        check=False,
    )
    if tried.returncode != 0:
        pytest.skip(f"the compiler has no ThreadSanitizer: {tried.stderr.strip()[:200]}")
    libs = root / "lib"
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(proxy_build, "SANITIZE", THREAD_SANITIZER)
        proxy_build.build(libs, sanitize=True)
    program = root / "core_check"
    subprocess.run(
        [found, *THREAD_SANITIZER, *WARNINGS, "-std=c11", str(C_DIR / "core_check.c"),
         "-o", str(program), *linked_to(libs, HIP_LIBRARY), "-pthread"],
        check=True,
    )  # fmt: skip
    return program


@pytest.fixture
def worker(short_dir: Path) -> Iterator[Worker]:  # noqa: F811
    started = _start(short_dir, "resume_grace = 30\n")
    try:
        yield started
    finally:
        stop_worker(started.process)


def _run(program: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        HIPR_URL=url,
        HIPR_DATA_LINKS="4",
        HIPR_STRIPE_MIN_BYTES=str(4 << 20),
        HIPR_PROXY_DEBUG="1",
        **TSAN_ENV,
    )
    result = subprocess.run(
        [str(program), "striped"], env=env, capture_output=True, text=True, timeout=300
    )
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-4000:]
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stdout.startswith("ok striped"), result.stdout
    return result


def test_striped_copies_race_free(tsan_program: Path, worker: Worker) -> None:
    result = _run(tsan_program, worker.unix_url)
    assert _striped(result.stderr) > 0 and _striped_down(result.stderr) > 0, result.stderr


@pytest.mark.parametrize(
    ("up", "down"), [([10_000_000], []), ([], [10_000_000])], ids=["under-upload", "under-download"]
)
def test_data_links_cut_race_free(
    tsan_program: Path, worker: Worker, up: list[int], down: list[int]
) -> None:
    relay = DataLinkRelay(worker.unix_url.removeprefix("unix://"), up, down)
    try:
        result = _run(tsan_program, f"tcp://127.0.0.1:{relay.port}")
        assert relay.cuts == 1, result.stderr
        if down:
            assert _asked_again(result.stderr) >= 1, result.stderr
    finally:
        relay.close()
