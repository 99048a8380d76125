"""tls://: round trips, mutual TLS, and one clear client-side error for each failure,
with the listener serving the next good client every time."""

from __future__ import annotations

import datetime
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import trustme
from anyio.abc import SocketAttribute

from hipr.errors import HipConnectionError
from hipr.transports import (
    TransportConfig,
    TransportFailedError,
    connect,
    listen,
    peer_certificate_subject,
    peer_description,
)
from hipr.transports.tls import DEFAULT_PORT, client_context, server_context
from tests.transports.conftest import EchoServer, Pki, assert_echoes, exchange, serving


def _config(pki: Pki, **changes: object) -> TransportConfig:
    base: dict[str, object] = {"certfile": pki.server_cert, "keyfile": pki.server_key}
    base.update(changes)
    return TransportConfig(**base)  # type: ignore[arg-type]


def _mtls(pki: Pki, **changes: object) -> TransportConfig:
    return _config(pki, client_ca=pki.ca_file, require_client_cert=True, **changes)


@asynccontextmanager
async def tls_worker(config: TransportConfig) -> AsyncIterator[tuple[str, EchoServer]]:
    """An echo worker on tls://127.0.0.1:<free port>; yields its URL and what it saw."""
    listener = await listen("tls://127.0.0.1:0", config)
    port = listener.extra(SocketAttribute.local_port)
    async with serving(listener) as server:
        yield f"tls://127.0.0.1:{port}", server


async def _good_client_still_served(url: str, pki: Pki, **options: object) -> None:
    stream = await connect(url, ca=pki.ca_file, **options)
    await assert_echoes(stream, (100,))


@pytest.mark.anyio
async def test_tls_round_trip_small_and_8mib(pki: Pki) -> None:
    with anyio.fail_after(30):
        async with tls_worker(_config(pki)) as (url, server):
            stream = await connect(url, ca=pki.ca_file)
            assert peer_description(stream).startswith("tls 127.0.0.1:")
            await assert_echoes(stream)
        assert server.subjects == [None]
        assert server.descriptions[0].startswith("tls 127.0.0.1:")


@pytest.mark.anyio
async def test_a_cancelled_receive_leaves_the_stream_whole(pki: Pki) -> None:
    """A receive cancelled while it waits for bytes (a worker connection stopping its
    reader to drain) takes nothing from the socket: sends and receives go on. Before,
    the stream called itself broken and a draining worker's last reply was lost."""
    with anyio.fail_after(30):
        async with tls_worker(_config(pki)) as (url, _):
            stream = await connect(url, ca=pki.ca_file)
            assert await exchange(stream, b"before") == b"before"
            with anyio.move_on_after(0.2) as scope:
                await stream.receive()  # the echo server sends nothing unasked
            assert scope.cancelled_caught
            await assert_echoes(stream, (100, 70_000))


@pytest.mark.anyio
async def test_mutual_tls_round_trip_and_client_identity(pki: Pki) -> None:
    with anyio.fail_after(30):
        async with tls_worker(_mtls(pki)) as (url, server):
            stream = await connect(url, ca=pki.ca_file, cert=pki.client_cert, key=pki.client_key)
            # The client sees the worker's certificate, issued for localhost.
            assert peer_certificate_subject(stream) is not None
            await assert_echoes(stream)
        assert server.subjects[0] is not None
        assert server.subjects[0]["commonName"] == "alice"
        assert server.descriptions[0].startswith("tls CN=alice 127.0.0.1:")


@pytest.mark.anyio
async def test_ca_and_client_cert_as_pem_text(pki: Pki) -> None:
    client = pki.ca.issue_cert("bob@example.org", common_name="bob")
    with anyio.fail_after(20):
        async with tls_worker(_mtls(pki)) as (url, server):
            stream = await connect(
                url,
                ca=pki.ca.cert_pem.bytes().decode(),
                cert=client.cert_chain_pems[0].bytes(),
                key=client.private_key_pem.bytes().decode(),
            )
            await assert_echoes(stream, (10,))
        assert server.subjects[0] == {"commonName": "bob", "organizationName": "trustme"} or (
            server.subjects[0] is not None and server.subjects[0]["commonName"] == "bob"
        )


