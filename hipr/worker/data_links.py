"""Data links (protocol 1.4): further connections of a session that carry the chunks of
its striped copies, each read by a thread of its own (``hipr.sessions.stripes`` says
why), and written by the threads that send a striped download's chunks.

A data link starts as any connection, with DATA_LINK as its first frame in place of
HELLO; once the worker has answered, the connection's socket is taken off the event loop
and read here, blocking, by a thread. Every frame must be a chunk: DATA, flags 0, CBOR
part ``{offset}``, bulk at most ``chunk_bytes``. Anything else, or a frame that does not
arrive whole within the frame timeout, ends the link (its upload then fails as stalled
unless the client sends the chunk again on another). The chunks are received straight
into the worker's pinned payload buffers when their upload is running (the runtime DMAs
from them as they are), else into memory of their own. A striped download's chunks go
the other way (:meth:`DataLink.send_chunk`): DATA, flags REPLY, ``{offset}`` and bytes.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2

from hipr.errors import ProtocolError
from hipr.protocol.bounded_cbor import CborLimits, bounded_loads
from hipr.protocol.codec import ARGS_LENGTH, encode_frame_parts
from hipr.protocol.header import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PROTOCOL_MAJOR,
    Flags,
    version_major,
)
from hipr.protocol.opcodes import Opcode
from hipr.sessions.stripes import DataLinkEnded, StripeInbox

__all__ = ["MAX_CHUNK_ARGS", "DataLink"]

#: A chunk's CBOR part is ``{"offset": n}``: 17 bytes at most.
MAX_CHUNK_ARGS = 64
#: How often a blocked read or write wakes to check the frame under way's deadline.
_TICK = struct.pack("ll", 1, 0)
_HEAD_BYTES = HEADER_SIZE + ARGS_LENGTH.size
_decode_args = bounded_loads(CborLimits(max_items=8, max_depth=2))


class DataLink:
    """One data link of a session: its socket and the thread that reads it."""

    def __init__(
        self,
        sock: socket.socket,
        inbox: StripeInbox,
        pinned: Callable[[int], memoryview | None] | None,
        frame_timeout: float,
        log: Any,
    ) -> None:
        """``sock``: the link's connected socket, now owned here. ``pinned(size)``: a
        free pinned payload buffer of ``size`` bytes, or None (the backend's
        ``payload_buffer``; None for a backend without them)."""
        self._sock = sock
        self._inbox = inbox
        self._pinned = pinned
        self._frame_timeout = frame_timeout
        self._log = log
        self._closed = threading.Event()
        #: One chunk at a time on the wire (downloads are sent from several threads).
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hipr-data-link", daemon=True)
        #: Chunks received (tests, diagnostics).
        self.chunks = 0

    def start(self) -> None:
        """Read the link on its own thread until it ends."""
        self._sock.setblocking(True)
        # A blocked read or write wakes every second, to give up on a frame that
        # trickles (in, or out to a client that stopped reading).
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TICK)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TICK)
        self._thread.start()

    def close(self) -> None:
        """End the link: its thread's read returns, and the thread closes the socket."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone

    def send_chunk(self, request_id: int, offset: int, data: memoryview) -> None:
        """Send one chunk of a striped download (blocking; from a worker thread, never the
        event loop). DataLinkEnded if the link ended or the client stopped reading it for
        longer than the frame timeout."""
        parts: list[Any] = encode_frame_parts(
            Opcode.DATA, request_id, Flags.REPLY, {"offset": offset}, data
        )
        views = [memoryview(part).cast("B") for part in parts]
        limit = self._frame_timeout + data.nbytes / (1 << 20)
        with self._send_lock:
            try:
                self._send_views(views, limit)
            except DataLinkEnded:
                self.close()  # a frame cut short: nothing more can follow it on this link
                raise

    def _send_views(self, views: list[memoryview], limit: float) -> None:
        """Write every byte of ``views``; DataLinkEnded on failure or after ``limit``
        seconds of the client not reading."""
        started = time.monotonic()
        while views:
            if self._closed.is_set():
                raise DataLinkEnded("the data link ended")
            try:
                sent = self._sock.sendmsg(views)
            except (BlockingIOError, TimeoutError):
                sent = 0  # the write's tick: the client read nothing for a second
            except OSError as exc:
                raise DataLinkEnded(f"the data link failed: {exc}") from None
            while sent and views:
                if sent >= views[0].nbytes:
                    sent -= views.pop(0).nbytes
                else:
                    views[0] = views[0][sent:]
                    sent = 0
            if views and time.monotonic() - started > limit:
                raise DataLinkEnded("the client did not read a chunk within the frame timeout")

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (tests)."""
        self._thread.join(timeout)

    # --- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._next_chunk():
                pass
        except DataLinkEnded as ended:
            if str(ended):
                self._log.warning("data link ended", reason=str(ended))
        except OSError as exc:
            if not self._closed.is_set():
                self._log.info("data link lost", error=repr(exc))
        except Exception:  # a bug must end this link, never pass silently
            self._log.exception("data link failed")
        finally:
            self._inbox.remove_link(self)
            self._closed.set()
            # Never while a download's chunk is being written from another thread: the
            # descriptor could be reused by a new connection under that write.
            with self._send_lock:
                self._sock.close()

    def _next_chunk(self) -> bool:
        """Receive one chunk and deliver it; False once the session is closed."""
        head = bytearray(_HEAD_BYTES)
        if not self._receive_into(memoryview(head), idle_ok=True):
            raise DataLinkEnded("")  # closed between frames: the usual end
        magic, version, opcode, request_id, flags, length = HEADER.unpack_from(head)
        (args_length,) = ARGS_LENGTH.unpack_from(head, HEADER_SIZE)
        chunk_bytes = self._inbox.chunk_bytes
        if magic != MAGIC or version_major(version) != PROTOCOL_MAJOR:
            raise DataLinkEnded("not a hipr frame")
        if opcode != Opcode.DATA or flags != 0:
            raise DataLinkEnded(f"a data link carries DATA chunks only (opcode {opcode:#06x})")
        if not 0 < args_length <= MAX_CHUNK_ARGS:
            raise DataLinkEnded(f"a chunk's CBOR part is {args_length} bytes")
        size = length - ARGS_LENGTH.size - args_length
        if not 0 < size <= chunk_bytes:
            raise DataLinkEnded(f"a chunk of {size} bytes (at most {chunk_bytes})")
        started = time.monotonic()
        raw = bytearray(args_length)
        self._receive_into(memoryview(raw), started=started, size=size)
        try:
            args = _decode_args(raw)
        except (ProtocolError, cbor2.CBORError) as exc:
            raise DataLinkEnded(f"a chunk's CBOR part does not decode: {exc}") from None
        offset = args.get("offset") if isinstance(args, dict) else None
        if type(offset) is not int or offset < 0 or offset % chunk_bytes:
            raise DataLinkEnded(f"a chunk's offset must be a multiple of {chunk_bytes}")
        buffer = None
        if self._pinned is not None and self._inbox.expects(request_id):
            buffer = self._pinned(size)
        if buffer is None:
            buffer = memoryview(bytearray(size))
        self._receive_into(buffer, started=started, size=size)
        self.chunks += 1
        return self._inbox.deliver(request_id, offset, buffer)

    def _receive_into(
        self, view: memoryview, *, idle_ok: bool = False, started: float = 0.0, size: int = 0
    ) -> bool:
        """Fill ``view`` from the socket; False at end of stream before its first byte
        when ``idle_ok`` (between frames, where waiting has no limit)."""
        sock = self._sock
        got = 0
        # As the event loop's links: the frame timeout, plus a second per MiB.
        limit = self._frame_timeout + size / (1 << 20)
        while got < view.nbytes:
            try:
                n = sock.recv_into(view[got:], view.nbytes - got, socket.MSG_WAITALL)
            except (BlockingIOError, TimeoutError):
                n = -1  # the read's tick: nothing arrived for a second
            if n == 0:
                if got == 0 and idle_ok:
                    return False
                raise DataLinkEnded("the link closed inside a frame")
            if n > 0:
                if got == 0 and idle_ok:
                    started = time.monotonic()
                got += n
            if self._closed.is_set():
                raise DataLinkEnded("")
            if (got or not idle_ok) and time.monotonic() - (started or time.monotonic()) > limit:
                raise DataLinkEnded("a frame did not arrive whole within the frame timeout")
        return True
