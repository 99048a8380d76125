"""tcp:// and unix://: round trips, listener housekeeping, and messages that say what to do."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketAttribute

from hipr.errors import HipConnectionError
from hipr.transports import (
    TransportConfig,
    connect,
    listen,
    listen_many,
    peer_description,
)
from tests.transports.conftest import assert_echoes, exchange, serving


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.anyio
async def test_tcp_round_trip_small_and_8mib() -> None:
    with anyio.fail_after(20):
        listener = await listen("tcp://127.0.0.1:0")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener) as server:
            stream = await connect(f"tcp://127.0.0.1:{port}")
            assert peer_description(stream) == f"tcp 127.0.0.1:{port}"
            await assert_echoes(stream)
        assert server.descriptions[0].startswith("tcp 127.0.0.1:")
        assert server.uids == [None]
        assert server.subjects == [None]


@pytest.mark.anyio
async def test_tcp_nodelay_on_both_ends() -> None:
    with anyio.fail_after(10):
        listener = await listen("tcp://127.0.0.1:0")
        port = listener.extra(SocketAttribute.local_port)
        accepted = anyio.Event()
        nodelay: list[int] = []

        async def handler(stream: anyio.abc.ByteStream) -> None:
            sock = stream.extra(SocketAttribute.raw_socket)
            nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            accepted.set()
            await stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handler)
            async with await connect(f"tcp://127.0.0.1:{port}") as stream:
                sock = stream.extra(SocketAttribute.raw_socket)
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                await accepted.wait()
            tg.cancel_scope.cancel()
        await listener.aclose()
        assert nodelay and nodelay[0]


@pytest.mark.anyio
async def test_accepted_tcp_stream_names_both_ports() -> None:
    """Whichever stream class the loop gets (the loop's transport on asyncio, the
    non-blocking socket on trio), an accepted TCP stream gives both ends' ports."""
    with anyio.fail_after(10):
        listener = await listen("tcp://127.0.0.1:0")
        port = listener.extra(SocketAttribute.local_port)
        seen: list[tuple[int, int, str]] = []
        accepted = anyio.Event()

        async def handler(stream: anyio.abc.ByteStream) -> None:
            seen.append(
                (
                    stream.extra(SocketAttribute.local_port),
                    stream.extra(SocketAttribute.remote_port),
                    stream.extra(SocketAttribute.remote_address)[0],
                )
            )
            accepted.set()
            await stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handler)
            async with await connect(f"tcp://127.0.0.1:{port}") as stream:
                await accepted.wait()
                client_port = stream.extra(SocketAttribute.local_port)
            tg.cancel_scope.cancel()
        await listener.aclose()
        assert seen == [(port, client_port, "127.0.0.1")]


@pytest.mark.anyio
@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 loopback here")
async def test_tcp_ipv6() -> None:
    with anyio.fail_after(10):
        listener = await listen("tcp://[::1]:0")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener) as server:
            stream = await connect(f"tcp://[::1]:{port}")
            await assert_echoes(stream, (10,))
        assert server.descriptions[0].startswith("tcp [::1]:")


@pytest.mark.anyio
async def test_tcp_host_with_several_addresses_listens_on_each_with_one_port() -> None:
    """``localhost`` may resolve to 127.0.0.1 and ::1: one socket each, one port for all
    (port 0 included), and a client reaches the worker on every one of them."""
    # As the listener resolves it (AI_ADDRCONFIG leaves out families not configured).
    flags = socket.AI_PASSIVE | socket.AI_ADDRCONFIG
    infos = socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM, flags=flags)
    addresses = {info[4][0] for info in infos}
    with anyio.fail_after(20):
        listener = await listen("tcp://localhost:0")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener):
            for address in sorted(addresses):
                host = f"[{address}]" if ":" in address else address
                stream = await connect(f"tcp://{host}:{port}")
                await assert_echoes(stream, (10,))


@pytest.mark.anyio
async def test_tcp_refused_says_what_to_do() -> None:
    port = _free_port()
    with anyio.fail_after(10), pytest.raises(HipConnectionError) as info:
        await connect(f"tcp://127.0.0.1:{port}")
    assert info.value.message == (
        f"could not connect to tcp://127.0.0.1:{port}: connection refused "
        "(is `hipr worker` running and listening there?)"
    )


@pytest.mark.anyio
async def test_tcp_default_port_in_message(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    monkeypatch.setattr("hipr.transports.tcp.DEFAULT_PORT", port)
    with anyio.fail_after(10), pytest.raises(HipConnectionError, match=f"tcp://127.0.0.1:{port}:"):
        await connect("tcp://")


@pytest.mark.anyio
async def test_tcp_unresolvable_host() -> None:
    with anyio.fail_after(20), pytest.raises(HipConnectionError, match="cannot resolve"):
        await connect("tcp://no-such-host.invalid:18515")


@pytest.mark.anyio
async def test_tcp_port_in_use_is_clear() -> None:
    listener = await listen("tcp://127.0.0.1:0")
    port = listener.extra(SocketAttribute.local_port)
    try:
        with pytest.raises(OSError, match="already listening") as info:
            await listen(f"tcp://127.0.0.1:{port}")
        assert info.value.errno == errno.EADDRINUSE
    finally:
        await listener.aclose()


@pytest.mark.anyio
async def test_tcp_url_with_path_is_refused() -> None:
    with pytest.raises(ValueError, match="take no path"):
        await connect("tcp://127.0.0.1:1/run/x.sock")


@pytest.mark.anyio
async def test_unix_round_trip_and_peer_uid(short_tmp: Path) -> None:
    path = short_tmp / "sub" / "dir" / "w.sock"  # parents are created
    with anyio.fail_after(20):
        listener = await listen(f"unix://{path}")
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
        async with serving(listener) as server:
            stream = await connect(f"unix://{path}")
            await assert_echoes(stream)
        assert not path.exists()  # removed on close
        assert server.uids == [os.getuid()]
        assert server.descriptions == [f"unix uid={os.getuid()} pid={os.getpid()}"]


def _asked_send_buffer() -> int:
    """What the kernel gives a Unix socket that asks for hipr's send buffer (it doubles
    the ask and caps it at twice net.core.wmem_max)."""
    from hipr.transports.unix import size_send_buffer

    with socket.socket(socket.AF_UNIX) as sock:
        size_send_buffer(sock)
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))


