"""``tls://host:port``: TCP with TLS (1.2 at least), optionally mutual.

The worker side does each TLS handshake inside the accepted connection's own task, with
a time limit: a client with a bad certificate, a plaintext client or a port scanner
fails its own handshake and is logged, while the listener goes on serving everyone
else. The client side turns every handshake failure into one ``HipConnectionError`` that
carries OpenSSL's reason ("certificate has expired", "Hostname mismatch", ...).

No close_notify is required of the peer (anyio's ``standard_compatible=False``): the
wire protocol frames its own messages, so a peer that hangs up without it cannot
truncate a message unnoticed.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any, ClassVar, TypeVar, cast

import anyio
from anyio.abc import AnyByteStream, ByteStream, Listener, SocketAttribute, TaskGroup
from anyio.streams.tls import TLSAttribute

from hipr.errors import HipConnectionError
from hipr.transports._common import connect_timeout_option, merge_options
from hipr.transports.base import (
    BlockingStream,
    TransportConfig,
    TransportFailedError,
    TransportUrl,
    format_host_port,
)
from hipr.transports.tcp import (
    DEFAULT_HOST,
    check_no_path,
    connect_tcp_socket,
    create_tcp_listener,
    open_tcp_stream,
)

__all__ = [
    "DEFAULT_PORT",
    "TlsListener",
    "TlsStream",
    "TlsTransport",
    "client_context",
    "server_context",
    "tls_failure",
]

DEFAULT_PORT = 18516

_log = logging.getLogger(__name__)
_SSL_MESSAGE = re.compile(r"\] (.+?)(?: \(_ssl\.c:\d+\))?$")
_T = TypeVar("_T")

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}

_CONNECT_OPTIONS = frozenset(
    {"ca", "cert", "key", "server_hostname", "ssl_context", "connect_timeout", "min_version"}
)


def _is_pem(value: str | bytes) -> bool:
    marker = b"-----BEGIN " if isinstance(value, bytes) else "-----BEGIN "
    return marker in value  # type: ignore[operator]


def _min_version(value: str) -> ssl.TLSVersion:
    try:
        return _VERSIONS[str(value)]
    except KeyError:
        raise ValueError(
            f"TLS min_version must be one of {', '.join(_VERSIONS)}, not {value!r}"
        ) from None


def _load_trust(ctx: ssl.SSLContext, ca: str | bytes, what: str) -> None:
    """Trust ``ca``: a PEM file's path or the PEM text itself."""
    try:
        if _is_pem(ca):
            ctx.load_verify_locations(cadata=ca.decode() if isinstance(ca, bytes) else ca)
        else:
            ctx.load_verify_locations(cafile=os.fspath(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the {what} {_shorten(ca)!r}: {exc}") from exc


def _load_chain(ctx: ssl.SSLContext, cert: str | bytes, key: str | bytes | None, what: str) -> None:
    """Load a certificate chain and key given as file paths or as PEM text.

    ``ssl`` reads chains only from files, so PEM text goes through a private temporary
    file (mode 0600) that is removed as soon as it is loaded.
    """
    paths: list[str] = []
    try:
        cert_path, key_path = cert, key
        for value, slot in ((cert, "cert"), (key, "key")):
            if value is not None and _is_pem(value):
                fd, path = tempfile.mkstemp(prefix="hipr-tls-", suffix=".pem")
                paths.append(path)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(value.encode() if isinstance(value, str) else value)
                if slot == "cert":
                    cert_path = path
                else:
                    key_path = path
        ctx.load_cert_chain(
            os.fsdecode(cert_path), None if key_path is None else os.fsdecode(key_path)
        )
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the {what} {_shorten(cert)!r}: {exc}") from exc
    finally:
        for path in paths:
            os.unlink(path)


def _shorten(value: str | bytes) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text if len(text) < 80 else text[:40] + "..."


def server_context(config: TransportConfig) -> ssl.SSLContext:
    """The worker's TLS context from its config (mutual TLS when ``require_client_cert``)."""
    if not config.certfile:
        raise ValueError(
            "a tls:// listener needs a certificate: set certfile (and keyfile) in the "
            "worker's [tls] config"
        )
    if config.require_client_cert and not config.client_ca:
        raise ValueError(
            "require_client_cert needs client_ca: the CA that client certificates must chain to"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _min_version(config.min_version)
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    _load_chain(ctx, config.certfile, config.keyfile, "worker certificate")
    if config.client_ca:
        # Only this CA vouches for clients: the system store would let any public
        # certificate authenticate.
        _load_trust(ctx, config.client_ca, "client CA")
        ctx.verify_mode = ssl.CERT_REQUIRED if config.require_client_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_context(
    ca: str | bytes | None = None,
    cert: str | bytes | None = None,
    key: str | bytes | None = None,
    min_version: str = "1.2",
) -> ssl.SSLContext:
    """A client context: ``ca`` alone or else the system store, hostname checked."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca is not None:
        # A given CA replaces the system store: a private CA is meant to be the only
        # one that can vouch for this worker.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_trust(ctx, ca, "CA")
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = _min_version(min_version)
    if cert is not None:
        _load_chain(ctx, cert, key, "client certificate")
    elif key is not None:
        raise ValueError("a TLS key= was given without its cert=")
    return ctx


def _is_eof(exc: BaseException) -> bool:
    """Whether an ``ssl`` error only says the peer hung up (no close_notify)."""
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return True
    return isinstance(exc, ssl.SSLError) and "UNEXPECTED_EOF" in (exc.strerror or "")


def _handshake_reason(exc: BaseException) -> str:
    """OpenSSL's reason for a failed handshake, as short as it stays clear."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if _is_eof(exc) or isinstance(exc, ConnectionError):
        # What a blocking socket sees where an anyio stream raises EndOfStream or
        # BrokenResourceError: the same words for both clients.
        return "the peer closed the connection during the handshake"
    if isinstance(exc, ssl.SSLError):
        # str() reads "[SSL: CODE] human words (_ssl.c:NNNN)"; the words are the reason.
        match = _SSL_MESSAGE.search(str(exc))
        if match:
            return match.group(1)
        return (exc.reason or str(exc)).lower().replace("_", " ")
    if isinstance(exc, (anyio.EndOfStream, anyio.BrokenResourceError)):
        return "the peer closed the connection during the handshake"
    return str(exc) or type(exc).__name__


def _client_hint(exc: BaseException) -> str:
    """What the user can do about a failed handshake, seen from the client."""
    reason = _handshake_reason(exc).lower()
    if "hostname mismatch" in reason or "ip address mismatch" in reason:
        return " (connect with the name the certificate was issued for, or pass server_hostname=)"
    if "expired" in reason or "not yet valid" in reason:
        return " (the worker's certificate must be renewed, or a clock is wrong)"
    if "unable to get local issuer" in reason or "self-signed" in reason or "self signed" in reason:
        return " (pass ca= with the CA that issued the worker's certificate)"
    if any(
        s in reason
        for s in (
            "wrong version number",
            "record layer failure",
            "packet length",
            "unexpected message",
        )
    ):
        return " (is the worker listening with TLS there? a tcp:// worker does not speak TLS)"
    if "certificate required" in reason or "handshake failure" in reason:
        return " (the worker may require a client certificate: pass cert= and key=)"
    if "unknown ca" in reason or "bad certificate" in reason:
        return " (the worker did not accept the client certificate)"
    if "closed the connection" in reason:
        return " (is the worker listening with TLS there, and does it accept this client?)"
    return ""


# Plaintext in a TLS record: bounded so a large send never holds a huge copy in memory.
_CHUNK = 256 * 1024


class TlsStream(ByteStream):
    """A TLS session over another byte stream (built on ``ssl.MemoryBIO``).

    It differs from ``anyio.streams.tls.TLSStream`` where hipr needs it to: the alert
    OpenSSL queues when a handshake or record fails is sent to the peer before the error
    is raised, so the peer learns *why* (e.g. "certificate required") instead of seeing
    a bare EOF; a failure on an open stream raises :class:`TransportFailedError` with
    OpenSSL's reason; writes to the underlying stream are serialised, so one task may
    send while another receives; large sends go out in bounded records. It offers the
    same ``TLSAttribute`` extra attributes as anyio's stream.
    """

    def __init__(
        self,
        transport: AnyByteStream,
        ssl_object: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        target: str,
    ) -> None:
        self.transport_stream = transport
        self._ssl = ssl_object
        self._in = incoming
        self._out = outgoing
        self._target = target
        self._write_lock = anyio.Lock()
        self._broken = False

    @classmethod
    async def handshake(
        cls,
        transport: AnyByteStream,
        ssl_context: ssl.SSLContext,
        *,
        server_side: bool,
        hostname: str | None = None,
        target: str = "the peer",
    ) -> TlsStream:
        """Do the handshake over ``transport``; raises ``ssl.SSLError`` or ``EndOfStream``."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        ssl_object = ssl_context.wrap_bio(
            incoming, outgoing, server_side=server_side, server_hostname=hostname
        )
        stream = cls(transport, ssl_object, incoming, outgoing, target)
        await stream._drive(ssl_object.do_handshake)
        return stream

    async def _flush(self) -> None:
        if not self._out.pending:
            # Without this a receive would queue behind a send blocked on a full socket,
            # and the peer, unable to send to us, might never drain it.
            return
        async with self._write_lock:
            # Read inside the lock: records must reach the wire in the order OpenSSL
            # produced them, whichever task produced them.
            data = self._out.read()
            if data:
                try:
                    await self.transport_stream.send(data)
                except BaseException:
                    # A record is lost: nothing sent after it could be decrypted.
                    self._broken = True
                    raise

    async def _drive(self, func: Callable[..., _T], *args: Any) -> _T:
        """Call an SSLObject method, moving bytes until it completes."""
        if self._broken:
            raise anyio.BrokenResourceError
        while True:
            try:
                result = func(*args)
            except ssl.SSLWantReadError:
                await self._flush()
                try:
                    data = await self.transport_stream.receive()
                except anyio.EndOfStream:
                    self._in.write_eof()
                except anyio.get_cancelled_exc_class():
                    # Nothing was taken from the socket: OpenSSL still waits for the
                    # same bytes, and the stream goes on (a connection that stops its
                    # reader, say to drain, must still send its last replies).
                    raise
                except BaseException:
                    self._broken = True
                    raise
                else:
                    self._in.write(data)
            except ssl.SSLWantWriteError:
                await self._flush()
            except ssl.SSLError as exc:
                self._broken = True
                if _is_eof(exc):
                    # The peer hung up without close_notify; the protocol above frames
                    # its own messages, so this is an ordinary end of stream.
                    raise anyio.EndOfStream from None
                await self._send_alert()
                raise
            else:
                await self._flush()
                return result

    async def _send_alert(self) -> None:
        """Best effort: tell the peer why, without waiting long on a peer that is gone."""
        with anyio.move_on_after(1.0):
            try:
                await self._flush()
            except Exception:  # the peer may be gone; its alert is a courtesy
                pass

    def _failed(self, exc: ssl.SSLError) -> TransportFailedError:
        return tls_failure(exc, self._target, server_side=self._ssl.server_side)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Decrypted bytes; ``EndOfStream`` when the peer closed the connection."""
        if max_bytes < 1:
            raise ValueError("max_bytes must be a positive integer")
        try:
            data = await self._drive(self._ssl.read, max_bytes)
        except ssl.SSLError as exc:
            raise self._failed(exc) from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        """Encrypt and send all of ``item``."""
        view = memoryview(item)
        try:
            for offset in range(0, max(len(view), 1), _CHUNK):
                await self._drive(self._ssl.write, view[offset : offset + _CHUNK])
        except ssl.SSLError as exc:
            raise self._failed(exc) from exc

    async def send_eof(self) -> None:
        """TLS has no half-close that both TLS 1.2 and 1.3 peers understand."""
        raise NotImplementedError("TLS streams cannot send EOF and keep receiving")

    async def aclose(self) -> None:
        """Send close_notify when it costs no waiting, then close the underlying stream."""
        try:
            if not self._broken:
                with anyio.move_on_after(1.0, shield=True):
                    try:
                        self._ssl.unwrap()
                    except ssl.SSLError:
                        pass  # WantRead: the peer's close_notify is not worth waiting for
                    await self._flush()
        except Exception:  # closing anyway
            pass
        finally:
            self._broken = True
            await self.transport_stream.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """anyio's ``TLSAttribute`` set, over the underlying stream's attributes."""
        ssl_object = self._ssl
        return {
            **self.transport_stream.extra_attributes,
            TLSAttribute.alpn_protocol: ssl_object.selected_alpn_protocol,
            TLSAttribute.channel_binding_tls_unique: ssl_object.get_channel_binding,
            TLSAttribute.cipher: ssl_object.cipher,
            TLSAttribute.peer_certificate: lambda: ssl_object.getpeercert(False),
            TLSAttribute.peer_certificate_binary: lambda: ssl_object.getpeercert(True),
            TLSAttribute.server_side: lambda: ssl_object.server_side,
            TLSAttribute.shared_ciphers: lambda: (
                ssl_object.shared_ciphers() if ssl_object.server_side else None
            ),
            TLSAttribute.standard_compatible: lambda: False,
            TLSAttribute.ssl_object: lambda: ssl_object,
            TLSAttribute.tls_version: ssl_object.version,
        }


class TlsListener(Listener[TlsStream]):
    """Wraps a TCP listener; each accepted stream does its TLS handshake in its own task.

    A handshake that fails or takes longer than ``handshake_timeout`` closes that one
    connection and is logged at WARNING (no traceback: port scanners and misconfigured
    clients are routine, not bugs); the listener keeps serving.
    """

    def __init__(
        self, inner: Listener[Any], ssl_context: ssl.SSLContext, handshake_timeout: float
    ) -> None:
        self._inner = inner
        self.ssl_context = ssl_context
        self.handshake_timeout = handshake_timeout

    async def serve(
        self, handler: Callable[[TlsStream], Any], task_group: TaskGroup | None = None
    ) -> None:
        """Accept connections forever; ``handler`` gets each one after its handshake."""

        @wraps(handler)
        async def handshake_then_handle(stream: AnyByteStream) -> None:
            peer = _peer(stream)
            try:
                with anyio.fail_after(self.handshake_timeout):
                    tls_stream = await TlsStream.handshake(
                        stream, self.ssl_context, server_side=True, target=peer
                    )
            except Exception as exc:
                _log.warning(
                    "TLS handshake with %s failed: %s%s",
                    peer,
                    "timed out" if isinstance(exc, TimeoutError) else _handshake_reason(exc),
                    _server_hint(exc),
                )
                await anyio.aclose_forcefully(stream)
                return
            except BaseException:
                await anyio.aclose_forcefully(stream)
                raise
            await handler(tls_stream)

        await self._inner.serve(handshake_then_handle, task_group)

    async def aclose(self) -> None:
        """Stop listening."""
        await self._inner.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """The TCP listener's attributes (local address and port)."""
        return self._inner.extra_attributes


def _peer(stream: Any) -> str:
    addr = stream.extra(SocketAttribute.remote_address, None)
    if isinstance(addr, tuple):
        return format_host_port(str(addr[0]), int(addr[1]))
    return "a client"


def tls_failure(
    exc: BaseException, target: str, *, server_side: bool = False
) -> TransportFailedError:
    """The error of an open TLS stream that failed (an alert, a bad record), with a hint."""
    hint = _server_hint(exc) if server_side else _client_hint(exc)
    return TransportFailedError(
        message=f"TLS connection with {target} failed: {_handshake_reason(exc)}{hint}"
    )


def _handshake_error(target: str, exc: BaseException) -> HipConnectionError:
    return HipConnectionError(
        message=f"TLS handshake with {target} failed: {_handshake_reason(exc)}{_client_hint(exc)}"
    )


def _handshake_timeout_error(target: str, timeout: float | None) -> HipConnectionError:
    return HipConnectionError(
        message=f"could not connect to {target}: the TLS handshake timed out after "
        f"{timeout or 0:g} s (is the worker listening with TLS there?)"
    )


@dataclass(frozen=True)
class _ClientSettings:
    """What a client connect needs, from the URL and the options (both paths share it)."""

    host: str
    port: int
    target: str
    timeout: float | None
    context: ssl.SSLContext
    hostname: str


def _client_settings(url: TransportUrl, options: dict[str, Any]) -> _ClientSettings:
    check_no_path(url)
    opts = merge_options(url, options, _CONNECT_OPTIONS)
    host, port = url.host_port(DEFAULT_HOST, DEFAULT_PORT)
    ctx = opts.get("ssl_context")
    if ctx is None:
        ctx = client_context(
            opts.get("ca"), opts.get("cert"), opts.get("key"), opts.get("min_version", "1.2")
        )
    elif not isinstance(ctx, ssl.SSLContext):
        raise ValueError(f"ssl_context must be an ssl.SSLContext, not {type(ctx).__name__}")
    return _ClientSettings(
        host=host,
        port=port,
        target=f"tls://{format_host_port(host, port)}",
        timeout=connect_timeout_option(opts),
        context=ctx,
        hostname=opts.get("server_hostname") or host,
    )


def _server_hint(exc: BaseException) -> str:
    reason = _handshake_reason(exc).lower()
    if "http request" in reason or "wrong version number" in reason or "record" in reason:
        return " (a plaintext client on the TLS port?)"
    if "peer did not return a certificate" in reason or "certificate required" in reason:
        return " (mutual TLS is required and the client sent no certificate)"
    return ""


class TlsTransport:
    """``tls://[host][:port]`` (default port 18516): TLS over TCP, mutual TLS optional.

    Connect options (also from the URL query, where strings): ``ca`` (path or PEM text;
    default the system trust store), ``cert`` and ``key`` (client certificate for
    mutual TLS), ``server_hostname`` (name to check, default the URL's host),
    ``ssl_context`` (a ready ``ssl.SSLContext``, overriding the others),
    ``connect_timeout`` (seconds for TCP connect plus handshake), ``min_version``.

    Under TLS 1.3 the worker checks a client certificate after the client has finished
    its side of the handshake, so a missing or refused client certificate surfaces on the
    first ``receive`` as :class:`TransportFailedError` (a ``HipConnectionError`` carrying
    the alert, e.g. "tlsv13 alert certificate required"), not from ``connect``.
    """

    scheme: ClassVar[str] = "tls"

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        """Listen with the worker's certificate; see :func:`server_context`."""
        ctx = server_context(config)
        inner = await create_tcp_listener(url, DEFAULT_PORT)
        return TlsListener(inner, ctx, config.handshake_timeout)

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        """Connect and complete the handshake, or raise one ``HipConnectionError``."""
        s = _client_settings(url, options)
        with anyio.move_on_after(s.timeout):
            stream = await open_tcp_stream(s.host, s.port, s.target, s.timeout)
            try:
                return await TlsStream.handshake(
                    stream, s.context, server_side=False, hostname=s.hostname, target=s.target
                )
            except (ssl.SSLError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
                await anyio.aclose_forcefully(stream)
                raise _handshake_error(s.target, exc) from exc
            except BaseException:
                await anyio.aclose_forcefully(stream)
                raise
        # Only reached when the time limit cancelled the connect or the handshake.
        raise _handshake_timeout_error(s.target, s.timeout)

    def connect_blocking(self, url: TransportUrl, **options: Any) -> BlockingStream:
        """The blocking twin of :meth:`connect`: an ``ssl.SSLSocket``, same options and errors.

        The TCP connect and the handshake share ``connect_timeout``, as in ``connect``.
        A failure on the open socket raises ``ssl.SSLError``/``OSError``; pass it to
        :func:`hipr.transports.stream_failure` for the same message ``receive`` gives.
        """
        s = _client_settings(url, options)
        deadline = None if s.timeout is None else time.monotonic() + s.timeout
        sock = connect_tcp_socket(s.host, s.port, s.target, s.timeout)
        try:
            tls = s.context.wrap_socket(
                sock, server_hostname=s.hostname, do_handshake_on_connect=False
            )
        except BaseException:
            sock.close()
            raise
        try:
            if deadline is not None:
                tls.settimeout(max(deadline - time.monotonic(), 1e-3))
            tls.do_handshake()
            tls.settimeout(None)
        except TimeoutError:
            tls.close()
            raise _handshake_timeout_error(s.target, s.timeout) from None
        except OSError as exc:  # ssl.SSLError included
            tls.close()
            raise _handshake_error(s.target, exc) from exc
        except BaseException:
            tls.close()
            raise
        # Set on the SSLSocket itself (its instances take attributes) rather than through a
        # wrapper: sendall/recv_into stay ssl's own, with no call of ours in between.
        cast(Any, tls).description = s.target
        return cast(BlockingStream, tls)
