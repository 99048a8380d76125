"""The worker's memory of recent replies, so a resent request is answered, not rerun."""

from __future__ import annotations

from collections import OrderedDict

#: Replies kept per session; a client waits for replies, so few are ever outstanding.
MAX_REPLIES = 512
#: Bytes of replies kept per session; larger replies are not kept (see ``put``).
MAX_REPLY_BYTES = 16 << 20
MAX_ONE_REPLY = 4 << 20


class ReplyCache:
    """The encoded reply frames of a session's most recent requests, by request id."""

    def __init__(self, max_replies: int = MAX_REPLIES, max_bytes: int = MAX_REPLY_BYTES) -> None:
        self.max_replies = max_replies
        self.max_bytes = max_bytes
        self._replies: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._replies)

    def put(self, request_id: int, frames: bytes) -> bool:
        """Keep ``frames`` for ``request_id``; False when too large to keep."""
        size = len(frames)
        if size > MAX_ONE_REPLY or size > self.max_bytes:
            return False
        replies = self._replies
        replies[request_id] = frames
        self._bytes += size
        while len(replies) > self.max_replies or self._bytes > self.max_bytes:
            _, dropped = replies.popitem(last=False)
            self._bytes -= len(dropped)
        return True

    def get(self, request_id: int) -> bytes | None:
        """The reply frames of ``request_id``, if still kept."""
        return self._replies.get(request_id)
