"""``ssh://[user@]host[:port]/remote/worker.sock`` or ``ssh://host?target=127.0.0.1:18515``.

A client-only transport over the system's OpenSSH client, so the user's
``~/.ssh/config``, keys, agent, ``ProxyJump`` and known_hosts apply exactly as they do
for ``ssh`` itself. hipr starts one ``ssh`` process per connection and owns it: closing
the stream ends the process.

How the bytes travel: ``ssh -N -L <private socket>:<remote target>`` forwards a local
Unix socket, made in a fresh 0700 directory, to the worker's Unix socket (OpenSSH's
``direct-streamlocal`` channel, OpenSSH >= 6.7 on both ends) or to its loopback TCP
port. hipr connects to that local socket once and removes it (and its directory) at
once, so no port or socket is left for anyone else to use. Not ``ssh -W``: ``-W`` takes
only ``host:port``, and OpenSSH (9.2 checked) silently ignores a Unix socket path there
rather than failing, and a remote ``nc -U``/``socat`` would need more than sshd on the
GPU node. The local socket appearing is also ssh's positive signal that it
authenticated and set the forward up, so ``connect`` either returns a working stream
or raises ssh's own message ("Permission denied (publickey)", "Host key verification
failed", ...) as a :class:`~hipr.errors.HipConnectionError`; it never waits on a
prompt (``BatchMode=yes``).

A forward the remote end refuses (no worker listening at the target) or an ssh that
dies with a message mid-session surfaces from ``receive``/``send`` as
:class:`~hipr.transports.base.TransportFailedError` (also anyio's
``BrokenResourceError``); an ssh process that is killed silently is an ordinary end
of stream. Either way the client sees a dropped transport and may reconnect.

The blocking connect (:class:`SshSocket`, for the synchronous client) starts ssh the same
way (:func:`spawn_ssh`, one helper for both) and connects a blocking Unix socket to the
forward. On Linux the ssh child gets ``PR_SET_PDEATHSIG``, so it dies with its client
even when the client is SIGKILLed; because the kernel ties that signal to the *thread*
that forked, every ssh is forked from one long-lived thread, never from a caller's
thread (or anyio's worker threads) that may exit while the tunnel is in use.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, ClassVar

import anyio
from anyio.abc import ByteStream, Listener

from hipr.errors import HipConnectionError
from hipr.transports._common import (
    DEFAULT_CONNECT_TIMEOUT,
    BlockingSocket,
    as_timeout,
    merge_options,
)
from hipr.transports.base import (
    TransportAttribute,
    TransportConfig,
    TransportFailedError,
    TransportUrl,
    format_host_port,
    query_values,
)
from hipr.transports.tcp import DEFAULT_HOST, DEFAULT_PORT
from hipr.transports.unix import connect_unix_socket, open_unix_stream

__all__ = ["SshSocket", "SshStream", "SshTransport", "end_process", "spawn_ssh", "ssh_command"]

#: ssh as both connect paths start it (a Popen, so the two share one spawner)
SshProcess = subprocess.Popen[bytes]

_CONNECT_OPTIONS = frozenset(
    {
        "identity",
        "ssh_config",
        "known_hosts",
        "options",
        "option",
        "connect_timeout",
        "timeout",
        "target",
        "ssh_command",
    }
)

#: stderr kept for error messages: ssh's messages are short, a remote banner may not be
_STDERR_TAIL = 4096

#: how long ssh gets to exit after SIGTERM before it is killed
_TERMINATE_GRACE = 2.0


def _target(url: TransportUrl, opts: Mapping[str, Any]) -> str:
    """The forward's remote end in ``-L`` syntax: a socket path or ``host:port``."""
    path = url.path if url.path not in ("", "/") else ""
    target = opts.get("target")
    if path and target:
        raise ValueError(
            f"{url.raw!r}: give the worker's socket path or ?target=host:port, not both"
        )
    if path:
        return path
    if not target:
        return format_host_port(DEFAULT_HOST, DEFAULT_PORT)
    host, sep, port = str(target).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"ssh target {target!r} must be host:port (e.g. 127.0.0.1:18515) or the URL's "
            "path must be the worker's socket, e.g. ssh://gpu01/run/hipr/worker.sock"
        )
    return format_host_port(host, int(port))


