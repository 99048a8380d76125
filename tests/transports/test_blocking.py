"""connect_blocking: every built-in transport against its own async listener.

The blocking client runs in a worker thread (``anyio.to_thread``) while the listener
serves on the test's event loop, so each test runs under trio and asyncio like the rest.
Error cases check that the blocking path says exactly what the async path says.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from anyio.abc import SocketAttribute

from hipr.errors import HipConnectionError
from hipr.transports import (
    BlockingStream,
    TransportConfig,
    TransportFailedError,
    blocking_transport_for,
    connect,
    connect_blocking,
    listen,
    stream_failure,
)
from hipr.transports.base import format_host_port
from hipr.transports.ssh import SshSocket
from hipr.transports.tcp import TcpTransport
from tests.transports.conftest import EchoServer, Pki, SshServer, serving
from tests.transports.test_registry import _with_entry_points
from tests.transports.test_tcp_unix import _free_port, _has_ipv6

_T = TypeVar("_T")

#: bounds every blocking call of a test: a hang fails the test instead of stalling it
_IO_TIMEOUT = 20.0

#: what the single-threaded exchange sends before reading the echo back
_CHUNK = 64 * 1024


@asynccontextmanager
async def tcp_echo(host: str = "127.0.0.1") -> AsyncIterator[tuple[str, EchoServer]]:
    """An async echo worker on a free TCP port; yields its URL and what it saw."""
    listener = await listen(f"tcp://{format_host_port(host, 0)}")
    port = listener.extra(SocketAttribute.local_port)
    async with serving(listener) as server:
        yield f"tcp://{format_host_port(host, port)}", server


async def in_thread(func: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run blocking ``func`` off the event loop, which keeps serving meanwhile."""
    return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))


def _receive_exactly(stream: BlockingStream, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = stream.recv_into(view[got:])
        if n == 0:
            raise EOFError(f"end of stream after {got} of {len(view)} bytes")
        got += n


def exchange(stream: BlockingStream, payload: bytes) -> bytes:
    """Send ``payload`` a chunk at a time, reading each chunk's echo before the next.

    One thread only: an ``ssl.SSLSocket`` must not be read and written at the same time
    from two threads (OpenSSL's objects are not thread-safe, and ``ssl`` adds no lock).
    """
    received = bytearray(len(payload))
    view = memoryview(received)
    for offset in range(0, len(payload), _CHUNK):
        piece = payload[offset : offset + _CHUNK]
        stream.sendall(piece)
        _receive_exactly(stream, view[offset : offset + len(piece)])
    return bytes(received)


def exchange_concurrently(stream: BlockingStream, payload: bytes) -> bytes:
    """Send from a second thread while reading the echo: fine on a plain socket."""
    received = bytearray(len(payload))
    sender = threading.Thread(target=stream.sendall, args=(payload,))
    sender.start()
    try:
        _receive_exactly(stream, memoryview(received))
    finally:
        sender.join(_IO_TIMEOUT)
    return bytes(received)


def assert_echoes(stream: BlockingStream, sizes: tuple[int, ...] = (1, 24, 1 << 20)) -> None:
    """Round-trip payloads of ``sizes`` both ways, then close the stream."""
    try:
        stream.settimeout(_IO_TIMEOUT)
        for size in sizes:
            payload = os.urandom(size)
            assert exchange(stream, payload) == payload
    finally:
        stream.close()


def echo_through(url: str, sizes: tuple[int, ...] = (1, 24, 1 << 20), **options: Any) -> str:
    """Connect blocking, round-trip, close; the stream's description."""
    stream = connect_blocking(url, **options)
    assert isinstance(stream, BlockingStream)
    description = stream.description
    assert_echoes(stream, sizes)
    return description


async def both_messages(url: str, **options: Any) -> tuple[str, str]:
    """The ``HipConnectionError`` messages of the async and the blocking connect."""
    with pytest.raises(HipConnectionError) as from_async:
        stream = await connect(url, **options)
        await stream.aclose()
    with pytest.raises(HipConnectionError) as from_blocking:
        await in_thread(lambda: connect_blocking(url, **options).close())
    return from_async.value.message, from_blocking.value.message


# --- tcp:// ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_tcp_round_trip() -> None:
    with anyio.fail_after(30):
        async with tcp_echo() as (url, server):
            assert await in_thread(echo_through, url) == url
        assert server.connections == 1


@pytest.mark.anyio
async def test_tcp_socket_is_blocking_with_nagle_off() -> None:
    with anyio.fail_after(30):
        async with tcp_echo() as (url, _):
            stream = await in_thread(connect_blocking, url)
            try:
                assert isinstance(stream, socket.socket)
                assert stream.gettimeout() is None
                assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                # The hot path is the C socket's own methods, not a Python wrapper.
                assert type(stream).sendall is socket.socket.sendall
                assert type(stream).recv_into is socket.socket.recv_into
            finally:
                stream.close()


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["tcp", "unix"])
async def test_plain_socket_sends_and_receives_from_two_threads(
    scheme: str, short_tmp: Path
) -> None:
    def run(url: str) -> None:
        stream = connect_blocking(url)
        try:
            stream.settimeout(_IO_TIMEOUT)
            payload = os.urandom(8 << 20)  # several socket buffers: both sides block
            assert exchange_concurrently(stream, payload) == payload
        finally:
            stream.close()

    with anyio.fail_after(30):
        if scheme == "tcp":
            async with tcp_echo() as (url, _):
                await in_thread(run, url)
        else:
            async with serving(await listen(f"unix://{short_tmp}/w.sock")):
                await in_thread(run, f"unix://{short_tmp}/w.sock")


