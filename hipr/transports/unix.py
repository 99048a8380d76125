"""``unix:///abs/path``: a Unix domain socket, for clients on the GPU node and for ssh.

File permissions guard the socket (``unix_socket_mode``, 0o660 by default, so the
socket's group decides who may connect) and the kernel tells the worker who connected
(``SO_PEERCRED``, see :func:`hipr.transports.peer_uid`). An ssh tunnel lands here as the
ssh-authenticated user, so the worker sees that user's uid too.

Streams are not taken from anyio: on asyncio, anyio 4.16's own Unix socket classes
resolve a reader future with a bare ``set_result`` callback, so a task cancelled in
``receive()`` just as bytes arrive makes the event loop report ``InvalidStateError`` (a
routine race when a worker shuts down). Under asyncio a connected socket is served by
the loop's transport (``hipr.transports.loop_stream``, which guards that race and is the
cheaper path); under trio by :class:`UnixSocketStream`, a non-blocking socket and
``wait_readable``. The listener is ``hipr.transports.listener``'s.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import sniffio
from anyio.abc import ByteStream, Listener

from hipr.errors import InvalidUrlError
from hipr.transports._common import (
    BlockingSocket,
    connect_errors,
    connect_timeout_option,
    merge_options,
    socket_attributes,
)
from hipr.transports.base import TransportAttribute, TransportConfig, TransportUrl
from hipr.transports.listener import SocketListener
from hipr.transports.loop_stream import open_loop_stream
from hipr.transports.thread_writes import ThreadWrites

__all__ = [
    "UnixSocketListener",
    "UnixSocketStream",
    "UnixTransport",
    "connect_unix_socket",
    "open_unix_stream",
    "size_send_buffer",
    "socket_path",
    "socket_stream",
]

_log = logging.getLogger(__name__)

_CONNECT_OPTIONS = frozenset({"connect_timeout"})


def socket_path(url: TransportUrl) -> Path:
    """The absolute socket path of a ``unix://`` URL (``unix:///run/hipr/worker.sock``)."""
    if url.host not in ("", "localhost"):
        # unix://run/x parses "run" as a host: the usual slip of two slashes for three.
        raise InvalidUrlError(
            message=f"{url.raw!r}: a unix:// URL needs an absolute path after the scheme, "
            f"e.g. unix:///{url.host}{url.path}"
        )
    if not url.path.startswith("/"):
        raise InvalidUrlError(message=f"{url.raw!r}: a unix:// URL needs an absolute path")
    return Path(url.path)


