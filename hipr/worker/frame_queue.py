"""Requests read off a connection and waiting for its executor, in order, bounded in bytes.

A plain deque and one wake-up per wait: an anyio memory stream spends an extra
event-loop pass and several backend look-ups per item, a measurable part of each small
request's round trip. The reader (push or pull) bounds the queue: it counts each frame's
charge in :attr:`FrameQueue.inflight` and holds back at :data:`READ_AHEAD_BYTES`.
"""

from __future__ import annotations

from collections import deque

import anyio

from hipr.protocol.codec import Frame
from hipr.protocol.header import Flags
from hipr.sessions.loop_wakeup import LoopWaker, OneShot

__all__ = ["READ_AHEAD_BYTES", "FrameQueue"]

#: Request bytes read ahead of the executor per connection: overlap for pipelined
#: copies and batches of small frames, with bounded memory.
READ_AHEAD_BYTES = 16 << 20
_NO_REPLY = int(Flags.NO_REPLY)


class FrameQueue:
    """Frames from a connection's reader to its executor, in order (module doc)."""

    __slots__ = ("_closed", "_frames", "_loop", "_waiter", "drained", "inflight")

    def __init__(self) -> None:
        self._frames: deque[Frame] = deque()
        self._waiter: OneShot | None = None
        self._closed = False
        #: Looked up once: the loop the executor waits on (None under trio).
        self._loop = LoopWaker().asyncio_loop
        #: Request bytes read but not yet taken by the executor (max_inflight_bytes),
        #: each frame counted for at least ``fairness.FRAME_COST``.
        self.inflight = 0
        #: Set (and replaced) by the executor when :attr:`inflight` falls back under
        #: the read-ahead bound.
        self.drained = anyio.Event()

    def put(self, frame: Frame) -> None:
        """Queue ``frame`` and wake the executor if it waits."""
        self._frames.append(frame)
        if self._waiter is not None:
            self._waiter.set()

    def close(self) -> None:
        """No more frames: a waiting executor gets ``EndOfStream`` once the queue is empty."""
        self._closed = True
        if self._waiter is not None:
            self._waiter.set()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._closed

    @property
    def queued(self) -> bool:
        """True while frames wait for the executor."""
        return bool(self._frames)

    @property
    def executor_waiting(self) -> bool:
        """True while the executor waits for a frame and none is queued."""
        return self._waiter is not None and not self._frames

    def take(self) -> Frame | None:
        """The next frame if one is queued, without waiting."""
        return self._frames.popleft() if self._frames else None

    def fire_and_forget_next(self) -> bool:
        """True when the next queued frame asks for no reply (a launch in a stream of
        launches, say), False when it waits for one or nothing is queued."""
        # int(): IntFlag's own ``&`` runs Python-level enum code on every request.
        return bool(self._frames) and bool(int(self._frames[0].header.flags) & _NO_REPLY)

    async def get(self) -> Frame:
        """The next frame, waiting for one; ``EndOfStream`` after :meth:`close`."""
        while not self._frames:
            if self._closed:
                raise anyio.EndOfStream
            self._waiter = OneShot(self._loop)
            try:
                await self._waiter.wait()
            finally:
                self._waiter = None
        return self._frames.popleft()
