"""How soon after its launch a tiny kernel is seen done, on a GPU backend alone.

    python -m benchmarks.kernel_latency [--backend cuda] [--count N] [--gap SECONDS]

Launches a 1-thread ``fill_f32`` through the backend (as the worker's inline launch
does) and waits for it three ways: polling the backend's ``work_done`` (the worker's
inline look, through ``run_in_lane``'s machinery less the session), polling the raw
stream query, and the runtime's stream synchronize. Prints the medians, in µs, of the
launch call's return to the kernel seen done, of the launch and wait together, and the
polls it took. ``--gap`` sleeps between launches (a worker between requests): the CPU
then runs the next launch cold. What it separates: the GPU's own latency for a tiny
kernel, the runtime's launch call, and what the backend's poll adds to both.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from hipr.backends import load_backend


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.kernel_latency``; see the module doc."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernel_latency", description=__doc__
    )
    parser.add_argument("--backend", default="cuda", choices=("cuda", "hip"))
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--gap", type=float, default=0.0, metavar="SECONDS")
    options = parser.parse_args(argv)
    backend: Any = load_backend(options.backend)
    backend.bind_thread(0)
    function = backend.module_get_function(backend.builtin_module(), "fill_f32")
    word = backend.malloc(4096)
    args = struct.pack("<Qf4xQ", word, 1.0, 1)
    raw = backend._default_stream()  # the lane's own stream, where launch() puts the kernel
    query = backend._rt.function(backend._calls.stream_query)
    synchronize = backend._rt.function(backend._calls.stream_synchronize)

    def poll_work_done() -> int:
        polls = 1
        while not backend.work_done([]):
            polls += 1
        return polls

    def poll_query() -> int:
        polls = 1
        while int(query(raw)[0]) != 0:
            polls += 1
        return polls

    def stream_synchronize() -> int:
        synchronize(raw)
        return 0

    def run(name: str, wait: Callable[[], int]) -> None:
        after, total, polls = [], [], []
        for index in range(options.count + 200):  # the first 200 warm up
            started = time.perf_counter()
            backend.launch(function, (1, 1, 1), (1, 1, 1), 0, None, args)
            issued = time.perf_counter()
            count = wait()
            done = time.perf_counter()
            if index >= 200:
                after.append((done - issued) * 1e6)
                total.append((done - started) * 1e6)
                polls.append(count)
            if options.gap:
                time.sleep(options.gap)
        med = statistics.median
        print(
            f"  {name:32} launch -> seen done {med(after):6.2f} µs, launch + wait "
            f"{med(total):6.2f} µs, polls {med(polls):.0f}"
        )

    gap = options.gap * 1e6
    print(f"tiny kernel on {options.backend}, gap {gap:.0f} µs, medians of {options.count}")
    try:
        run("backend work_done poll", poll_work_done)
        run("raw stream query poll", poll_query)
        run("stream synchronize", stream_synchronize)
    finally:
        backend.free(word)
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
