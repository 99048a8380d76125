"""Prometheus metrics: the observer's counters, gauges derived from a live worker, the
HTTP endpoint, device telemetry, and the example Grafana dashboard's metric names."""

from __future__ import annotations

import json
import re
import sys
import types
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import DeviceProperties
from hipr.cli.docgen import metrics_markdown
from hipr.observability.metrics import (
    PrometheusObserver,
    device_metrics,
    parse_listen,
    start_metrics_server,
)
from hipr.observability.telemetry import DeviceTelemetry, device_telemetry, normalise_bus_id
from hipr.protocol.header import PROTOCOL_VERSION, version_text
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import token_hash

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20
ALICE = "alice-token-for-tests"
BOB = "bob-token-for-tests"


def value(observer: PrometheusObserver, metric: str, **labels: str) -> float | None:
    return observer.registry.get_sample_value(metric, labels)


# --- the observer alone ---------------------------------------------------------------


def test_observer_counts_events() -> None:
    obs = PrometheusObserver()
    obs.request_done("a", "MALLOC", "ok", 0.002)
    obs.request_done("a", "MALLOC", "ok", 0.004)
    obs.request_done("a", "FREE", "hipErrorInvalidValue", 0.001)
    obs.bytes_copied("a", "htod", 1000)
    obs.bytes_copied("a", "htod", 24)
    obs.bytes_copied("a", "dtoh", 7)
    obs.session_opened("a")
    obs.session_closed("a")
    obs.session_resumed("a")
    obs.quota_rejected("a", "max_streams")
    obs.protocol_error("protocol")
    assert value(obs, "hipr_requests_total", tenant="a", opcode="MALLOC", outcome="ok") == 2
    assert (
        value(obs, "hipr_requests_total", tenant="a", opcode="FREE", outcome="hipErrorInvalidValue")
        == 1
    )
    assert value(obs, "hipr_request_duration_seconds_count", opcode="MALLOC") == 2
    assert value(obs, "hipr_request_duration_seconds_sum", opcode="MALLOC") == pytest.approx(0.006)
    assert value(obs, "hipr_request_duration_seconds_bucket", opcode="MALLOC", le="0.0025") == 1
    assert value(obs, "hipr_bytes_copied_total", tenant="a", direction="htod") == 1024
    assert value(obs, "hipr_bytes_copied_total", tenant="a", direction="dtoh") == 7
    assert value(obs, "hipr_sessions_opened_total", tenant="a") == 1
    assert value(obs, "hipr_sessions_closed_total", tenant="a") == 1
    assert value(obs, "hipr_session_resumes_total", tenant="a") == 1
    assert value(obs, "hipr_quota_rejections_total", tenant="a", quota="max_streams") == 1
    assert value(obs, "hipr_protocol_errors_total", kind="protocol") == 1


def test_observers_do_not_share_series() -> None:
    one, two = PrometheusObserver(), PrometheusObserver()
    one.protocol_error("protocol")
    assert value(two, "hipr_protocol_errors_total", kind="protocol") is None


def test_device_metrics_leave_out_what_is_unknown() -> None:
    full = DeviceTelemetry(
        0,
        name="H100",
        memory_used=1,
        memory_total=2,
        utilization=50.0,
        temperature_c=40.0,
        power_w=300.0,
    )
    partial = DeviceTelemetry(1, name="emu", memory_used=3, memory_total=4)
    families = {f.name: f for f in device_metrics([full, partial])}
    used = {s.labels["device"]: s.value for s in families["hipr_device_memory_used_bytes"].samples}
    assert used == {"0": 1.0, "1": 3.0}
    assert [s.labels["device"] for s in families["hipr_device_power_watts"].samples] == ["0"]
    assert families["hipr_device_utilization_percent"].samples[0].value == 50.0
    assert families["hipr_device_temperature_celsius"].samples[0].labels["name"] == "H100"


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9464", ":9464", "host:", "host:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)


# --- against a live worker ------------------------------------------------------------


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(ALICE)}"]\n'
        'max_device_memory = "1MiB"\nmax_sessions = 3\nmax_streams = 1\n'
        f'[tenants.bob]\ntokens = ["{token_hash(BOB)}"]\n'
    )
    return path


