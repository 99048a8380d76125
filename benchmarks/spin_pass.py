"""What one pass of the worker's busy polling costs on an event loop: the two ways a
loop can be kept from sleeping between passes, each timed alone for ``--seconds``.

    python -m benchmarks.spin_pass [--seconds 0.5] [--loop uvloop,asyncio,trio]

- ``task checkpoint``: a task that awaits ``anyio.lowlevel.checkpoint()`` in a loop (the
  spin before stop 43, and the spin under trio);
- ``callback chain``: a callback that schedules itself with ``loop.call_soon`` (the spin
  under asyncio and uvloop since stop 43, ``BusyPoll._turn``); asyncio loops only.

Both leave the loop polling its sockets without sleeping between passes, so a request
that arrives mid-pass waits for the rest of it: the shorter the pass, the sooner it is
read. Prints microseconds per pass; a benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import anyio
import anyio.lowlevel


async def _task_passes(seconds: float) -> int:
    passes = 0
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        passes += 1
        await anyio.lowlevel.checkpoint()
    return passes


async def _callback_passes(seconds: float) -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    until = time.perf_counter() + seconds
    passes = 0

    def one_pass() -> None:
        nonlocal passes
        if time.perf_counter() < until:
            passes += 1
            loop.call_soon(one_pass)
        else:
            done.set_result(passes)

    loop.call_soon(one_pass)
    return await done


async def _measure(seconds: float, name: str) -> None:
    per_pass = seconds * 1e6 / await _task_passes(seconds)
    print(f"{name:8} task checkpoint {per_pass:6.2f} µs a pass", flush=True)
    if name != "trio":
        per_pass = seconds * 1e6 / await _callback_passes(seconds)
        print(f"{name:8} callback chain  {per_pass:6.2f} µs a pass", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.spin_pass``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spin_pass")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--loop", default="uvloop,asyncio,trio")
    args = parser.parse_args(argv)
    for name in args.loop.split(","):
        if name == "trio":
            anyio.run(_measure, args.seconds, name, backend="trio")
        else:
            options = {"use_uvloop": name == "uvloop"}
            anyio.run(_measure, args.seconds, name, backend="asyncio", backend_options=options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
