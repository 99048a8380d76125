"""Fixtures of the native proxy's tests: the libraries built (skipped, with the reason,
where no C compiler or libcbor is installed: scripts/setup installs both), an emulator
worker on a unix socket, and programs run through ``hipr run``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hipr.cli.proxy import ensure_built
from hipr.cli.run import proxy_environment
from hipr.proxy.build import build, missing_prerequisites

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def sanitized_libs(proxy_libs: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The proxy libraries built once with AddressSanitizer and UBSan (a build takes
    ~12 s here), shared read-only by every sanitized C test's program."""
    libs = tmp_path_factory.mktemp("sanitized") / "lib"
    build(libs, sanitize=True)
    return libs


@pytest.fixture(scope="session")
def proxy_libs() -> None:
    """The proxy libraries in hipr/proxy/lib, current with their sources."""
    why = missing_prerequisites()
    if why is not None:
        pytest.skip(why)
    failed = ensure_built(quiet=True)
    assert failed is None, failed


def _wait_for_socket(path: Path, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}")
        if path.exists():
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(path))
                    return
                except OSError:
                    pass
        time.sleep(0.05)
    raise TimeoutError(f"no worker listening on {path}")


def start_worker(directory: Path, config: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """An emulator worker listening on a unix socket in ``directory``."""
    sock = directory / "w.sock"
    cfg = directory / "worker.toml"
    cfg.write_text(
        f'listen = ["unix://{sock}"]\nbackend = "emulator"\nlog_level = "warning"\n{config}'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "hipr", "worker", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=open(directory / "worker.log", "wb"),  # noqa: SIM115 - the worker's lifetime
    )
    try:
        _wait_for_socket(sock, process, 30)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, f"unix://{sock}"


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it lingers."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def worker_url(tmp_path_factory: pytest.TempPathFactory, proxy_libs: None) -> Iterator[str]:
    """The URL of an emulator worker shared by the tests that need one of default
    config (a worker process's start is a second or more of CPU; each program opens a
    session of its own, and a test that needs a fresh or other worker starts its own)."""
    # A short path: unix socket paths are limited to ~100 bytes.
    directory = Path(tmp_path_factory.mktemp("pw", numbered=True))
    process, url = start_worker(directory)
    try:
        yield url
    finally:
        stop_worker(process)


def run_python(
    code: str,
    *,
    url: str | None,
    proxied: bool = True,
    token_file: Path | None = None,
    env: dict[str, str] | None = None,
    via_cli: bool = False,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code``: with the proxy (in the environment ``hipr run`` makes, or
    through the command itself with ``via_cli``) or plainly (with HIPR_URL, for programs
    that import hipr.hip)."""
    base = dict(os.environ, **(env or {}))
    base.pop("HIPR_TOKEN", None)
    if proxied and not via_cli:
        # What `hipr run` sets, without its start-up (tests of the command use via_cli).
        token = token_file.read_text().strip() if token_file is not None else None
        cmd = [sys.executable, "-c", code]
        base = proxy_environment(base, url, token)
    elif proxied:
        cmd = [sys.executable, "-m", "hipr", "run"]
        if url is not None:
            cmd += ["--url", url]
        if token_file is not None:
            cmd += ["--token-file", str(token_file)]
        cmd += ["--", sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-c", code]
        if url is not None:
            base["HIPR_URL"] = url
    return subprocess.run(cmd, env=base, capture_output=True, text=True, timeout=timeout)
