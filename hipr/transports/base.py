"""The transport plugin interface: URLs, listener settings and the ``Transport`` protocol.

A transport turns a URL into an anyio ``Listener`` of byte streams (worker side) or one
``ByteStream`` (client side, async); a transport that also implements
``connect_blocking`` (:class:`BlockingTransport`) opens a :class:`BlockingStream` for the
synchronous client. Nothing above this layer knows which transport it has, so this
module knows nothing of the wire protocol either: bytes in, bytes out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable
from urllib.parse import parse_qsl, unquote, urlsplit

from anyio import BrokenResourceError, TypedAttributeSet, typed_attribute
from anyio.abc import ByteStream, Listener

from hipr.errors import HipConnectionError, InvalidUrlError

__all__ = [
    "BlockingStream",
    "BlockingTransport",
    "PushDelivery",
    "ThreadWriter",
    "Transport",
    "TransportAttribute",
    "TransportConfig",
    "TransportFailedError",
    "TransportUrl",
    "format_host_port",
    "parse_url",
    "query_values",
    "stream_capability",
]

T = TypeVar("T")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


@dataclass(frozen=True)
class TransportUrl:
    """A transport URL taken apart, e.g. ``tcp://127.0.0.1:18515`` or ``ssh://me@gpu01/run/w.sock``.

    ``host`` has IPv6 brackets removed (``[::1]`` gives ``"::1"``); ``port`` and ``user``
    are ``None`` when absent; ``path`` is percent-decoded and ``""`` when absent; ``query``
    keeps the last value of a repeated key (``raw`` still has them all); ``raw`` is the
    string that was parsed.
    """

    scheme: str
    host: str
    port: int | None
    path: str
    user: str | None
    query: dict[str, str] = field(default_factory=dict)
    raw: str = ""

    def host_port(self, default_host: str, default_port: int) -> tuple[str, int]:
        """``(host, port)`` with the transport's defaults filled in."""
        return (self.host or default_host, default_port if self.port is None else self.port)

    def __str__(self) -> str:
        return self.raw


def parse_url(url: str) -> TransportUrl:
    """Parse a transport URL; a malformed one raises :class:`ValueError` saying what is wrong.

    Only the generic shape is checked here (scheme, port number, no password, no
    fragment); each transport checks what it needs of host and path itself.
    """
    if not isinstance(url, str):
        raise InvalidUrlError(message=f"a transport URL must be a string, not {type(url).__name__}")
    text = url.strip()
    if "://" not in text:
        raise InvalidUrlError(
            message=f"malformed transport URL {url!r}: expected scheme://..., "
            "e.g. tcp://127.0.0.1:18515, unix:///run/hipr/worker.sock, tls://gpu01:18516 "
            "or ssh://user@gpu01/run/hipr/worker.sock"
        )
    scheme_text = text.split("://", 1)[0]
    if not _SCHEME.match(scheme_text):
        raise InvalidUrlError(
            message=f"malformed transport URL {url!r}: bad scheme {scheme_text!r}"
        )
    try:
        parts = urlsplit(text)
        port = parts.port
        hostname = parts.hostname
    except ValueError as exc:
        # urllib's own messages ("Port out of range 0-65535", "Invalid IPv6 URL") are
        # clear enough once they name the URL they are about.
        raise InvalidUrlError(message=f"malformed transport URL {url!r}: {exc}") from None
    if parts.password is not None:
        raise InvalidUrlError(
            message=f"malformed transport URL {url!r}: passwords do not belong in URLs "
            "(they end up in logs); use keys, certificates or tokens"
        )
    if parts.fragment:
        raise InvalidUrlError(
            message=f"malformed transport URL {url!r}: unexpected '#{parts.fragment}'"
        )
    netloc_host = parts.netloc.rpartition("@")[2]
    if netloc_host.startswith("[") and not netloc_host.partition("]")[0][1:]:
        raise InvalidUrlError(message=f"malformed transport URL {url!r}: empty IPv6 address")
    if parts.netloc.endswith(":"):
        raise InvalidUrlError(message=f"malformed transport URL {url!r}: empty port")
    try:
        query_pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        if parts.query:
            raise InvalidUrlError(
                message=f"malformed transport URL {url!r}: bad query {parts.query!r}, "
                "expected key=value&key=value"
            ) from None
        query_pairs = []
    return TransportUrl(
        scheme=scheme_text.lower(),
        host=unquote(hostname or ""),
        port=port,
        path=unquote(parts.path),
        user=unquote(parts.username) if parts.username else None,
        query=dict(query_pairs),
        raw=text,
    )


