"""``ThreadWrites``: a frame written to a connection's socket from another thread goes
whole and in order with the loop's own writes, or not at all."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import anyio
import pytest

from hipr.transports.thread_writes import ThreadWrites
from hipr.transports.unix import socket_stream


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def never() -> bool:
    return False


def nothing() -> int:
    return 0


def fill(sock: socket.socket) -> int:
    """Fill ``sock``'s send buffer (the peer reads nothing): the bytes it took."""
    sent = 0
    chunk = b"\0" * 65536
    while True:
        try:
            sent += sock.send(chunk, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return sent


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    sock.settimeout(5)
    while len(data) < size:
        piece = sock.recv(size - len(data))
        assert piece, "the peer closed"
        data += piece
    return data


def test_a_frame_goes_whole_from_another_thread(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    writes = ThreadWrites(a)
    sent: list[bool] = []
    worker = threading.Thread(target=lambda: sent.append(writes.write(b"frame", never, nothing)))
    worker.start()
    worker.join()
    assert sent == [True]
    assert read_exactly(b, 5) == b"frame"
    assert writes.take_held() == b""


@pytest.mark.parametrize("why", ["busy", "queued", "locked", "closed", "full"])
def test_it_sends_nothing_when_it_must_not(
    pair: tuple[socket.socket, socket.socket], why: str
) -> None:
    a, b = pair
    writes = ThreadWrites(a)
    busy = (lambda: True) if why == "busy" else never
    queued = (lambda: 5) if why == "queued" else nothing
    if why == "closed":
        with writes.lock:
            writes.close()
    if why == "full":
        fill(a)
    if why == "locked":
        writes.lock.acquire()  # the loop is writing: the thread does not wait for it
    try:
        assert not writes.write(b"frame", busy, queued)
    finally:
        if why == "locked":
            writes.lock.release()
    assert writes.take_held() == b""
    if why != "full":
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(16)


def test_the_rest_of_a_frame_taken_in_part_is_held_for_the_loop(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    frame = bytes(range(256)) * 1024  # more than the small buffer takes at once
    writes = ThreadWrites(a)
    assert writes.write(frame, never, nothing)
    with writes.lock:
        held = writes.take_held()
    assert 0 < len(held) < len(frame)
    assert read_exactly(b, len(frame) - len(held)) == frame[: len(frame) - len(held)]
    # Until the loop takes it, the thread writes nothing more (it would overtake it).
    assert writes.write(frame, never, nothing)
    assert not writes.write(b"later", never, nothing)


def test_closing_drops_the_duplicate_descriptor(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    writes = ThreadWrites(a)
    assert writes.write(b"x", never, nothing)
    duplicate = writes._dup
    assert duplicate is not None and duplicate.fileno() != a.fileno()
    with writes.lock:
        writes.close()
    assert duplicate.fileno() == -1
    assert not writes.write(b"y", never, nothing)


@pytest.mark.anyio
async def test_a_stream_sends_the_rest_of_a_thread_frame_before_its_own(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """Under both loops: a thread's frame that the socket took in part is finished before
    the loop's next frame, and nothing of the two interleaves."""
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    stream = await socket_stream(a)
    frame = bytes(range(256)) * 2048  # more than the small buffer takes at once
    results: list[bool] = []
    thread = threading.Thread(
        target=lambda: results.append(stream.write_from_thread(frame, never))  # type: ignore[attr-defined]
    )
    thread.start()
    thread.join()
    assert results == [True]
    reader_done = anyio.Event()
    received = bytearray()

    def read_all() -> None:
        b.settimeout(5)
        want = len(frame) + 4
        while len(received) < want:
            piece = b.recv(1 << 20)
            assert piece
            received.extend(piece)

    async def read() -> None:
        await anyio.to_thread.run_sync(read_all)
        reader_done.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await stream.send(b"next")
            await stream.flush_thread_write()  # type: ignore[attr-defined]
            await reader_done.wait()
    assert bytes(received) == frame + b"next"
    await stream.aclose()