@pytest.mark.anyio
async def test_unix_send_buffer_on_both_ends(short_tmp: Path) -> None:
    """Bulk copies need room for more than the kernel's default in flight: both ends,
    and the sync client's blocking socket, ask for hipr's send buffer."""
    from hipr.transports import connect_blocking

    expected = _asked_send_buffer()
    with anyio.fail_after(10):
        listener = await listen(f"unix://{short_tmp}/w.sock")
        sizes: list[int] = []
        accepted = anyio.Event()

        async def handler(stream: anyio.abc.ByteStream) -> None:
            sock = stream.extra(SocketAttribute.raw_socket)
            sizes.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
            accepted.set()
            await stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, handler)
            async with await connect(f"unix://{short_tmp}/w.sock") as stream:
                sock = stream.extra(SocketAttribute.raw_socket)
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == expected
                await accepted.wait()
            blocking = connect_blocking(f"unix://{short_tmp}/w.sock")
            try:
                assert blocking.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == expected
            finally:
                blocking.close()
            tg.cancel_scope.cancel()
        await listener.aclose()
        assert sizes and sizes[0] == expected


@pytest.mark.anyio
async def test_unix_socket_mode_from_config(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    listener = await listen(f"unix://{path}", TransportConfig(unix_socket_mode=0o600))
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        await listener.aclose()


@pytest.mark.anyio
async def test_unix_stale_socket_is_replaced(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # a worker that died: the file stays, nobody listens
    assert stat.S_ISSOCK(path.lstat().st_mode)
    with anyio.fail_after(10):
        listener = await listen(f"unix://{path}")
        async with serving(listener):
            await assert_echoes(await connect(f"unix://{path}"), (5,))


@pytest.mark.anyio
async def test_unix_regular_file_is_not_removed(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    path.write_text("precious")
    with pytest.raises(FileExistsError, match="is not a socket; refusing to remove it"):
        await listen(f"unix://{path}")
    assert path.read_text() == "precious"


@pytest.mark.anyio
async def test_unix_live_socket_is_not_stolen(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    with anyio.fail_after(10):
        first = await listen(f"unix://{path}")
        async with serving(first):
            with pytest.raises(OSError, match="already listening there") as info:
                await listen(f"unix://{path}")
            assert info.value.errno == errno.EADDRINUSE
            await assert_echoes(await connect(f"unix://{path}"), (5,))


@pytest.mark.anyio
async def test_unix_close_leaves_a_newer_socket_alone(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    old = await listen(f"unix://{path}")
    path.unlink()  # e.g. an operator cleaned up, and a new worker took the path
    new = await listen(f"unix://{path}")
    await old.aclose()
    assert path.exists()
    await new.aclose()
    assert not path.exists()


@pytest.mark.anyio
async def test_unix_missing_socket_says_what_to_do(short_tmp: Path) -> None:
    with anyio.fail_after(5), pytest.raises(HipConnectionError) as info:
        await connect(f"unix://{short_tmp}/none.sock")
    assert info.value.message == (
        f"could not connect to unix://{short_tmp}/none.sock: no such socket "
        "(is `hipr worker` running and listening there?)"
    )


@pytest.mark.anyio
async def test_unix_stale_socket_refuses(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()
    with anyio.fail_after(5), pytest.raises(HipConnectionError, match="connection refused"):
        await connect(f"unix://{path}")


@pytest.mark.parametrize("url", ["unix://run/hipr/w.sock", "unix://"])
@pytest.mark.anyio
async def test_unix_needs_absolute_path(url: str) -> None:
    with pytest.raises(ValueError, match="absolute path"):
        await connect(url)


@pytest.mark.anyio
async def test_listen_many_tcp_and_unix(short_tmp: Path) -> None:
    port = _free_port()
    path = short_tmp / "w.sock"
    with anyio.fail_after(20):
        listener = await listen_many([f"tcp://127.0.0.1:{port}", f"unix://{path}"])
        async with (
            serving(listener) as server,
            await connect(f"tcp://127.0.0.1:{port}") as a,
            await connect(f"unix://{path}") as b,
        ):
            assert await exchange(a, b"over tcp") == b"over tcp"
            assert await exchange(b, b"over unix") == b"over unix"
        assert server.connections == 2
        assert sorted(d.split()[0] for d in server.descriptions) == ["tcp", "unix"]
        assert not path.exists()


@pytest.mark.anyio
async def test_listen_many_is_all_or_nothing(short_tmp: Path) -> None:
    path = short_tmp / "w.sock"
    busy = await listen("tcp://127.0.0.1:0")
    port = busy.extra(SocketAttribute.local_port)
    try:
        with pytest.raises(OSError, match="already listening"):
            await listen_many([f"unix://{path}", f"tcp://127.0.0.1:{port}"])
        assert not path.exists()  # the unix listener that did open was closed again
    finally:
        await busy.aclose()