@pytest.mark.anyio
async def test_options_from_url_query(pki: Pki) -> None:
    with anyio.fail_after(20):
        async with tls_worker(_config(pki)) as (url, _):
            stream = await connect(f"{url}?ca={pki.ca_file}&server_hostname=localhost")
            await assert_echoes(stream, (10,))


@pytest.mark.anyio
async def test_tls13_floor_from_config(pki: Pki) -> None:
    with anyio.fail_after(20):
        async with tls_worker(_config(pki, min_version="1.3")) as (url, _):
            stream = await connect(url, ca=pki.ca_file)
            assert stream.extra(ssl_version_attr()) == "TLSv1.3"
            await stream.aclose()
            # A client capped at TLS 1.2 is refused with a clear reason.
            ctx = client_context(ca=pki.ca_file)
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises(HipConnectionError, match="TLS handshake with .* failed"):
                await connect(url, ssl_context=ctx)
            await _good_client_still_served(url, pki)


def ssl_version_attr() -> object:
    from anyio.streams.tls import TLSAttribute

    return TLSAttribute.tls_version


def _expired_pki(pki: Pki) -> trustme.LeafCert:
    now = datetime.datetime.now(datetime.UTC)
    return pki.ca.issue_cert(
        "localhost",
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )


@pytest.mark.anyio
async def test_untrusted_ca(pki: Pki) -> None:
    other = trustme.CA()
    with anyio.fail_after(20):
        async with tls_worker(_config(pki)) as (url, _):
            with pytest.raises(HipConnectionError) as info:
                await connect(url, ca=other.cert_pem.bytes())
            assert "certificate verify failed" in info.value.message
            assert "pass ca=" in info.value.message
            # The system trust store does not know trustme's CA either.
            with pytest.raises(HipConnectionError, match="certificate verify failed"):
                await connect(url)
            await _good_client_still_served(url, pki)


@pytest.mark.anyio
async def test_wrong_hostname(pki: Pki) -> None:
    with anyio.fail_after(20):
        async with tls_worker(_config(pki)) as (url, _):
            with pytest.raises(HipConnectionError) as info:
                await connect(url, ca=pki.ca_file, server_hostname="gpu99.example.org")
            assert "Hostname mismatch" in info.value.message
            assert "server_hostname=" in info.value.message
            await _good_client_still_served(url, pki)


@pytest.mark.anyio
async def test_expired_certificate(pki: Pki, tmp_path: object) -> None:
    expired = _expired_pki(pki)
    cert = pki.dir / "expired.pem"
    key = pki.dir / "expired.key"
    expired.cert_chain_pems[0].write_to_path(str(cert))
    expired.private_key_pem.write_to_path(str(key))
    with anyio.fail_after(20):
        async with tls_worker(TransportConfig(certfile=str(cert), keyfile=str(key))) as (url, _):
            with pytest.raises(HipConnectionError) as info:
                await connect(url, ca=pki.ca_file)
            assert "certificate has expired" in info.value.message
            assert "renewed" in info.value.message