@pytest.mark.anyio
@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 loopback here")
async def test_tcp_ipv6() -> None:
    with anyio.fail_after(30):
        async with tcp_echo("::1") as (url, _):
            assert await in_thread(echo_through, url, (1, 4096)) == url


@pytest.mark.anyio
async def test_tcp_refused_and_unresolvable_say_what_async_says() -> None:
    with anyio.fail_after(30):
        port = _free_port()
        from_async, from_blocking = await both_messages(f"tcp://127.0.0.1:{port}")
        assert from_blocking == from_async
        assert "connection refused" in from_blocking
        from_async, from_blocking = await both_messages("tcp://no-such-host.invalid:1")
        assert from_blocking == from_async
        assert "cannot resolve the host name" in from_blocking


@contextmanager
def full_backlog() -> Iterator[int]:
    """A TCP port whose accept queue is full, so a new connect's SYN goes unanswered."""
    server = socket.socket()
    fillers: list[socket.socket] = []
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        address = server.getsockname()
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(address)
            fillers.append(filler)
        time.sleep(0.2)
        yield int(address[1])
    finally:
        for filler in fillers:
            filler.close()
        server.close()


@pytest.mark.anyio
async def test_tcp_connect_timeout() -> None:
    with anyio.fail_after(30), full_backlog() as port:
        url = f"tcp://127.0.0.1:{port}"
        start = time.monotonic()
        from_async, from_blocking = await both_messages(url, connect_timeout=0.5)
        assert time.monotonic() - start < 5
    assert from_blocking == from_async
    assert "timed out after 0.5 s (is `hipr worker` running" in from_blocking


# --- unix:// --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_unix_round_trip(short_tmp: Path) -> None:
    path = short_tmp / "worker.sock"
    with anyio.fail_after(30):
        async with serving(await listen(f"unix://{path}")) as server:
            assert await in_thread(echo_through, f"unix://{path}") == f"unix://{path}"
        assert server.uids == [os.getuid()]


@pytest.mark.anyio
async def test_unix_missing_and_refused_say_what_async_says(short_tmp: Path) -> None:
    with anyio.fail_after(30):
        from_async, from_blocking = await both_messages(f"unix://{short_tmp}/nobody.sock")
        assert from_blocking == from_async
        assert "no such socket" in from_blocking
        # A socket file nobody listens on (a worker that died): refused.
        stale = short_tmp / "stale.sock"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(stale))
            from_async, from_blocking = await both_messages(f"unix://{stale}")
        assert from_blocking == from_async
        assert "connection refused" in from_blocking


# --- tls:// ---------------------------------------------------------------------------


async def _tls_listener(pki: Pki, **changes: Any) -> tuple[Any, str]:
    config = TransportConfig(certfile=pki.server_cert, keyfile=pki.server_key, **changes)
    listener = await listen("tls://127.0.0.1:0", config)
    return listener, f"tls://127.0.0.1:{listener.extra(SocketAttribute.local_port)}"


@pytest.mark.anyio
async def test_tls_round_trip(pki: Pki) -> None:
    with anyio.fail_after(30):
        listener, url = await _tls_listener(pki)
        async with serving(listener):
            assert await in_thread(echo_through, url, ca=pki.ca_file) == url


@pytest.mark.anyio
async def test_mutual_tls_round_trip(pki: Pki) -> None:
    with anyio.fail_after(30):
        listener, url = await _tls_listener(pki, client_ca=pki.ca_file, require_client_cert=True)
        async with serving(listener) as server:
            options = {"ca": pki.ca_file, "cert": pki.client_cert, "key": pki.client_key}
            await in_thread(echo_through, url, (1, 4096), **options)
        [subject] = server.subjects
        assert subject is not None
        assert subject["commonName"] == "alice"


