"""A worker's resident memory while many clients copy, and once they are gone.

    python -m benchmarks.copy_memory [--clients 48] [--seconds 8] [--loop uvloop]

Starts a worker on the emulator in a subprocess, runs ``--clients`` threads that each
copy 1-3 MiB host→device and back with ``hipr.connect()`` for ``--seconds``, and prints
the worker's RSS at start, its peak under the load, right after, and 3 s later (the
worker hands freed heap back after a second without sessions). A memory figure, not a
speed one: run it on a quiet machine and compare runs of it with each other.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no VmRSS")


def measure(clients: int, seconds: float, loop: str) -> dict[str, int]:
    """Run the load; the worker's RSS in MiB at start, peak, end and 3 s after."""
    import hipr

    directory = tempfile.mkdtemp(prefix="hipr-copymem-")
    url = f"unix://{directory}/w.sock"
    command = [sys.executable, "-m", "hipr", "worker", "--backend", "emulator"]
    worker = subprocess.Popen(
        [*command, "--loop", loop, "--listen", url],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{directory}/w.sock"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start")
            time.sleep(0.05)
        time.sleep(0.5)
        figures = {"start": _rss_mib(worker.pid)}
        stop = time.monotonic() + seconds
        errors: list[BaseException] = []

        def client(index: int) -> None:
            try:
                with hipr.connect(url) as gpu:
                    size = (1 << 20) * (1 + index % 3)
                    pointer = gpu.malloc(size)
                    data, out = np.ones(size, np.uint8), np.empty(size, np.uint8)
                    while time.monotonic() < stop:
                        gpu.memcpy_htod(pointer, data)
                        gpu.memcpy_dtoh(pointer, size, out=out)
                        for _ in range(20):
                            gpu.synchronize()
            except BaseException as exc:  # reported below, after the others finish
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        peak = 0
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, _rss_mib(worker.pid))
            time.sleep(0.2)
        if errors:
            raise errors[0]
        figures["peak"] = peak
        figures["end"] = _rss_mib(worker.pid)
        time.sleep(3)
        figures["idle"] = _rss_mib(worker.pid)
        return figures
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.copy_memory``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.copy_memory", description=__doc__)
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio", "trio"))
    options = parser.parse_args(argv)
    figures = measure(options.clients, options.seconds, options.loop)
    print(
        f"worker RSS (MiB), {options.clients} copying clients, {options.loop}: "
        f"start {figures['start']}, peak under load {figures['peak']}, "
        f"end {figures['end']}, idle 3 s later {figures['idle']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