@pytest.mark.anyio
async def test_missing_client_certificate_under_mutual_tls(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(20):
        async with tls_worker(_mtls(pki)) as (url, server):
            # TLS 1.3 delivers the worker's verdict after the client's side of the
            # handshake, so the error comes from connect() or from the first exchange.
            with (
                caplog.at_level(logging.WARNING, "hipr.transports.tls"),
                pytest.raises(HipConnectionError) as info,
            ):
                stream = await connect(url, ca=pki.ca_file)
                async with stream:
                    await stream.send(b"hello")
                    await stream.receive()
            assert "certificate required" in info.value.message
            assert "pass cert= and key=" in info.value.message
            if not isinstance(info.value, TransportFailedError):
                assert info.value.message.startswith("TLS handshake with")
            else:
                assert isinstance(info.value, anyio.BrokenResourceError)
            stream = await connect(url, ca=pki.ca_file, cert=pki.client_cert, key=pki.client_key)
            await assert_echoes(stream, (10,))
        assert server.connections == 1  # the refused client never reached the handler
        assert any("TLS handshake with 127.0.0.1:" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_client_certificate_from_another_ca(pki: Pki) -> None:
    stranger = trustme.CA().issue_cert("mallory@example.org", common_name="mallory")
    with anyio.fail_after(20):
        async with tls_worker(_mtls(pki)) as (url, server):
            with pytest.raises(HipConnectionError) as info:
                stream = await connect(
                    url,
                    ca=pki.ca_file,
                    cert=stranger.cert_chain_pems[0].bytes(),
                    key=stranger.private_key_pem.bytes(),
                )
                async with stream:
                    await stream.send(b"hello")
                    await stream.receive()
            assert "unknown ca" in info.value.message.lower()
            assert server.connections == 0


@pytest.mark.anyio
async def test_plaintext_client_on_tls_port(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(20):
        async with tls_worker(_config(pki)) as (url, server):
            port = url.rsplit(":", 1)[1]
            with caplog.at_level(logging.WARNING, "hipr.transports.tls"):
                async with await connect(f"tcp://127.0.0.1:{port}") as plain:
                    await plain.send(b"HIPR\x01\x00" + bytes(18))
                    # The worker answers with a TLS alert record (content type 21) and
                    # hangs up: no hang, and the bytes say "TLS" to whoever reads them.
                    received = bytearray()
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                        while True:
                            received += await plain.receive()
                    assert not received or received[0] == 0x15
            assert any("plaintext client" in r.getMessage() for r in caplog.records)
            await _good_client_still_served(url, pki)
            assert server.connections == 1


@pytest.mark.anyio
async def test_tls_client_on_plaintext_port(pki: Pki) -> None:
    with anyio.fail_after(20):
        listener = await listen("tcp://127.0.0.1:0")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener):
            # The echo server sends the ClientHello back: not a ServerHello.
            with pytest.raises(HipConnectionError, match="TLS handshake with .* failed"):
                await connect(f"tls://127.0.0.1:{port}", ca=pki.ca_file)


@pytest.mark.anyio
async def test_silent_client_is_dropped_after_handshake_timeout(pki: Pki) -> None:
    with anyio.fail_after(20):
        async with tls_worker(_config(pki, handshake_timeout=0.3)) as (url, _):
            port = url.rsplit(":", 1)[1]
            async with await connect(f"tcp://127.0.0.1:{port}") as silent:
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    with anyio.fail_after(5):
                        await silent.receive()
            await _good_client_still_served(url, pki)


@pytest.mark.anyio
async def test_refused_tls_port_message() -> None:
    with socket_free_port() as port, pytest.raises(HipConnectionError) as info:
        await connect(f"tls://127.0.0.1:{port}")
    assert info.value.message == (
        f"could not connect to tls://127.0.0.1:{port}: connection refused "
        "(is `hipr worker` running and listening there?)"
    )


class socket_free_port:
    def __enter__(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


def test_default_port() -> None:
    assert DEFAULT_PORT == 18516


def test_server_config_errors(pki: Pki) -> None:
    with pytest.raises(ValueError, match="needs a certificate"):
        server_context(TransportConfig())
    with pytest.raises(ValueError, match="require_client_cert needs client_ca"):
        server_context(_config(pki, require_client_cert=True))
    with pytest.raises(ValueError, match="cannot load the worker certificate"):
        server_context(TransportConfig(certfile=str(pki.dir / "nope.pem")))
    with pytest.raises(ValueError, match="min_version must be one of 1.2, 1.3"):
        server_context(_config(pki, min_version="1.0"))
    ctx = server_context(_config(pki))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    assert server_context(_mtls(pki)).verify_mode == ssl.CERT_REQUIRED


def test_client_context_defaults(pki: Pki) -> None:
    ctx = client_context()
    assert ctx.check_hostname
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(ValueError, match="without its cert="):
        client_context(key=pki.client_key)
    with pytest.raises(ValueError, match="cannot load the CA"):
        client_context(ca=str(pki.dir / "missing.pem"))
