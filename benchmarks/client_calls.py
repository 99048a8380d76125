"""The sync client's own Python work per call, counted: deterministic, so two trees compare
on a loaded machine where timings do not.

    python -m benchmarks.client_calls [--count N]

Starts an emulator worker in this process (on a unix socket, in a thread of its own) and
connects the sync client to it; then counts, with cProfile on the client's thread only,
the Python function calls of a 1-thread launch + synchronize, of a lone fire-and-forget
launch and of a fire-and-forget 4 B host-to-device copy, per call. Run it with
``PYTHONPATH`` at another tree's root to count that tree (an A/B of client changes).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import numpy as np

import hipr
from hipr.backends import load_backend
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

WARM_UP = 200


def calls_per(count: int, body: Callable[[], None], after: Callable[[], None]) -> float:
    """Python calls of ``body`` on this thread, per call, over ``count`` calls (``after``
    runs once inside the count: the synchronize that ends a run of posts)."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(count):
        body()
    after()
    profile.disable()
    stats = pstats.Stats(profile)
    total = sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]
    return total / count


def measure(url: str, count: int) -> dict[str, float]:
    """The three counts against the worker at ``url``."""
    with hipr.connect(url) as gpu:
        buf = gpu.malloc(4096)
        kernel = gpu.builtin("fill_f32")
        args = [buf, np.float32(1.0), np.uint64(1)]
        source = np.zeros(1, dtype=np.float32)

        def launch() -> None:
            kernel.launch(grid=(1, 1, 1), block=(1, 1, 1), args=args)

        def launch_and_sync() -> None:
            launch()
            gpu.synchronize()

        def copy() -> None:
            gpu.memcpy_htod_async(buf, source)

        for _ in range(WARM_UP):
            launch_and_sync()
        return {
            "launch + synchronize": calls_per(count, launch_and_sync, lambda: None),
            "lone launch": calls_per(count, launch, gpu.synchronize),
            "fire-and-forget 4 B copy": calls_per(count, copy, gpu.synchronize),
        }


async def serve_and_measure(count: int) -> dict[str, float]:
    """An emulator worker for the duration of :func:`measure`."""
    with tempfile.TemporaryDirectory() as directory:
        url = f"unix://{Path(directory) / 'w.sock'}"
        config = WorkerConfig(isolation="none")
        async with running_worker(config, load_backend("emulator"), [url]) as worker:
            bound = worker.bound_urls[0]
            return await anyio.to_thread.run_sync(measure, bound, count)


def main(argv: list[str] | None = None) -> int:
    """Print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args(argv)
    counts = anyio.run(serve_and_measure, args.count)
    print(f"sync client, Python calls per call ({args.count} calls each, hipr {hipr.__version__})")
    for name, value in counts.items():
        print(f"  {name:<28} {value:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