@pytest.fixture
async def observed(
    anyio_backend: str, tenants_file: Path
) -> AsyncIterator[tuple[Worker, PrometheusObserver]]:
    config = WorkerConfig(tenants_file=tenants_file, max_frame_bytes=8 * MiB, isolation="none")
    backend = EmulatorBackend(device_count=2, total_memory=64 * MiB)
    async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as worker:
        observer = PrometheusObserver(worker)
        worker.observer = observer  # before any session: sessions keep the one they got
        yield worker, observer


@pytest.mark.anyio
async def test_requests_copies_and_sessions_of_a_live_worker(
    observed: tuple[Worker, PrometheusObserver],
) -> None:
    worker, obs = observed
    url = worker.bound_urls[0]
    async with hipr.aconnect(url, token=ALICE) as gpu:
        p = await gpu.malloc(4096)
        await gpu.memcpy_htod(p, b"x" * 4096)
        assert await gpu.memcpy_dtoh(p, 100) == b"x" * 100
        async with hipr.aconnect(url, token=BOB) as other:
            q = await other.malloc(8192)
            assert value(obs, "hipr_sessions", tenant="alice") == 1
            assert value(obs, "hipr_sessions", tenant="bob") == 1
            assert value(obs, "hipr_tenant_device_memory_bytes", tenant="alice") == 4096
            assert value(obs, "hipr_tenant_device_memory_bytes", tenant="bob") == 8192
            await other.free(q)
        assert value(obs, "hipr_tenant_device_memory_bytes", tenant="bob") == 0
        await gpu.stream_create()
        assert value(obs, "hipr_tenant_handles", tenant="alice", kind="streams") == 1
    assert value(obs, "hipr_requests_total", tenant="alice", opcode="MALLOC", outcome="ok") == 1
    assert value(obs, "hipr_bytes_copied_total", tenant="alice", direction="htod") == 4096
    assert value(obs, "hipr_bytes_copied_total", tenant="alice", direction="dtoh") == 100
    assert value(obs, "hipr_request_duration_seconds_count", opcode="MEMCPY_HTOD") == 1
    # Closed sessions free everything: the derived gauges fall back to zero.
    with anyio.fail_after(5):
        while worker.sessions:
            await anyio.sleep(0.01)
    assert value(obs, "hipr_sessions", tenant="alice") == 0
    assert value(obs, "hipr_tenant_device_memory_bytes", tenant="alice") == 0
    assert value(obs, "hipr_sessions_opened_total", tenant="alice") == 1
    assert value(obs, "hipr_sessions_closed_total", tenant="alice") == 1
    # Quotas as configured; none for an unlimited tenant.
    assert value(obs, "hipr_tenant_device_memory_quota_bytes", tenant="alice") == MiB
    assert value(obs, "hipr_tenant_session_quota", tenant="alice") == 3
    assert value(obs, "hipr_tenant_device_memory_quota_bytes", tenant="bob") is None
    assert (
        value(
            obs,
            "hipr_worker_info",
            version=hipr.__version__,
            backend="emulator",
            protocol=version_text(PROTOCOL_VERSION),
        )
        == 1
    )
    assert (
        value(obs, "hipr_device_memory_total_bytes", device="1", name="hipr emulator") == 64 * MiB
    )


@pytest.mark.anyio
async def test_quota_rejections_and_errors_are_counted(
    observed: tuple[Worker, PrometheusObserver],
) -> None:
    worker, obs = observed
    async with hipr.aconnect(worker.bound_urls[0], token=ALICE) as gpu:
        await gpu.stream_create()
        with pytest.raises(hipr.HipError):
            await gpu.stream_create()
        with pytest.raises(hipr.HipError):
            await gpu.malloc(2 * MiB)
        with pytest.raises(hipr.HipError):
            await gpu.free(12345)
    assert value(obs, "hipr_quota_rejections_total", tenant="alice", quota="max_streams") == 1
    assert value(obs, "hipr_quota_rejections_total", tenant="alice", quota="max_device_memory") == 1
    assert (
        value(
            obs,
            "hipr_requests_total",
            tenant="alice",
            opcode="FREE",
            outcome="hipErrorInvalidValue",
        )
        == 1
    )


