"""Helpers shared by the built-in transports: option handling, connect-error messages and
the blocking socket the synchronous client gets."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Self

from anyio.abc import SocketAttribute

from hipr.errors import HipConnectionError
from hipr.transports.base import TransportUrl

#: how long a connection attempt may take unless the caller says otherwise
DEFAULT_CONNECT_TIMEOUT = 10.0

_HINT = "is `hipr worker` running and listening there?"


def merge_options(
    url: TransportUrl, options: Mapping[str, Any], allowed: frozenset[str]
) -> dict[str, Any]:
    """The URL's query merged under the call's options; an unknown name is a clear error.

    Query values are strings; options given in the call win over them, so a program can
    override what a configured URL says.
    """
    merged: dict[str, Any] = {k: v for k, v in url.query.items() if k in allowed}
    unknown = sorted((set(url.query) | set(options)) - allowed)
    if unknown:
        raise ValueError(
            f"{url.scheme}:// does not take option(s) {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(sorted(allowed))}"
        )
    merged.update({k: v for k, v in options.items() if v is not None})
    return merged


def as_timeout(value: Any, name: str) -> float | None:
    """A positive number of seconds, or ``None`` (no limit) for ``0``/``"none"``."""
    if value is None or (isinstance(value, str) and value.lower() in ("", "none", "0")):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None
    if seconds < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return seconds or None


def connect_timeout_option(opts: Mapping[str, Any]) -> float | None:
    """The ``connect_timeout`` option in seconds (default 10 s; ``0`` for no limit)."""
    return as_timeout(opts.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT), "connect_timeout")


def _leaf_errors(exc: BaseException) -> Iterator[BaseException]:
    """The errors underneath anyio's "All connection attempts failed" wrapper."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
            continue
        if current.__cause__ is not None:
            stack.append(current.__cause__)
        yield current


def describe_os_error(exc: BaseException) -> str:
    """A short reason for a failed connect, most specific cause first."""
    leaves = [e for e in _leaf_errors(exc) if isinstance(e, OSError)]
    if any(isinstance(e, socket.gaierror) for e in leaves):
        gai = next(e for e in leaves if isinstance(e, socket.gaierror))
        return f"cannot resolve the host name ({gai.strerror or gai})"
    for err in leaves:
        if err.errno == errno.ENOENT:
            return f"no such socket ({_HINT})"
        if err.errno in (errno.EACCES, errno.EPERM):
            return "permission denied (is your user allowed to use the worker's socket?)"
        if err.errno == errno.ECONNREFUSED:
            return f"connection refused ({_HINT})"
        if err.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return f"{err.strerror.lower() if err.strerror else 'unreachable'} (check the address)"
    for err in leaves:
        if err.errno is not None and err.strerror:
            return err.strerror[:1].lower() + err.strerror[1:]
    return str(exc) or type(exc).__name__


def connect_error(target: str, exc: BaseException) -> HipConnectionError:
    """``HipConnectionError("could not connect to <target>: <reason>")`` for an OSError."""
    return HipConnectionError(message=f"could not connect to {target}: {describe_os_error(exc)}")


def connect_timeout_error(target: str, seconds: float) -> HipConnectionError:
    """The error of a connect that did not finish in time."""
    return HipConnectionError(
        message=f"could not connect to {target}: timed out after {seconds:g} s ({_HINT})"
    )


@contextlib.contextmanager
def connect_errors(target: str, time_limit: float | None) -> Iterator[None]:
    """Turn a failed connect's ``TimeoutError``/``OSError`` into ``HipConnectionError``."""
    try:
        yield
    except TimeoutError:
        raise connect_timeout_error(target, time_limit or 0) from None
    except OSError as exc:
        raise connect_error(target, exc) from exc


class BlockingSocket(socket.socket):
    """A connected, blocking socket with a ``description`` for logs.

    A subclass rather than a wrapper: ``sendall`` and ``recv_into`` stay the C socket
    methods, so the synchronous client pays nothing per call for it.
    """

    #: see :class:`hipr.transports.base.BlockingStream`
    description: str = ""

    @classmethod
    def adopt(cls, sock: socket.socket, description: str) -> Self:
        """Take over ``sock``'s connection (``sock`` is left detached), in blocking mode."""
        adopted = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        # The descriptor may still be non-blocking from a connect timeout.
        adopted.settimeout(None)
        adopted.description = description
        return adopted


def socket_attributes(sock: socket.socket, *, connected: bool) -> dict[Any, Callable[[], Any]]:
    """anyio's ``SocketAttribute`` family of ``sock``: family, raw socket, local address,
    and for TCP the local port; the peer's address (and port) when ``connected``. One
    table for the listeners and every stream class built here."""
    attributes: dict[Any, Callable[[], Any]] = {
        SocketAttribute.family: lambda: sock.family,
        SocketAttribute.local_address: sock.getsockname,
        SocketAttribute.raw_socket: lambda: sock,
    }
    tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
    if tcp:
        attributes[SocketAttribute.local_port] = lambda: sock.getsockname()[1]
    if connected:
        attributes[SocketAttribute.remote_address] = sock.getpeername
        if tcp:
            attributes[SocketAttribute.remote_port] = lambda: sock.getpeername()[1]
    return attributes
