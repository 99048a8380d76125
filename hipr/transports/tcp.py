"""``tcp://host:port``: plain TCP, the default transport on a trusted network.

The defaults (127.0.0.1, port 18515) keep a worker off the network until its URL says
otherwise. Requests and replies are small frames that wait on each other, so Nagle's
algorithm is off (TCP_NODELAY) on both ends: it would hold each small write back for
the previous one's ACK and add up to tens of milliseconds a call.
"""

from __future__ import annotations

import errno
import socket
from typing import Any, ClassVar

import anyio
from anyio.abc import ByteStream, Listener, SocketAttribute, SocketStream
from anyio.streams.stapled import MultiListener

from hipr.errors import InvalidUrlError
from hipr.transports._common import (
    BlockingSocket,
    connect_errors,
    connect_timeout_option,
    merge_options,
)
from hipr.transports.base import TransportConfig, TransportUrl, format_host_port
from hipr.transports.listener import SocketListener
from hipr.transports.unix import socket_stream

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "TcpTransport",
    "connect_tcp_socket",
    "open_tcp_stream",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18515

_CONNECT_OPTIONS = frozenset({"connect_timeout"})


def check_no_path(url: TransportUrl) -> None:
    """TCP-based URLs name a host and port only; a path is most likely a typo."""
    if url.path not in ("", "/"):
        raise InvalidUrlError(
            message=f"{url.raw!r}: {url.scheme}:// URLs take no path (did you mean unix://{url.path}?)"
        )


def _set_nodelay(sock: socket.socket | None) -> None:
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_nodelay(stream: SocketStream) -> None:
    """Turn Nagle off (see the module docstring); harmless where anyio already did."""
    _set_nodelay(stream.extra(SocketAttribute.raw_socket, None))


async def open_tcp_stream(
    host: str, port: int, target: str, time_limit: float | None
) -> SocketStream:
    """Connect to ``host:port``; failures become ``HipConnectionError`` naming ``target``."""
    with connect_errors(target, time_limit), anyio.fail_after(time_limit):
        stream = await anyio.connect_tcp(host, port)
    set_nodelay(stream)
    return stream


def connect_tcp_socket(
    host: str, port: int, target: str, time_limit: float | None
) -> BlockingSocket:
    """The blocking twin of :func:`open_tcp_stream`: same errors, Nagle off, IPv4 or IPv6.

    The returned socket blocks without a time limit; ``time_limit`` bounds each address
    tried (``socket.create_connection`` tries the resolved addresses in turn).
    """
    with connect_errors(target, time_limit):
        sock = socket.create_connection((host, port), timeout=time_limit)
    try:
        _set_nodelay(sock)
        return BlockingSocket.adopt(sock, target)
    except BaseException:
        sock.close()
        raise


async def _accepted(sock: socket.socket) -> ByteStream:
    _set_nodelay(sock)
    return await socket_stream(sock)


def _bind_all(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (as anyio binds them:
    SO_REUSEADDR, IPv6 sockets IPv6-only so that they do not collide with IPv4 ones).
    Port 0 on several addresses takes the first one's port for all, trying again with
    a new port when another process holds that port on a later address."""
    infos = list(
        dict.fromkeys(
            socket.getaddrinfo(
                host or None,
                port,
                type=socket.SOCK_STREAM,
                flags=socket.AI_PASSIVE | socket.AI_ADDRCONFIG,
            )
        )
    )
    for attempt in range(10):
        try:
            return _bind_each(infos, port)
        except OSError as exc:
            if port != 0 or len(infos) < 2 or exc.errno != errno.EADDRINUSE or attempt == 9:
                raise
    raise AssertionError("unreachable")


def _bind_each(infos: list[Any], port: int) -> list[socket.socket]:
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(socket.SOMAXCONN)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


async def create_tcp_listener(url: TransportUrl, default_port: int) -> Listener[ByteStream]:
    """A TCP listener for ``url``, with an error that names the URL when the bind fails.

    Accepted sockets get TCP_NODELAY and the running loop's cheapest stream (see
    :func:`hipr.transports.unix.socket_stream`), on trio and asyncio.
    """
    check_no_path(url)
    host, port = url.host_port(DEFAULT_HOST, default_port)
    try:
        sockets = await anyio.to_thread.run_sync(_bind_all, host, port)
        name = f"tcp://{format_host_port(host, port)}"
        listeners = [SocketListener(sock, _accepted, name) for sock in sockets]
        if len(listeners) == 1:
            return listeners[0]
        return MultiListener(listeners)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            why += " (is another worker already listening there?)"
        raise OSError(
            exc.errno, f"cannot listen on {url.scheme}://{format_host_port(host, port)}: {why}"
        ) from exc


class TcpTransport:
    """``tcp://[host][:port]`` (default ``127.0.0.1:18515``); IPv6 as ``tcp://[::1]:18515``.

    Connect option: ``connect_timeout`` (seconds, default 10; also from the URL query).
    """

    scheme: ClassVar[str] = "tcp"

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        """Listen on the URL's address; ``tcp://0.0.0.0:18515`` listens on every interface."""
        return await create_tcp_listener(url, DEFAULT_PORT)

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        """Connect, with a message that says what to check when the worker is not there."""
        return await open_tcp_stream(*_connect_args(url, options))

    def connect_blocking(self, url: TransportUrl, **options: Any) -> BlockingSocket:
        """The blocking twin of :meth:`connect`: same options, defaults and errors."""
        return connect_tcp_socket(*_connect_args(url, options))


def _connect_args(url: TransportUrl, options: dict[str, Any]) -> tuple[str, int, str, float | None]:
    """``(host, port, target, time_limit)`` of a ``tcp://`` connect."""
    check_no_path(url)
    opts = merge_options(url, options, _CONNECT_OPTIONS)
    timeout = connect_timeout_option(opts)
    host, port = url.host_port(DEFAULT_HOST, DEFAULT_PORT)
    return host, port, f"tcp://{format_host_port(host, port)}", timeout