def query_values(url: TransportUrl, key: str) -> list[str]:
    """Every value of a query key, in order (``url.query`` keeps only the last)."""
    query = urlsplit(url.raw).query
    return [v for k, v in parse_qsl(query, keep_blank_values=True) if k == key]


def format_host_port(host: str, port: int) -> str:
    """``host:port``, with IPv6 addresses in brackets as URLs write them."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class TransportConfig:
    """Listener settings of the worker, shared by every transport it listens on.

    The TLS fields apply to ``tls://`` listeners: ``certfile``/``keyfile`` are the
    worker's certificate chain and key (PEM files), ``client_ca`` the CA (file or PEM
    text) that client certificates must chain to, ``require_client_cert`` turns on
    mutual TLS, and ``min_version`` is ``"1.2"`` or ``"1.3"``. ``unix_socket_mode`` is
    the permission of ``unix://`` sockets. ``extra`` carries settings of third-party
    transports, keyed as they document.
    """

    certfile: str | None = None
    keyfile: str | None = None
    client_ca: str | None = None
    require_client_cert: bool = False
    min_version: str = "1.2"
    handshake_timeout: float = 10.0
    unix_socket_mode: int = 0o660
    extra: dict[str, Any] = field(default_factory=dict)


class TransportFailedError(HipConnectionError, BrokenResourceError):
    """An open stream's transport failed and the transport knows why (a TLS alert, ssh's
    own message).

    It is both a :class:`~hipr.errors.HipConnectionError`, so users see the reason, and
    anyio's ``BrokenResourceError``, so code that treats a broken stream as a dropped
    connection (and reconnects) needs no special case.
    """


class PushDelivery(Protocol):
    """A stream that can hand arriving bytes to a callback in the event loop's own I/O
    callback, instead of waiting for ``receive`` (a stream's optional capability, found
    with ``stream.extra(TransportAttribute.push_delivery, None)``).

    The worker decodes requests as they arrive this way, with no task woken just to
    read, and receives a large payload straight into its own buffer."""

    def deliver_to(
        self,
        on_data: Callable[[bytes], None],
        on_end: Callable[[], None],
        target: Callable[[], memoryview | None] | None = None,
        target_filled: Callable[[int], None] | None = None,
    ) -> None:
        """From now on hand each arriving chunk to ``on_data`` (bytes already buffered
        first), and call ``on_end`` at end of stream or when the link breaks. Before each
        read, ``target()`` may name the buffer the next bytes must land in; then
        ``target_filled(n)`` reports them instead of ``on_data``."""
        ...

    def pause_reading(self, paused: bool) -> None:
        """Back-pressure: stop (or restart) reading from the peer."""
        ...

    @property
    def unread_bytes(self) -> int:
        """Bytes read from the peer that no one has taken yet."""
        ...

    @property
    def writable_now(self) -> bool:
        """True when a write would be taken at once (open, and the peer reads)."""
        ...

    def write_nowait(self, data: bytes) -> None:
        """Queue ``data`` for sending without waiting; the caller keeps whole frames
        whole. ``anyio.BrokenResourceError`` once the link is gone."""
        ...


class ThreadWriter(Protocol):
    """A stream that lets a thread other than its loop's write whole frames to it (a
    stream's optional capability, found with
    ``stream.extra(TransportAttribute.thread_writer, None)``): a worker session's GPU
    thread puts a synchronize's reply on the wire itself, without waking the loop."""

    def write_from_thread(self, data: bytes, busy: Callable[[], bool]) -> bool:
        """From a thread other than the loop's: send ``data`` (one whole frame) at once,
        unless ``busy()`` (a frame half-written) or the stream's own queue says it must
        wait; False, with nothing sent, then."""
        ...

    def reserve_native_write(self, busy: Callable[[], bool]) -> int:
        """On the loop: a socket descriptor a native call may send one whole frame to,
        with the stream's other writes held back until :meth:`native_written`; -1 when
        it may not now (``busy()``, a queue, a closed stream)."""
        ...

    def native_written(self, data: bytes, sent: int) -> None:
        """After :meth:`reserve_native_write`: the socket took ``sent`` bytes of ``data``
        (0 or a negative ``-errno``: none); the rest goes first with the next write."""
        ...

    @property
    def thread_write_held(self) -> bool:
        """True while the rest of a frame a thread began waits unsent (the socket took
        only part of it)."""
        ...

    async def flush_thread_write(self) -> None:
        """On the loop: send the rest of a frame a thread began, if the socket took only
        part of it (before the connection's next frame, under its send lock)."""
        ...