def _extra_options(url: TransportUrl, call: Mapping[str, Any]) -> list[str]:
    """Extra ``-o`` options: the call's ``options`` (str or list), else the URL's."""
    given = [call[k] for k in ("options", "option") if call.get(k) is not None]
    extra: list[str] = []
    if given:
        for value in given:
            extra.extend([value] if isinstance(value, str) else list(value))
    else:
        extra = query_values(url, "option") + query_values(url, "options")
    for option in extra:
        if not isinstance(option, str) or ("=" not in option and " " not in option):
            raise ValueError(f"ssh option {option!r} must look like Name=value")
    return extra


def _expand(path: str | os.PathLike[str]) -> str:
    """``~/.ssh/id_ed25519`` as the user means it (``-F`` would not expand ``~`` itself)."""
    return os.path.expanduser(os.fspath(path))


def ssh_command(
    ssh: str,
    url: TransportUrl,
    local_socket: str,
    target: str,
    *,
    identity: str | None = None,
    ssh_config: str | None = None,
    known_hosts: str | None = None,
    options: Sequence[str] = (),
    connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
) -> list[str]:
    """The ssh argv that forwards ``local_socket`` to ``target`` on the URL's host."""
    argv = [ssh, "-N", "-T", "-e", "none"]
    if ssh_config:
        argv += ["-F", _expand(ssh_config)]
    # ssh keeps the first value it is given for an option: the caller's own options go
    # first so they can override any default below.
    for option in options:
        argv += ["-o", option]
    if identity:
        argv += ["-i", _expand(identity), "-o", "IdentitiesOnly=yes"]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={_expand(known_hosts)}"]
    if connect_timeout:
        argv += ["-o", f"ConnectTimeout={max(1, math.ceil(connect_timeout))}"]
    argv += [
        # Never prompt: a password or host-key question would hang a program forever.
        "-o", "BatchMode=yes",
        # Fail at once, with ssh's reason, when the forward cannot be set up.
        "-o", "ExitOnForwardFailure=yes",
        # Own the connection: a shared master would outlive this process (ControlPersist)
        # and keep the tunnel's lifetime out of hipr's hands.
        "-o", "ControlMaster=no",
        "-o", "ControlPath=none",
        # The local socket is for this process only.
        "-o", "StreamLocalBindMask=0177",
        # Notice a dead network within about a minute, as a dropped transport.
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
    ]  # fmt: skip
    if url.port is not None:
        argv += ["-p", str(url.port)]
    if url.user:
        argv += ["-l", url.user]
    argv += ["-L", f"{local_socket}:{target}", "--", url.host]
    return argv


def _read_tail(errfile: IO[bytes], start: int = 0) -> str:
    """ssh's stderr from ``start`` on (its last few KiB), as clean text."""
    try:
        errfile.flush()
        end = errfile.seek(0, os.SEEK_END)
        errfile.seek(max(start, end - _STDERR_TAIL))
        data = errfile.read()
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in data.decode(errors="replace").splitlines()]
    return "\n".join(line for line in lines if line)


def _hint(message: str) -> str:
    lowered = message.lower()
    if "permission denied" in lowered:
        return " (check identity= or your ssh keys/agent, and the remote authorized_keys)"
    if "host key verification failed" in lowered:
        return (
            " (the host key is unknown or changed: connect once with plain `ssh` to check "
            "and record it, or pass known_hosts=)"
        )
    if "could not resolve hostname" in lowered:
        return " (check the host name)"
    if "connection refused" in lowered and "open failed" not in lowered:
        return " (is sshd running there, on that port?)"
    if "open failed" in lowered or "connect failed" in lowered:
        return " (is `hipr worker` listening at that target on the remote host?)"
    return ""


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _death_signal_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent thread ends (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
        # The parent may have died before prctl; the signal would then never come.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _forget_spawner() -> None:
    global _spawner, _spawner_lock
    # A forked child has the executor object but not its thread.
    _spawner, _spawner_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawner)


def _popen(argv: list[str], errfile: IO[bytes]) -> SshProcess:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errfile,
        # Out of the terminal's process group: a Ctrl-C meant for the program must not
        # kill the tunnel before the program has closed it.
        start_new_session=True,
        # preexec_fn is unsafe only where other threads may hold locks the child needs;
        # it runs prctl and getppid alone, forked from the spawner thread.
        preexec_fn=_death_signal_preexec(),
    )


