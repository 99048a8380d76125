"""ssh://: a real sshd on loopback, the worker on a Unix socket (or loopback TCP)."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketAttribute

from hipr.errors import HipConnectionError
from hipr.transports import (
    TransportFailedError,
    connect,
    listen,
    parse_url,
    peer_description,
    peer_uid,
)
from hipr.transports.ssh import SshStream, ssh_command
from tests.transports.conftest import SshServer, assert_echoes, serving


def _tunnel_dirs() -> set[Path]:
    """The private directories of ssh forwards that exist right now."""
    return set(Path(tempfile.gettempdir()).glob("hipr-ssh-*"))


@pytest.mark.anyio
async def test_echo_through_ssh_to_unix_socket(sshd: SshServer, short_tmp: Path) -> None:
    path = short_tmp / "worker.sock"
    tunnels_before = _tunnel_dirs()
    with anyio.fail_after(30):
        async with serving(await listen(f"unix://{path}")) as server:
            stream = await connect(sshd.url(str(path)), **sshd.options())
            # The private forward socket and its directory went as soon as we connected.
            assert _tunnel_dirs() <= tunnels_before
            assert isinstance(stream, SshStream)
            assert peer_description(stream) == (f"ssh {sshd.user}@127.0.0.1:{sshd.port} -> {path}")
            assert peer_uid(stream) is None  # the local socket's peer is ssh, not the worker
            await assert_echoes(stream)
            assert stream.process.returncode is not None  # closing ended ssh
        # sshd connected to the worker's socket as the ssh-authenticated user.
        assert server.uids == [os.getuid()]


@pytest.mark.anyio
async def test_echo_through_ssh_to_tcp_target(sshd: SshServer) -> None:
    with anyio.fail_after(30):
        listener = await listen("tcp://127.0.0.1:0")
        port = listener.extra(SocketAttribute.local_port)
        async with serving(listener) as server:
            stream = await connect(sshd.url(f"?target=127.0.0.1:{port}"), **sshd.options())
            await assert_echoes(stream, (1, 4096))
        assert server.connections == 1


@pytest.mark.anyio
async def test_options_from_url_query(sshd: SshServer, short_tmp: Path) -> None:
    path = short_tmp / "worker.sock"
    query = (
        f"?identity={sshd.identity}&known_hosts={sshd.known_hosts}"
        f"&ssh_config={sshd.ssh_config}&option=Compression=no&connect_timeout=5"
    )
    with anyio.fail_after(30):
        async with serving(await listen(f"unix://{path}")):
            stream = await connect(sshd.url(f"{path}{query}"))
            await assert_echoes(stream, (10,))


@pytest.mark.anyio
async def test_wrong_key_is_a_clear_auth_error(sshd: SshServer, short_tmp: Path) -> None:
    options = {**sshd.options(), "identity": sshd.wrong_identity}
    with anyio.fail_after(30), pytest.raises(HipConnectionError) as info:
        await connect(sshd.url(f"{short_tmp}/worker.sock"), **options)
    assert "Permission denied (publickey" in info.value.message
    assert "check identity=" in info.value.message


@pytest.mark.anyio
async def test_unknown_host_key_is_a_clear_error(sshd: SshServer, short_tmp: Path) -> None:
    empty = short_tmp / "known_hosts"
    empty.write_text("")
    options = {**sshd.options(), "known_hosts": str(empty)}
    with anyio.fail_after(30), pytest.raises(HipConnectionError) as info:
        await connect(sshd.url(f"{short_tmp}/worker.sock"), **options)
    assert "Host key verification failed" in info.value.message


@pytest.mark.anyio
async def test_missing_ssh_binary(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(HipConnectionError) as info:
        await connect(f"ssh://gpu01{short_tmp}/worker.sock")
    assert info.value.message == ("ssh transport needs the OpenSSH client: `ssh` not found on PATH")


@pytest.mark.anyio
async def test_sshd_not_running(sshd: SshServer) -> None:
    from tests.transports.conftest import _free_port

    port = _free_port()
    with anyio.fail_after(30), pytest.raises(HipConnectionError) as info:
        await connect(f"ssh://127.0.0.1:{port}/w.sock", **sshd.options())
    assert "Connection refused" in info.value.message
    assert "is sshd running" in info.value.message


@pytest.mark.anyio
async def test_killed_ssh_is_end_of_stream(sshd: SshServer, short_tmp: Path) -> None:
    path = short_tmp / "worker.sock"
    with anyio.fail_after(30):
        async with serving(await listen(f"unix://{path}")):
            stream = await connect(sshd.url(str(path)), **sshd.options())
            assert isinstance(stream, SshStream)
            async with stream:
                await stream.send(b"ping")
                assert await stream.receive() == b"ping"
                stream.process.send_signal(signal.SIGKILL)
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await stream.receive()


@pytest.mark.anyio
async def test_no_worker_at_target_breaks_the_stream(sshd: SshServer, short_tmp: Path) -> None:
    # ssh itself connects fine; the remote end refuses the forward. That surfaces on the
    # first exchange as a dropped transport carrying ssh's reason.
    with anyio.fail_after(30):
        stream = await connect(sshd.url(f"{short_tmp}/nobody.sock"), **sshd.options())
        async with stream:
            with pytest.raises(TransportFailedError) as info:
                await stream.send(b"ping")
                await stream.receive()
    assert isinstance(info.value, anyio.BrokenResourceError)
    assert "open failed" in info.value.message
    assert "is `hipr worker` listening" in info.value.message


@pytest.mark.anyio
async def test_listen_is_refused() -> None:
    with pytest.raises(ValueError, match="ssh:// is client-only"):
        await listen("ssh://gpu01/run/hipr/worker.sock")


@pytest.mark.anyio
async def test_bad_urls() -> None:
    before = _tunnel_dirs()
    with pytest.raises(ValueError, match="needs a host"):
        await connect("ssh:///run/w.sock")
    with pytest.raises(ValueError, match="not both"):
        await connect("ssh://gpu01/run/w.sock?target=127.0.0.1:1")
    with pytest.raises(ValueError, match="must be host:port"):
        await connect("ssh://gpu01?target=nonsense")
    with pytest.raises(ValueError, match="must look like Name=value"):
        await connect("ssh://gpu01/run/w.sock", options=["BatchMode"])
    assert _tunnel_dirs() <= before  # nothing left behind by a refused URL


def test_command_line() -> None:
    url = parse_url("ssh://me@gpu01:2222/run/hipr/worker.sock")
    argv = ssh_command(
        "/usr/bin/ssh",
        url,
        "/tmp/hipr-ssh-x/s",
        "/run/hipr/worker.sock",
        identity="/k",
        ssh_config="/cfg",
        known_hosts="/kh",
        options=["ProxyJump=bastion"],
        connect_timeout=7.5,
    )
    assert argv[:5] == ["/usr/bin/ssh", "-N", "-T", "-e", "none"]
    text = " ".join(argv)
    assert "-F /cfg" in text
    assert "-i /k -o IdentitiesOnly=yes" in text
    assert "-o UserKnownHostsFile=/kh" in text
    assert "-o ConnectTimeout=8" in text
    assert "-o BatchMode=yes" in text
    # The caller's options come before the defaults, so they win (ssh keeps the first).
    assert text.index("ProxyJump=bastion") < text.index("BatchMode=yes")
    assert argv[-6:] == [
        "-l", "me", "-L", "/tmp/hipr-ssh-x/s:/run/hipr/worker.sock", "--", "gpu01"
    ]  # fmt: skip
    assert argv[argv.index("-p") + 1] == "2222"


def test_command_line_ipv6_target() -> None:
    argv = ssh_command("ssh", parse_url("ssh://[::1]?target=[::1]:18515"), "/s", "[::1]:18515")
    assert argv[-4:] == ["-L", "/s:[::1]:18515", "--", "::1"]