class UnixSocketStream(ByteStream):
    """A connected Unix stream socket as an anyio ``ByteStream`` (see the module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._closed = False
        #: Writes of whole frames from other threads (``write_from_thread``).
        self.thread_writes = ThreadWrites(sock)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """Bytes from the peer; ``EndOfStream`` once the peer has closed its end."""
        if max_bytes < 1:
            raise ValueError("max_bytes must be a positive integer")
        # Cancellation is checked, but no event-loop pass is spent when bytes are
        # already there: waiting for readability below is the pass that matters. A
        # reader can't starve the loop for long: it runs only as fast as bytes arrive.
        await anyio.lowlevel.checkpoint_if_cancelled()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = self._sock.recv(max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
            except OSError as exc:
                if self._closed:
                    raise anyio.ClosedResourceError from None
                raise anyio.BrokenResourceError from exc
            else:
                if not data:
                    raise anyio.EndOfStream
                return data

    async def send(self, item: bytes) -> None:
        """Send all of ``item``, waiting while the socket buffer is full."""
        # As in receive: a send that fits in the socket buffer costs no loop pass.
        await anyio.lowlevel.checkpoint_if_cancelled()
        with self.thread_writes.lock:
            held = self.thread_writes.take_held()
        if held:
            await self._send_all(held)
        await self._send_all(item)

    async def _send_all(self, item: bytes | memoryview) -> None:
        view = memoryview(item).cast("B")
        lock = self.thread_writes.lock
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                with lock:
                    sent = self._sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
            except OSError as exc:
                if self._closed:
                    raise anyio.ClosedResourceError from None
                raise anyio.BrokenResourceError from exc
            else:
                view = view[sent:]

    def write_from_thread(self, data: bytes, busy: Callable[[], bool]) -> bool:
        """From a thread other than the loop's: send ``data`` (one whole frame) at once
        if ``busy()`` says no frame is half-written (``hipr.transports.thread_writes``);
        False, with nothing sent, otherwise."""
        return self.thread_writes.write(data, busy, _nothing_queued)

    def reserve_native_write(self, busy: Callable[[], bool]) -> int:
        """On the loop: a descriptor a native call may send one whole frame to, this
        stream's writes held back until :meth:`native_written`; -1 when it may not now
        (``ThreadWrites.reserve``)."""
        return self.thread_writes.reserve(busy, _nothing_queued)

    def native_written(self, data: bytes, sent: int) -> None:
        """After :meth:`reserve_native_write`: ``sent`` bytes of ``data`` left (0 or a
        negative ``-errno``: none); the rest goes first with the next write."""
        self.thread_writes.reserved_written(data, sent)

    @property
    def thread_write_held(self) -> bool:
        """True while the rest of a frame a thread began waits unsent."""
        return bool(self.thread_writes.held)

    async def flush_thread_write(self) -> None:
        """Send the rest of a frame that :meth:`write_from_thread` began, if the socket
        took only part of it (call before the connection's next frame, under its send
        lock)."""
        with self.thread_writes.lock:
            held = self.thread_writes.take_held()
        if held:
            await self._send_all(held)

    async def send_eof(self) -> None:
        """Half-close: the peer reads end of stream, and can still send to us."""
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise anyio.ClosedResourceError
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    async def aclose(self) -> None:
        """Close; a task waiting in ``receive``/``send`` gets ``ClosedResourceError``."""
        if not self._closed:
            self._closed = True
            with self.thread_writes.lock:
                self.thread_writes.close()
            anyio.notify_closing(self._sock)
            self._sock.close()
        await anyio.lowlevel.checkpoint()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """anyio's ``SocketAttribute`` family (addresses, ports for TCP, raw socket), and
        the stream's capability to take writes from other threads."""
        return {
            **socket_attributes(self._sock, connected=True),
            TransportAttribute.thread_writer: lambda: self,
        }


def _nothing_queued() -> int:
    """A plain socket stream keeps no bytes of its own waiting to be sent."""
    return 0


async def socket_stream(sock: socket.socket) -> ByteStream:
    """A connected stream socket as the cheapest ``ByteStream`` for the running loop:
    the loop's own transport under asyncio and uvloop (``hipr.transports.loop_stream``),
    :class:`UnixSocketStream` (non-blocking socket and ``wait_readable``) under trio. Works
    for any stream socket family, TCP included."""
    if sniffio.current_async_library() == "asyncio":
        return await open_loop_stream(sock)
    return UnixSocketStream(sock)


class UnixSocketListener(SocketListener):
    """A listening Unix socket that removes its socket file when closed.

    It removes the file only while it is still the one this listener bound (same inode),
    so a worker that replaced a stale socket is not cut off by the old one's shutdown.
    """

    def __init__(self, sock: socket.socket, path: Path) -> None:
        super().__init__(sock, _accepted, f"unix://{path}")
        self.path = path
        st = path.lstat()
        self._identity = (st.st_dev, st.st_ino)

    def _on_closed(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self._identity:
            self.path.unlink(missing_ok=True)


def _is_live_socket(path: Path) -> bool:
    """Whether a process accepts connections on the socket at ``path`` right now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
        return True


def _bind(path: Path, mode: int) -> socket.socket:
    """Bind and listen at ``path``, replacing a stale socket file and nothing else.

    A live socket means another worker serves there: taking its path would cut its
    clients off silently, so that is an error. Anything not a socket is the user's file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(
                errno.EEXIST,
                f"cannot listen on unix://{path}: the path exists and is not a socket; "
                "refusing to remove it",
                os.fspath(path),
            )
        if _is_live_socket(path):
            raise OSError(
                errno.EADDRINUSE,
                f"cannot listen on unix://{path}: another process is already listening "
                "there (is another worker running?)",
            )
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        # chmod before listen(): no client can connect while the socket still has the
        # umask's permissions.
        os.chmod(path, mode)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on unix://{path}: {exc.strerror or exc}") from exc
    return sock