@pytest.mark.anyio
async def test_protocol_errors_are_counted(observed: tuple[Worker, PrometheusObserver]) -> None:
    worker, obs = observed
    host, port = worker.bound_urls[0].removeprefix("tcp://").rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as sock:
        await sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 32)
        with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            while True:
                await sock.receive()
    with anyio.fail_after(5):
        while not any(
            s.value
            for f in obs.registry.collect()
            if f.name == "hipr_protocol_errors"
            for s in f.samples
            if s.name == "hipr_protocol_errors_total"
        ):
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_metrics_endpoint_serves_the_text_format(anyio_backend: str) -> None:
    backend = EmulatorBackend(device_count=1, total_memory=64 * MiB)
    async with running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker:
        server = start_metrics_server(worker, "127.0.0.1:0")
        try:
            assert worker.observer is server.observer
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", server.url)
            async with hipr.aconnect(worker.bound_urls[0]) as gpu:
                await gpu.ping()
                await gpu.malloc(4096)

                def fetch() -> str:
                    with urllib.request.urlopen(server.url, timeout=5) as response:
                        return str(response.read().decode())

                text = await anyio.to_thread.run_sync(fetch)
        finally:
            server.close()
    assert 'hipr_requests_total{opcode="MALLOC",outcome="ok",tenant="anonymous"} 1.0' in text
    assert 'hipr_sessions{tenant="anonymous"} 1.0' in text
    assert 'hipr_tenant_device_memory_bytes{tenant="anonymous"} 4096.0' in text
    assert "process_resident_memory_bytes" in text or sys.platform != "linux"


@pytest.mark.anyio
async def test_metrics_listen_in_use_names_the_key(anyio_backend: str) -> None:
    backend = EmulatorBackend(device_count=1, total_memory=64 * MiB)
    async with running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker:
        first = start_metrics_server(worker, "127.0.0.1:0")
        try:
            port = first.url.rsplit(":", 1)[1].split("/")[0]
            with pytest.raises(OSError) as err:
                start_metrics_server(worker, f"127.0.0.1:{port}")
            assert err.value.filename == f"metrics_listen 127.0.0.1:{port}"
        finally:
            first.close()


# --- device telemetry -----------------------------------------------------------------


def test_emulator_telemetry_reports_its_memory() -> None:
    backend = EmulatorBackend(device_count=2, total_memory=64 * MiB)
    backend.bind_thread(1)
    backend.malloc(MiB)
    devices = device_telemetry(backend)
    assert [d.index for d in devices] == [0, 1]
    assert devices[1].memory_used is not None and devices[1].memory_used >= MiB
    assert devices[0].memory_used == 0
    assert all(d.memory_total == 64 * MiB and d.source == "emulator" for d in devices)
    assert devices[0].utilization is None and devices[0].power_w is None


class FakeGpuBackend:
    """A cuda or hip backend as telemetry sees it: a count and properties."""

    def __init__(self, name: str, buses: list[str]) -> None:
        self.name = name
        self.buses = buses

    def device_count(self) -> int:
        return len(self.buses)

    def device_properties(self, device: int) -> DeviceProperties:
        return DeviceProperties(
            name=f"gpu{device}",
            arch="sm_90",
            total_memory=80 << 30,
            multiprocessor_count=132,
            warp_size=32,
            max_threads_per_block=1024,
            clock_rate_khz=1,
            pci_bus_id=self.buses[device],
        )


def test_telemetry_without_a_management_library_keeps_the_runtime_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    devices = device_telemetry(FakeGpuBackend("cuda", ["0000:05:00.0"]))  # type: ignore[arg-type]
    assert devices == [
        DeviceTelemetry(0, name="gpu0", pci_bus_id="0000:05:00.0", memory_total=80 << 30)
    ]


def test_telemetry_never_raises() -> None:
    class Broken:
        name = "cuda"

        def device_count(self) -> int:
            raise RuntimeError("driver gone")

    assert device_telemetry(Broken()) == []  # type: ignore[arg-type]


def test_normalise_bus_id() -> None:
    assert normalise_bus_id("00000000:0A:00.0") == "0000:0a:00.0"
    assert normalise_bus_id("0000:0a:00.0") == "0000:0a:00.0"
    assert normalise_bus_id("weird") == "weird"


