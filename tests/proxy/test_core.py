"""The proxy's client core over every link it serves, under ASan/UBSan: tls:// with
certificates made by trustme (the CA from HIPR_TLS_CA or the URL, a refused certificate
and a wrong host name said clearly), ssh:// through a real sshd (the transport tests'
fixture), a link cut under a stream of fire-and-forget launches and copies (resumed with
every launch run exactly once and every copy landed), and threads and fork."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hipr.proxy.build import HIP_LIBRARY
from tests.proxy.conftest import stop_worker
from tests.proxy.sanitized import (
    SANITIZED_FLAGS,
    SANITIZER_ENV,
    assert_sanitizer_clean,
    cc,
    linked_to,
)
from tests.transports.conftest import Pki, SshServer, pki, sshd  # noqa: F401 - fixtures

C_DIR = Path(__file__).resolve().parent / "c"


@dataclass(frozen=True)
class Program:
    """core_check.c built against sanitized proxy libraries."""

    path: Path

    def run(
        self, url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 90
    ) -> subprocess.CompletedProcess[str]:
        full = dict(os.environ, HIPR_URL=url, **SANITIZER_ENV, **(env or {}))
        for name in ("HIPR_TOKEN", "HIPR_TLS_CA", "HIPR_TLS_CERT", "HIPR_TLS_KEY"):
            if name not in (env or {}):
                full.pop(name, None)
        return subprocess.run(
            [str(self.path), *args], env=full, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def program(sanitized_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> Program:
    root = tmp_path_factory.mktemp("core")
    libs = sanitized_libs
    path = root / "core_check"
    cc([
        *SANITIZED_FLAGS, str(C_DIR / "core_check.c"), "-o", str(path),
        *linked_to(libs, HIP_LIBRARY), "-pthread",
    ])  # fmt: skip
    return Program(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    unix_url: str
    directory: Path
    tls_url: str | None = None

    def log(self) -> str:
        return (self.directory / "worker.log").read_text(errors="replace")


def _start(
    directory: Path, extra: str = "", tls: Pki | None = None, mutual: bool = False
) -> Worker:
    sock = directory / "w.sock"
    listen = [f"unix://{sock}"]
    tls_url = None
    if tls is not None:
        port = _free_port()
        tls_url = f"tls://127.0.0.1:{port}"
        listen.append(tls_url)
        extra += f'\n[tls]\ncertfile = "{tls.server_cert}"\nkeyfile = "{tls.server_key}"\n'
        if mutual:
            extra += f'client_ca = "{tls.ca_file}"\nrequire_client_cert = true\n'
    cfg = directory / "worker.toml"
    cfg.write_text(
        f"listen = {listen!r}\n".replace("'", '"')
        # HIPR_TEST_BACKEND=cuda runs the same programs against a GPU worker.
        + f'backend = "{os.environ.get("HIPR_TEST_BACKEND", "emulator")}"\n'
        + 'log_level = "warning"\n'
        + extra
    )
    log = open(directory / "worker.log", "wb")  # noqa: SIM115 - the worker's lifetime
    process = subprocess.Popen(
        [sys.executable, "-m", "hipr", "worker", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    deadline = time.monotonic() + 30
    while not sock.exists() or (
        tls_url is not None and not _listening(int(tls_url.rsplit(":", 1)[1]))
    ):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError((directory / "worker.log").read_text())
        time.sleep(0.05)
    return Worker(process, f"unix://{sock}", directory, tls_url)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def tls_worker(
    tmp_path_factory: pytest.TempPathFactory,
    proxy_libs: None,
    pki: Pki,  # noqa: F811 - the fixture imported above
) -> Iterator[Worker]:
    worker = _start(Path(tmp_path_factory.mktemp("tw")), tls=pki)
    try:
        yield worker
    finally:
        stop_worker(worker.process)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short path: unix socket paths are limited to ~100 bytes."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="hc-", dir="/tmp"))
    try:
        yield path
    finally:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


# --- tls ---------------------------------------------------------------------------------


def test_tls_with_the_ca_from_the_environment(
    program: Program,
    tls_worker: Worker,
    pki: Pki,  # noqa: F811
) -> None:
    assert tls_worker.tls_url is not None
    result = program.run(tls_worker.tls_url, "basic", env={"HIPR_TLS_CA": pki.ca_file})
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok basic"


def test_tls_with_the_ca_in_the_url_and_a_host_name(
    program: Program,
    tls_worker: Worker,
    pki: Pki,  # noqa: F811
) -> None:
    assert tls_worker.tls_url is not None
    url = f"{tls_worker.tls_url}?ca={pki.ca_file}&server_hostname=localhost&min_version=1.2"
    result = program.run(url, "basic")
    assert_sanitizer_clean(result)
    assert result.stdout.strip() == "ok basic"


def test_tls_refuses_a_certificate_no_trusted_ca_signed(
    program: Program, tls_worker: Worker
) -> None:
    assert tls_worker.tls_url is not None
    # Without a CA the system store is used: trustme's CA is not in it.
    result = program.run(tls_worker.tls_url, "basic")
    assert result.returncode != 0
    assert f"TLS handshake with {tls_worker.tls_url} failed: certificate verify failed" in (
        result.stderr
    ), result.stderr
    assert "HIPR_TLS_CA" in result.stderr  # the hint says what to set
    assert "AddressSanitizer" not in result.stderr and "LeakSanitizer" not in result.stderr


def test_tls_checks_the_host_name(
    program: Program,
    tls_worker: Worker,
    pki: Pki,  # noqa: F811
) -> None:
    assert tls_worker.tls_url is not None
    result = program.run(
        tls_worker.tls_url,
        "basic",
        env={"HIPR_TLS_CA": pki.ca_file, "HIPR_TLS_SERVER_HOSTNAME": "gpu.example.org"},
    )
    assert result.returncode != 0
    assert "hostname mismatch" in result.stderr.lower(), result.stderr


def test_tls_bad_ca_file_is_a_clear_error(program: Program, tls_worker: Worker) -> None:
    assert tls_worker.tls_url is not None
    result = program.run(tls_worker.tls_url, "basic", env={"HIPR_TLS_CA": "/nonexistent/ca.pem"})
    assert result.returncode != 0
    assert "cannot load the CA /nonexistent/ca.pem" in result.stderr, result.stderr


def test_mutual_tls_with_a_client_certificate(
    program: Program,
    tmp_path: Path,
    pki: Pki,  # noqa: F811
) -> None:
    worker = _start(tmp_path, tls=pki, mutual=True)
    try:
        assert worker.tls_url is not None
        result = program.run(
            worker.tls_url,
            "basic",
            env={
                "HIPR_TLS_CA": pki.ca_file,
                "HIPR_TLS_CERT": pki.client_cert,
                "HIPR_TLS_KEY": pki.client_key,
            },
        )
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok basic"
        # Without one, the worker's alert is the reason (TLS 1.3: after the handshake;
        # where the worker's reset overtakes its alert, the hint alone).
        refused = program.run(worker.tls_url, "basic", env={"HIPR_TLS_CA": pki.ca_file})
        assert refused.returncode != 0
        assert "HIPR_TLS_CERT" in refused.stderr, refused.stderr
        assert "AddressSanitizer" not in refused.stderr
    finally:
        stop_worker(worker.process)


# --- ssh ---------------------------------------------------------------------------------


def _ssh_url(server: SshServer, socket_path: str, identity: str | None = None) -> str:
    return server.url(
        f"{socket_path}?identity={identity or server.identity}&known_hosts={server.known_hosts}"
        f"&ssh_config={server.ssh_config}&connect_timeout=10"
    )


def test_ssh_forward_to_the_workers_socket(
    program: Program,
    sshd: SshServer,  # noqa: F811
    short_dir: Path,
) -> None:
    worker = _start(short_dir)
    own_tmp = short_dir / "t"  # the forward's private directory goes under TMPDIR
    own_tmp.mkdir()
    try:
        url = _ssh_url(sshd, worker.unix_url.removeprefix("unix://"))
        result = program.run(url, "basic", env={"TMPDIR": str(own_tmp)})
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok basic"
        # The forward's private directory went as soon as it was connected to.
        assert list(own_tmp.iterdir()) == []
        missing = short_dir / "gone"
        refused = program.run(url, "basic", env={"TMPDIR": str(missing)})
        assert refused.returncode != 0
        assert "cannot make a private directory for the ssh forward" in refused.stderr
        assert not missing.exists()
    finally:
        stop_worker(worker.process)


def test_ssh_wrong_key_is_a_clear_error(
    program: Program,
    sshd: SshServer,  # noqa: F811
    short_dir: Path,
) -> None:
    url = _ssh_url(sshd, f"{short_dir}/w.sock", identity=sshd.wrong_identity)
    result = program.run(url, "basic")
    assert result.returncode != 0
    assert "could not connect: " in result.stderr and "Permission denied" in result.stderr
    assert "check identity=" in result.stderr, result.stderr


# --- a link cut mid-program ------------------------------------------------------------


def end_pair(pair: tuple[socket.socket, ...]) -> None:
    """Shut a relayed connection's two sockets down and close them."""
    for s in pair:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def forward_plainly(
    src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, ...]
) -> None:
    """Forward ``src`` to ``dst`` as it comes, no mark counted, until either ends."""
    while True:
        try:
            data = src.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            break
        try:
            dst.sendall(data)
        except OSError:
            break
    end_pair(pair)


