"""Where one small request's time goes, stage by stage, on the client and the worker.

    python -m benchmarks.stages [--backend emulator|cuda] [--count N] [--loop uvloop]
        [--profile N] [--cpu N]

Starts a worker whose connection code is instrumented (``benchmarks.stage_worker``:
timestamps from ``time.perf_counter_ns``, which reads CLOCK_MONOTONIC and so compares
across the two processes) and sends it requests one at a time, first over a plain blocking socket
speaking hipr's frames (the floor of any client), then through ``hipr.connect()``. For
each request it prints the medians and 90th percentiles of:

- client send -> worker ``data_received`` (the wake-up of the worker's loop),
- ``data_received`` -> execution starts (decoding, and the hand-off to the executor
  unless the request is answered in the I/O callback itself),
- execution -> the reply's send starts (the handler and the request's bookkeeping),
- the reply's send (a syscall that wakes the client),
- the reply's send ends -> the client has its reply (the client's wake-up and decoding).

Then the same for a 1-thread ``fill_f32`` launch followed by ``synchronize()`` (the
``hipr bench`` row), where the worker's part is split at the two requests:
data_received -> the launch starts -> the launch is issued (its I/O callback returns;
the runtime's launch call alone is printed below the table) -> the synchronize starts
-> the kernel is seen done (the synchronize's look from the loop, or the GPU thread's
synchronize, finds the work finished) -> its reply's send starts.

Then a kernel that runs ~2 ms (the 2048³ SGEMM on GPU backends, a fill of 4 Mi
elements on the emulator), launched and synchronized through two connections taking
turns, one forecasting its waits (``LinkOptions.forecast_waits``, the default) and one
not (``--long N`` pairs each, 0 to skip): its synchronize outlasts the worker's inline
poll and waits on the session's GPU thread (or, with the worker's ``spin_wait``, is
polled from its loop), so the split is: data_received -> the launch starts -> the
launch is issued (the I/O callback returns) -> the worker sees the kernel done (the
GPU thread's synchronize returns, or the loop's poll finds it; the kernel's run is in
here) -> the reply's send starts (the GPU thread's own send of the reply, or the loop's
wake-up and the reply where the thread left it to the loop) -> the client has
it (the client's wake-up, which the forecast is meant to save; it acts only where the
client spins, on 4 or more CPUs by default). Pairs whose synchronize found the kernel
done at once are left out, and counted.

``--worker-spin-wait S`` runs the worker with ``spin_wait = S`` (seconds; unset, the
worker's default, ``"auto"``): which stages shrink when its loop stays awake.

With ``--cpu N`` the worker and this client both run on CPU ``N`` only: a woken
process then runs on the CPU of the one that woke it, so the figures show the work
alone, without the cost of waking a process on another CPU (tens of µs on a virtual
machine whose idle CPUs halt). Compare with a run without it to see that cost.

The raw socket's DEVICE_SYNCHRONIZE runs twice: waiting in ``recv``, and in ``poll()``
before each ``recv`` (what a socket with a Python timeout does): the cost of the way a
client waits. Each run also prints the CPU time the worker and the client used per
request (``/proc``'s utime + stime for the worker, ``time.process_time`` for the client:
syscalls and the wake-ups they cause included), where ``/proc`` exists.

With ``--profile N``, the launch + synchronize workload then runs once more under
``cProfile`` in both processes (the worker's event-loop thread, where launches and
synchronizes run inline, and the client's thread), and the N functions with the most
own time are printed for each: where the time goes, slowed by the profiler's own cost
but in proportion. The timed figures above are taken without it.

A stage can read negative when the woken client preempts the worker on its core. Only
for the asyncio worker (push mode): the instrumented points are the loop stream's
``data_received``, ``send`` and ``write_nowait``, and the GPU thread's own write of a
reply (``ThreadWrites.write``). The instrumentation costs ~1 µs a point; compare runs
of this tool with each other, not with ``hipr bench``.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import io
import json
import os
import pstats
import select
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
LAUNCH_STAGES = (
    "client call -> worker data_received",
    "data_received -> launch starts",
    "launch starts -> launch issued",
    "launch issued -> synchronize starts",
    "synchronize -> kernel seen done",
    "kernel seen done -> reply send starts",
    "reply send",
    "reply sent -> client has it",
    "total",
)


LONG_STAGES = (
    "client call -> worker data_received",
    "data_received -> launch starts",
    "launch starts -> launch issued",
    "launch issued -> kernel done",
    "kernel done -> reply send starts",
    "reply send",
    "reply sent -> client has it",
    "total",
)
#: The launch row's last line: the runtime's launch call alone, inside "launch starts ->
#: launch issued" (the rest of that stage is the handler's checks and bookkeeping).
BACKEND_LAUNCH = "backend launch call (inside the above)"
#: The long-kernel rows' last line: the CPU time the client's thread spent on a pair.
LONG_CLIENT_CPU = "client CPU per pair"


def _spans(
    names: Sequence[str], client: Sequence[tuple[int, int]], points: Sequence[Sequence[int]]
) -> dict[str, list[int]]:
    """Per-stage durations (ns): for each request, from its client start through
    ``points`` (one timestamp list per point, in order) to its client end, the time
    between each point and the next, then the total; ``names`` names them in order."""
    series = [[c[0] for c in client], *points, [c[1] for c in client]]
    stages = {
        name: [b - a for a, b in zip(earlier, later, strict=True)]
        for name, earlier, later in zip(names, series, series[1:], strict=False)
    }
    stages[names[-1]] = [c[1] - c[0] for c in client]
    return stages


def _stages(client: Sequence[tuple[int, int]], marks: dict[str, list[int]]) -> dict[str, list[int]]:
    """Per-stage durations (ns) of the last ``len(client)`` requests, matched in order."""
    n = len(client)
    points = [marks[key][-n:] for key in ("recv", "exec", "send0", "send1")]
    return _spans(STAGES, client, points)


def _first_between(times: Sequence[int], after: int, before: int) -> int | None:
    """The first of ``times`` (sorted) within ``[after, before]``, or None."""
    index = bisect.bisect_left(times, after)
    return times[index] if index < len(times) and times[index] <= before else None


def _last_up_to(times: Sequence[int], at: int) -> int | None:
    """The last of ``times`` (sorted) at or before ``at``, or None."""
    index = bisect.bisect_right(times, at)
    return times[index - 1] if index else None


def _launch_stages(
    client: Sequence[tuple[int, int]], marks: dict[str, list[int]], launch: int, sync: int
) -> dict[str, list[int]]:
    """Per-stage durations (ns) of the last ``len(client)`` launch + synchronize pairs:
    each synchronize start is paired with the launch start before it, and with the last
    data_received at or before that launch (both frames usually arrive in one read);
    the launch is issued when its I/O callback returns, and the kernel is seen done
    when the synchronize's inline look (or the GPU thread's synchronize) finds it so.
    Pairs missing a point (a launch handed to the GPU thread) are left out. Adds the
    median time of the runtime's launch call itself as ``BACKEND_LAUNCH``."""
    flat = marks["starts"]
    pairs = list(zip(flat[::2], flat[1::2], strict=True))
    launches, syncs = [], []
    last_launch = None
    for at, opcode in pairs:
        if opcode == launch:
            last_launch = at
        elif opcode == sync and last_launch is not None:
            launches.append(last_launch)
            syncs.append(at)
            last_launch = None
    n = len(client)
    launches, syncs = launches[-n:], syncs[-n:]
    send0, send1 = marks["send0"][-n:], marks["send1"][-n:]
    issued_times = sorted(
        t for t, op in zip(marks["ends"][::2], marks["ends"][1::2], strict=True) if op == launch
    )
    seen = sorted(marks.get("polled", []) + marks["waited"])
    recvs = sorted(marks["recv"])
    kept: list[tuple[int, int]] = []
    points: list[list[int]] = [[] for _ in range(7)]
    for index, (begun, finished) in enumerate(client):
        arrived = _last_up_to(recvs, launches[index])
        issued = _first_between(issued_times, launches[index], syncs[index])
        done = _first_between(seen, syncs[index], send0[index])
        if arrived is None or issued is None or done is None:
            continue
        kept.append((begun, finished))
        values = (arrived, launches[index], issued, syncs[index], done, send0[index], send1[index])
        for series, value in zip(points, values, strict=True):
            series.append(value)
    stages = _spans(LAUNCH_STAGES, kept, points) if kept else {}
    calls = marks.get("launch_calls", [])
    if stages and calls:
        stages[BACKEND_LAUNCH] = [b - a for a, b in zip(calls[::2], calls[1::2], strict=True)][-n:]
    return stages