#: The send buffer asked for on both ends of a Unix connection (the kernel caps it at
#: twice ``net.core.wmem_max``). Linux's default, 208 KiB, holds 1/20 of a bulk chunk: a
#: sender then stops each time the reader pauses between chunks. A plain blocking stream
#: gains as much, which is why the benchmarks' floor sizes its sockets the same way
#: (``size_send_buffer``); the figures are in benchmarks/README.md ("Measurement notes").
#: A Unix socket takes memory for the bytes in flight only, so an idle link costs
#: nothing more. (TCP keeps the kernel's autotuning, which a fixed size would disable.)
SEND_BUFFER_BYTES = 1 << 20


def size_send_buffer(sock: socket.socket) -> None:
    """Ask for :data:`SEND_BUFFER_BYTES` of send buffer on a Unix stream socket (best
    effort: a kernel that refuses leaves its default)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)


def _connect_blocking(path: str, time_limit: float | None) -> BlockingSocket:
    sock = BlockingSocket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        size_send_buffer(sock)
        sock.settimeout(time_limit)
        sock.connect(path)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


async def _accepted(sock: socket.socket) -> ByteStream:
    size_send_buffer(sock)
    return await socket_stream(sock)


def connect_unix_socket(path: str, target: str, time_limit: float | None) -> BlockingSocket:
    """The blocking twin of :func:`open_unix_stream`: the same errors, naming ``target``.

    The socket blocks without a time limit once connected; its description is ``target``.
    """
    with connect_errors(target, time_limit):
        sock = _connect_blocking(path, time_limit)
    sock.description = target
    return sock


async def open_unix_stream(path: str, target: str, time_limit: float | None) -> ByteStream:
    """Connect to the socket at ``path``; failures become ``HipConnectionError`` naming
    ``target``.

    The connect runs in a worker thread: a Unix connect is quick, except when the
    listener's backlog is full, and then a blocking connect with a timeout is the
    simple correct way to wait (non-blocking it fails with EAGAIN rather than waiting).
    """
    with connect_errors(target, time_limit), anyio.fail_after(time_limit):
        sock = await anyio.to_thread.run_sync(
            _connect_blocking, path, time_limit, abandon_on_cancel=True
        )
    return await socket_stream(sock)


class UnixTransport:
    """``unix:///abs/path``: listen and connect on a Unix domain socket.

    Listening creates the parent directory when missing, replaces a stale socket file
    (never a regular file, nor a socket a live process serves), sets the socket's mode to
    ``config.unix_socket_mode`` and removes the socket file on close. Connect option:
    ``connect_timeout``.
    """

    scheme: ClassVar[str] = "unix"

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        """Bind and listen on the URL's path."""
        path = socket_path(url)
        sock = await anyio.to_thread.run_sync(_bind, path, config.unix_socket_mode)
        return UnixSocketListener(sock, path)

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        """Connect to the socket at the URL's path."""
        return await open_unix_stream(*_connect_args(url, options))

    def connect_blocking(self, url: TransportUrl, **options: Any) -> BlockingSocket:
        """The blocking twin of :meth:`connect`: same options, defaults and errors."""
        return connect_unix_socket(*_connect_args(url, options))


def _connect_args(url: TransportUrl, options: dict[str, Any]) -> tuple[str, str, float | None]:
    """``(path, target, time_limit)`` of a ``unix://`` connect."""
    path = socket_path(url)
    opts = merge_options(url, options, _CONNECT_OPTIONS)
    return os.fspath(path), f"unix://{path}", connect_timeout_option(opts)
