"""Where one small request's time goes, stage by stage, on the client and the worker.

    python -m benchmarks.stages [--backend emulator|cuda] [--count N] [--loop uvloop]

Starts a worker whose connection code is instrumented (timestamps from
``time.perf_counter_ns``, which reads CLOCK_MONOTONIC and so compares across the two
processes) and sends it requests one at a time, first over a plain blocking socket
speaking hipr's frames (the floor of any client), then through ``hipr.connect()``. For
each request it prints the medians and 90th percentiles of:

- client send -> worker ``data_received`` (the wake-up of the worker's loop),
- ``data_received`` -> execution starts (decoding, and the hand-off to the executor
  unless the request is answered in the I/O callback itself),
- execution -> the reply's send starts (the handler and the request's bookkeeping),
- the reply's send (a syscall that wakes the client),
- the reply's send ends -> the client has its reply (the client's wake-up and decoding).

A stage can read negative when the woken client preempts the worker on its core. Only
for the asyncio worker (push mode): the instrumented points are the loop stream's
``data_received``, ``send`` and ``write_nowait``. The instrumentation costs ~1 µs a
point; compare runs of this tool with each other, not with ``hipr bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STAGES = (
    "client send -> worker data_received",
    "data_received -> execution starts",
    "execution -> reply send starts",
    "reply send",
    "reply sent -> client has it",
    "total",
)


def _serve(dump: str, worker_argv: list[str]) -> int:
    """The instrumented worker: record timestamps, write them to ``dump`` on SIGUSR1."""
    from hipr.protocol.header import Flags
    from hipr.transports import loop_stream
    from hipr.worker import connection

    marks: dict[str, list[int]] = {"recv": [], "exec": [], "send0": [], "send1": []}
    sends: list[tuple[int, int]] = []
    now = time.perf_counter_ns

    received = loop_stream._Protocol.data_received

    def data_received(self: Any, data: bytes) -> None:
        marks["recv"].append(now())
        received(self, data)

    execute = connection.WorkerConnection._execute

    async def timed_execute(self: Any, frame: Any) -> bool:
        marks["exec"].append(now())
        return await execute(self, frame)

    answer_now = connection.WorkerConnection._answer_now

    def timed_answer_now(self: Any, frame: Any) -> bool:
        # A request answered in the I/O callback starts executing here; one handed to
        # the executor is marked there instead.
        started = now()
        answered = answer_now(self, frame)
        if answered and not frame.header.flags & Flags.NO_REPLY:
            marks["exec"].append(started)
        return answered

    send = loop_stream.LoopSocketStream.send
    write_nowait = loop_stream.LoopSocketStream.write_nowait

    def timed_write_nowait(self: Any, data: bytes) -> None:
        started = now()
        write_nowait(self, data)
        sends.append((started, now()))

    async def timed_send(self: Any, item: bytes) -> None:
        started = now()
        await send(self, item)
        sends.append((started, now()))  # one entry per finished send: never half a pair

    loop_stream._Protocol.data_received = data_received  # type: ignore[method-assign]
    connection.WorkerConnection._execute = timed_execute  # type: ignore[method-assign]
    connection.WorkerConnection._answer_now = timed_answer_now  # type: ignore[method-assign]
    loop_stream.LoopSocketStream.send = timed_send  # type: ignore[method-assign]
    loop_stream.LoopSocketStream.write_nowait = timed_write_nowait  # type: ignore[method-assign]

    def write(*_: object) -> None:
        finished = list(sends)
        marks["send0"] = [a for a, _ in finished]
        marks["send1"] = [b for _, b in finished]
        Path(dump).write_text(json.dumps(marks))

    signal.signal(signal.SIGUSR1, write)
    from hipr.cli import main

    return main(worker_argv)


def _stages(client: Sequence[tuple[int, int]], marks: dict[str, list[int]]) -> dict[str, list[int]]:
    """Per-stage durations (ns) of the last ``len(client)`` requests, matched in order."""
    n = len(client)
    recv, start = marks["recv"][-n:], marks["exec"][-n:]
    send0, send1 = marks["send0"][-n:], marks["send1"][-n:]
    return {
        STAGES[0]: [r - c[0] for r, c in zip(recv, client, strict=True)],
        STAGES[1]: [e - r for r, e in zip(recv, start, strict=True)],
        STAGES[2]: [s - e for e, s in zip(start, send0, strict=True)],
        STAGES[3]: [b - a for a, b in zip(send0, send1, strict=True)],
        STAGES[4]: [c[1] - s for s, c in zip(send1, client, strict=True)],
        STAGES[5]: [c[1] - c[0] for c in client],
    }


def _print(title: str, stages: dict[str, list[int]], out: Callable[[str], None]) -> None:
    out(title)
    for name, values in stages.items():
        ordered = sorted(values)
        p90 = ordered[int(len(ordered) * 0.9)]
        out(
            f"  {name:38s} median {statistics.median(values) / 1000:8.1f} µs   "
            f"p90 {p90 / 1000:8.1f} µs"
        )


class _Worker:
    """An instrumented worker in a subprocess, on a unix socket in a fresh directory."""

    def __init__(self, backend: str, loop: str) -> None:
        directory = tempfile.mkdtemp(prefix="hipr-stages-")
        self.socket = f"{directory}/w.sock"
        self.dump = f"{directory}/marks.json"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.stages",
                "--serve",
                self.dump,
                "worker",
                "--backend",
                backend,
                "--loop",
                loop,
                "--listen",
                f"unix://{self.socket}",
            ],
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the instrumented worker did not start")
            time.sleep(0.05)

    def marks(self) -> dict[str, list[int]]:
        """The worker's timestamps so far."""
        Path(self.dump).unlink(missing_ok=True)
        time.sleep(0.1)  # the last reply's send may still be returning in the worker
        os.kill(self.process.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.dump) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # let the write finish
        data: dict[str, list[int]] = json.loads(Path(self.dump).read_text())
        return data

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _raw(
    sock_path: str, opcode: int, count: int, marks: Callable[[], dict[str, list[int]]]
) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """``count`` requests through a plain blocking socket: (sent, reply read) each, and
    the worker's marks, taken before the goodbye adds its own."""
    from hipr.protocol.codec import FrameDecoder, encode_frame
    from hipr.protocol.header import Flags
    from hipr.protocol.opcodes import Opcode

    now = time.perf_counter_ns
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(sock_path)
        sock.sendall(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "stages"}))
        decoder = FrameDecoder()
        buffer = bytearray(65536)

        def reply() -> None:
            while True:
                got = sock.recv_into(buffer)
                if not got:
                    raise ConnectionError("the worker closed the connection")
                decoder.feed(bytes(buffer[:got]))
                frame = decoder.next_frame()
                if frame is not None and frame.request_id:
                    return

        reply()
        times = []
        for i in range(count):
            message = encode_frame(opcode, i + 2, Flags.NONE)
            sent = now()
            sock.sendall(message)
            reply()
            times.append((sent, now()))
        taken = marks()
        sock.sendall(encode_frame(Opcode.GOODBYE, count + 2, Flags.NONE))
        reply()
    return times, taken