def _long_stages(
    client: Sequence[tuple[int, int]], marks: dict[str, list[int]], launch: int
) -> dict[str, list[int]]:
    """Per-stage durations (ns) of long-kernel launch + synchronize pairs, each matched
    by time window (two connections took turns): only the pairs whose synchronize
    waited for the kernel (on the GPU thread, or polling from the loop with the worker's
    ``spin_wait``) and whose launch was issued in the I/O callback count."""
    starts = list(zip(marks["starts"][::2], marks["starts"][1::2], strict=True))
    ends = list(zip(marks["ends"][::2], marks["ends"][1::2], strict=True))
    kept: list[tuple[int, int]] = []
    points: list[list[int]] = [[] for _ in range(6)]
    launched_at = sorted(t for t, op in starts if op == launch)
    issued_at = sorted(t for t, op in ends if op == launch)
    recvs, waited = sorted(marks["recv"]), sorted(marks["waited"])
    sent0, sent1 = sorted(marks["send0"]), sorted(marks["send1"])
    for begun, finished in client:
        launched = _first_between(launched_at, begun, finished)
        issued = _first_between(issued_at, begun, finished)
        if launched is None or issued is None:
            continue
        arrived = _last_up_to(recvs, launched)
        if arrived is not None and arrived < begun:
            arrived = None
        done = _first_between(waited, issued, finished)
        send0 = _first_between(sent0, done, finished) if done is not None else None
        send1 = _first_between(sent1, send0, finished) if send0 is not None else None
        if arrived is None or done is None or send0 is None or send1 is None:
            continue
        kept.append((begun, finished))
        values = (arrived, launched, issued, done, send0, send1)
        for series, value in zip(points, values, strict=True):
            series.append(value)
    return _spans(LONG_STAGES, kept, points) if kept else {}


