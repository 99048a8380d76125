"""Prometheus metrics of a worker: a :class:`~hipr.observe.WorkerObserver` and an endpoint.

Events (requests, copies, rejections, protocol errors, sessions opened and resumed) are
counted as they happen. State (live sessions, device memory by tenant against its quota,
device telemetry) is read from the :class:`~hipr.server.Worker` at scrape time by a
custom collector: derived from the sessions' own tables, the figures cannot drift from
what the worker holds and nothing is counted twice.

Every metric is named ``hipr_*``; ``docs/metrics.md`` lists them with their labels
(generated from this module by ``scripts/gen-docs``), and ``config/grafana-dashboard.json``
is an example dashboard over them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hipr._version import __version__
from hipr.backends.interface import Backend
from hipr.observability.isolation_figures import isolation_metrics
from hipr.observability.module_store_metrics import module_store_metrics
from hipr.observability.observer import WorkerObserver
from hipr.observability.runaway_metrics import runaway_metrics
from hipr.observability.telemetry import DeviceTelemetry, device_telemetry
from hipr.protocol.header import PROTOCOL_VERSION, version_text


class Allocations(Protocol):
    """A session's allocation table, as the metrics read it."""

    @property
    def total_bytes(self) -> int: ...
    def __len__(self) -> int: ...


class Session(Protocol):
    """What the metrics read of a worker session (its handle tables, named in
    :data:`HANDLE_KINDS`, are read with ``getattr``)."""

    @property
    def tenant(self) -> str: ...
    @property
    def allocations(self) -> Allocations: ...


class TenantQuotas(Protocol):
    """The quotas the metrics export."""

    @property
    def max_device_memory(self) -> int | None: ...
    @property
    def max_sessions(self) -> int | None: ...


class TenantNames(Protocol):
    """The tenant registry, as far as the metrics need it."""

    @property
    def tenants(self) -> Any: ...


