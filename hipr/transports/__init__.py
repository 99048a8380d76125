"""Transports: a URL in, an anyio ``Listener`` (worker) or ``ByteStream`` (client) out.

Transports are plugins found by URL scheme in the ``hipr.transports`` entry-point group,
the built-ins (``tcp``, ``unix``, ``tls``, ``ssh``) exactly as a third party's::

    [project.entry-points."hipr.transports"]
    quic = "hipr_quic:QuicTransport"

The synchronous client opens a blocking socket instead (:func:`connect_blocking`), from
the transports that offer one (every built-in does).

Nothing here knows the wire protocol; the functions at the bottom describe a peer for
the worker's logs and its authentication (Unix peer uid, TLS client certificate).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import socket
import ssl
import struct
from collections.abc import Iterable
from typing import Any

import anyio
from anyio.abc import ByteStream, Listener, SocketAttribute
from anyio.streams.stapled import MultiListener
from anyio.streams.tls import TLSAttribute

from hipr.errors import HipConnectionError, InvalidUrlError
from hipr.transports.base import (
    BlockingStream,
    BlockingTransport,
    PushDelivery,
    ThreadWriter,
    Transport,
    TransportAttribute,
    TransportConfig,
    TransportFailedError,
    TransportUrl,
    format_host_port,
    parse_url,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "BlockingStream",
    "BlockingTransport",
    "PushDelivery",
    "ThreadWriter",
    "Transport",
    "TransportAttribute",
    "TransportConfig",
    "TransportFailedError",
    "TransportUrl",
    "available_transports",
    "blocking_transport_for",
    "connect",
    "connect_blocking",
    "get_transport",
    "listen",
    "listen_many",
    "parse_url",
    "peer_certificate_subject",
    "peer_description",
    "peer_uid",
    "stream_failure",
]

ENTRY_POINT_GROUP = "hipr.transports"

#: The built-ins as pyproject.toml declares them; used only where package metadata is
#: missing or predates a built-in (running from a source tree, a stale editable install).
_BUILTINS: dict[str, str] = {
    "tcp": "hipr.transports.tcp:TcpTransport",
    "unix": "hipr.transports.unix:UnixTransport",
    "tls": "hipr.transports.tls:TlsTransport",
    "ssh": "hipr.transports.ssh:SshTransport",
}

_instances: dict[tuple[str, str], Transport] = {}


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    # Scanning installed distributions costs milliseconds: once per process, not per
    # connect (reconnection loops and every hipr.connect call pass through here).
    return {ep.name.lower(): ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_transports() -> dict[str, str]:
    """Every installed transport: scheme -> ``"module:Class"``, sorted by scheme."""
    table = dict(_BUILTINS)
    table.update({name: ep.value for name, ep in _entry_points().items()})
    return dict(sorted(table.items()))


def _load(target: str, ep: importlib.metadata.EntryPoint | None) -> object:
    if ep is not None:
        return ep.load()
    module_name, _, attr = target.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def get_transport(scheme: str) -> Transport:
    """The transport registered for ``scheme``; an unknown scheme names the known ones."""
    key = scheme.lower()
    eps = _entry_points()
    target = eps[key].value if key in eps else _BUILTINS.get(key)
    if target is None:
        known = ", ".join(available_transports())
        raise InvalidUrlError(
            message=f"unknown transport scheme {scheme!r}; known schemes: {known} "
            "(e.g. tcp://HOST:PORT or unix:///PATH)"
        )
    cached = _instances.get((key, target))
    if cached is not None:
        return cached
    try:
        obj = _load(target, eps.get(key))
        transport = obj() if isinstance(obj, type) else obj
    except Exception as exc:
        raise ValueError(f"transport {key!r} ({target}) failed to load: {exc}") from exc
    if not isinstance(transport, Transport):
        raise ValueError(
            f"transport {key!r} ({target}) is not a transport: it needs scheme, "
            "async listen(url, config) and async connect(url, **options)"
        )
    _instances[(key, target)] = transport
    return transport


async def connect(url: str, **options: Any) -> ByteStream:
    """Open a byte stream to the worker at ``url``; options go to the transport.

    Raises :class:`hipr.errors.HipConnectionError` when the worker cannot be reached and
    :class:`ValueError` for a malformed URL, an unknown scheme or an unknown option.
    """
    parsed = parse_url(url)
    return await get_transport(parsed.scheme).connect(parsed, **options)


def blocking_transport_for(url: str) -> BlockingTransport | None:
    """The transport of ``url``'s scheme if it can connect blocking, else ``None``.

    Raises :class:`ValueError` for a malformed URL or an unknown scheme, as ``connect``.
    """
    transport = get_transport(parse_url(url).scheme)
    return transport if isinstance(transport, BlockingTransport) else None


def connect_blocking(url: str, **options: Any) -> BlockingStream:
    """Open a blocking stream to the worker at ``url``, for the synchronous client.

    The transport is found by scheme as :func:`connect` finds it, and takes the same
    options; the errors are the same too. A transport without ``connect_blocking`` (a
    third-party plugin may lack it) raises :class:`NotImplementedError` naming the
    scheme, so the caller can fall back to :func:`connect`.
    """
    parsed = parse_url(url)
    transport = get_transport(parsed.scheme)
    if not isinstance(transport, BlockingTransport):
        raise NotImplementedError(
            f"transport {parsed.scheme!r} has no blocking connect (connect_blocking); "
            "use the async connect for it"
        )
    return transport.connect_blocking(parsed, **options)


def stream_failure(
    stream: BlockingStream, exc: BaseException | None = None
) -> HipConnectionError | None:
    """The transport's reason why a blocking stream failed, when it knows one.

    Call it when ``sendall``/``recv_into`` raised ``exc`` (or ``recv_into`` returned 0
    unexpectedly, with ``exc=None``): an ssh tunnel gives ssh's message, a TLS socket
    OpenSSL's reason with a hint; both as :class:`TransportFailedError`, the text the
    async streams raise. ``None`` means a plain dropped connection.
    """
    hook = getattr(stream, "failure", None)
    if callable(hook):
        found = hook(exc)
        if isinstance(found, HipConnectionError):
            return found
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError):
        from hipr.transports.tls import tls_failure  # only a TLS stream gets here

        return tls_failure(exc, stream.description)
    return None


async def listen(url: str, config: TransportConfig | None = None) -> Listener[ByteStream]:
    """Listen at ``url`` with the worker's transport settings (defaults when ``None``)."""
    parsed = parse_url(url)
    return await get_transport(parsed.scheme).listen(parsed, config or TransportConfig())