def long_kernel(gpu: Any, backend: str) -> tuple[Any, Any, Any, list[Any], Callable[[], None]]:
    """A kernel that runs ~2 ms, on this connection: (function, grid, block, arguments,
    clean-up). The issue's 2048³ SGEMM on GPU backends; on the emulator, a fill of 4 Mi
    elements (its kernels run in Python, so smaller)."""
    import numpy as np

    from hipr.bench import floors as fl

    if backend == "emulator":
        n = 4 << 20
        target = gpu.malloc(4 * n)
        return (
            gpu.builtin("fill_f32"),
            (n + 255) // 256,
            256,
            [target, np.float32(1.0), np.uint64(n)],
            lambda: gpu.free(target),
        )
    n = 2048
    module = gpu.compile(fl.SGEMM_SOURCE, "sgemm.hip")
    a, b = fl.sgemm_inputs(n)
    ptrs = [gpu.malloc(a.nbytes) for _ in range(3)]
    gpu.memcpy_htod(ptrs[0], a)
    gpu.memcpy_htod(ptrs[1], b)

    def clean() -> None:
        for p in ptrs:
            gpu.free(p)
        module.unload()

    tile = fl.SGEMM_TILE
    grid, block = (n // tile, n // tile), (tile, tile)
    return module.function("sgemm"), grid, block, [*ptrs, np.int32(n)], clean


def _long_rows(
    url: str, backend: str, rounds: int, marks: Callable[[], dict[str, list[int]]]
) -> tuple[dict[str, list[tuple[int, int]]], dict[str, list[int]], dict[str, list[int]]]:
    """Long-kernel launch + synchronize through two connections, one forecasting its
    waits (``LinkOptions.forecast_waits``, the default) and one not, taking turns in
    blocks of 10 so that a host's drift hits both alike: each one's (start, end) times
    after two blocks of warming up, the CPU time this thread spent on each pair (the
    client's spin and polling), and the worker's marks."""
    import hipr
    from hipr.client.link import LinkOptions

    now, cpu = time.perf_counter_ns, time.thread_time_ns
    times: dict[str, list[tuple[int, int]]] = {"forecast": [], "no forecast": []}
    spent: dict[str, list[int]] = {"forecast": [], "no forecast": []}
    with (
        hipr.connect(url) as on,
        hipr.connect(url, link=LinkOptions(forecast_waits=False)) as off,
    ):
        kernels = {
            "forecast": (on, long_kernel(on, backend)),
            "no forecast": (off, long_kernel(off, backend)),
        }
        try:
            for block in range(rounds // 10 + 2):
                for name, (gpu, (fn, grid, threads, args, _)) in kernels.items():
                    for _ in range(10):
                        sent, used = now(), cpu()
                        fn.launch(grid, threads, args)
                        gpu.synchronize()
                        if block >= 2:  # two blocks each to learn and warm up
                            times[name].append((sent, now()))
                            spent[name].append(cpu() - used)
            taken = marks()
        finally:
            for _, (*_, clean) in kernels.values():
                clean()
    return times, spent, taken


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

    def __init__(self, backend: str, loop: str, spin_wait: float | None = None) -> None:
        directory = tempfile.mkdtemp(prefix="hipr-stages-")
        self.socket = f"{directory}/w.sock"
        self.dump = f"{directory}/marks.json"
        config = Path(directory) / "worker.toml"
        # Unset: the worker's own default ("auto").
        config.write_text("" if spin_wait is None else f"spin_wait = {spin_wait!r}\n")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.stage_worker",
                self.dump,
                "worker",
                "--config",
                str(config),
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

    def profile(self, run: Callable[[], None]) -> pstats.Stats:
        """``run()`` with the worker's event-loop thread under cProfile; its statistics."""
        path = Path(f"{self.dump}.prof")
        path.unlink(missing_ok=True)
        os.kill(self.process.pid, signal.SIGUSR2)
        time.sleep(0.1)  # the loop runs the handler at its next turn
        run()
        time.sleep(0.1)
        os.kill(self.process.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # let the dump finish
        return pstats.Stats(str(path))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _raw(
    sock_path: str,
    opcode: int,
    count: int,
    marks: Callable[[], dict[str, list[int]]],
    cpu: _CpuMeter,
    *,
    poll_first: bool = False,
) -> tuple[list[tuple[int, int]], dict[str, list[int]]]:
    """``count`` requests through a plain blocking socket: (sent, reply read) each, and
    the worker's marks, taken before the goodbye adds its own. ``poll_first``: wait in
    ``poll()`` before each ``recv``."""
    from hipr.protocol.codec import FrameDecoder, encode_frame
    from hipr.protocol.header import Flags
    from hipr.protocol.opcodes import Opcode

    now = time.perf_counter_ns
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(sock_path)
        sock.sendall(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"client": "stages"}))
        decoder = FrameDecoder()
        buffer = bytearray(65536)
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)

        def reply() -> None:
            while True:
                if poll_first:
                    poller.poll(10_000)
                got = sock.recv_into(buffer)
                if not got:
                    raise ConnectionError("the worker closed the connection")
                decoder.feed(bytes(buffer[:got]))
                frame = decoder.next_frame()
                if frame is not None and frame.request_id:
                    return

        reply()
        times = []
        cpu.start()
        for i in range(count):
            message = encode_frame(opcode, i + 2, Flags.NONE)
            sent = now()
            sock.sendall(message)
            reply()
            times.append((sent, now()))
        cpu.stop(count)
        taken = marks()
        sock.sendall(encode_frame(Opcode.GOODBYE, count + 2, Flags.NONE))
        reply()
    return times, taken


