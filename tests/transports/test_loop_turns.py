"""The loop's stream gives other connections a turn between large reads into a payload
(``_Protocol._yield_turn``): reading pauses after such a read and resumes on the loop's
next pass, the payload arrives whole, and a consumer's own pause is never undone by it.
Sync tests over asyncio's and uvloop's loops: the stream is asyncio's alone."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hipr.transports.loop_stream import YIELD_AFTER_BYTES, _Protocol, open_loop_stream
from hipr.transports.unix import size_send_buffer


def loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


def run_on(loop: str, main: Callable[[], Any]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


class Payload:
    """A push-mode consumer that receives ``size`` bytes into a target of its own."""

    def __init__(self, size: int) -> None:
        self.view = memoryview(bytearray(size))
        self.filled = 0
        self.whole = asyncio.Event()

    def target(self) -> memoryview | None:
        return self.view[self.filled :] if self.filled < self.view.nbytes else None

    def filled_by(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == self.view.nbytes:
            self.whole.set()


@pytest.mark.parametrize("loop", loops())
def test_large_reads_into_a_payload_give_the_loop_a_turn(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns: list[int] = []
    yield_turn = _Protocol._yield_turn

    def counted(self: _Protocol) -> None:
        turns.append(1)
        yield_turn(self)

    monkeypatch.setattr(_Protocol, "_yield_turn", counted)
    size = 16 * YIELD_AFTER_BYTES + 3
    body = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8).tobytes()

    async def main() -> None:
        a, b = socket.socketpair()
        size_send_buffer(b)  # as both ends of a worker's unix link: reads of up to 1 MiB
        stream = await open_loop_stream(a)
        payload = Payload(size)
        stream.deliver_to(lambda data: None, lambda: None, payload.target, payload.filled_by)
        sender = threading.Thread(target=b.sendall, args=(body,))
        sender.start()
        await asyncio.wait_for(payload.whole.wait(), 20)
        sender.join(10)
        assert payload.view.tobytes() == body
        await stream.aclose()
        b.close()

    run_on(loop, main)
    assert turns  # at least one read was large enough to pause for a turn


class FakeTransport:
    """Records pause/resume calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def set_write_buffer_limits(self, high: int) -> None:
        pass


def test_a_turn_resumes_reading_on_the_next_pass_unless_the_consumer_paused() -> None:
    async def main() -> None:
        protocol = _Protocol()
        transport = FakeTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol._yield_turn()
        assert protocol.yielding and transport.calls == ["pause"]
        protocol._yield_turn()  # one turn at a time
        assert transport.calls == ["pause"]
        await asyncio.sleep(0)
        assert not protocol.yielding and transport.calls == ["pause", "resume"]
        # The consumer holds reading back meanwhile: the turn's end leaves it paused.
        protocol._yield_turn()
        protocol.reading_paused = True
        await asyncio.sleep(0)
        assert transport.calls == ["pause", "resume", "pause"]
        # A consumer that holds reading back gets no turn at all.
        protocol._yield_turn()
        assert transport.calls == ["pause", "resume", "pause"]

    asyncio.run(main())


def test_the_consumers_resume_during_a_turn_waits_for_the_turns_end() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        stream = await open_loop_stream(a)
        protocol = stream._protocol
        real = protocol.transport
        fake = FakeTransport()
        protocol.transport = stream._transport = fake  # type: ignore[assignment]
        try:
            protocol._yield_turn()
            stream.pause_reading(True)  # the consumer holds reading back during the turn
            stream.pause_reading(False)  # and lets go before the turn ends
            assert fake.calls == ["pause", "pause"]  # not resumed yet
            await asyncio.sleep(0)
            assert fake.calls == ["pause", "pause", "resume"]  # the turn's end resumes
        finally:
            protocol.transport = stream._transport = real  # type: ignore[assignment]
        await stream.aclose()
        b.close()

    asyncio.run(main())
