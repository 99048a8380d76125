"""The worker's own CPU cost of a request, hot, with no socket and no wake-up in it.

    python -m benchmarks.callback [--backend emulator|cuda|hip] [--count N] [--profile N]

Builds a worker connection in this process over an in-memory transport (the loop
stream's protocol and a transport that keeps no bytes), opens a session, and feeds the
connection's I/O callback the frames a client sends, back to back: a null
``synchronize()``; a lone fire-and-forget 1-thread ``fill_f32`` launch; such a launch
and a ``synchronize()`` in one read (``hipr bench``'s launch + synchronize row); the
same as one request (protocol 1.3's LAUNCH_KERNEL with ``synchronize``, what the native
proxy sends for a launch then ``hipDeviceSynchronize``); a batch of 64 launches in one
LAUNCH_KERNELS frame (the ``1,000 launches`` row's unit).
It prints the microseconds each costs the worker: decoding, checks, the backend's
calls, bookkeeping and the reply's encoding, all on the event loop's thread as in push
mode (asyncio; uvloop where installed). What it leaves out (the wake-ups and syscalls
of a real link) is what ``benchmarks.stages`` shows; the two together say where a
round trip's time goes.

A request the I/O callback cannot answer (a synchronize whose kernel is still running)
goes to the executor task as it would in a worker; the loop then runs until the reply
is there, and the run counts how many did. With ``--profile N``, the launches with
``synchronize`` run once more under cProfile and the N functions with the most own
time are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from hipr.backends import load_backend
from hipr.kernels.kernel_args import pack_args
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.transports.loop_stream import LoopSocketStream, _Protocol
from hipr.worker.client_link import WorkerConnection
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker

#: Launches in one LAUNCH_KERNELS frame, as the clients batch them.
BATCH = 64


class _NullTransport:
    """An asyncio transport that takes every write at once and keeps only the replies'
    bytes for the caller to read."""

    def __init__(self) -> None:
        self.written = bytearray()
        #: Called after each write (wakes a waiting :meth:`InProcessLink.until_answered`).
        self.on_write: Callable[[], object] = lambda: None

    def write(self, data: bytes) -> None:
        self.written += data
        self.on_write()

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


class InProcessLink:
    """A worker connection driven by hand: :meth:`feed` hands it bytes as the loop
    would, :meth:`replies` takes the frames it answered."""

    def __init__(self, worker: Worker) -> None:
        #: A GPU thread's replies go to the socket itself (ThreadWrites), read here.
        self._ours, self._theirs = socket.socketpair()
        self.transport = _NullTransport()
        self.protocol = _Protocol()
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]
        stream = LoopSocketStream(self.transport, self.protocol, self._ours)  # type: ignore[arg-type]
        self.connection = WorkerConnection(worker, stream, "in-process")
        tenant = worker.tenants.authenticate(None)
        session = worker.open_session(tenant, "in-process")
        session.connection = self.connection
        self._requests = self.connection.attach(session)
        self._decoder = FrameDecoder()
        self._next_id = 0
        self._executor: asyncio.Task[bool] | None = None

    async def start(self) -> None:
        """Start the executor task and push mode, as a served connection does."""
        self._executor = asyncio.ensure_future(self._requests.run())
        self.connection.reader.start_push()
        await asyncio.sleep(0)

    def request_id(self) -> int:
        """The next request id (ids only grow: a lower one is taken for a resend)."""
        self._next_id += 1
        return self._next_id

    def feed(self, data: bytes) -> None:
        """Bytes arriving from the client."""
        self.protocol.data_received(data)

    def replies(self) -> list[Frame]:
        """The frames answered since the last call: written to the transport by the
        loop, or to the socket itself by a session's GPU thread (a synchronize that
        waited there; one request is under way at a time, so the two never mix)."""
        self._decoder.feed(bytes(self.transport.written))
        self.transport.written.clear()
        try:
            self._decoder.feed(self._theirs.recv(1 << 16, socket.MSG_DONTWAIT))
        except BlockingIOError:
            pass
        return list(self._decoder.frames())

    async def call(self, opcode: Opcode, args: Any = None) -> Any:
        """One request, answered (by the callback or the executor): its result."""
        self.feed(encode_frame(opcode, self.request_id(), Flags.NONE, args))
        while True:
            for frame in self.replies():
                if Flags.ERROR in frame.flags:
                    raise RuntimeError(f"{opcode.name} failed: {frame.args}")
                return frame.args
            await asyncio.sleep(0)

    async def until_answered(self, count: int) -> int:
        """Run the loop until ``count`` replies were written since the last take; how
        many loop passes that needed."""
        passes = 0
        got = len(self.replies())
        while got < count:
            # The loop waits in its poll, as a worker's does, until a reply is written
            # (by the executor, or by a GPU thread to the socket): polling instead would
            # hold the interpreter lock against the session's GPU thread (a convoy).
            answered = asyncio.get_running_loop().create_future()

            def wake(answered: asyncio.Future[None] = answered) -> None:
                if not answered.done():
                    answered.set_result(None)

            self.transport.on_write = wake
            asyncio.get_running_loop().add_reader(self._theirs, wake)
            try:
                got += len(self.replies())
                if got < count:
                    await answered
                    passes += 1
            finally:
                asyncio.get_running_loop().remove_reader(self._theirs)
                self.transport.on_write = lambda: None
            got += len(self.replies())
        return passes

    async def close(self) -> None:
        if self._executor is not None:
            self._executor.cancel()
        self._ours.close()
        self._theirs.close()


@contextlib.asynccontextmanager
async def in_process_link(backend_name: str) -> AsyncIterator[InProcessLink]:
    """A started :class:`InProcessLink` to a worker (no spin wait) on that backend, closed
    with the backend on exit."""
    backend = load_backend(backend_name)
    link = InProcessLink(Worker(WorkerConfig(spin_wait=0.0), backend))
    try:
        await link.start()
        yield link
    finally:
        await link.close()
        close = getattr(backend, "close", None)
        if close is not None:
            close()


async def fill_launch(link: InProcessLink) -> dict[str, Any]:
    """LAUNCH_KERNEL's arguments for a 1-thread ``fill_f32`` of a word allocated here, on
    the null stream (the smallest launch there is)."""
    fill = await link.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"})
    word = (await link.call(Opcode.MALLOC, {"size": 4096}))["ptr"]
    packed = pack_args([np.uint64(word), np.float32(1.0), np.uint64(1)])
    return {
        "function": fill["function"],
        "grid": [1],
        "block": [1],
        "shared_mem": 0,
        "args": packed.data,
        "ptrs": packed.pointer_offsets(),
        "stream": None,
    }


async def _measure(backend_name: str, count: int, profile: int) -> list[str]:
    lines = [f"per request on the worker, µs ({backend_name}, Python {sys.version.split()[0]})"]
    async with in_process_link(backend_name) as link:
        launch = await fill_launch(link)
        batch = {**launch, "args": [launch["args"]] * BATCH}

        def sync_frames() -> bytes:
            return encode_frame(Opcode.DEVICE_SYNCHRONIZE, link.request_id(), Flags.NONE)

        def pair_frames() -> bytes:
            first = encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NO_REPLY, launch)
            return first + sync_frames()

        fused = {**launch, "synchronize": True}

        def fused_frame() -> bytes:
            # Protocol 1.3: the launch and its synchronize as one request.
            return encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NONE, fused)

        def launch_frame() -> bytes:
            return encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NO_REPLY, launch)

        def batch_frames() -> bytes:
            frames = encode_frame(Opcode.LAUNCH_KERNELS, link.request_id(), Flags.NO_REPLY, batch)
            return frames + sync_frames()

        async def timed(
            make: Callable[[], bytes], rounds: int, replies: int = 1
        ) -> tuple[float, int]:
            await link.call(Opcode.DEVICE_SYNCHRONIZE)  # nothing left running
            datas = [make() for _ in range(rounds)]  # ids after that call's: not resends
            waited = 0
            started = time.perf_counter()
            for data in datas:
                link.feed(data)
                if replies and await link.until_answered(replies):
                    waited += 1
            elapsed = time.perf_counter() - started
            await link.call(Opcode.DEVICE_SYNCHRONIZE)
            return elapsed / rounds * 1e6, waited

        rows = (
            ("null synchronize", sync_frames, count, 1),
            ("1-thread launch alone (fire-and-forget, no reply)", launch_frame, count, 1),
            ("1-thread launch + synchronize", pair_frames, count, 1),
            ("1-thread launch with synchronize (one request, 1.3)", fused_frame, count, 1),
            (
                f"{BATCH} launches in one frame + synchronize, per launch",
                batch_frames,
                max(1, count // BATCH),
                BATCH,
            ),
        )
        for name, make, rounds, per in rows:
            replies = 0 if make is launch_frame else 1
            await timed(make, max(1, rounds // 10), replies)  # warm-up
            micros, waited = await timed(make, rounds, replies)
            note = f"   ({waited} of {rounds} waited for the executor)" if waited else ""
            lines.append(f"  {name:<55} {micros / per:8.2f}{note}")
        if profile:
            datas = [fused_frame() for _ in range(count)]
            profiler = cProfile.Profile()
            profiler.enable()
            for data in datas:
                link.feed(data)
                await link.until_answered(1)
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(profile)
            lines.append(
                f"launches with synchronize (one request) under cProfile, top {profile} by own time"
            )
            lines.append(text.getvalue())
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.callback``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.callback", description=__doc__)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    options = parser.parse_args(argv)
    run: Callable[..., Any] = asyncio.run
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    print("\n".join(run(_measure(options.backend, options.count, options.profile))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