class _CpuMeter:
    """CPU time per request of the worker process and of this one, over a run."""

    def __init__(self, worker_pid: int) -> None:
        self._stat = Path(f"/proc/{worker_pid}/stat")
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._began = (0, 0.0)
        self.per_request: dict[str, float] = {}

    def _worker_ns(self) -> int:
        # utime and stime, in clock ticks (fields 14 and 15; the name before may hold spaces).
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // self._tick

    def start(self) -> None:
        """Note both processes' CPU time now."""
        self.per_request = {}
        if self._stat.exists():
            self._began = (self._worker_ns(), time.process_time())

    def stop(self, count: int) -> None:
        """CPU time per request since :meth:`start`, over ``count`` requests."""
        if not self._stat.exists() or not count:
            return
        worker, client = self._began
        self.per_request = {
            "worker CPU per request": (self._worker_ns() - worker) / count,
            "client CPU per request": (time.process_time() - client) * 1e9 / count,
        }

    def report(self, stages: dict[str, list[int]], out: Callable[[str], None]) -> None:
        """Print the figures under a stage table and keep them in it (one value each)."""
        for name, value in self.per_request.items():
            stages[name] = [int(value)]
            out(f"  {name:38s}        {value / 1000:8.1f} µs")


def _print_profile(title: str, stats: pstats.Stats, top: int, out: Callable[[str], None]) -> None:
    text = io.StringIO()
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    out(title)
    # From the column header on: the lines before name the file and the totals.
    lines = text.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    for line in lines[start:]:
        if line.strip():
            out("  " + line.replace(str(Path.cwd()) + "/", ""))