def _end_if_spawned(future: Future[SshProcess]) -> None:
    if not future.cancelled() and future.exception() is None:
        end_process(future.result())


def spawn_ssh(argv: Sequence[str], errfile: IO[bytes]) -> SshProcess:
    """Start ``argv`` (from :func:`ssh_command`) as both connect paths do; blocks briefly.

    stderr goes to ``errfile``, an unlinked temporary file rather than a pipe: nothing has
    to drain it for the life of the tunnel, and it is there to read when something
    fails. The fork happens on one long-lived thread (see the module docstring).
    """
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(1, thread_name_prefix="hipr-ssh-spawner")
        future = _spawner.submit(_popen, list(argv), errfile)
    try:
        return future.result()
    except BaseException:
        # Interrupted while ssh was starting: nobody will own that process.
        future.add_done_callback(_end_if_spawned)
        raise


def end_process(process: SshProcess) -> None:
    """Terminate, give ssh a moment to exit cleanly, then kill; always reap (blocking)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(_TERMINATE_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()


def _tunnel_failure(
    errfile: IO[bytes], stderr_start: int, description: str
) -> TransportFailedError | None:
    """ssh's reason, when it printed one after the tunnel was set up."""
    message = _read_tail(errfile, stderr_start)
    if not message:
        return None
    return TransportFailedError(
        message=f"{description}: the tunnel failed: {message}{_hint(message)}"
    )


def _exit_error(process: SshProcess, errfile: IO[bytes], description: str) -> HipConnectionError:
    message = _read_tail(errfile) or f"ssh exited with status {process.returncode}"
    return HipConnectionError(
        message=f"{description}: could not connect: {message}{_hint(message)}"
    )


def _slow_error(
    errfile: IO[bytes], description: str, time_limit: float | None
) -> HipConnectionError:
    message = _read_tail(errfile)
    return HipConnectionError(
        message=f"{description}: could not connect: ssh did not finish connecting within "
        f"{time_limit or 0:g} s" + (f": {message}" if message else "")
    )


def _poll_delays() -> Iterator[float]:
    """Sleeps between looks for the forward's socket: quick at first, then every 50 ms.

    The socket appears once ssh has authenticated and bound it; polling for it is cheap
    next to an ssh handshake and needs no parsing of ssh's logs.
    """
    delay = 0.005
    while True:
        yield delay
        delay = min(delay * 2, 0.05)


@dataclass
class _Tunnel:
    """One ssh forward being set up; both connect paths share it.

    Used as a context manager around the setup: the private directory goes at the end
    either way (hipr connects to the socket once, then nobody may), ``errfile`` only
    when the setup fails (a stream owns it afterwards).
    """

    argv: list[str]
    local: str
    tmpdir: str
    description: str
    timeout: float | None
    errfile: IO[bytes]

    def __enter__(self) -> _Tunnel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        if exc_type is not None:
            self.errfile.close()

    def forward_is_up(self, process: SshProcess) -> bool:
        """Whether the local socket is there; raises ssh's message if ssh has exited."""
        if _is_socket(self.local):
            return True
        if process.poll() is not None:
            raise _exit_error(process, self.errfile, self.description)
        return False

    def stderr_mark(self) -> int:
        """Where ssh's stderr is now: what it prints from here on is news to the stream.

        Taken before connecting: a refused forward is reported within a round trip.
        """
        return self.errfile.seek(0, os.SEEK_END)

    def connected(self) -> None:
        """Remove the forward's socket so nothing else can use this tunnel."""
        with contextlib.suppress(OSError):
            os.unlink(self.local)


