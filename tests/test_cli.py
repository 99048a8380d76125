"""The ``hipr`` command, without a worker: ``hipr.connect`` and ``hipr.server`` are faked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sniffio

import hipr
from hipr._version import __version__
from hipr.backends.interface import DeviceProperties
from hipr.cli import app as cli
from hipr.errors import (
    HipConnectionError,
    HipError,
    HipErrorCode,
    HipTimeoutError,
    SessionLostError,
)
from hipr.protocol.header import PROTOCOL_VERSION, version_text
from hipr.worker.config import ConfigError, GiB, WorkerConfig

pytestmark = pytest.mark.usefixtures("logging_restored")

REPO = Path(__file__).resolve().parent.parent

PROPS = [
    DeviceProperties(
        name="AMD Instinct MI300X",
        arch="gfx942:sramecc+:xnack-",
        total_memory=192 * GiB,
        multiprocessor_count=304,
        warp_size=64,
        max_threads_per_block=1024,
        clock_rate_khz=2_100_000,
        pci_bus_id="0000:05:00.0",
        major=9,
        minor=4,
        max_shared_memory_per_block=65536,
    ),
    DeviceProperties(
        name="hipr emulator",
        arch="emulator",
        total_memory=8 * GiB,
        multiprocessor_count=1,
        warp_size=32,
        max_threads_per_block=1024,
        clock_rate_khz=0,
        pci_bus_id="emulator:1",
    ),
]
MEM = [(180 * GiB, 192 * GiB), (GiB * 15 // 2, 8 * GiB)]


class FakeGpu:
    """Just enough of the client's ``Gpu`` for ``hipr info`` and ``hipr ping``."""

    def __init__(self, rtts: list[float] | None = None, fail: BaseException | None = None):
        self.current = 0
        self.set_devices: list[int] = []
        self.rtts = list(rtts or [0.001, 0.003, 0.002])
        self.fail = fail
        self.closed = False

    def __enter__(self) -> FakeGpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def worker_info(self) -> dict[str, Any]:
        return {
            "protocol": 0x0100,
            "worker_version": "0.1.0",
            "backend": "hip",
            "session_id": "sess-42",
        }

    def device_count(self) -> int:
        if self.fail is not None:
            raise self.fail
        return len(PROPS)

    def device_properties(self, index: int) -> DeviceProperties:
        return PROPS[index]

    def set_device(self, index: int) -> None:
        self.current = index
        self.set_devices.append(index)

    def mem_get_info(self) -> tuple[int, int]:
        return MEM[self.current]

    def ping(self) -> float:
        if self.fail is not None:
            raise self.fail
        return self.rtts.pop(0)


@pytest.fixture
def fake_connect(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeGpu]]:
    """Replace ``hipr.connect``; the fixture's ``calls`` and ``gpu`` tell what happened."""
    monkeypatch.setenv("COLUMNS", "200")
    state: dict[str, Any] = {"gpu": FakeGpu(), "calls": [], "raise": None}

    def connect(url: str, **kwargs: Any) -> FakeGpu:
        state["calls"].append((url, kwargs))
        if state["raise"] is not None:
            raise state["raise"]
        gpu: FakeGpu = state["gpu"]
        return gpu

    connect.state = state  # type: ignore[attr-defined]
    monkeypatch.setattr(hipr, "connect", connect, raising=False)
    yield connect


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- version and help -----------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"hipr {__version__} (protocol {version_text(PROTOCOL_VERSION)})"


def test_version_through_python_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hipr", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("hipr ")
    assert f"(protocol {version_text(PROTOCOL_VERSION)})" in proc.stdout


@pytest.mark.parametrize("argv", [["--help"], ["worker", "--help"], ["info", "-h"], ["ping", "-h"]])
def test_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert out.startswith("usage: hipr")