def measure(
    backend: str = "emulator",
    count: int = 3000,
    loop: str = "uvloop",
    out: Callable[[str], None] = print,
) -> dict[str, dict[str, list[int]]]:
    """Run the stage measurements; print them through ``out``; return them (ns)."""
    import hipr
    from hipr.protocol.opcodes import Opcode

    warm = count // 10
    results: dict[str, dict[str, list[int]]] = {}
    worker = _Worker(backend, loop)
    try:
        for name in ("DEVICE_SYNCHRONIZE", "GET_DEVICE"):
            times, marks = _raw(worker.socket, Opcode[name], count, worker.marks)
            title = f"{backend}, {loop} worker, raw blocking socket: {name}"
            results[title] = _stages(times[warm:], marks)
            _print(title, results[title], out)
        now = time.perf_counter_ns
        with hipr.connect(f"unix://{worker.socket}") as gpu:
            times = []
            for _ in range(count):
                sent = now()
                gpu.synchronize()
                times.append((sent, now()))
            title = f"{backend}, {loop} worker, hipr.connect(): synchronize()"
            results[title] = _stages(times[warm:], worker.marks())
            _print(title, results[title], out)
    finally:
        worker.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.stages``; see the module doc."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        return _serve(args[1], args[2:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stages", description=__doc__)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    options = parser.parse_args(args)
    measure(options.backend, options.count, options.loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