@dataclass
class Relay:
    """A TCP relay to the worker's unix socket that cuts the link once the bytes sent
    in one direction pass each of the given marks (cumulative over all links); with
    ``freeze``, the first cut stops forwarding instead and leaves both sockets open (a
    route that went silent)."""

    target: str
    up_cuts: list[int]
    down_cuts: list[int]
    freeze: bool = False
    #: Where the bytes sent up (client to worker) are kept, if anywhere.
    spy: bytearray | None = None
    #: Tell the client the worker speaks protocol 1.2 (HELLO's and RESUME's reply).
    downgrade: bool = False
    #: Tell the client the worker speaks protocol 1.<this> (as downgrade, any minor).
    announce_minor: int | None = None
    #: Byte strings replaced in what the worker sends (HELLO's reply: what it offers).
    down_rewrites: list[tuple[bytes, bytes]] = field(default_factory=list)
    listener: socket.socket = field(init=False)
    port: int = field(init=False)
    cuts: int = 0
    links: int = 0
    _up: int = 0
    _down: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _frozen: tuple[socket.socket, ...] | None = None

    def __post_init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _admit(self) -> bool:
        """Whether to forward the connection just accepted (subclasses refuse some)."""
        return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self._admit():
                client.close()
                continue
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.target)
            self.links += 1
            pair = (client, upstream)
            threading.Thread(
                target=self._pump, args=(client, upstream, True, pair), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, False, pair), daemon=True
            ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, up: bool, pair: tuple[socket.socket, ...]
    ) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if self._frozen is pair:
                return  # silent both ways from here on; the sockets stay open
            if not data:
                break
            minor = 2 if self.downgrade else self.announce_minor
            if not up and minor is not None:
                data = re.sub(
                    rb"hprotocol\x19\x01[\x00-\x17]", b"hprotocol\x19\x01" + bytes([minor]), data
                )
            for old, new in [] if up else self.down_rewrites:
                data = data.replace(old, new)
            with self._lock:
                if up and self.spy is not None:
                    self.spy += data
                marks = self.up_cuts if up else self.down_cuts
                before = self._up if up else self._down
                after = before + len(data)
                if up:
                    self._up = after
                else:
                    self._down = after
                cut = bool(marks) and after >= marks[0]
                if cut:
                    marks.pop(0)
                    self.cuts += 1
            if cut and self.freeze:
                self.freeze = False
                self._frozen = pair
                return
            if cut:
                # Half of this piece gets through: the cut falls inside a frame.
                try:
                    dst.sendall(data[: len(data) // 2])
                except OSError:
                    pass
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        end_pair(pair)

    def close(self) -> None:
        self.listener.close()


def test_cut_links_are_resumed_exactly_once(program: Program, short_dir: Path) -> None:
    worker = _start(short_dir, "resume_grace = 30\n")
    relay = Relay(
        worker.unix_url.removeprefix("unix://"),
        # Among small fire-and-forget frames, inside 2 MiB uploads, and inside downloads.
        up_cuts=[60_000, 3_000_000, 7_500_000],
        down_cuts=[4_500_000],
    )
    try:
        result = program.run(f"tcp://127.0.0.1:{relay.port}", "stream", "1500", timeout=110)
        assert_sanitizer_clean(result)
        assert relay.cuts == 4, (relay.cuts, result.stderr)
        assert result.stdout.strip() == "ok stream rounds=1500 resumes=4", result.stderr
        assert result.stderr.count("resumed the session") == 4
    finally:
        relay.close()
        stop_worker(worker.process)


def _launches_and_syncs(sent: bytes) -> tuple[int, int, int]:
    """(launches sent for a reply with `synchronize`, fire-and-forget launches,
    DEVICE_SYNCHRONIZE requests) among the frames a client sent."""
    from hipr.protocol import Flags, FrameDecoder, Opcode

    decoder = FrameDecoder(max_payload=1 << 30)
    decoder.feed(sent)
    fused = alone = syncs = 0
    for frame in decoder.frames():
        if frame.opcode == Opcode.LAUNCH_KERNEL:
            if Flags.NO_REPLY in frame.flags:
                assert "synchronize" not in frame.args
                alone += 1
            else:
                assert frame.args["synchronize"] is True
                fused += 1
        syncs += frame.opcode == Opcode.DEVICE_SYNCHRONIZE
    return fused, alone, syncs


@pytest.mark.parametrize("minor", [3, 2])
def test_a_launch_then_a_synchronize_is_one_request_for_a_worker_of_minor_3(
    program: Program, short_dir: Path, minor: int
) -> None:
    worker = _start(short_dir)
    relay = Relay(
        worker.unix_url.removeprefix("unix://"), [], [], spy=bytearray(), downgrade=minor < 3
    )
    try:
        result = program.run(f"tcp://127.0.0.1:{relay.port}", "fused", "40")
        assert_sanitizer_clean(result)
        assert result.stdout.startswith("ok fused rounds=40 "), result.stderr
        assert relay.spy is not None
        fused, alone, syncs = _launches_and_syncs(bytes(relay.spy))
        if minor >= 3:
            assert (fused, alone, syncs) == (40, 0, 0)
        else:  # an older worker gets the two requests
            assert (fused, alone, syncs) == (0, 40, 40)
    finally:
        relay.close()
        stop_worker(worker.process)


def test_fused_launches_are_resumed_exactly_once(program: Program, short_dir: Path) -> None:
    worker = _start(short_dir, "resume_grace = 30\n")
    relay = Relay(
        worker.unix_url.removeprefix("unix://"),
        # Inside launch + synchronize requests going up, and inside their replies.
        up_cuts=[30_000, 120_000],
        down_cuts=[20_000],
    )
    try:
        result = program.run(f"tcp://127.0.0.1:{relay.port}", "fused", "1500", timeout=110)
        assert_sanitizer_clean(result)
        assert relay.cuts == 3, (relay.cuts, result.stderr)
        assert result.stdout.strip().startswith("ok fused rounds=1500 "), result.stderr
        assert result.stdout.strip().endswith(" resumes=3"), result.stdout
    finally:
        relay.close()
        stop_worker(worker.process)


def test_a_link_that_cannot_come_back_says_so(program: Program, short_dir: Path) -> None:
    worker = _start(short_dir, "resume_grace = 30\n")
    relay = Relay(worker.unix_url.removeprefix("unix://"), up_cuts=[20_000], down_cuts=[])
    try:
        result = program.run(
            f"tcp://127.0.0.1:{relay.port}",
            "stream",
            "300",
            env={"HIPR_RECONNECT_TIMEOUT": "0"},
        )
        assert result.returncode != 0
        assert "lost the session with the worker" in result.stderr, result.stderr
        assert "AddressSanitizer" not in result.stderr and "LeakSanitizer" not in result.stderr
    finally:
        relay.close()
        stop_worker(worker.process)


def test_a_silent_link_is_taken_for_dead_and_resumed(program: Program, short_dir: Path) -> None:
    # The worker pings every 0.3 s: the proxy takes 2 s of silence for a dead link.
    worker = _start(
        short_dir, "resume_grace = 30\nheartbeat_interval = 0.3\nheartbeat_timeout = 5\n"
    )
    relay = Relay(
        worker.unix_url.removeprefix("unix://"), up_cuts=[40_000], down_cuts=[], freeze=True
    )
    try:
        started = time.monotonic()
        result = program.run(f"tcp://127.0.0.1:{relay.port}", "stream", "400")
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok stream rounds=400 resumes=1", result.stderr
        assert "the worker was silent for 2 s" in result.stderr
        assert time.monotonic() - started < 60
    finally:
        relay.close()
        stop_worker(worker.process)


def test_an_idle_program_keeps_its_session(program: Program, short_dir: Path) -> None:
    # The worker drops a link silent for 0.8 s: the proxy answers its pings meanwhile.
    worker = _start(short_dir, "heartbeat_interval = 0.2\nheartbeat_timeout = 0.8\n")
    try:
        result = program.run(worker.unix_url, "idle", "2.5")
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok idle resumes=0", result.stderr
    finally:
        stop_worker(worker.process)


# --- threads and fork --------------------------------------------------------------------


def test_threads_and_fork(program: Program, short_dir: Path) -> None:
    worker = _start(short_dir, "[emulator]\ndevice_count = 2\n")
    try:
        result = program.run(worker.unix_url, "threads")
        assert_sanitizer_clean(result)
        assert result.stdout.strip() == "ok threads devices=2"
    finally:
        stop_worker(worker.process)
