"""``hipr info`` / ``hipr status`` over several workers, and ``hipr workers``."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from hipr import cli
from hipr.cli import workers
from hipr.cli.workers import service_dns_name
from hipr.testing.harness import LogWatch
from hipr.worker.config import ConfigError
from tests.multi.conftest import ADMIN, Fleet

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def quiet_workers() -> Any:
    """The in-process workers' logs would land in the captured stdout."""
    with LogWatch().installed() as watch:
        yield watch
    assert not watch.crashes


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


# --- info and status ----------------------------------------------------------------


def test_info_of_several_workers_is_one_table(
    capsys: pytest.CaptureFixture[str], threaded_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    urls = threaded_fleet.urls
    code, out, err = run(capsys, "info", urls[0], f"{urls[1]},{urls[2]}")
    assert code == 0, err
    for url in urls:
        assert url in out
    assert "6 devices on 3 of 3 workers" in out

    code, out, _ = run(capsys, "info", *urls, "--json")
    assert code == 0
    data = json.loads(out)
    devices = [d for w in data["workers"] for d in w["devices"]]
    assert [d["device"] for d in devices] == list(range(6))
    assert [d["index"] for d in devices] == [0, 0, 1, 0, 1, 2]


def test_an_unreachable_worker_is_a_row_and_exit_3(
    capsys: pytest.CaptureFixture[str], threaded_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    dead = _dead_url()
    code, out, _ = run(capsys, "info", threaded_fleet.urls[0], dead, "--timeout", "2")
    assert code == 3
    assert "unreachable" in out and dead in out
    assert "1 devices on 1 of 2 workers" in out


def test_status_of_several_workers(
    capsys: pytest.CaptureFixture[str], threaded_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    urls = threaded_fleet.urls
    code, out, err = run(capsys, "status", *urls, "--admin-token", ADMIN)
    assert code == 0, err
    for url in urls:
        assert url in out
    assert "3 sessions on 3 of 3 workers" in out  # each status call's own session
    code, out, _ = run(capsys, "status", *urls, "--admin-token", ADMIN, "--json")
    data = json.loads(out)
    assert [w["url"] for w in data["workers"]] == urls
    assert all(w["info"]["backend"] == "emulator" for w in data["workers"])
    code, _, err = run(capsys, "status", *urls, "--watch")
    assert code == 2 and "--watch" in err
    code, out, _ = run(capsys, "status", urls[0], "--admin-token", "wrong", "--json")
    assert code == 4  # one URL: the single-worker command (a refused token: ExitCode.AUTH)


# --- workers ------------------------------------------------------------------------


def _fake_dns(records: dict[str, list[str]]) -> Any:
    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for address in records[host]:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sockaddr = (address, port, 0, 0) if family == socket.AF_INET6 else (address, port)
            out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))
            out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))  # duplicates happen
        return out

    return getaddrinfo


def test_workers_from_a_headless_service(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        _fake_dns(
            {
                "hipr-worker.gpu.svc.cluster.local": [
                    "10.0.3.7",
                    "fd00::2",
                    "10.0.12.1",
                    "10.0.3.10",
                ],
                "hipr-worker.default.svc.k8s.example": ["10.1.0.1"],
            }
        ),
    )
    code, out, err = run(capsys, "workers", "--kubernetes", "hipr-worker.gpu")
    assert code == 0, err
    assert out.strip() == (
        "tcp://10.0.3.7:18515,tcp://10.0.3.10:18515,tcp://10.0.12.1:18515,tcp://[fd00::2]:18515"
    )
    code, out, _ = run(
        capsys,
        "workers",
        "--kubernetes",
        "hipr-worker",
        "--namespace",
        "gpu",
        "--json",
        "--port",
        "9000",
        "--scheme",
        "tls",
    )
    assert json.loads(out)[0] == "tls://10.0.3.7:9000" and len(json.loads(out)) == 4
    monkeypatch.setattr(workers, "POD_NAMESPACE_FILE", workers.Path("/nonexistent/ns"))
    code, out, _ = run(
        capsys,
        "workers",
        "--kubernetes",
        "hipr-worker",
        "--cluster-domain",
        "k8s.example",
        "--lines",
    )
    assert out.splitlines() == ["tcp://10.1.0.1:18515"]
    code, _, err = run(capsys, "workers", "--kubernetes", "nothing.here")
    assert code == 3 and "nothing.here.svc.cluster.local" in err


def test_service_dns_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    assert service_dns_name("w.ns", None, "cluster.local") == "w.ns.svc.cluster.local"
    assert service_dns_name("w", "ns", "c.x") == "w.ns.svc.c.x"
    assert service_dns_name("w.ns.svc", None, "c.x") == "w.ns.svc.c.x"
    assert service_dns_name("w.ns.svc.c.x.", None, "cluster.local") == "w.ns.svc.c.x"
    ns_file = tmp_path / "namespace"
    ns_file.write_text("from-pod\n")
    monkeypatch.setattr(workers, "POD_NAMESPACE_FILE", ns_file)
    assert service_dns_name("w", None, "cluster.local") == "w.from-pod.svc.cluster.local"
    for bad in ("", "a..b", "a.b.c"):
        with pytest.raises(ConfigError):
            service_dns_name(bad, None, "cluster.local")
