"""How the sync client moves bytes on its stream: reads that wait, and sends.

A plain socket (tcp, unix, ssh's forwarded socket) is read with one blocking ``recv``
whose time limit is the kernel's (``SO_RCVTIMEO``), polled with one
``recv(MSG_DONTWAIT)``, and written with ``send(MSG_DONTWAIT)``, waiting in ``poll()``
only when the socket's buffer is full. A Python-level socket timeout would put a
``poll()`` in front of every ``recv`` and ``send`` (CPython waits for readiness before
each call on a socket with a timeout); on a virtual machine each such syscall, and a
wake-up from ``poll`` rather than from ``recv``, was a measurable part of a round trip
(``python -m benchmarks.stages`` prints both ways of waiting). A send into a link that
stopped moving still fails after ``heartbeat_timeout`` without room, as before (the
kernel's ``SO_SNDTIMEO`` would not do: a link that trickles returns a few bytes per
timeout and never fails).

TLS streams (and any stream that is not a plain socket) keep the general way: ``poll()``
for readiness, then ``recv_into``, under the send lock for TLS, whose connection object
must not be used from two threads at once; sends with the stream's own timeout.
"""

from __future__ import annotations

import select
import socket
import struct
import sys
import threading
from typing import Protocol

from hipr.transports.base import BlockingStream

#: ``struct timeval`` as the kernel's socket options take it (two C longs on Linux;
#: on macOS the padded layout of a long and an int reads the same).
_TIMEVAL = struct.Struct("@ll")


class StreamIO(Protocol):
    """Reads from one stream on behalf of the connection's reading thread, and sends on
    it under the connection's send lock."""

    def read(self, buffer: bytearray | memoryview, timeout: float | None) -> int | None:
        """Bytes received into ``buffer`` (0 at end of stream), waiting at most
        ``timeout`` seconds (None: no limit; 0: only what has arrived); None when
        nothing came in time. Raises OSError when the link failed."""
        ...

    def read_more(self, view: memoryview) -> int:
        """More of a frame under way into ``view`` (0 at end of stream), waiting up to the
        link's own timeout: a caller's deadline never cuts a frame in half. Raises
        OSError when the link failed or stopped moving."""
        ...

    def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send all of ``data``. Raises OSError when the link failed, or found no room
        for the link's own timeout (a slow link may take as long as it needs)."""
        ...

    def wait_readable(self, timeout: float) -> bool:
        """Wait until bytes can be read, at most ``timeout`` seconds and never much
        longer (a nap before an expected reply): True when they can, False on
        timeout. Reads nothing."""
        ...


def io_for(stream: BlockingStream, send_lock: threading.RLock, link_timeout: float) -> StreamIO:
    """The I/O for ``stream``; sets the stream's timeouts as it needs them
    (``link_timeout`` bounds a send's wait for room, and a read inside a frame)."""
    if (
        isinstance(stream, socket.socket)
        and not hasattr(stream, "pending")  # ssl.SSLSocket
        and sys.platform != "win32"
    ):
        return SocketIO(stream, link_timeout)
    return PolledIO(stream, send_lock, link_timeout)