def _fake_pynvml() -> types.ModuleType:
    """NVML with two devices in the opposite order of CUDA's."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    devices: list[dict[str, Any]] = [
        {"bus": b"00000000:0B:00.0", "used": 7, "total": 100, "gpu": 10, "temp": 50, "mw": 90000},
        {"bus": b"00000000:0A:00.0", "used": 3, "total": 100, "gpu": 99, "temp": 70, "mw": None},
    ]
    ns = types.SimpleNamespace

    def power(h: dict[str, Any]) -> int:
        if h["mw"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return int(h["mw"])

    nv.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPciInfo = lambda h: ns(busId=h["bus"])  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = lambda h: ns(used=h["used"], total=h["total"])  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUtilizationRates = lambda h: ns(gpu=h["gpu"], memory=0)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetTemperature = lambda h, sensor: h["temp"]  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    return nv


def test_nvml_figures_are_matched_by_bus_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import hipr.observability.telemetry as telemetry

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setattr(telemetry, "_nvml_ready", False)
    backend = FakeGpuBackend("cuda", ["0000:0a:00.0", "0000:0b:00.0"])
    first, second = device_telemetry(backend)  # type: ignore[arg-type]
    assert (first.memory_used, first.utilization, first.temperature_c) == (3, 99.0, 70.0)
    assert first.power_w is None  # not supported: left out, not an error
    assert (second.memory_used, second.power_w, second.source) == (7, 90.0, "nvml")


def test_amdsmi_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    import hipr.observability.telemetry as telemetry

    smi = types.ModuleType("amdsmi")
    smi.AmdSmiInitFlags = types.SimpleNamespace(INIT_AMD_GPUS=1)  # type: ignore[attr-defined]
    smi.AmdSmiTemperatureType = types.SimpleNamespace(HOTSPOT="hot", EDGE="edge")  # type: ignore[attr-defined]
    smi.AmdSmiTemperatureMetric = types.SimpleNamespace(CURRENT="cur")  # type: ignore[attr-defined]
    smi.amdsmi_init = lambda flags: None  # type: ignore[attr-defined]
    smi.amdsmi_get_processor_handles = lambda: ["h0"]  # type: ignore[attr-defined]
    smi.amdsmi_get_gpu_device_bdf = lambda h: "0000:05:00.0"  # type: ignore[attr-defined]
    smi.amdsmi_get_gpu_vram_usage = lambda h: {"vram_used": 2, "vram_total": 192 * 1024}  # type: ignore[attr-defined]
    smi.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": 42, "umc_activity": "N/A"}  # type: ignore[attr-defined]

    def temp(h: str, sensor: str, metric: str) -> int:
        if sensor == "hot":
            raise RuntimeError("not supported")
        return 55

    smi.amdsmi_get_temp_metric = temp  # type: ignore[attr-defined]
    smi.amdsmi_get_power_info = lambda h: {  # type: ignore[attr-defined]
        "current_socket_power": "N/A",
        "average_socket_power": 650,
    }
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    monkeypatch.setattr(telemetry, "_amdsmi_ready", False)
    [device] = device_telemetry(FakeGpuBackend("hip", ["0000:05:00.0"]))  # type: ignore[arg-type]
    assert device.memory_used == 2 * MiB and device.memory_total == 192 << 30
    assert (device.utilization, device.temperature_c, device.power_w) == (42.0, 55.0, 650.0)
    assert device.source == "amdsmi"


# --- the dashboard --------------------------------------------------------------------


def documented_metrics() -> set[str]:
    return set(re.findall(r"^\| `(hipr_\w+)`", metrics_markdown(), flags=re.M))


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    dashboard = json.loads((REPO / "config" / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    known = documented_metrics()
    used = set()
    for expr in exprs:
        for name in re.findall(r"\bhipr_\w+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in known or base in known, f"{name} is not exported (in {expr})"
            used.add(base if base in known else name)
    # The dashboard shows what the issue asks for.
    for wanted in (
        "hipr_requests_total",
        "hipr_request_duration_seconds",
        "hipr_bytes_copied_total",
        "hipr_sessions",
        "hipr_tenant_device_memory_bytes",
        "hipr_tenant_device_memory_quota_bytes",
        "hipr_quota_rejections_total",
        "hipr_session_resumes_total",
        "hipr_protocol_errors_total",
    ):
        assert wanted in used, f"the dashboard does not show {wanted}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
