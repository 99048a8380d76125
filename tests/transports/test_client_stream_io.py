"""The sync client's stream I/O (hipr.client.stream_io): plain sockets wait in the kernel,
other streams in poll(); both bound a send that finds no room, and a read inside a frame."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from hipr.client.stream_io import PolledIO, SocketIO, _timeval, io_for

pytestmark = pytest.mark.timeout(30)


def _io(kind: type, sock: socket.socket, link_timeout: float) -> SocketIO | PolledIO:
    if kind is SocketIO:
        return SocketIO(sock, link_timeout)
    return PolledIO(sock, threading.RLock(), link_timeout)


@pytest.fixture(params=[SocketIO, PolledIO], ids=["kernel-waits", "polled"])
def kind(request: pytest.FixtureRequest) -> type:
    """Each way of waiting, for the tests that hold for both."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    with left, right:
        yield left, right


def test_plain_sockets_get_kernel_waits_and_others_poll(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    left, _ = pair
    lock = threading.RLock()
    assert isinstance(io_for(left, lock, 1.0), SocketIO)
    assert left.gettimeout() is None  # blocking: no poll() before each recv and send

    class Wrapped:
        """A stream that is not a socket (a transport plugin's)."""

        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

        def __getattr__(self, name: str) -> object:
            return getattr(self._sock, name)

    assert isinstance(io_for(Wrapped(left), lock, 1.0), PolledIO)  # type: ignore[arg-type]


def test_reads_wait_at_most_their_timeout_and_see_what_arrives(
    pair: tuple[socket.socket, socket.socket], kind: type
) -> None:
    left, right = pair
    io = _io(kind, left, 5.0)
    buffer = bytearray(64)
    assert io.read(buffer, 0) is None  # nothing yet, asked without waiting
    started = time.monotonic()
    assert io.read(buffer, 0.05) is None
    assert 0.04 <= time.monotonic() - started < 2.0
    right.sendall(b"hello")
    assert io.read(buffer, 0) == 5 and bytes(buffer[:5]) == b"hello"
    right.sendall(b"again")
    assert io.read(buffer, 1.0) == 5 and bytes(buffer[:5]) == b"again"
    right.shutdown(socket.SHUT_WR)
    assert io.read(buffer, 1.0) == 0  # end of stream


def test_a_frame_that_stops_arriving_fails_after_the_link_timeout_not_a_call_deadline(
    pair: tuple[socket.socket, socket.socket], kind: type
) -> None:
    left, right = pair
    io = _io(kind, left, 0.3)
    buffer = bytearray(64)
    assert io.read(buffer, 0.01) is None  # a short wait leaves its limit behind ...
    threading.Timer(0.1, lambda: right.sendall(b"rest")).start()
    assert io.read_more(memoryview(buffer)) == 4  # ... which does not cut this one short
    started = time.monotonic()
    with pytest.raises(OSError):  # TimeoutError: the link is taken for dead
        io.read_more(memoryview(buffer))
    assert 0.25 <= time.monotonic() - started < 5.0


def test_a_send_that_finds_no_room_fails_after_the_link_timeout(
    pair: tuple[socket.socket, socket.socket], kind: type
) -> None:
    left, _ = pair  # the peer never reads
    io = _io(kind, left, 0.3)
    started = time.monotonic()
    with pytest.raises(OSError):
        io.send_all(b"x" * (64 << 20))
    assert 0.25 <= time.monotonic() - started < 10.0


def test_a_slow_reader_gets_every_byte_in_order(
    pair: tuple[socket.socket, socket.socket], kind: type
) -> None:
    left, right = pair
    io = _io(kind, left, 2.0)
    data = bytes(range(256)) * (16 << 10)  # 4 MiB: many times the socket's buffer
    received = bytearray()

    def drain() -> None:
        while len(received) < len(data):
            chunk = right.recv(1 << 16)
            if not chunk:
                return
            received.extend(chunk)
            time.sleep(0.001)

    reader = threading.Thread(target=drain)
    reader.start()
    io.send_all(memoryview(data))
    reader.join(20)
    assert bytes(received) == data


def test_time_limits_never_round_down_to_no_limit() -> None:
    # The kernel reads a zero timeval as "wait forever".
    forever = _timeval(None)
    assert forever == b"\0" * len(forever)
    assert _timeval(1e-9) != forever and _timeval(0.0) != forever
    assert _timeval(2.5) == _timeval(2.5000001)


@pytest.mark.parametrize("select_limit", [1024, 0], ids=["select", "poll"])
def test_a_nap_ends_at_its_time_or_when_bytes_arrive_and_reads_nothing(
    pair: tuple[socket.socket, socket.socket],
    kind: type,
    select_limit: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``wait_readable`` (a nap before an expected reply): False after its time with
    nothing to read, True at once when bytes are there, and the bytes stay to be read.
    Past select()'s descriptor limit it waits in poll(), whose whole milliseconds are
    rounded down so that a nap never overruns."""
    monkeypatch.setattr("hipr.client.stream_io._SELECT_LIMIT", select_limit)
    left, right = pair
    io = _io(kind, left, 5.0)
    started = time.monotonic()
    assert io.wait_readable(0.03) is False
    assert 0.015 <= time.monotonic() - started < 1.0
    assert io.wait_readable(0.0) is False
    threading.Timer(0.05, lambda: right.sendall(b"reply")).start()
    started = time.monotonic()
    assert io.wait_readable(5.0) is True
    assert time.monotonic() - started < 2.0  # woken by the bytes, not by the time
    buffer = bytearray(16)
    assert io.read(buffer, 0) == 5 and bytes(buffer[:5]) == b"reply"
    assert io.wait_readable(-1.0) is False  # a nap already over waits for nothing
