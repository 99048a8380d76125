"""hipr is a library first: it writes nothing to stderr (or stdout) unless the program
asks, by Python's convention (a ``NullHandler`` on the ``hipr`` logger; opt in with
``hipr.log_to_stderr()`` or any ``logging`` set-up of the program's own)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hipr
from hipr.observability.log import LIBRARY_LOGGER

SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    import hipr
    from hipr.client.link import LinkOptions

    sock = sys.argv[1]
    if sys.argv[2] == "loud":
        hipr.log_to_stderr("info")
    worker = subprocess.Popen(
        [sys.executable, "-m", "hipr", "worker", "--backend", "emulator",
         "--listen", "unix://" + sock, "--log-level", "info"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                gpu = hipr.connect("unix://" + sock, link=LinkOptions(
                    reconnect_attempts=2, reconnect_timeout=2.0, reconnect_delay=0.05))
                break
            except hipr.HipConnectionError:
                time.sleep(0.05)
        p = gpu.malloc(64)
        gpu.synchronize()
    finally:
        worker.kill()
        worker.wait()
    try:
        gpu.memcpy_dtoh(p, 64)
    except hipr.HipError as exc:
        print("lost:", type(exc).__name__)
    gpu.close()
    """
)


def _run(short_tmp: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = short_tmp / "client.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), str(short_tmp / "w.sock"), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_client_script_writes_nothing_it_was_not_asked_to(short_tmp: Path) -> None:
    quiet = _run(short_tmp, "quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.startswith("lost: ")  # the worker went away under the client
    assert quiet.stderr == ""
    # The same run, asked for logs, shows the events the quiet run kept to itself.
    loud = _run(short_tmp, "loud")
    assert loud.returncode == 0, loud.stderr
    assert loud.stdout == quiet.stdout
    assert "disconnected" in loud.stderr or "reconnecting" in loud.stderr, loud.stderr


def test_the_library_logger_has_a_null_handler_only() -> None:
    library = logging.getLogger(LIBRARY_LOGGER)
    assert any(isinstance(h, logging.NullHandler) for h in library.handlers)
    assert not [h for h in library.handlers if not isinstance(h, logging.NullHandler)]
    assert callable(hipr.log_to_stderr)


def test_a_program_logging_setup_receives_hipr_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import structlog

    from hipr.observability.log import get_logger, install_library_default

    old = structlog.get_config()
    structlog.reset_defaults()  # as in a fresh program: another test may have set it up
    install_library_default()
    try:
        with caplog.at_level(logging.INFO, logger="hipr"):
            get_logger("hipr.client").info("resumed", url="tcp://x:1", token="secret")
    finally:
        structlog.configure(**old)
    [record] = [r for r in caplog.records if r.name == "hipr.client"]
    assert record.getMessage().startswith("resumed url='tcp://x:1'")
    assert "secret" not in record.getMessage()  # still redacted