def _prepare(url: TransportUrl, options: Mapping[str, Any]) -> _Tunnel:
    """Check the URL and options, find ssh, and make the private socket directory."""
    if not url.host:
        raise ValueError(f"{url.raw!r}: an ssh:// URL needs a host, e.g. ssh://me@gpu01/...")
    opts = merge_options(url, options, _CONNECT_OPTIONS)
    target = _target(url, opts)
    connect_timeout = as_timeout(
        opts.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT), "connect_timeout"
    )
    timeout = as_timeout(opts.get("timeout", (connect_timeout or 10) + 20), "timeout")
    ssh = shutil.which(str(opts.get("ssh_command", "ssh")))
    if ssh is None:
        raise HipConnectionError(
            message="ssh transport needs the OpenSSH client: "
            f"`{opts.get('ssh_command', 'ssh')}` not found on PATH"
        )
    host = url.host if url.port is None else format_host_port(url.host, url.port)
    dest = f"{url.user}@{host}" if url.user else host
    extra = _extra_options(url, options)
    tmpdir = tempfile.mkdtemp(prefix="hipr-ssh-")  # mode 0700: ours alone
    local = os.path.join(tmpdir, "s")
    argv = ssh_command(
        ssh,
        url,
        local,
        target,
        identity=opts.get("identity"),
        ssh_config=opts.get("ssh_config"),
        known_hosts=opts.get("known_hosts"),
        options=extra,
        connect_timeout=connect_timeout,
    )
    return _Tunnel(
        argv=argv,
        local=local,
        tmpdir=tmpdir,
        description=f"ssh {dest} -> {target}",
        timeout=timeout,
        # The stream that comes of this owns it (see __exit__ for a failed setup).
        errfile=tempfile.TemporaryFile(),
    )


class SshStream(ByteStream):
    """A byte stream through an ssh forward; owns the ``ssh`` process behind it."""

    def __init__(
        self,
        stream: ByteStream,
        process: SshProcess,
        errfile: IO[bytes],
        stderr_start: int,
        description: str,
    ) -> None:
        self._stream = stream
        self._process = process
        self._errfile = errfile
        # What ssh printed while connecting is not news; only what follows is.
        self._stderr_start = stderr_start
        self.description = description
        self._closed = False

    @property
    def process(self) -> SshProcess:
        """The ``ssh`` process carrying this stream."""
        return self._process

    def _failure(self) -> TransportFailedError | None:
        return _tunnel_failure(self._errfile, self._stderr_start, self.description)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Bytes from the worker; ``EndOfStream`` when the tunnel closed."""
        try:
            return await self._stream.receive(max_bytes)
        except (anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            failure = self._failure()
            if failure is not None:
                raise failure from exc
            raise

    async def send(self, item: bytes) -> None:
        """Send all of ``item`` to the worker."""
        try:
            await self._stream.send(item)
        except anyio.BrokenResourceError as exc:
            failure = self._failure()
            if failure is not None:
                raise failure from exc
            raise

    async def send_eof(self) -> None:
        """Half-close: the worker sees end of stream, replies still arrive."""
        await self._stream.send_eof()

    async def aclose(self) -> None:
        """Close the stream and end the ssh process (SIGTERM, then SIGKILL), reaping it."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self._stream.aclose()
            finally:
                await _end_process(self._process)
                self._errfile.close()

    def __del__(self) -> None:
        # A stream dropped without aclose() must not leave an ssh -N running forever.
        if not getattr(self, "_closed", True) and self._process.returncode is None:
            with contextlib.suppress(Exception):
                self._process.kill()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """Only the description: the local socket's peer is ssh, not the worker."""
        return {TransportAttribute.description: lambda: self.description}


