"""A real worker on loopback with the emulator backend, reached over every transport:
tcp, unix, tls, mutual TLS, and ssh (a real sshd forwarding to the worker's socket)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.abc
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.testing.harness import worker_in_thread
from hipr.transports import connect
from hipr.worker.config import TlsConfig, WorkerConfig
from hipr.worker.server import Worker, running_worker
from tests.transports.conftest import Pki, SshServer, pki, sshd  # noqa: F401  (fixtures)

EMULATED_MEMORY = 64 << 20
TRANSPORTS = ["tcp", "unix", "tls", "mtls", "ssh"]


@dataclass(frozen=True)
class Endpoint:
    """How a client reaches the test worker: a URL and the transport's options."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def aconnect(self, **more: Any) -> AbstractAsyncContextManager[hipr.AsyncGpu]:
        """``hipr.aconnect`` to the worker over this transport."""
        return hipr.aconnect(self.url, **self.options, **more)

    async def raw(self) -> anyio.abc.ByteStream:
        """A bare byte stream to the worker, for hand-made frames."""
        return await connect(self.url, **self.options)


@pytest.fixture(params=TRANSPORTS)
def transport_kind(request: pytest.FixtureRequest) -> str:
    """Which transport the test runs over."""
    return str(request.param)


@pytest.fixture
def listen_url(transport_kind: str, short_tmp: Path) -> str:
    """Where the test worker listens (ssh clients arrive through its unix socket)."""
    if transport_kind == "tcp":
        return "tcp://127.0.0.1:0"
    if transport_kind in ("tls", "mtls"):
        return "tls://127.0.0.1:0"
    return f"unix://{short_tmp}/worker.sock"


@pytest.fixture
def backend() -> EmulatorBackend:
    """A fresh emulator with two devices."""
    return EmulatorBackend(device_count=2, total_memory=EMULATED_MEMORY)


@pytest.fixture
def worker_config(transport_kind: str, request: pytest.FixtureRequest) -> WorkerConfig:
    """The worker's configuration (TLS settings for the tls kinds)."""
    config = WorkerConfig(max_frame_bytes=8 << 20)
    if transport_kind in ("tls", "mtls"):
        certs: Pki = request.getfixturevalue("pki")
        tls = TlsConfig(
            certfile=Path(certs.server_cert),
            keyfile=Path(certs.server_key),
            client_ca=Path(certs.ca_file) if transport_kind == "mtls" else None,
            require_client_cert=transport_kind == "mtls",
        )
        config = dataclasses.replace(config, tls=tls)
    return config


@pytest.fixture
async def worker(
    anyio_backend: str, listen_url: str, backend: EmulatorBackend, worker_config: WorkerConfig
) -> AsyncIterator[Worker]:
    """A worker serving on loopback for the test's duration."""
    async with running_worker(worker_config, backend, [listen_url]) as running:
        yield running


@pytest.fixture
def endpoint(worker: Worker, transport_kind: str, request: pytest.FixtureRequest) -> Endpoint:
    """The client's way to ``worker`` over the test's transport."""
    return client_endpoint(worker.bound_urls[0], transport_kind, request)


def client_endpoint(bound: str, transport_kind: str, request: pytest.FixtureRequest) -> Endpoint:
    """How a client reaches a worker listening on ``bound`` over ``transport_kind``."""
    if transport_kind == "tls":
        return Endpoint(bound, {"ca": request.getfixturevalue("pki").ca_file})
    if transport_kind == "mtls":
        certs: Pki = request.getfixturevalue("pki")
        return Endpoint(
            bound, {"ca": certs.ca_file, "cert": certs.client_cert, "key": certs.client_key}
        )
    if transport_kind == "ssh":
        server: SshServer = request.getfixturevalue("sshd")
        return Endpoint(server.url(bound.removeprefix("unix://")), server.options())
    return Endpoint(bound)


@pytest.fixture(params=["tcp", "unix"])
def sync_listen_url(request: pytest.FixtureRequest, short_tmp: Path) -> str:
    """Where the worker of the synchronous-client tests listens."""
    if request.param == "tcp":
        return "tcp://127.0.0.1:0"
    return f"unix://{short_tmp}/worker.sock"


@pytest.fixture
def threaded_worker(sync_listen_url: str, backend: EmulatorBackend) -> Iterator[Worker]:
    """A worker on its own event-loop thread, for tests of the synchronous client."""
    config = WorkerConfig(max_frame_bytes=8 << 20)
    with worker_in_thread(config, backend, sync_listen_url, loop="trio") as running:
        yield running


@dataclass(frozen=True)
class BlockingEndpoint:
    """A worker on its own event-loop thread and the way to it over one transport, for
    tests of the synchronous client (a blocking call must not run on the worker's loop)."""

    url: str
    options: dict[str, Any]
    worker: Worker
    #: The worker's event-loop thread: async helpers (a faulty proxy) can run there too.
    portal: BlockingPortal

    def connect(self, **more: Any) -> hipr.Gpu:
        """``hipr.connect`` to the worker over this transport."""
        gpu = hipr.connect(self.url, **self.options, **more)
        assert isinstance(gpu, hipr.Gpu)
        return gpu


@pytest.fixture
def blocking_endpoint(
    transport_kind: str,
    listen_url: str,
    backend: EmulatorBackend,
    worker_config: WorkerConfig,
    request: pytest.FixtureRequest,
) -> Iterator[BlockingEndpoint]:
    """A worker on its own thread, reached over every transport of :data:`TRANSPORTS`."""
    with (
        start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(
            running_worker(worker_config, backend, [listen_url])
        ) as running,
    ):
        way = client_endpoint(running.bound_urls[0], transport_kind, request)
        yield BlockingEndpoint(way.url, way.options, running, portal)


# A raw session (hand-made frames) with the test worker; defined beside its helpers.
from tests.e2e.raw import raw_session  # noqa: E402, F401  (fixture)
