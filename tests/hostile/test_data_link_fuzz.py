"""A data link's reader (``hipr.worker.data_links``) fed arbitrary bytes: chunk frames
well formed, damaged, cut short, or none at all. Whatever comes, the link delivers only
chunks whose offset is a multiple of the chunk size and whose size is at most a chunk,
ends when its peer closes, and never fails with an exception of its own."""

from __future__ import annotations

import socket
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipr.protocol import Flags, Opcode, encode_frame
from hipr.sessions.stripes import StripeInbox
from hipr.worker.data_links import DataLink

CHUNK = 64


class _Log:
    """Counts what the link logs; an ``exception`` is a bug in the reader."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def warning(self, event: str, **kw: Any) -> None:
        pass

    def info(self, event: str, **kw: Any) -> None:
        pass

    def exception(self, event: str, **kw: Any) -> None:
        self.failures.append(event)


def _chunk(request_id: int, index: int, size: int) -> bytes:
    offset = index * CHUNK
    return encode_frame(Opcode.DATA, request_id, Flags.NONE, {"offset": offset}, bytes(size))


_frames = st.lists(
    st.one_of(
        st.builds(
            _chunk,
            st.integers(0, 2**32 - 1),
            st.integers(0, 1000),
            st.integers(1, CHUNK),
        ),
        st.binary(max_size=64),
    ),
    max_size=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=_frames, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255))))
def test_a_data_link_survives_any_bytes(frames: list[bytes], flips: list[tuple[int, int]]) -> None:
    data = bytearray(b"".join(frames))
    for at, mask in flips:
        if data:
            data[at % len(data)] ^= mask
    ours, theirs = socket.socketpair()
    inbox = StripeInbox(chunk_bytes=CHUNK, stall_seconds=1.0)
    log = _Log()
    link = DataLink(ours, inbox, None, frame_timeout=1.0, log=log)
    assert inbox.add_link(link, 4) == 0
    link.start()
    try:
        theirs.sendall(bytes(data))
        theirs.shutdown(socket.SHUT_WR)
        link.join(timeout=10)
        assert not link._thread.is_alive(), "the link did not end when its peer closed"
    finally:
        link.close()
        theirs.close()
    assert log.failures == []
    assert inbox.links == 0
    for request_chunks in inbox._chunks.values():
        for chunk in request_chunks:
            assert chunk.offset % CHUNK == 0 and 0 < chunk.data.nbytes <= CHUNK
    inbox.close()