def test_help_lists_commands_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "--help")
    for word in ("worker", "info", "ping", "Exit codes"):
        assert word in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["ping"],
        ["ping", "tcp://x", "-n", "0"],
        ["ping", "tcp://x", "--timeout", "-1"],
        ["worker", "--backend", "gl"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert "usage: hipr" in err
    assert out == ""


# --- worker -------------------------------------------------------------------------


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A stand-in ``hipr.worker.service`` whose ``run_worker`` records how it was called."""
    seen: dict[str, Any] = {"raise": None}

    async def run_worker(config: WorkerConfig, config_path: Any = None) -> None:
        seen["config"] = config
        seen["config_path"] = config_path
        seen["async_library"] = sniffio.current_async_library()
        if seen["raise"] is not None:
            raise seen["raise"]

    module = types.ModuleType("hipr.worker.service")
    module.run_worker = run_worker  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hipr.worker.service", module)
    monkeypatch.delenv("HIPR_LOG_LEVEL", raising=False)
    monkeypatch.delenv("HIPR_LOG_FORMAT", raising=False)
    yield seen


def test_worker_runs_the_server_under_asyncio_by_default_and_trio_on_request(
    capsys: pytest.CaptureFixture[str], fake_server: dict[str, Any]
) -> None:
    code, _, _ = run(capsys, "worker")
    assert code == 0
    assert fake_server["config"] == WorkerConfig()
    assert fake_server["async_library"] == "asyncio"
    code, _, _ = run(capsys, "worker", "--loop", "trio")
    assert code == 0
    assert fake_server["async_library"] == "trio"


def test_worker_flags_override_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_server: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conf = tmp_path / "w.toml"
    conf.write_text(
        'listen = "tcp://127.0.0.1:1"\nbackend = "hip"\nlog_level = "error"\n'
        'log_format = "console"\n[emulator]\ndevice_count = 3\n'
    )
    monkeypatch.setenv("HIPR_LOG_FORMAT", "json")
    code, _, _ = run(
        capsys,
        "worker",
        "--config",
        str(conf),
        "--listen",
        "unix:///tmp/a.sock",
        "--listen",
        "tcp://127.0.0.1:2",
        "--backend",
        "emulator",
        "--log-level",
        "debug",
    )
    assert code == 0
    cfg: WorkerConfig = fake_server["config"]
    assert cfg.listen == ("unix:///tmp/a.sock", "tcp://127.0.0.1:2")
    assert cfg.backend == "emulator"
    assert cfg.log_level == "debug"
    assert cfg.log_format == "json"  # environment over file
    assert cfg.emulator.device_count == 3


def test_worker_config_error_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_server: dict[str, Any]
) -> None:
    conf = tmp_path / "w.toml"
    conf.write_text("[emulator]\ntotal_memory = -5\n")
    code, out, err = run(capsys, "worker", "--config", str(conf))
    assert code == 2
    assert out == ""
    assert err == f"hipr: {conf}: emulator.total_memory: a size cannot be negative, got -5\n"
    assert "config" not in fake_server


def test_worker_config_error_in_a_real_process(tmp_path: Path) -> None:
    """The installed entry point: one line on stderr, exit 2, no traceback."""
    conf = tmp_path / "w.toml"
    conf.write_text("max_frame = 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "hipr", "worker", "--config", str(conf)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"hipr: {conf}: unknown key 'max_frame' (known: ")
    assert proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_worker_bad_env_level(
    capsys: pytest.CaptureFixture[str],
    fake_server: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HIPR_LOG_LEVEL", "chatty")
    code, _, err = run(capsys, "worker")
    assert code == 2
    assert err.startswith("hipr: HIPR_LOG_LEVEL: log_level: expected one of")


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (
            OSError(98, "Address already in use"),
            5,
            "hipr: Address already in use; stop the process listening there, or choose "
            "another address (--listen, or listen / metrics_listen in the config)\n",
        ),
        (
            ConfigError("refusing plaintext tokens", key="listen"),
            2,
            "hipr: listen: refusing plaintext tokens\n",
        ),
        (
            HipError(HipErrorCode.hipErrorNoDevice, "no GPU"),
            1,
            "hipr: hipErrorNoDevice (100): no GPU\n",
        ),
        (
            ExceptionGroup("tasks", [OSError(13, "Permission denied", "/run/x.sock")]),
            1,
            "hipr: /run/x.sock: Permission denied\n",
        ),
    ],
)
def test_worker_failures_map_to_exit_codes(
    capsys: pytest.CaptureFixture[str],
    fake_server: dict[str, Any],
    exc: BaseException,
    code: int,
    message: str,
) -> None:
    fake_server["raise"] = exc
    got, _, err = run(capsys, "worker", "--log-level", "error")
    assert (got, err) == (code, message)


def test_worker_unexpected_error_is_not_swallowed(
    capsys: pytest.CaptureFixture[str], fake_server: dict[str, Any]
) -> None:
    fake_server["raise"] = RuntimeError("bug")
    with pytest.raises(RuntimeError, match="bug"):
        cli.main(["worker", "--log-level", "error"])


def test_worker_interrupted_exits_130(
    capsys: pytest.CaptureFixture[str], fake_server: dict[str, Any]
) -> None:
    fake_server["raise"] = KeyboardInterrupt()
    code, _, err = run(capsys, "worker", "--log-level", "error")
    assert code == 130
    assert err == ""


# --- info ---------------------------------------------------------------------------


def test_info_table(capsys: pytest.CaptureFixture[str], fake_connect: Any) -> None:
    code, out, err = run(capsys, "info", "tcp://gpu:18515")
    assert (code, err) == (0, "")
    state = fake_connect.state
    assert state["calls"] == [("tcp://gpu:18515", {})]
    assert state["gpu"].set_devices == [0, 1]
    assert state["gpu"].closed
    for text in (
        "tcp://gpu:18515",
        "hip",
        "0.1.0",
        "1.0",
        "sess-42",
        "AMD Instinct MI300X",
        "gfx942:sramecc+:xnack-",
        "304",
        "2100 MHz",
        "180.0 GiB / 192.0 GiB",
        "0000:05:00.0",
        "hipr emulator",
        "7.5 GiB / 8.0 GiB",
    ):
        assert text in out, text


def test_info_passes_the_token(capsys: pytest.CaptureFixture[str], fake_connect: Any) -> None:
    code, out, _ = run(capsys, "info", "tls://gpu:1", "--token", "t0ken", "--timeout", "2.5")
    assert code == 0
    assert fake_connect.state["calls"] == [("tls://gpu:1", {"token": "t0ken", "timeout": 2.5})]
    assert "t0ken" not in out


def test_info_json(capsys: pytest.CaptureFixture[str], fake_connect: Any) -> None:
    code, out, _ = run(capsys, "info", "unix:///tmp/w.sock", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["url"] == "unix:///tmp/w.sock"
    assert data["worker"] == {
        "protocol": 256,
        "worker_version": "0.1.0",
        "backend": "hip",
        "session_id": "sess-42",
    }
    assert [d["index"] for d in data["devices"]] == [0, 1]
    d0 = data["devices"][0]
    assert d0["name"] == "AMD Instinct MI300X"
    assert d0["total_memory"] == 192 * GiB
    assert (d0["memory_free"], d0["memory_total"]) == MEM[0]
    assert d0["max_shared_memory_per_block"] == 65536
    assert data["devices"][1]["memory_free"] == MEM[1][0]


# --- ping ---------------------------------------------------------------------------


def test_ping_table(capsys: pytest.CaptureFixture[str], fake_connect: Any) -> None:
    code, out, _ = run(capsys, "ping", "tcp://gpu:18515", "-n", "3")
    assert code == 0
    assert "seq=1 rtt=1.000 ms" in out
    assert "seq=2 rtt=3.000 ms" in out
    assert "seq=3 rtt=2.000 ms" in out
    for col in ("min ms", "median ms", "max ms"):
        assert col in out
    # The summary row: count, min, median, max.
    assert ["3", "1.000", "2.000", "3.000"] in [line.split() for line in out.splitlines()], out


def test_ping_json(capsys: pytest.CaptureFixture[str], fake_connect: Any) -> None:
    fake_connect.state["gpu"] = FakeGpu(rtts=[0.004, 0.001, 0.002, 0.010])
    code, out, _ = run(capsys, "ping", "tcp://gpu:18515", "--count", "4", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["count"] == 4
    assert data["rtt_ms"] == pytest.approx([4.0, 1.0, 2.0, 10.0])
    assert data["min_ms"] == pytest.approx(1.0)
    assert data["median_ms"] == pytest.approx(3.0)
    assert data["max_ms"] == pytest.approx(10.0)


# --- exit codes of client commands --------------------------------------------------


@pytest.mark.parametrize("command", ["info", "ping"])
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (HipConnectionError(message="connection refused: is `hipr worker` running?"), 3),
        (HipTimeoutError(message="no reply in 5 s"), 3),
        (SessionLostError(message="worker restarted"), 3),
        (ConnectionRefusedError(111, "Connection refused"), 3),
        (ExceptionGroup("g", [ConnectionResetError(104, "Connection reset by peer")]), 3),
    ],
)
def test_connection_errors_exit_3(
    capsys: pytest.CaptureFixture[str],
    fake_connect: Any,
    command: str,
    exc: BaseException,
    code: int,
) -> None:
    fake_connect.state["raise"] = exc
    got, out, err = run(capsys, command, "tcp://gpu:18515")
    assert got == code
    assert out == ""
    assert err.startswith("hipr: ") and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["info", "ping"])
def test_hip_error_from_the_worker_exits_1(
    capsys: pytest.CaptureFixture[str], fake_connect: Any, command: str
) -> None:
    fake_connect.state["gpu"] = FakeGpu(
        fail=HipError(HipErrorCode.hipErrorInvalidDevice, "device 7 does not exist")
    )
    got, _, err = run(capsys, command, "tcp://gpu:18515")
    assert got == 1
    assert err == "hipr: hipErrorInvalidDevice (101): device 7 does not exist\n"


def test_connection_error_mid_session_exits_3(
    capsys: pytest.CaptureFixture[str], fake_connect: Any
) -> None:
    fake_connect.state["gpu"] = FakeGpu(fail=HipConnectionError(message="link reset"))
    got, _, err = run(capsys, "ping", "tcp://gpu:18515")
    assert got == 3
    assert "link reset" in err


def test_multiline_messages_become_one_line(
    capsys: pytest.CaptureFixture[str], fake_connect: Any
) -> None:
    fake_connect.state["raise"] = HipConnectionError(message="refused\n  try: hipr worker")
    got, _, err = run(capsys, "info", "tcp://gpu:18515")
    assert got == 3
    assert err.count("\n") == 1


def test_human_size() -> None:
    assert cli.human_size(0) == "0 B"
    assert cli.human_size(512) == "512 B"
    assert cli.human_size(1536) == "1.5 KiB"
    assert cli.human_size(8 * GiB) == "8.0 GiB"
    assert cli.human_size(3 * 1024**5) == "3072.0 TiB"


def test_entry_points_and_scripts_exist() -> None:
    assert (REPO / "hipr" / "__main__.py").is_file()
    for script in ("scripts/test", "scripts/demo", "scripts/setup", ".ci/run"):
        assert os.access(REPO / script, os.X_OK), script


def test_info_table_never_cuts_values_on_a_narrow_terminal(
    capsys: pytest.CaptureFixture[str], fake_connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "info", "tcp://gpu:18515")
    assert code == 0
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_readme_starts_with_the_two_set_up_commands() -> None:
    readme = (REPO / "README.md").read_text()
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    assert "#" in block.splitlines()[0] and "#" in block.splitlines()[1]  # annotated


def test_transports_lists_every_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert cli.main(["transports", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert {"tcp", "unix", "tls", "ssh"} <= set(found)
    assert found["tcp"].endswith(":TcpTransport")
