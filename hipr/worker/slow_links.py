"""Slow links: a frame, once begun, must arrive whole within a bounded time.

A link's silence clock is reset by every byte that arrives, so a peer that drips one
byte every few seconds would hold its connection (and its buffers) forever. The
connection's heartbeat asks :class:`FrameClock` at each tick whether the frame under way
has been under way too long: ``frame_timeout`` seconds, plus one for every MiB of its
payload, so that a large chunk on a slow but honest link still arrives.
"""

from __future__ import annotations

#: What the heartbeat passes while a frame's header itself is incomplete.
HEADER_UNDER_WAY = object()
#: The slowest rate at which a large payload is still waited for: a second per MiB.
BYTES_PER_SECOND = 1 << 20


class FrameClock:
    """Times the frame under way, as the heartbeat sees it tick by tick."""

    __slots__ = ("_since", "_under_way", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._under_way: object | None = None
        self._since = 0.0

    def overdue(self, now: float, under_way: object | None, payload_length: int = 0) -> bool:
        """True once the same frame (``under_way``: its header object, or
        :data:`HEADER_UNDER_WAY`) has been under way longer than allowed; None passed
        means no frame is under way, or the link is held back by the worker itself."""
        if under_way is None or under_way is not self._under_way:
            self._under_way = under_way
            self._since = now
            return False
        return now - self._since > self.timeout + payload_length / BYTES_PER_SECOND