def measure(
    backend: str = "emulator",
    count: int = 3000,
    loop: str = "uvloop",
    out: Callable[[str], None] = print,
    profile_top: int = 0,
    long_rounds: int = 100,
    worker_spin_wait: float | None = None,
) -> dict[str, dict[str, list[int]]]:
    """Run the stage measurements; print them through ``out``; return them (ns). With
    ``profile_top``, also profile launch + synchronize; ``long_rounds`` long-kernel
    pairs per connection (0: none; see the module doc); ``worker_spin_wait``, the
    worker's ``spin_wait`` (its loop then stays awake that long after each request)."""
    import numpy as np

    import hipr
    from hipr.protocol.opcodes import Opcode

    warm = count // 10
    results: dict[str, dict[str, list[int]]] = {}
    worker = _Worker(backend, loop, worker_spin_wait)
    cpu = _CpuMeter(worker.process.pid)

    def report(title: str, stages: dict[str, list[int]]) -> None:
        results[title] = stages
        _print(title, stages, out)
        cpu.report(stages, out)

    try:
        for name, poll_first in (
            ("DEVICE_SYNCHRONIZE", False),
            ("DEVICE_SYNCHRONIZE", True),
            ("GET_DEVICE", False),
        ):
            times, marks = _raw(
                worker.socket, Opcode[name], count, worker.marks, cpu, poll_first=poll_first
            )
            how = "poll() then recv" if poll_first else "recv"
            report(
                f"{backend}, {loop} worker, raw blocking socket ({how}): {name}",
                _stages(times[warm:], marks),
            )
        now = time.perf_counter_ns
        with hipr.connect(f"unix://{worker.socket}") as gpu:
            times = []
            cpu.start()
            for _ in range(count):
                sent = now()
                gpu.synchronize()
                times.append((sent, now()))
            cpu.stop(count)
            report(
                f"{backend}, {loop} worker, hipr.connect(): synchronize()",
                _stages(times[warm:], worker.marks()),
            )
            word = gpu.malloc(4)
            fill = gpu.builtin("fill_f32")
            args = [word, np.float32(1.0), np.uint64(1)]
            times = []
            cpu.start()
            for _ in range(count):
                sent = now()
                fill.launch(1, 1, args)
                gpu.synchronize()
                times.append((sent, now()))
            cpu.stop(count)
            report(
                f"{backend}, {loop} worker, hipr.connect(): 1-thread launch + synchronize()",
                _launch_stages(
                    times[warm:], worker.marks(), Opcode.LAUNCH_KERNEL, Opcode.DEVICE_SYNCHRONIZE
                ),
            )
        if long_rounds:
            from hipr.client.link import LinkOptions

            spin = LinkOptions().spin_seconds()
            pairs, spent, marks = _long_rows(
                f"unix://{worker.socket}", backend, long_rounds, worker.marks
            )
            kernel = "fill_f32 of 4 Mi elements" if backend == "emulator" else "SGEMM 2048³"
            for name, timed in pairs.items():
                stages = _long_stages(timed, marks, Opcode.LAUNCH_KERNEL)
                title = (
                    f"{backend}, {loop} worker, hipr.connect(): {kernel} launch + synchronize(), "
                    f"{name} (client spin {spin * 1e6:.0f} µs; {len(stages.get('total', []))} "
                    f"of {len(timed)} waited for the kernel)"
                )
                if stages:
                    stages[LONG_CLIENT_CPU] = spent[name]
                results[title] = stages
                if stages:
                    _print(title, stages, out)
                else:
                    out(title)
        with hipr.connect(f"unix://{worker.socket}") as gpu:
            word = gpu.malloc(4)
            fill = gpu.builtin("fill_f32")
            args = [word, np.float32(1.0), np.uint64(1)]
            if profile_top:
                client = cProfile.Profile()

                def launch_sync() -> None:
                    client.enable()
                    for _ in range(count):
                        fill.launch(1, 1, args)
                        gpu.synchronize()
                    client.disable()

                stats = worker.profile(launch_sync)
                _print_profile(
                    f"worker's loop thread, {count} launch + synchronize, cProfile",
                    stats,
                    profile_top,
                    out,
                )
                _print_profile(
                    f"client, {count} launch + synchronize, cProfile",
                    pstats.Stats(client),
                    profile_top,
                    out,
                )
    finally:
        worker.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.stages``; see the module doc."""
    args = list(sys.argv[1:] if argv is None else argv)
    from hipr.bench.servers import spin_setting

    parser = argparse.ArgumentParser(prog="python -m benchmarks.stages", description=__doc__)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--cpu", type=int, default=None, metavar="N")
    parser.add_argument("--long", type=int, default=100, metavar="N")
    parser.add_argument("--worker-spin-wait", type=spin_setting, metavar="S")
    options = parser.parse_args(args)
    allowed = os.sched_getaffinity(0)
    if options.cpu is not None:
        # Inherited by the worker subprocess: both ends on one CPU.
        os.sched_setaffinity(0, {options.cpu})
    try:
        measure(
            options.backend,
            options.count,
            options.loop,
            profile_top=options.profile,
            long_rounds=options.long,
            worker_spin_wait=options.worker_spin_wait,
        )
    finally:
        os.sched_setaffinity(0, allowed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