@pytest.mark.anyio
async def test_tls_verification_failures_say_what_async_says(pki: Pki) -> None:
    import trustme

    with anyio.fail_after(30):
        listener, url = await _tls_listener(pki)
        async with serving(listener):
            other_ca = trustme.CA().cert_pem.bytes()
            from_async, from_blocking = await both_messages(url, ca=other_ca)
            assert from_blocking == from_async
            assert "certificate verify failed" in from_blocking
            assert "pass ca=" in from_blocking
            from_async, from_blocking = await both_messages(
                url, ca=pki.ca_file, server_hostname="gpu99.example"
            )
            assert from_blocking == from_async
            assert "Hostname mismatch" in from_blocking


@pytest.mark.anyio
async def test_tls_client_on_plaintext_port(pki: Pki) -> None:
    with anyio.fail_after(30):
        async with tcp_echo() as (url, _):
            tls_url = url.replace("tcp://", "tls://")
            from_async, from_blocking = await both_messages(tls_url, ca=pki.ca_file)
        assert from_blocking == from_async
        assert from_blocking.startswith(f"TLS handshake with {tls_url} failed: ")


@pytest.mark.anyio
async def test_tls_handshake_timeout(pki: Pki) -> None:
    # The kernel completes the TCP handshake; nobody ever answers the ClientHello.
    with anyio.fail_after(30), socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"tls://127.0.0.1:{silent.getsockname()[1]}"
        from_async, from_blocking = await both_messages(url, ca=pki.ca_file, connect_timeout=0.5)
        assert from_blocking == from_async
        assert from_blocking == (
            f"could not connect to {url}: the TLS handshake timed out after 0.5 s "
            "(is the worker listening with TLS there?)"
        )


@pytest.mark.anyio
async def test_missing_client_certificate_surfaces_as_transport_failure(pki: Pki) -> None:
    def first_exchange(url: str) -> TransportFailedError | None:
        stream = connect_blocking(url, ca=pki.ca_file, min_version="1.3")
        try:
            stream.settimeout(_IO_TIMEOUT)
            stream.sendall(b"ping")
            # TLS 1.3: the worker checks the client certificate after the client's
            # handshake is done, so the refusal arrives as an alert on the first read.
            try:
                stream.recv_into(bytearray(16))
            except OSError as exc:
                failure = stream_failure(stream, exc)
                return failure if isinstance(failure, TransportFailedError) else None
            return None
        finally:
            stream.close()

    with anyio.fail_after(30):
        listener, url = await _tls_listener(pki, client_ca=pki.ca_file, require_client_cert=True)
        async with serving(listener):
            failure = await in_thread(first_exchange, url)
    assert failure is not None
    assert failure.message.startswith(f"TLS connection with {url} failed: ")
    assert "certificate required" in failure.message


# --- ssh:// ---------------------------------------------------------------------------


def _tunnel_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("hipr-ssh-*"))


def _is_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


@pytest.mark.anyio
async def test_ssh_round_trip_and_close_ends_ssh(sshd: SshServer, short_tmp: Path) -> None:
    path = short_tmp / "worker.sock"
    before = _tunnel_dirs()

    def run() -> SshSocket:
        stream = connect_blocking(sshd.url(str(path)), **sshd.options())
        assert isinstance(stream, SshSocket)
        # The private forward socket and its directory went as soon as we connected.
        assert _tunnel_dirs() <= before
        assert stream.description == f"ssh {sshd.user}@127.0.0.1:{sshd.port} -> {path}"
        assert stream.process is not None
        assert stream.process.poll() is None
        assert_echoes(stream)
        return stream

    with anyio.fail_after(30):
        async with serving(await listen(f"unix://{path}")) as server:
            stream = await in_thread(run)
        assert stream.process is not None
        assert stream.process.returncode is not None  # close() ended and reaped ssh
        assert server.uids == [os.getuid()]


@pytest.mark.anyio
async def test_ssh_tunnel_outlives_the_thread_that_opened_it(
    sshd: SshServer, short_tmp: Path
) -> None:
    # PR_SET_PDEATHSIG fires when the forking *thread* ends; the tunnel must not.
    path = short_tmp / "worker.sock"
    opened: list[BlockingStream] = []

    def open_and_exit() -> None:
        opened.append(connect_blocking(sshd.url(str(path)), **sshd.options()))

    def open_in_short_lived_thread() -> None:
        thread = threading.Thread(target=open_and_exit)
        thread.start()
        thread.join(_IO_TIMEOUT)
        time.sleep(0.3)
        assert_echoes(opened[0], (1, 4096))

    with anyio.fail_after(30):
        async with serving(await listen(f"unix://{path}")):
            await in_thread(open_in_short_lived_thread)