class SocketIO:
    """A plain socket in blocking mode, with kernel time limits (see the module doc)."""

    __slots__ = (
        "_arrival",
        "_limit",
        "_link_timeout",
        "_recv_into",
        "_room",
        "_send",
        "_socket",
    )

    def __init__(self, sock: socket.socket, link_timeout: float) -> None:
        self._socket = sock
        self._link_timeout = link_timeout
        sock.settimeout(None)
        #: The SO_RCVTIMEO last set, so that a wait with the same limit costs no syscall.
        self._limit: float | None = -1.0
        self._recv_into = sock.recv_into
        self._send = sock.send
        #: Waits for room to send (used under the send lock only: one poll at a time).
        self._room = select.poll()
        self._room.register(sock.fileno(), select.POLLOUT)
        #: Waits for bytes to read where select() cannot (a descriptor past FD_SETSIZE).
        self._arrival = select.poll()
        self._arrival.register(sock.fileno(), select.POLLIN)

    def _wait_at_most(self, timeout: float | None) -> None:
        if timeout != self._limit:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
            self._limit = timeout

    def read(self, buffer: bytearray | memoryview, timeout: float | None) -> int | None:
        """See :meth:`StreamIO.read`."""
        try:
            if timeout is not None and timeout <= 0:
                return self._recv_into(buffer, 0, socket.MSG_DONTWAIT)
            self._wait_at_most(timeout)
            return self._recv_into(buffer)
        except BlockingIOError:
            return None

    def read_more(self, view: memoryview) -> int:
        """See :meth:`StreamIO.read_more`."""
        self._wait_at_most(self._link_timeout)
        try:
            return self._recv_into(view)
        except BlockingIOError:
            raise TimeoutError(
                f"no bytes of a frame under way for {self._link_timeout} s"
            ) from None

    def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """See :meth:`StreamIO.send_all`."""
        view = memoryview(data)
        total = view.nbytes
        try:
            sent = self._send(view, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent == total:
            return
        view = view.cast("B")
        while sent < total:
            if not self._room.poll(self._link_timeout * 1000):
                raise TimeoutError(f"no room to send for {self._link_timeout} s")
            try:
                sent += self._send(view[sent:], socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass

    def wait_readable(self, timeout: float) -> bool:
        """See :meth:`StreamIO.wait_readable`."""
        return _readable(self._socket.fileno(), self._arrival, timeout)


class PolledIO:
    """Any blocking stream: ``poll()`` for readiness, then ``recv_into`` (TLS under the
    send lock; bytes TLS already decrypted are seen without polling); sends with the
    stream's own timeout."""

    __slots__ = ("_lock", "_poller", "_stream", "_tls")

    def __init__(
        self, stream: BlockingStream, send_lock: threading.RLock, link_timeout: float
    ) -> None:
        self._stream = stream
        self._lock = send_lock
        self._tls = hasattr(stream, "pending")
        # The Python-level timeout bounds each wait for room to send, and a read's wait
        # inside the stream.
        stream.settimeout(link_timeout)
        self._poller = select.poll()
        self._poller.register(stream.fileno(), select.POLLIN)

    def read(self, buffer: bytearray | memoryview, timeout: float | None) -> int | None:
        """See :meth:`StreamIO.read`."""
        if not self._decrypted() and not self._poller.poll(
            None if timeout is None else timeout * 1000
        ):
            return None
        return self.read_more(memoryview(buffer))

    def read_more(self, view: memoryview) -> int:
        """See :meth:`StreamIO.read_more`."""
        if self._tls:
            with self._lock:
                return self._stream.recv_into(view)
        return self._stream.recv_into(view)

    def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """See :meth:`StreamIO.send_all`. ``send`` rather than ``sendall``: the timeout
        then bounds each wait for room, not the whole transfer (``sendall``'s would cut a
        large chunk short on a slow link)."""
        stream = self._stream
        sent = stream.send(data)
        if sent == len(data):
            return
        view = memoryview(data).cast("B")[sent:]
        while view:
            view = view[stream.send(view) :]

    def wait_readable(self, timeout: float) -> bool:
        """See :meth:`StreamIO.wait_readable` (bytes TLS already decrypted count)."""
        return bool(self._decrypted()) or _readable(self._stream.fileno(), self._poller, timeout)

    def _decrypted(self) -> int:
        pending = getattr(self._stream, "pending", None)
        return int(pending()) if pending is not None else 0


#: select() takes descriptors below this only (glibc's FD_SETSIZE).
_SELECT_LIMIT = 1024


def _readable(fd: int, poller: select.poll, timeout: float) -> bool:
    """Wait at most ``timeout`` s for ``fd`` to be readable. select() where it can, for
    its microsecond timeout; else ``poller`` (registered for POLLIN), whose timeout is in
    whole milliseconds, rounded down so that a nap never overruns."""
    timeout = max(0.0, timeout)
    if fd < _SELECT_LIMIT:
        return bool(select.select([fd], [], [], timeout)[0])
    return bool(poller.poll(int(timeout * 1000)))


def _timeval(seconds: float | None) -> bytes:
    """``seconds`` as a socket option's timeval: None is no limit (0 to the kernel), and a
    positive time never rounds down to that."""
    if seconds is None:
        return _TIMEVAL.pack(0, 0)
    micros = max(1, round(seconds * 1e6))
    return _TIMEVAL.pack(micros // 1_000_000, micros % 1_000_000)
