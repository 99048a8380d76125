"""Small frames written to a connection's socket from a thread other than its loop's.

When a worker session's GPU thread sees a synchronize end, it can put the reply on the
wire itself instead of waking the event loop to do it: on the H100 host that wake-up
and the loop's pass cost 50-100 µs between a kernel's end and its reply. The loop
keeps every other write, and the two never mix:

- every write, the loop's and the thread's, is one syscall under one lock, and the
  thread never waits for that lock (it gives up and lets the loop send instead);
- the thread writes only while nothing the loop wrote still waits in the transport's
  buffer and the connection has no frame half-written (the caller's ``busy``), so a
  frame is never split and replies keep their order;
- the thread writes to a duplicate of the socket's descriptor, made on first use, so
  that a connection closed meanwhile (its descriptor closed, its number perhaps reused
  for another client) can only make the write fail, never reach someone else;
- a frame the socket takes only in part keeps its rest here: the loop's next write
  sends it first, and the connection flushes it as soon as its loop runs.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

__all__ = ["ThreadWrites"]


class ThreadWrites:
    """The lock and the thread's descriptor of one connection's socket (module doc).

    The loop side holds :attr:`lock` around each of its own writes and first sends
    :meth:`take_held` when :attr:`held` is not empty."""

    __slots__ = ("_closed", "_dup", "_sock", "held", "lock")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._dup: socket.socket | None = None
        #: The unsent rest of a frame the thread began (read it under :attr:`lock`).
        self.held = b""
        self._closed = False
        self.lock = threading.Lock()

    def write(self, data: bytes, busy: Callable[[], bool], queued: Callable[[], int]) -> bool:
        """From any thread: start sending ``data`` (one whole frame) now; True when it
        is on its way (the rest held here if the socket took only part). False, with
        nothing sent, when the loop is writing, ``busy()`` (a frame half-written),
        ``queued()`` bytes wait unsent in the loop's transport, the stream is closed or
        the socket takes nothing: the caller then sends it the usual way."""
        lock = self.lock
        if not lock.acquire(blocking=False):
            return False
        try:
            dup = self._descriptor(busy, queued)
            if dup is None:
                return False
            try:
                sent = dup.send(data, socket.MSG_DONTWAIT)
            except OSError:  # no room at all, or the link is gone: the loop finds out
                return False
            if sent < len(data):
                self.held = data[sent:]
            return True
        finally:
            lock.release()

    def reserve(self, busy: Callable[[], bool], queued: Callable[[], int]) -> int:
        """The descriptor a native call may send one whole frame to (the GPU thread's
        duplicate), with every other write held back until :meth:`reserved_written`; -1,
        holding nothing, where :meth:`write` would send nothing now. For the loop's own
        native launch-and-wait (``hipr.backends._launch_wait``), which sends a reply the
        moment its kernel is seen done."""
        if not self.lock.acquire(blocking=False):
            return -1
        try:
            dup = self._descriptor(busy, queued)
        except OSError:
            dup = None
        if dup is None:
            self.lock.release()
            return -1
        return dup.fileno()

    def reserved_written(self, data: bytes, sent: int) -> None:
        """After :meth:`reserve`: the socket took ``sent`` bytes of ``data`` (0 or a
        negative ``-errno``: none); the rest is held for the loop's next write. Other
        writes go on."""
        try:
            if 0 < sent < len(data):
                self.held = data[sent:]
        finally:
            self.lock.release()

    def _descriptor(
        self, busy: Callable[[], bool], queued: Callable[[], int]
    ) -> socket.socket | None:
        """The duplicate to write a frame to now (made on first use); None when nothing
        may be written from here now. Call with :attr:`lock` held."""
        if self._closed or self.held or busy() or queued():
            return None
        dup = self._dup
        if dup is None:
            dup = self._dup = self._sock.dup()
        return dup

    def take_held(self) -> bytes:
        """The rest of a frame the thread began (b"" if none), now the loop's to send
        before anything else. Call with :attr:`lock` held."""
        held, self.held = self.held, b""
        return held

    def close(self) -> None:
        """No more thread writes; drops the duplicate descriptor. Call with :attr:`lock`
        held, before the stream's own socket closes."""
        self._closed = True
        self.held = b""
        if self._dup is not None:
            self._dup.close()
            self._dup = None