@pytest.mark.anyio
async def test_ssh_failures_say_what_async_says(sshd: SshServer, short_tmp: Path) -> None:
    with anyio.fail_after(60):
        options = {**sshd.options(), "identity": sshd.wrong_identity}
        from_async, from_blocking = await both_messages(
            sshd.url(f"{short_tmp}/worker.sock"), **options
        )
        assert from_blocking == from_async
        assert "Permission denied (publickey" in from_blocking
        assert "check identity=" in from_blocking
        port = _free_port()
        from_async, from_blocking = await both_messages(
            f"ssh://127.0.0.1:{port}/w.sock", **sshd.options()
        )
        assert from_blocking == from_async
        assert "Connection refused" in from_blocking
        assert "is sshd running" in from_blocking


@pytest.mark.anyio
async def test_ssh_no_worker_at_target(sshd: SshServer, short_tmp: Path) -> None:
    def first_exchange() -> str:
        stream = connect_blocking(sshd.url(f"{short_tmp}/nobody.sock"), **sshd.options())
        try:
            stream.settimeout(_IO_TIMEOUT)
            error: OSError | None = None
            try:
                stream.sendall(b"ping")
                assert stream.recv_into(bytearray(16)) == 0
            except OSError as exc:
                error = exc
            deadline = time.monotonic() + 5
            # ssh reports the refused forward on stderr around when it closes the socket.
            while (failure := stream_failure(stream, error)) is None:
                assert time.monotonic() < deadline, "ssh gave no reason"
                time.sleep(0.05)
            assert isinstance(failure, TransportFailedError)
            return failure.message
        finally:
            stream.close()

    with anyio.fail_after(30):
        message = await in_thread(first_exchange)
    assert "open failed" in message
    assert "is `hipr worker` listening" in message


_CHILD = """
import sys, time
import anyio
from hipr.transports import connect, connect_blocking

url, mode = sys.argv[1], sys.argv[2]
options = dict(arg.split("=", 1) for arg in sys.argv[3:])
if mode == "blocking":
    stream = connect_blocking(url, **options)
    print(stream.process.pid, flush=True)
    time.sleep(60)
else:
    async def main():
        stream = await connect(url, **options)
        print(stream.process.pid, flush=True)
        await anyio.sleep(60)
    anyio.run(main)
"""


@pytest.mark.parametrize("mode", ["blocking", "async"])
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ssh_dies_with_a_killed_client(sshd: SshServer, short_tmp: Path, mode: str) -> None:
    # A worker socket is not needed: the tunnel is up once ssh has bound its local end.
    args = [f"{k}={v}" for k, v in sshd.options().items()]
    client = subprocess.Popen(
        [sys.executable, "-c", _CHILD, sshd.url(f"{short_tmp}/w.sock"), mode, *args],
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
    )
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        assert line.strip(), "the client printed no ssh pid"
        ssh_pid = int(line)
        assert not _is_gone(ssh_pid)
        client.send_signal(signal.SIGKILL)
        client.wait(10)
        deadline = time.monotonic() + 10
        while not _is_gone(ssh_pid):
            assert time.monotonic() < deadline, "ssh outlived its client"
            time.sleep(0.05)
    finally:
        client.kill()
        client.wait()


# --- the registry ---------------------------------------------------------------------


def test_blocking_transport_for_the_builtins() -> None:
    assert isinstance(blocking_transport_for("tcp://127.0.0.1:1"), TcpTransport)
    for url in ("unix:///run/w.sock", "tls://gpu01", "ssh://gpu01/run/w.sock"):
        assert blocking_transport_for(url) is not None


def test_third_party_without_blocking_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_entry_points(monkeypatch, loop="tests.transports.test_registry:LoopbackTransport")
    assert blocking_transport_for("loop://anywhere") is None
    with pytest.raises(NotImplementedError, match="transport 'loop' has no blocking connect"):
        connect_blocking("loop://anywhere")


def test_bad_options_are_refused_as_in_connect() -> None:
    with pytest.raises(ValueError, match="does not take option"):
        connect_blocking("tcp://127.0.0.1:1", bogus=1)
    with pytest.raises(ValueError, match="take no path"):
        connect_blocking("tcp://127.0.0.1:1/run/w.sock")
    with pytest.raises(ValueError, match="needs a host"):
        connect_blocking("ssh:///run/w.sock")