async def listen_many(
    urls: Iterable[str], config: TransportConfig | None = None
) -> Listener[ByteStream]:
    """Listen on every URL at once; ``serve`` hands over streams from all of them.

    Either all listeners open or none stays open: a URL that fails closes the ones
    already opened, so a worker never half-starts.
    """
    urls = list(urls)
    if not urls:
        raise ValueError("listen_many needs at least one URL")
    listeners: list[Listener[ByteStream]] = []
    try:
        for url in urls:
            listeners.append(await listen(url, config))
    except BaseException:
        with anyio.CancelScope(shield=True):
            for opened in listeners:
                await opened.aclose()
        raise
    return MultiListener(listeners)


def _socket(stream: ByteStream) -> Any:
    """The stream's socket: a ``socket.socket``, or asyncio's ``TransportSocket`` proxy."""
    sock = stream.extra(SocketAttribute.raw_socket, None)
    return sock if hasattr(sock, "family") and hasattr(sock, "getsockopt") else None


def peer_uid(stream: ByteStream) -> int | None:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``).

    ``None`` for other transports and where the platform lacks ``SO_PEERCRED``. Over an
    ssh tunnel to the worker's Unix socket, the worker sees the ssh-authenticated user.
    """
    creds = _peer_creds(stream)
    return None if creds is None else creds[1]


def _peer_creds(stream: ByteStream) -> tuple[int, int, int] | None:
    sock = _socket(stream)
    if sock is None or sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_certificate_subject(stream: ByteStream) -> dict[str, str] | None:
    """The verified client certificate's subject, e.g. ``{"commonName": "alice"}``.

    ``None`` when the stream is not TLS or the peer sent no (verified) certificate. A
    repeated attribute (two ``organizationalUnitName``) keeps its values joined by ", ".
    """
    cert: Any = stream.extra(TLSAttribute.peer_certificate, None)
    if not cert:
        return None
    subject: dict[str, str] = {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            subject[key] = f"{subject[key]}, {value}" if key in subject else str(value)
    return subject or None


def peer_description(stream: ByteStream) -> str:
    """Who is at the other end, for logs: ``"tcp 127.0.0.1:53012"``, ``"unix uid=1000
    pid=4242"``, ``"tls CN=alice 10.0.0.2:50212"``, ``"ssh me@gpu01:22 -> /run/w.sock"``.
    """
    described = stream.extra(TransportAttribute.description, None)
    if described:
        return str(described)
    is_tls = stream.extra(TLSAttribute.tls_version, None) is not None
    sock = _socket(stream)
    if sock is not None and sock.family == socket.AF_UNIX:
        creds = _peer_creds(stream)
        who = f"uid={creds[1]} pid={creds[0]}" if creds else "peer"
        return f"{'tls+unix' if is_tls else 'unix'} {who}"
    remote = stream.extra(SocketAttribute.remote_address, None)
    address = (
        format_host_port(str(remote[0]), int(remote[1]))
        if isinstance(remote, tuple) and len(remote) >= 2
        else "?"
    )
    if is_tls:
        subject = peer_certificate_subject(stream)
        cn = subject.get("commonName") if subject else None
        return f"tls CN={cn} {address}" if cn else f"tls {address}"
    if sock is not None:
        return f"tcp {address}"
    return type(stream).__name__
