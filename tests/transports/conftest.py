"""Shared helpers of the transport tests: an echo server, short socket paths, TLS keys."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, Listener

from hipr.transports import peer_certificate_subject, peer_description, peer_uid

#: the big payload of the round-trip tests: several socket buffers and TLS records
BIG = 8 * 1024 * 1024


@dataclass
class EchoServer:
    """What the echo handler saw of each client, for the peer-identity tests."""

    descriptions: list[str] = field(default_factory=list)
    uids: list[int | None] = field(default_factory=list)
    subjects: list[dict[str, str] | None] = field(default_factory=list)
    connections: int = 0

    async def handle(self, stream: ByteStream) -> None:
        """Echo until the client hangs up; a broken client ends only its own task."""
        self.connections += 1
        self.descriptions.append(peer_description(stream))
        self.uids.append(peer_uid(stream))
        self.subjects.append(peer_certificate_subject(stream))
        async with stream:
            try:
                while True:
                    await stream.send(await stream.receive())
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


@asynccontextmanager
async def serving(listener: Listener[ByteStream]) -> AsyncIterator[EchoServer]:
    """Serve ``listener`` with an echo handler for the duration of the block."""
    server = EchoServer()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, server.handle)
            try:
                yield server
            finally:
                tg.cancel_scope.cancel()
    finally:
        # After serve() has ended: closing under a running accept() is an error.
        with anyio.CancelScope(shield=True):
            await listener.aclose()


async def exchange(stream: ByteStream, payload: bytes) -> bytes:
    """Send ``payload`` while reading the echo (a big one would deadlock otherwise)."""
    received = bytearray()
    async with anyio.create_task_group() as tg:
        tg.start_soon(stream.send, payload)
        while len(received) < len(payload):
            received += await stream.receive()
    return bytes(received)


async def assert_echoes(stream: ByteStream, sizes: tuple[int, ...] = (1, 24, BIG)) -> None:
    """Round-trip payloads of ``sizes`` and close the stream."""
    async with stream:
        for size in sizes:
            payload = os.urandom(size)
            assert await exchange(stream, payload) == payload


@dataclass(frozen=True)
class Pki:
    """A throw-away CA, a worker certificate for localhost and a client certificate."""

    ca: Any  #: a trustme.CA
    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    dir: Path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates made by trustme, written to files as a worker's config names them."""
    import trustme  # only here: suites that reuse these fixtures may not need TLS at all

    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1", "::1")
    client = ca.issue_cert("alice@example.org", common_name="alice")
    paths = {
        "ca.pem": ca.cert_pem,
        "server.pem": server.cert_chain_pems[0],
        "server.key": server.private_key_pem,
        "client.pem": client.cert_chain_pems[0],
        "client.key": client.private_key_pem,
    }
    for name, blob in paths.items():
        blob.write_to_path(str(root / name))
    return Pki(
        ca=ca,
        ca_file=str(root / "ca.pem"),
        server_cert=str(root / "server.pem"),
        server_key=str(root / "server.key"),
        client_cert=str(root / "client.pem"),
        client_key=str(root / "client.key"),
        dir=root,
    )


@dataclass(frozen=True)
class SshServer:
    """A real OpenSSH server on loopback, with throw-away keys, for the ssh:// tests."""

    port: int
    user: str
    identity: str  #: the authorized user key
    wrong_identity: str  #: a key sshd does not know
    known_hosts: str  #: knows this server's host key
    ssh_config: str  #: empty: the tests must not depend on ~/.ssh/config
    dir: Path

    def url(self, tail: str = "") -> str:
        """``ssh://user@127.0.0.1:port`` followed by ``tail`` (a path or a query)."""
        return f"ssh://{self.user}@127.0.0.1:{self.port}{tail}"

    def options(self) -> dict[str, str]:
        """The connect options that make this server known and the user's key used."""
        return {
            "identity": self.identity,
            "known_hosts": self.known_hosts,
            "ssh_config": self.ssh_config,
        }


def _apt_install(package: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        subprocess.run(argv, check=True, env=env, timeout=600, capture_output=True)


def _find_or_install(binary: str, package: str) -> str:
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"`{binary}` is missing; install {package} (apt-get install {package})")
    try:
        _apt_install(package)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"`{binary}` is missing and `apt-get install {package}` failed: {exc}")
    found = shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not found:
        pytest.skip(f"`{binary}` is still missing after installing {package}")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def sshd() -> Iterator[SshServer]:
    """Start ``sshd -D -e`` on a free loopback port as the current user, for the session."""
    sshd_bin = _find_or_install("sshd", "openssh-server")
    _find_or_install("ssh", "openssh-client")
    keygen = _find_or_install("ssh-keygen", "openssh-client")
    root = Path(tempfile.mkdtemp(prefix="hipr-sshd-"))
    for name in ("host_key", "user_key", "wrong_key"):
        subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(root / name)],
            check=True,
            capture_output=True,
        )
    shutil.copy(root / "user_key.pub", root / "authorized_keys")
    port = _free_port()
    user = pwd.getpwuid(os.getuid()).pw_name
    (root / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {root / 'host_key'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "StrictModes no",
                "UsePAM no",
                "PidFile none",
                "PermitRootLogin yes",
                "AllowTcpForwarding yes",
                "AllowStreamLocalForwarding yes",
                "LogLevel VERBOSE",
                # Tests open many links at once; the default (10) would drop some.
                "MaxStartups 200",
                "MaxSessions 200",
                "",
            ]
        )
    )
    host_key = (root / "host_key.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    (root / "ssh_config").write_text("")
    if os.geteuid() == 0:
        # sshd running as root insists on its privilege-separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = open(root / "sshd.log", "wb")  # noqa: SIM115 - closed after the process ends
    proc = subprocess.Popen(
        [sshd_bin, "-D", "-e", "-f", str(root / "sshd_config")],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited: {(root / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"sshd did not start: {(root / 'sshd.log').read_text()}")
                time.sleep(0.05)
        yield SshServer(
            port=port,
            user=user,
            identity=str(root / "user_key"),
            wrong_identity=str(root / "wrong_key"),
            known_hosts=str(root / "known_hosts"),
            ssh_config=str(root / "ssh_config"),
            dir=root,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
