"""``hipr status``, ``hipr completion``, ``--json`` everywhere, and errors that say what
to do; against a real worker on its own event-loop thread where a worker is needed."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from rich.console import Console

from hipr._version import __version__
from hipr.backends.emulator import EmulatorBackend
from hipr.cli import app as cli
from hipr.cli.common import human_duration
from hipr.cli.completion import SHELLS, completion_script, describe
from hipr.cli.status_view import render_status
from hipr.errors import AuthError, HipError, HipErrorCode, QuotaError, VersionMismatchError
from hipr.observability.log import configure_logging
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker
from hipr.worker.tenants import token_hash

ADMIN = "admin-token-for-cli-tests"


@pytest.fixture
def quiet_logs(logging_restored: None) -> None:
    """The in-process worker logs to a buffer, not to the stdout the CLI prints on."""
    configure_logging("warning", "json", io.StringIO())


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch, quiet_logs: None) -> Iterator[Worker]:
    monkeypatch.delenv("HIPR_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("HIPR_TOKEN", raising=False)
    config = WorkerConfig(admin_token_sha256=token_hash(ADMIN))
    backend = EmulatorBackend(device_count=1, total_memory=64 << 20)
    with worker_in_thread(config, backend, loop="trio") as running:
        yield running


def test_status_json(worker: Worker, capsys: pytest.CaptureFixture[str]) -> None:
    url = worker.bound_urls[0]
    assert cli.main(["status", url, "--admin-token", ADMIN, "--json"]) == cli.EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["url"] == url and out["backend"] == "emulator"
    [session] = out["sessions"]
    assert session["current"] is True and session["tenant"] == "anonymous"
    assert out["devices"][0]["memory_total"] == 64 << 20


def test_status_table(
    worker: Worker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HIPR_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("COLUMNS", "120")
    assert cli.main(["status", worker.bound_urls[0]]) == cli.EXIT_OK
    out = capsys.readouterr().out
    for word in ("backend", "emulator", "uptime", "devices", "tenants", "sessions", "anonymous"):
        assert word in out
    assert "64.0 MiB" in out


def test_status_watch_refreshes_until_count(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    url = worker.bound_urls[0]
    args = ["status", url, "--admin-token", ADMIN, "--watch", "--interval", "0.01"]
    assert cli.main([*args, "--count", "3", "--json"]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert all(r["url"] == url and "time" in r for r in records)
    # One session serves every refresh.
    assert len({r["sessions"][0]["id"] for r in records}) == 1
    assert cli.main([*args, "--count", "2"]) == cli.EXIT_OK
    assert "refreshing every 0.01 s" in capsys.readouterr().out


def test_status_with_a_wrong_admin_token(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["status", worker.bound_urls[0], "--admin-token", "nope"])
    assert code == cli.EXIT_AUTH  # a refused token, admin or tenant
    err = capsys.readouterr().err
    assert err.startswith("hipr: ") and "check the admin token" in err
    assert "HIPR_TOKEN or --token" not in err  # not the tenant token's hint


def test_status_refused_connection_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["status", "tcp://127.0.0.1:1", "--admin-token", "x", "--timeout", "2"])
    assert code == cli.EXIT_CONNECTION
    assert "hipr worker" in capsys.readouterr().err


def test_every_client_command_takes_json() -> None:
    parser = cli.build_parser()
    tree = describe(parser)
    for name in ("info", "ping", "status"):
        flags = {f for o in tree.subcommands[name].options for f in o.flags}
        assert "--json" in flags, f"hipr {name} has no --json"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_render_status_of_a_full_reply() -> None:
    status = {
        "backend": "cuda",
        "worker_version": "9.9",
        "protocol": 0x0100,
        "uptime_s": 3 * 86400 + 7200,
        "max_clients": 8,
        "listen": ["tls://0.0.0.0:18516"],
        "pinned_payload_buffers": {"held": 15, "in_use": 2, "bytes": 15 * (4 << 20)},
        "sessions": [
            {
                "id": "abcdef0123456789",
                "tenant": "alice",
                "peer": "tls 10.0.0.5:40000",
                "device": 0,
                "memory": 3 << 30,
                "allocations": 4,
                "handles": {"streams": 2, "events": 1, "functions": 9},
                "current": True,
            }
        ],
        "tenants": [
            {
                "name": "alice",
                "sessions": 1,
                "memory": 3 << 30,
                "max_sessions": 4,
                "max_device_memory": 4 << 30,
            }
        ],
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H100",
                "utilization": 87.0,
                "memory_used": 40 << 30,
                "memory_total": 80 << 30,
                "temperature_c": 61.0,
                "power_w": 412.3,
                "source": "nvml",
            }
        ],
    }
    console = Console(width=140, record=True, highlight=False)
    console.print(render_status(status, "tls://gpu01:18516", footer="footer text"))
    text = console.export_text()
    for expected in (
        "3d 2h",
        "1 / 8",
        "87%",
        "40.0 GiB / 80.0 GiB (50%)",
        "61 °C",
        "412 W",
        "3.0 GiB / 4.0 GiB (75%)",
        "1 / 4",
        "abcdef0123456789*",
        "tls 10.0.0.5:40000",
        "footer text",
        "2 / 15 in use (60.0 MiB page-locked)",
    ):
        assert expected in text, expected


def test_human_duration() -> None:
    assert human_duration(12.7) == "12s"
    assert human_duration(250) == "4m 10s"
    assert human_duration(2 * 3600 + 300) == "2h 05m"


# --- errors that name what to do -----------------------------------------------------


def test_tenant_auth_failure_names_the_token() -> None:
    text = cli.explain(AuthError(message="the token is not valid for this worker"))
    assert text.endswith("check the token (HIPR_TOKEN, --token-file or --token)")


def test_version_mismatch_says_upgrade_the_older_side() -> None:
    text = cli.explain(VersionMismatchError(message="worker speaks 2.0; client sent 1.0"))
    assert "upgrade the older side" in text and __version__ in text


def test_quota_names_the_quota_and_limit() -> None:
    err = QuotaError(message="tenant 'a' is at its max_streams quota of 4", quota="max_streams")
    err.details["limit"] = 4
    text = cli.explain(err)
    assert "[quota max_streams = 4: ask the worker's operator to raise it]" in text
    memory = HipError(
        HipErrorCode.hipErrorOutOfMemory, "over quota", quota="max_device_memory", limit=1 << 30
    )
    assert "quota max_device_memory = 1.0 GiB: free device memory" in cli.explain(memory)
    assert cli.explain(HipError(1, "plain")) == str(HipError(1, "plain"))


def test_quota_error_exit_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = QuotaError(message="the worker serves at most 2 clients", quota="max_clients", limit=2)
    assert cli._exit_code(err, client=True) == cli.EXIT_HIP_ERROR
    line = capsys.readouterr().err
    assert "max_clients = 2" in line and "try again later" in line


# --- shell completion -----------------------------------------------------------------


def test_completion_command_prints_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in SHELLS:
        assert cli.main(["completion", shell]) == 0
        assert "hipr" in capsys.readouterr().out
    assert cli.main(["completion", "tcsh"]) == cli.EXIT_USAGE


def _bash_complete(script: str, words: list[str]) -> list[str]:
    """COMPREPLY for the command line ``words`` (the last one being completed)."""
    program = (
        script
        + "\nCOMP_WORDS=("
        + " ".join(f"'{w}'" for w in words)
        + f")\nCOMP_CWORD={len(words) - 1}\n_hipr\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    run = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return run.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion_completes_commands_options_and_choices() -> None:
    script = completion_script(cli.build_parser(), "bash")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "status" in _bash_complete(script, ["hipr", "st"])
    assert set(_bash_complete(script, ["hipr", ""])) >= {"worker", "info", "status", "token"}
    assert set(_bash_complete(script, ["hipr", "worker", "--backend", ""])) == {
        "auto",
        "emulator",
        "cuda",
        "hip",
    }
    assert "--watch" in _bash_complete(script, ["hipr", "status", "url", "--w"])
    assert "new" in _bash_complete(script, ["hipr", "token", ""])
    assert "--json" in _bash_complete(script, ["hipr", "token", "new", "--"])
    assert set(_bash_complete(script, ["hipr", "completion", ""])) >= set(SHELLS)


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts(shell: str) -> None:
    script = completion_script(cli.build_parser(), shell)
    if shell == "fish":
        assert "complete -c hipr -n '__fish_use_subcommand' -a status" in script
        assert "-l backend -xa 'auto emulator cuda hip'" in script
        assert "-l config -rF" in script
    else:
        assert script.startswith("#compdef hipr\n") and "complete -F _hipr hipr" in script
    if shutil.which(shell):
        subprocess.run([shell, "-n"], input=script, text=True, check=True)