class TransportAttribute(TypedAttributeSet):
    """Typed attributes a transport may put on its streams (anyio's ``stream.extra``).

    Besides facts about the stream, a stream offers its optional capabilities this way:
    whoever uses one asks for it by attribute and never names a stream class."""

    #: how the stream is described in logs, when the transport knows better than the
    #: socket (e.g. ``"ssh me@gpu01:22 -> /run/hipr/worker.sock"``)
    description: str = typed_attribute()
    #: the stream itself, where it can deliver bytes in the loop's I/O callback
    push_delivery: PushDelivery = typed_attribute()
    #: the stream itself, where another thread may write whole frames to it
    thread_writer: ThreadWriter = typed_attribute()


def stream_capability(stream: ByteStream, attribute: T) -> T | None:
    """``stream``'s own capability ``attribute`` (``TransportAttribute.push_delivery``,
    ``.thread_writer``), or None. A wrapping stream forwards the attributes of the stream
    it wraps (anyio's TLS stream does): bytes pushed or written past the wrapper would
    skip its encryption, so a capability counts only when the stream itself offers it."""
    value = stream.extra(attribute, None)
    return value if value is stream else None


@runtime_checkable
class Transport(Protocol):
    """What a transport plugin provides; registered in the ``hipr.transports`` entry points.

    The class is instantiated with no arguments. ``listen`` may raise :class:`ValueError`
    for a URL or config it cannot serve; ``connect`` raises
    :class:`hipr.errors.HipConnectionError` when the peer cannot be reached. A transport
    may also offer ``connect_blocking(url, **options) -> BlockingStream`` for the
    synchronous client (see :class:`BlockingTransport`).
    """

    scheme: ClassVar[str]

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        """Start listening at ``url``; the listener's ``serve`` hands over each new stream."""
        ...

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        """Open one stream to ``url``; ``options`` are transport-specific (``ca=``, ...)."""
        ...


@runtime_checkable
class BlockingStream(Protocol):
    """A connected blocking byte stream, for the synchronous client's own I/O.

    A ``socket.socket`` or ``ssl.SSLSocket`` has every method here, so the built-in
    transports return one (a subclass, or the socket with ``description`` set on it):
    ``sendall`` and ``recv_into`` are the socket's own methods, with no Python-level
    wrapper on the hot path. ``recv_into`` returns 0 at end of stream; a timeout set
    with ``settimeout`` raises ``TimeoutError``. When a call fails,
    :func:`hipr.transports.stream_failure` gives the transport's reason, if it knows one
    (ssh's message, a TLS alert).

    Threads: one thread may send while another receives on a plain socket (tcp, unix,
    ssh), but not on a TLS one: ``ssl.SSLSocket`` adds no lock and OpenSSL's connection
    objects must not be used from two threads at once.
    """

    #: how the stream is described in logs, e.g. ``"ssh me@gpu01:22 -> /run/w.sock"``
    description: str

    def sendall(self, data: bytes | bytearray | memoryview, /) -> None:
        """Send all of ``data``, blocking (up to the timeout) while the buffer is full."""
        ...

    def send(self, data: bytes | bytearray | memoryview, /) -> int:
        """Send what fits now (waiting up to the timeout for room); the bytes sent."""
        ...

    def recv_into(self, buffer: memoryview | bytearray, nbytes: int = 0, /) -> int:
        """Receive up to ``nbytes`` (0: the buffer's size) into ``buffer``; 0 at end."""
        ...

    def settimeout(self, seconds: float | None, /) -> None:
        """Limit each later call to ``seconds`` (``None``: block without limit)."""
        ...

    def close(self) -> None:
        """Close the stream and release what carries it (an ssh process, ...)."""
        ...

    def fileno(self) -> int:
        """The file descriptor, for ``select``/``poll`` (-1 once closed)."""
        ...


@runtime_checkable
class BlockingTransport(Transport, Protocol):
    """A transport that can also open a blocking connection (all built-ins can).

    ``connect_blocking`` is optional for a plugin, so it is not part of
    :class:`Transport` itself (``isinstance`` would then refuse plugins without it):
    a plugin without it makes :func:`hipr.transports.connect_blocking` raise
    ``NotImplementedError``, and the synchronous client falls back to its async path.
    """

    def connect_blocking(self, url: TransportUrl, **options: Any) -> BlockingStream:
        """Open one blocking stream to ``url``; same options and errors as ``connect``."""
        ...
