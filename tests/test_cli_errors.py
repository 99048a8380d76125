"""A user's mistakes end in one line that says what is wrong and how to fix it, with the
documented exit code (``hipr.cli.common.ExitCode``, tabled in docs/cli.md), and in a
``hipr.HipError`` subclass from the API."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.cli import app as cli
from hipr.cli.common import ExitCode
from hipr.testing.harness import worker_in_thread
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker
from hipr.worker.tenants import new_token, token_hash

REPO = Path(__file__).resolve().parent.parent

BAD_URLS = [
    ("foo://x", "unknown transport scheme 'foo'"),
    ("127.0.0.1:28515", "expected scheme://"),
    ("tcp://127.0.0.1:notaport", "Port could not be cast"),
    ("unix://relative.sock", "absolute path"),
]


def _one_line(err: str) -> str:
    assert err.startswith("hipr: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(("url", "what"), BAD_URLS)
def test_mistyped_urls_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], url: str, what: str
) -> None:
    assert cli.main(["info", url]) == ExitCode.USAGE == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert what in _one_line(captured.err)
    assert "hipErrorInvalidValue" not in captured.err  # the code is no help for a typo


def test_mistyped_url_in_a_real_process() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "hipr", "info", "foo://x"], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "tcp://HOST:PORT" in _one_line(run.stderr)


@pytest.mark.parametrize(("url", "what"), BAD_URLS)
def test_connect_raises_a_hip_error_for_a_bad_url(url: str, what: str) -> None:
    with pytest.raises(hipr.InvalidUrlError, match=what) as caught:
        hipr.connect(url, timeout=2)
    assert isinstance(caught.value, hipr.UsageError)
    assert isinstance(caught.value, hipr.HipError)
    assert isinstance(caught.value, ValueError)  # what it raised before: still caught
    assert caught.value.code == hipr.HipErrorCode.hipErrorInvalidValue


@pytest.mark.anyio
async def test_aconnect_raises_a_hip_error_for_a_bad_url(anyio_backend: str) -> None:
    with pytest.raises(hipr.InvalidUrlError, match="unknown transport scheme"):
        async with hipr.aconnect("foo://x", timeout=2):
            pass  # pragma: no cover


def test_several_urls_with_one_bad_raise_the_same() -> None:
    with pytest.raises(hipr.InvalidUrlError, match="'bogus'"):
        hipr.connect(["tcp://127.0.0.1:1", "bogus://x"], timeout=2)


# --- a real worker with tenants ----------------------------------------------------------

TOKEN = new_token()


@pytest.fixture
def tenant_worker(short_tmp: Path) -> Iterator[Worker]:
    tenants = short_tmp / "tenants.toml"
    tenants.write_text(f'[tenants.alice]\ntokens = ["{token_hash(TOKEN)}"]\n')
    config = WorkerConfig(tenants_file=tenants, resume_grace=0.0)
    backend = EmulatorBackend(device_count=1, total_memory=16 << 20)
    with worker_in_thread(config, backend, loop="asyncio") as running:
        yield running


def test_missing_token_has_its_own_code_and_a_cli_hint(
    capsys: pytest.CaptureFixture[str],
    tenant_worker: Worker,
    monkeypatch: pytest.MonkeyPatch,
    short_tmp: Path,
) -> None:
    monkeypatch.delenv("HIPR_TOKEN", raising=False)
    url = tenant_worker.bound_urls[0]
    assert cli.main(["info", url, "--json"]) == ExitCode.AUTH == 4
    err = _one_line(capsys.readouterr().err)
    assert "requires a token" in err and "--token-file" in err and "HIPR_TOKEN" in err
    assert "hipr.connect" not in err  # an API hint would mislead a CLI user

    assert cli.main(["info", url, "--json", "--token", "wrong"]) == ExitCode.AUTH
    assert "not valid" in _one_line(capsys.readouterr().err)

    token_file = short_tmp / "token"
    token_file.write_text(TOKEN + "\n")
    assert cli.main(["info", url, "--json", "--token-file", str(token_file)]) == ExitCode.OK
    assert '"backend": "emulator"' in capsys.readouterr().out

    assert cli.main(["info", url, "--token-file", str(short_tmp / "nope")]) == ExitCode.USAGE
    assert "--token-file" in _one_line(capsys.readouterr().err)


def test_missing_token_from_the_api_names_the_api(
    tenant_worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HIPR_TOKEN", raising=False)
    with pytest.raises(hipr.AuthError, match="token=") as caught:
        hipr.connect(tenant_worker.bound_urls[0], timeout=5)
    assert caught.value.details.get("missing") is True


def test_address_in_use_is_one_line_with_its_own_code() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [
                *(sys.executable, "-m", "hipr", "worker", "--backend", "emulator"),
                *("--listen", f"tcp://127.0.0.1:{port}", "--log-level", "error"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == ExitCode.ADDRESS_IN_USE == 5
    err = _one_line(run.stderr)
    assert "Address already in use" in err and "--listen" in err


# --- something that is not a worker ------------------------------------------------------


class _Web(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # pragma: no cover - our HELLO is no GET
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Web)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_web_server_is_not_a_worker_and_we_say_so_at_once(web_server: str) -> None:
    start = time.monotonic()
    with pytest.raises(hipr.HipConnectionError, match="is not a hipr worker") as caught:
        hipr.connect(web_server, timeout=30)
    # Well under the 30 s connect timeout it would otherwise wait out (1 s when idle).
    assert time.monotonic() - start < 5
    assert "metrics port" in str(caught.value)


@pytest.mark.anyio
async def test_a_web_server_is_not_a_worker_async(anyio_backend: str, web_server: str) -> None:
    start = time.monotonic()
    with pytest.raises(hipr.HipConnectionError, match="is not a hipr worker"):
        async with hipr.aconnect(web_server, timeout=30):
            pass  # pragma: no cover
    assert time.monotonic() - start < 5


def test_a_web_server_from_the_cli_exits_3(
    capsys: pytest.CaptureFixture[str], web_server: str
) -> None:
    assert cli.main(["info", web_server, "--timeout", "30"]) == ExitCode.CONNECTION
    assert "not a hipr worker" in _one_line(capsys.readouterr().err)


# --- the table ----------------------------------------------------------------------------


def test_exit_code_table_in_the_docs_is_the_code() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "` |" in line]
    table = {
        int(r.split("|")[1]): r.split("`")[1] for r in rows if r.split("|")[1].strip().isdigit()
    }
    assert table == {member.value: member.name for member in ExitCode}
    assert len(set(ExitCode)) == len(ExitCode)  # no two names for one code
    assert "docs/cli.md" in cli.build_parser().epilog  # type: ignore[operator]


# --- a worker that must not fall back to the emulator -------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    import logging

    import structlog

    old = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**old)
    root.handlers[:] = handlers
    root.setLevel(level)


def test_auto_backend_can_be_told_to_refuse_the_emulator(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    restore_logging: None,
) -> None:
    # No GPU runtime importable, whatever this host has.
    for name in [n for n in sys.modules if n.startswith(("hip.", "cuda."))]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("hip", "cuda", "cuda.bindings"):
        monkeypatch.setitem(sys.modules, name, None)
    code = cli.main(
        [
            *("worker", "--backend", "auto", "--no-emulator-fallback"),
            *("--listen", "tcp://127.0.0.1:0", "--log-level", "error", "--log-format", "json"),
        ]
    )
    assert code == ExitCode.HIP_ERROR
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("hipr: ") and "emulator fallback is off" in err
    assert "'b'" not in err


def test_emulator_fallback_is_a_config_key() -> None:
    from hipr.worker.config import load_config

    assert load_config(None, {}).emulator_fallback is True
    assert load_config(None, {"emulator_fallback": False}).emulator_fallback is False
