"""The chunks of a session's striped uploads (protocol 1.4), on their way from the data
links' threads (``hipr.worker.data_links``) to the upload's handler.

An upload of hundreds of MiB over one socket is bound by one thread's reads of it: the
kernel's copy into the worker's memory, ~0.25 s of CPU per GiB on the GPU hosts
(docs/gpu-runs/2026-11-26-off-loop-receive.txt). A striped upload's chunks come on
several data links at once, each read by a thread of its own, and meet here: a thread
delivers a chunk under its request id, the handler takes them as they come. Chunks may
come before their request runs (they are held), after it ended (dropped), or twice (a
resend after a data link broke; the handler counts each offset once). What the session
holds is bounded: a thread that would hold more waits, and its link stops being read.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple, Protocol

from hipr.sessions.loop_wakeup import LoopWaker, OneShot

__all__ = ["STRIPE_HOLD_BYTES", "DataLinkEnd", "DataLinkEnded", "StripeChunk", "StripeInbox"]

#: Bytes of chunks a session holds before its handler takes them: data links beyond it
#: wait (4 links of 4 MiB chunks, each with one more on the way, fit twice over).
STRIPE_HOLD_BYTES = 32 << 20
#: Request ids remembered as finished, so that a late resend of their chunks is dropped.
_FINISHED_KEPT = 64


class StripeChunk(NamedTuple):
    """One chunk of a striped upload: where it goes in the upload, and its bytes."""

    offset: int
    data: memoryview


class DataLinkEnded(Exception):
    """A data link ended: the peer closed it, broke the rules of one (the message says
    how), or stopped reading it."""


class DataLinkEnd(Protocol):
    """What the session needs of one of its data links (``hipr.worker.data_links``)."""

    def close(self) -> None:
        """End the link."""
        ...

    def send_chunk(self, request_id: int, offset: int, data: memoryview) -> None:
        """Send a striped download's chunk on the link (blocking; from a thread);
        DataLinkEnded when the link cannot take it."""
        ...


class StripeInbox:
    """A session's striped-upload chunks and its data links (module doc). Thread-safe."""

    def __init__(
        self, chunk_bytes: int = 4 << 20, stall_seconds: float = 30.0, hold_bytes: int = 0
    ) -> None:
        #: The chunk size of striped uploads (HELLO's ``chunk_bytes``).
        self.chunk_bytes = chunk_bytes
        #: Seconds an upload waits for its next chunk before it fails as stalled.
        self.stall_seconds = stall_seconds
        self._hold_bytes = hold_bytes or STRIPE_HOLD_BYTES
        self._cond = threading.Condition()
        self._chunks: dict[int, deque[StripeChunk]] = {}
        self._held = 0
        #: Request id -> how to wake its handler (from any thread).
        self._waiting: dict[int, Callable[[], object]] = {}
        self._expected: set[int] = set()
        self._finished: deque[int] = deque(maxlen=_FINISHED_KEPT)
        self._links: list[DataLinkEnd] = []
        self._closed = False
        #: Chunks delivered, in the session's life (tests, diagnostics).
        self.chunks_delivered = 0

    # --- the data links (their threads) ----------------------------------------------
    def add_link(self, link: DataLinkEnd, limit: int) -> int | None:
        """Count ``link`` as one of the session's data links: its index, or None when
        the session holds ``limit`` already or is closed."""
        with self._cond:
            if self._closed or len(self._links) >= limit:
                return None
            self._links.append(link)
            return len(self._links) - 1

    def remove_link(self, link: DataLinkEnd) -> None:
        """``link`` ended (its thread calls this last)."""
        with self._cond:
            if link in self._links:
                self._links.remove(link)

    @property
    def links(self) -> int:
        """Data links attached now."""
        return len(self._links)

    def live_links(self) -> list[DataLinkEnd]:
        """The data links attached now, in the order they came."""
        with self._cond:
            return list(self._links)

    def expects(self, request_id: int) -> bool:
        """True while ``request_id``'s handler is taking chunks: its chunks are taken at
        once, so a thread may receive them into the worker's shared pinned buffers."""
        return request_id in self._expected

    def deliver(self, request_id: int, offset: int, data: memoryview) -> bool:
        """A data link's thread received a chunk. Waits while the session holds its
        bound; False once the session is closed (the thread then ends)."""
        with self._cond:
            while self._held >= self._hold_bytes and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self.chunks_delivered += 1
            if request_id in self._finished:
                return True  # a late resend: its upload is over
            self._chunks.setdefault(request_id, deque()).append(StripeChunk(offset, data))
            self._held += data.nbytes
            wake = self._waiting.pop(request_id, None)
        if wake is not None:
            wake()
        return True

    # --- the upload's handler (the event loop) ---------------------------------------
    @contextmanager
    def receiving(self, request_id: int) -> Iterator[None]:
        """While the handler of ``request_id`` takes its chunks; afterwards the chunks
        left (duplicates, or all of them after a failure) are dropped, and any that
        come later too."""
        with self._cond:
            self._expected.add(request_id)
        try:
            yield
        finally:
            with self._cond:
                self._expected.discard(request_id)
                self._waiting.pop(request_id, None)
                left = self._chunks.pop(request_id, None)
                if left:
                    self._held -= sum(chunk.data.nbytes for chunk in left)
                    self._cond.notify_all()
                self._finished.append(request_id)

    def take(self, request_id: int, waker: LoopWaker) -> StripeChunk | OneShot:
        """The next chunk of ``request_id``, or a wake-up to wait on for one (set when
        one is delivered, or the session closes)."""
        with self._cond:
            queue = self._chunks.get(request_id)
            if queue:
                chunk = queue.popleft()
                if not queue:
                    del self._chunks[request_id]
                self._held -= chunk.data.nbytes
                self._cond.notify_all()
                return chunk
            shot = waker.one_shot()
            if self._closed:
                shot.set()
            else:
                call_soon = waker.call_soon
                self._waiting[request_id] = lambda: call_soon(shot.set)
            return shot

    @property
    def closed(self) -> bool:
        """True once the session ended."""
        return self._closed

    def close(self) -> None:
        """The session ended: drop what is held, wake every waiting thread and handler,
        and close the data links (their threads end)."""
        with self._cond:
            self._closed = True
            self._chunks.clear()
            self._held = 0
            waiting = list(self._waiting.values())
            self._waiting.clear()
            links = list(self._links)
            self._cond.notify_all()
        for wake in waiting:
            wake()
        for link in links:
            link.close()
