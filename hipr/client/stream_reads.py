"""How the sync client waits for bytes on its stream.

A plain socket (tcp, unix, ssh's forwarded socket) is read with one blocking
``recv`` whose time limit is the kernel's (``SO_RCVTIMEO``), and polled with one
``recv(MSG_DONTWAIT)``. A Python-level socket timeout would put a ``poll()`` in front of
every ``recv`` and ``send`` (CPython waits for readiness before each call on a socket
with a timeout); on a virtual machine each such syscall, and a wake-up from ``poll``
rather than from ``recv``, was a measurable part of a round trip
(``python -m benchmarks.stages`` prints both ways of waiting). Sends keep their bound
through ``SO_SNDTIMEO``, so a send into a link that stopped moving still fails after
``heartbeat_timeout``.

TLS streams (and any stream that is not a plain socket) keep the general way: ``poll()``
for readiness, then ``recv_into``, under the send lock for TLS, whose connection object
must not be used from two threads at once.
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


class StreamReader(Protocol):
    """Reads from one stream on behalf of the connection's reading thread."""

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


def reader_for(
    stream: BlockingStream, send_lock: threading.RLock, link_timeout: float
) -> StreamReader:
    """The reader for ``stream``; sets the stream's timeouts as that reader needs them
    (``link_timeout`` bounds a send, and a read in the middle of a frame)."""
    if (
        isinstance(stream, socket.socket)
        and not hasattr(stream, "pending")  # ssl.SSLSocket
        and sys.platform != "win32"
    ):
        return SocketReader(stream, link_timeout)
    return PolledReader(stream, send_lock, link_timeout)


class SocketReader:
    """A plain socket in blocking mode, with kernel time limits (see the module doc)."""

    __slots__ = ("_limit", "_link_timeout", "_recv_into", "_socket")

    def __init__(self, sock: socket.socket, link_timeout: float) -> None:
        self._socket = sock
        self._link_timeout = link_timeout
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(link_timeout))
        #: The SO_RCVTIMEO last set, so that a wait with the same limit costs no syscall.
        self._limit: float | None = -1.0
        self._recv_into = sock.recv_into

    def _wait_at_most(self, timeout: float | None) -> None:
        if timeout != self._limit:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
            self._limit = timeout

    def read(self, buffer: bytearray | memoryview, timeout: float | None) -> int | None:
        """See :meth:`StreamReader.read`."""
        try:
            if timeout is not None and timeout <= 0:
                return self._recv_into(buffer, 0, socket.MSG_DONTWAIT)
            self._wait_at_most(timeout)
            return self._recv_into(buffer)
        except BlockingIOError:
            return None

    def read_more(self, view: memoryview) -> int:
        """See :meth:`StreamReader.read_more`."""
        self._wait_at_most(self._link_timeout)
        try:
            return self._recv_into(view)
        except BlockingIOError:
            raise TimeoutError(
                f"no bytes of a frame under way for {self._link_timeout} s"
            ) from None


class PolledReader:
    """Any blocking stream: ``poll()`` for readiness, then ``recv_into`` (TLS under the
    send lock; bytes TLS already decrypted are seen without polling)."""

    __slots__ = ("_lock", "_poller", "_stream", "_tls")

    def __init__(
        self, stream: BlockingStream, send_lock: threading.RLock, link_timeout: float
    ) -> None:
        self._stream = stream
        self._lock = send_lock
        self._tls = hasattr(stream, "pending")
        # The Python-level timeout bounds a send, and a read's wait inside the stream.
        stream.settimeout(link_timeout)
        self._poller = select.poll()
        self._poller.register(stream.fileno(), select.POLLIN)

    def read(self, buffer: bytearray | memoryview, timeout: float | None) -> int | None:
        """See :meth:`StreamReader.read`."""
        if not self._decrypted() and not self._poller.poll(
            None if timeout is None else timeout * 1000
        ):
            return None
        return self.read_more(memoryview(buffer))

    def read_more(self, view: memoryview) -> int:
        """See :meth:`StreamReader.read_more`."""
        if self._tls:
            with self._lock:
                return self._stream.recv_into(view)
        return self._stream.recv_into(view)

    def _decrypted(self) -> int:
        pending = getattr(self._stream, "pending", None)
        return int(pending()) if pending is not None else 0


def _timeval(seconds: float | None) -> bytes:
    """``seconds`` as a socket option's timeval: None is no limit (0 to the kernel), and a
    positive time never rounds down to that."""
    if seconds is None:
        return _TIMEVAL.pack(0, 0)
    micros = max(1, round(seconds * 1e6))
    return _TIMEVAL.pack(micros // 1_000_000, micros % 1_000_000)