async def _end_process(process: SshProcess) -> None:
    """:func:`end_process` off the event loop, which it may block for the grace period."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(end_process, process)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


class SshTransport:
    """``ssh://`` (client only): the OpenSSH client forwards to the worker's socket or port.

    Connect options (call keyword or URL query): ``identity`` (key file: ``-i`` with
    ``IdentitiesOnly=yes``), ``ssh_config`` (``-F`` file), ``known_hosts``
    (``UserKnownHostsFile``), ``options`` (extra ``-o Name=value`` strings; in a query,
    repeat ``option=``), ``connect_timeout`` (ssh's ``ConnectTimeout``, default 10 s),
    ``timeout`` (for the whole connect, authentication included; default
    ``connect_timeout`` + 20 s), ``target`` (``host:port`` on the remote side when the
    URL has no socket path; default 127.0.0.1:18515), ``ssh_command`` (the client binary,
    default ``ssh`` on PATH).
    """

    scheme: ClassVar[str] = "ssh"

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        """Refused: sshd is the listener; the worker listens on unix:// or tcp://."""
        raise ValueError(
            f"cannot listen on {url.raw!r}: ssh:// is client-only; run the worker on a Unix "
            "socket (e.g. --listen unix:///run/hipr/worker.sock) and connect with "
            "ssh://host/run/hipr/worker.sock"
        )

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        """Start ssh, wait until the forward is up, and connect through it."""
        with _prepare(url, options) as tunnel:
            process = await anyio.to_thread.run_sync(spawn_ssh, tunnel.argv, tunnel.errfile)
            try:
                with anyio.fail_after(tunnel.timeout):
                    for delay in _poll_delays():
                        if tunnel.forward_is_up(process):
                            break
                        await anyio.sleep(delay)
                    stderr_start = tunnel.stderr_mark()
                    stream = await open_unix_stream(
                        tunnel.local, f"the local end of {tunnel.description}", None
                    )
            except TimeoutError:
                await _end_process(process)
                raise _slow_error(tunnel.errfile, tunnel.description, tunnel.timeout) from None
            except BaseException:
                await _end_process(process)
                raise
            tunnel.connected()
            return SshStream(stream, process, tunnel.errfile, stderr_start, tunnel.description)

    def connect_blocking(self, url: TransportUrl, **options: Any) -> SshSocket:
        """The blocking twin of :meth:`connect`: same ssh, options and errors.

        Closing the returned socket ends the ssh process (SIGTERM, then SIGKILL) and
        reaps it; the private socket directory is gone as soon as this returns.
        """
        with _prepare(url, options) as tunnel:
            process = spawn_ssh(tunnel.argv, tunnel.errfile)
            deadline = None if tunnel.timeout is None else time.monotonic() + tunnel.timeout
            try:
                for delay in _poll_delays():
                    if tunnel.forward_is_up(process):
                        break
                    if deadline is not None and time.monotonic() >= deadline:
                        raise _slow_error(tunnel.errfile, tunnel.description, tunnel.timeout)
                    time.sleep(delay)
                stderr_start = tunnel.stderr_mark()
                left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
                sock = connect_unix_socket(
                    tunnel.local, f"the local end of {tunnel.description}", left
                )
            except BaseException:
                end_process(process)
                raise
            tunnel.connected()
            return SshSocket.adopt_tunnel(sock, process, tunnel.errfile, stderr_start, tunnel)


def _kill_quietly(process: SshProcess) -> None:
    with contextlib.suppress(Exception):
        process.kill()


class SshSocket(BlockingSocket):
    """A blocking stream through an ssh forward (a Unix socket); owns the ssh process.

    ``close()`` ends the ssh process (SIGTERM, then SIGKILL after a grace period) and
    reaps it; a socket dropped without ``close()`` still gets its ssh killed. When a
    call fails or the stream ends, :meth:`failure` gives ssh's reason if it printed one.
    """

    _process: SshProcess | None = None
    _errfile: IO[bytes] | None = None
    _stderr_start = 0
    _finalizer: weakref.finalize[Any, Any] | None = None

    @classmethod
    def adopt_tunnel(
        cls,
        sock: BlockingSocket,
        process: SshProcess,
        errfile: IO[bytes],
        stderr_start: int,
        tunnel: _Tunnel,
    ) -> SshSocket:
        """Take over ``sock`` (connected to the forward) and the ssh process behind it."""
        adopted = cls.adopt(sock, tunnel.description)
        adopted._process = process
        adopted._errfile = errfile
        # What ssh printed while connecting is not news; only what follows is.
        adopted._stderr_start = stderr_start
        adopted._finalizer = weakref.finalize(adopted, _kill_quietly, process)
        return adopted

    @property
    def process(self) -> SshProcess | None:
        """The ``ssh`` process carrying this stream (``None`` for a detached socket)."""
        return self._process

    def failure(self, exc: BaseException | None = None) -> TransportFailedError | None:
        """ssh's reason for a failed call or an unexpected end, if ssh printed one."""
        if self._errfile is None or self._errfile.closed:
            return None
        return _tunnel_failure(self._errfile, self._stderr_start, self.description)

    def close(self) -> None:
        """Close the socket, then end and reap the ssh process."""
        try:
            super().close()
        finally:
            if self._finalizer is not None:
                self._finalizer.detach()
            if self._process is not None:
                end_process(self._process)
            if self._errfile is not None:
                self._errfile.close()