class ChildFigures(Protocol):
    """A tenant's child worker as the parent last saw it (``isolation = "process"``)."""

    @property
    def tenant(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def rss(self) -> int: ...
    @property
    def sessions(self) -> list[dict[str, Any]]: ...
    @property
    def error(self) -> str | None: ...


class Worker(Protocol):
    """What the metrics read of a worker (``hipr.worker.server.Worker`` implements it;
    this module never imports the worker)."""

    backend: Backend
    observer: WorkerObserver

    @property
    def sessions(self) -> Any: ...
    @property
    def tenants(self) -> TenantNames: ...
    def quotas_of(self, tenant: str) -> TenantQuotas: ...


log = structlog.get_logger("hipr.metrics")

PREFIX = "hipr_"
#: Request latencies span a loopback PING (~50 µs) to a large compile (seconds).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: Distinct sources ``hipr_auth_failures`` labels; later ones count as ``other``.
MAX_SOURCES = 64
#: Handle tables of a session, as exported in ``hipr_tenant_handles{kind=...}``.
HANDLE_KINDS = ("streams", "events", "modules", "functions", "graphs", "graph_execs")


class PrometheusObserver:
    """Counts the worker's events into a Prometheus registry.

    ``registry`` defaults to a private one, so that several workers (tests) never share
    series. With ``worker`` given, a :class:`WorkerCollector` is registered too.
    """

    def __init__(
        self,
        worker: Worker | None = None,
        registry: CollectorRegistry | None = None,
        *,
        telemetry: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hipr_requests",
            "Requests executed, by opcode and outcome (ok or the HIP error name).",
            ["tenant", "opcode", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "hipr_request_duration_seconds",
            "Time from a request's arrival at the executor to its reply, by opcode.",
            ["opcode"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes = Counter(
            "hipr_bytes_copied",
            "Bytes copied between host and device over the link, by direction.",
            ["tenant", "direction"],
            registry=r,
        )
        self.opened = Counter("hipr_sessions_opened", "Sessions started.", ["tenant"], registry=r)
        self.closed = Counter(
            "hipr_sessions_closed", "Sessions ended (resources freed).", ["tenant"], registry=r
        )
        self.resumes = Counter(
            "hipr_session_resumes",
            "Detached sessions resumed on a new connection (client reconnects).",
            ["tenant"],
            registry=r,
        )
        self.data_links = Counter(
            "hipr_data_links",
            "Data links attached to sessions (protocol 1.4: further connections carrying "
            "the chunks of striped copies).",
            ["tenant"],
            registry=r,
        )
        self.quota_rejections = Counter(
            "hipr_quota_rejections",
            "Requests or handshakes refused by a quota, by quota name.",
            ["tenant", "quota"],
            registry=r,
        )
        self.protocol_errors = Counter(
            "hipr_protocol_errors",
            "Connections that broke the wire protocol, by kind.",
            ["kind"],
            registry=r,
        )
        self.handshake_timeouts = Counter(
            "hipr_handshake_timeouts",
            "Connections closed for sending no HELLO within handshake_timeout.",
            registry=r,
        )
        self.auth_failures = Counter(
            "hipr_auth_failures",
            "Refused HELLOs and RESUMEs (wrong, missing or revoked credentials), by tenant "
            f"where known, else by source address (the first {MAX_SOURCES} seen; "
            "then `other`).",
            ["who"],
            registry=r,
        )
        self.preauth_refusals = Counter(
            "hipr_preauth_refusals",
            "Connections closed at once, before their handshake, for a cap on unfinished "
            "handshakes: `pending_handshakes` (all sources) or `pending_handshakes_per_peer`.",
            ["reason"],
            registry=r,
        )
        self.session_cap_refusals = Counter(
            "hipr_session_cap_refusals",
            "Authenticated HELLOs refused for a cap on sessions: `max_clients` or `max_sessions`.",
            ["quota"],
            registry=r,
        )
        self.frames_refused = Counter(
            "hipr_frames_refused",
            "Frames refused, and their connection closed, for a limit: `frame_size` "
            "(max_frame_bytes, or max_hello_bytes before the handshake), `cbor_items` "
            "(max_cbor_items), `cbor_depth`, or `frame_timeout` (begun, never finished).",
            ["reason"],
            registry=r,
        )
        self._auth_sources: set[str] = set()
        # Labelled children by label values: ``labels()`` validates and looks up under
        # a lock on every call (~5 µs a request for the two metrics below, a tenth of
        # a small request's cost on the worker); a child found here is only incremented.
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._latency_children: dict[str, Any] = {}
        self.collector: WorkerCollector | None = None
        if worker is not None:
            self.collector = WorkerCollector(worker, telemetry=telemetry)
            r.register(self.collector)

    # --- WorkerObserver ----------------------------------------------------------------
    def request_done(self, tenant: str, opcode: str, outcome: str, seconds: float) -> None:
        """Count the request and observe its latency."""
        key = (tenant, opcode, outcome)
        counter = self._request_children.get(key)
        if counter is None:
            counter = self._request_children[key] = self.requests.labels(*key)
        counter.inc()
        histogram = self._latency_children.get(opcode)
        if histogram is None:
            histogram = self._latency_children[opcode] = self.latency.labels(opcode)
        histogram.observe(seconds)

    def bytes_copied(self, tenant: str, direction: str, size: int) -> None:
        """Add ``size`` to the direction's byte counter."""
        self.bytes.labels(tenant, direction).inc(size)

    def session_opened(self, tenant: str) -> None:
        """Count a new session (the live gauge is derived at scrape time)."""
        self.opened.labels(tenant).inc()

    def session_closed(self, tenant: str) -> None:
        """Count an ended session."""
        self.closed.labels(tenant).inc()

    def session_resumed(self, tenant: str) -> None:
        """Count a resume."""
        self.resumes.labels(tenant).inc()

    def data_link_opened(self, tenant: str) -> None:
        """Count a data link attached."""
        self.data_links.labels(tenant).inc()

    def quota_rejected(self, tenant: str, quota: str) -> None:
        """Count a refusal by ``quota``."""
        self.quota_rejections.labels(tenant, quota).inc()

    def protocol_error(self, kind: str) -> None:
        """Count a protocol violation."""
        self.protocol_errors.labels(kind).inc()

    def refused(self, what: str, who: str) -> None:
        """Count a refusal into its counter (see ``WorkerObserver.refused``)."""
        if what == "handshake_timeout":
            self.handshake_timeouts.inc()
        elif what == "auth":
            # Label values stay bounded whatever sources a scanner comes from.
            if who not in self._auth_sources:
                if len(self._auth_sources) >= MAX_SOURCES:
                    who = "other"
                else:
                    self._auth_sources.add(who)
            self.auth_failures.labels(who).inc()
        elif what in ("pending_handshakes", "pending_handshakes_per_peer"):
            self.preauth_refusals.labels(what).inc()
        elif what in ("max_clients", "max_sessions"):
            self.session_cap_refusals.labels(what).inc()
        else:
            self.frames_refused.labels(what).inc()


def _snapshot(sessions: dict[str, Session]) -> list[Session]:
    """The live sessions, copied safely from another thread than the event loop's."""
    for _ in range(5):
        try:
            return list(sessions.values())
        except RuntimeError:  # the dict changed size under us: try again
            continue
    return []


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """What one tenant holds now, derived from its live sessions."""

    sessions: int
    memory: int
    handles: dict[str, int]


def tenant_usage(sessions: Iterable[Session]) -> dict[str, TenantUsage]:
    """Sessions, device memory and handles of each tenant with a live session."""
    counts: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    handles: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(HANDLE_KINDS, 0))
    for s in sessions:
        counts[s.tenant] += 1
        memory[s.tenant] += s.allocations.total_bytes
        for kind in HANDLE_KINDS:
            handles[s.tenant][kind] += len(getattr(s, kind))
    return {t: TenantUsage(counts[t], memory[t], handles[t]) for t in counts}


def child_figures(worker: object) -> list[ChildFigures]:
    """The worker's tenant child workers as last polled; none for a worker without
    process isolation (or a stand-in worker without ``child_statuses``)."""
    statuses = getattr(worker, "child_statuses", None)
    return list(statuses()) if callable(statuses) else []


def add_child_usage(usage: dict[str, TenantUsage], children: Iterable[ChildFigures]) -> None:
    """Add the sessions, memory and handles of tenant child workers to ``usage``."""
    for child in children:
        for row in child.sessions:
            tenant = str(row.get("tenant", child.tenant))
            old = usage.get(tenant, TenantUsage(0, 0, dict.fromkeys(HANDLE_KINDS, 0)))
            handles = dict(old.handles)
            for kind, n in dict(row.get("handles") or {}).items():
                if kind in handles:
                    handles[kind] += int(n)
            usage[tenant] = TenantUsage(
                old.sessions + 1, old.memory + int(row.get("memory", 0)), handles
            )


def pinned_payload_figures(backend: object) -> dict[str, int] | None:
    """``{held, in_use, bytes}`` of a GPU backend's page-locked payload buffers
    (``pinned_payload_bytes``), or None for a backend without them (the emulator): for
    the status call and the gauge alike."""
    figures = getattr(backend, "payload_buffer_figures", None)
    return None if figures is None else dict(figures())


class WorkerCollector(Collector):
    """Gauges read from the worker at scrape time (sessions, memory, quotas, devices)."""

    def __init__(self, worker: Worker, *, telemetry: bool = True) -> None:
        self.worker = worker
        self.telemetry = telemetry
        self.started_at = float(getattr(worker, "started_at", time.time()))

    def describe(self) -> Iterable[Metric]:
        """Nothing: the registry must not call :meth:`collect` at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The gauges, computed now."""
        worker = self.worker
        info = GaugeMetricFamily(
            "hipr_worker_info",
            "The worker's version, backend and protocol (the value is always 1).",
            labels=["version", "backend", "protocol"],
        )
        info.add_metric([__version__, worker.backend.name, version_text(PROTOCOL_VERSION)], 1)
        yield info
        yield GaugeMetricFamily(
            "hipr_worker_start_time_seconds",
            "When the worker started, in seconds since the Unix epoch.",
            value=self.started_at,
        )
        yield from self._tenant_metrics()
        yield from isolation_metrics(worker)
        yield from runaway_metrics(worker)
        yield from module_store_metrics(worker)
        figures = pinned_payload_figures(worker.backend)
        if figures is not None:
            pinned = GaugeMetricFamily(
                "hipr_pinned_payload_buffers",
                "Page-locked buffers uploads and downloads go through (pinned_payload_bytes): "
                "held, and lent out now.",
                labels=["state"],
            )
            pinned.add_metric(["held"], figures["held"])
            pinned.add_metric(["in_use"], figures["in_use"])
            yield pinned
        if self.telemetry:
            yield from device_metrics(device_telemetry(worker.backend))

    def _tenant_metrics(self) -> Iterator[Metric]:
        worker = self.worker
        usage = tenant_usage(_snapshot(worker.sessions))
        children = child_figures(worker)
        add_child_usage(usage, children)
        # Configured tenants show zeros too, so dashboards see them before first use.
        tenants = sorted(set(worker.tenants.tenants) | set(usage))
        sessions = GaugeMetricFamily("hipr_sessions", "Live sessions.", labels=["tenant"])
        memory = GaugeMetricFamily(
            "hipr_tenant_device_memory_bytes",
            "Device memory held by the tenant's live sessions.",
            labels=["tenant"],
        )
        memory_quota = GaugeMetricFamily(
            "hipr_tenant_device_memory_quota_bytes",
            "The tenant's max_device_memory quota (absent when unlimited).",
            labels=["tenant"],
        )
        session_quota = GaugeMetricFamily(
            "hipr_tenant_session_quota",
            "The tenant's max_sessions quota (absent when unlimited).",
            labels=["tenant"],
        )
        handles = GaugeMetricFamily(
            "hipr_tenant_handles",
            "Streams, events, modules, functions, graphs and graph execs the tenant holds.",
            labels=["tenant", "kind"],
        )
        for tenant in tenants:
            used = usage.get(tenant, TenantUsage(0, 0, dict.fromkeys(HANDLE_KINDS, 0)))
            sessions.add_metric([tenant], used.sessions)
            memory.add_metric([tenant], used.memory)
            for kind, n in used.handles.items():
                handles.add_metric([tenant, kind], n)
            quotas = worker.quotas_of(tenant)
            if quotas.max_device_memory is not None:
                memory_quota.add_metric([tenant], quotas.max_device_memory)
            if quotas.max_sessions is not None:
                session_quota.add_metric([tenant], quotas.max_sessions)
        yield from (sessions, memory, memory_quota, session_quota, handles)
        yield from child_metrics(children)


def child_metrics(children: Iterable[ChildFigures]) -> Iterator[Metric]:
    """Gauges of the tenant child workers: resident memory, and whether each answered
    its last status call (their sessions are in the tenant gauges above)."""
    rss = GaugeMetricFamily(
        "hipr_tenant_worker_rss_bytes",
        "Resident memory of a tenant's child worker (isolation = process).",
        labels=["tenant", "pid"],
    )
    up = GaugeMetricFamily(
        "hipr_tenant_worker_up",
        "1 when the tenant's child worker answered the last status call, else 0.",
        labels=["tenant", "pid"],
    )
    for child in children:
        labels = [child.tenant, str(child.pid)]
        rss.add_metric(labels, child.rss)
        up.add_metric(labels, 0 if child.error else 1)
    yield from (rss, up)


def device_metrics(devices: Iterable[DeviceTelemetry]) -> Iterator[Metric]:
    """Gauges of device telemetry; a figure the runtime does not tell is left out."""
    families = {
        "memory_used": GaugeMetricFamily(
            "hipr_device_memory_used_bytes",
            "Device memory in use, all processes.",
            labels=["device", "name"],
        ),
        "memory_total": GaugeMetricFamily(
            "hipr_device_memory_total_bytes", "Device memory.", labels=["device", "name"]
        ),
        "utilization": GaugeMetricFamily(
            "hipr_device_utilization_percent",
            "Percent of time the device was busy over the last sample.",
            labels=["device", "name"],
        ),
        "temperature_c": GaugeMetricFamily(
            "hipr_device_temperature_celsius", "Device temperature.", labels=["device", "name"]
        ),
        "power_w": GaugeMetricFamily(
            "hipr_device_power_watts", "Device power draw.", labels=["device", "name"]
        ),
    }
    for device in devices:
        labels = [str(device.index), device.name]
        for field, family in families.items():
            value: Any = getattr(device, field)
            if value is not None:
                family.add_metric(labels, float(value))
    yield from families.values()


@dataclass(slots=True)
class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it."""

    url: str
    observer: PrometheusObserver
    _server: Any
    _thread: Any

    def close(self) -> None:
        """Stop serving and wait for the server thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def parse_listen(listen: str) -> tuple[str, int]:
    """``("127.0.0.1", 9464)`` for ``"127.0.0.1:9464"``; ``[::1]:9464`` works too."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def start_metrics_server(worker: Worker, listen: str) -> MetricsServer:
    """Serve ``worker``'s metrics on ``http://HOST:PORT/metrics`` from a daemon thread,
    and make the worker report to them (``worker.observer``).

    Call it before the worker serves: sessions keep the observer they were opened with.
    """
    observer = PrometheusObserver(worker)
    # The worker's own CPU, memory and open files, as every Prometheus exporter has them.
    ProcessCollector(registry=observer.registry)
    PlatformCollector(registry=observer.registry)
    host, port = parse_listen(listen)
    try:
        server, thread = start_http_server(port, addr=host, registry=observer.registry)
    except OSError as exc:
        # Named, so that "address already in use" says which listener it was.
        raise OSError(exc.errno, exc.strerror or str(exc), f"metrics_listen {listen}") from exc
    bound_port = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound_port}/metrics"
    worker.observer = observer
    log.info("metrics listening", url=url)
    return MetricsServer(url, observer, server, thread)
