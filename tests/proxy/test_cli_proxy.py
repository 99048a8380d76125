"""``hipr proxy`` and ``hipr run``: the library directory, the environment a command gets,
usage errors."""

from __future__ import annotations

import pytest

from hipr.cli import main
from hipr.cli.run import proxy_environment
from hipr.proxy.build import LIB_DIR


def test_proxy_path_prints_the_library_directory(
    proxy_libs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["proxy", "--path"]) == 0
    assert capsys.readouterr().out.strip() == str(LIB_DIR)


def test_run_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--url", "unix:///nowhere"]) == 2
    assert "give the command after --" in capsys.readouterr().err


def test_run_passes_the_exit_status(proxy_libs: None) -> None:
    assert main(["run", "--", "sh", "-c", "exit 7"]) == 7


def test_the_environment_a_command_gets() -> None:
    env = proxy_environment(
        {"LD_LIBRARY_PATH": "/opt/x", "ROCM_PATH": "/opt/rocm", "HIPR_TOKEN_FILE": "/t"},
        "tcp://gpu:1",
        "secret",
    )
    assert env["LD_LIBRARY_PATH"] == f"{LIB_DIR}:/opt/x"
    assert env["HIPR_URL"] == "tcp://gpu:1" and env["HIPR_TOKEN"] == "secret"
    assert "ROCM_PATH" not in env and "HIPR_TOKEN_FILE" not in env
    kept = proxy_environment({"HIPR_URL": "unix:///s"}, None, None)
    assert kept["HIPR_URL"] == "unix:///s" and kept["LD_LIBRARY_PATH"] == str(LIB_DIR)
