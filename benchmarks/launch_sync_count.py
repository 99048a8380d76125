"""A launch + synchronize N times through the worker's I/O callback, for instruction
counts: as two frames (a fire-and-forget LAUNCH_KERNEL, then DEVICE_SYNCHRONIZE) or as
one request (protocol 1.3's LAUNCH_KERNEL with ``synchronize``).

    valgrind --tool=callgrind python -m benchmarks.launch_sync_count pair 200
    valgrind --tool=callgrind python -m benchmarks.launch_sync_count pair 1200

The difference of two runs' totals over the difference of their counts is the cost of one
launch + synchronize on the worker (interpreter start-up and set-up cancel out); run with
``PYTHONHASHSEED=0`` so that both runs hash alike. Same in-process connection as
``benchmarks.callback`` (its ``in_process_link`` and ``fill_launch``), emulator backend by default.
"""

from __future__ import annotations

import argparse
import asyncio

from benchmarks.callback import fill_launch, in_process_link
from hipr.protocol.codec import encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode


async def run(mode: str, count: int, backend_name: str) -> None:
    """``count`` launch + synchronize rounds, each answered before the next."""
    async with in_process_link(backend_name) as link:
        launch = await fill_launch(link)
        fused = {**launch, "synchronize": True}
        for _ in range(count):
            if mode == "pair":
                data = encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NO_REPLY, launch)
                data += encode_frame(Opcode.DEVICE_SYNCHRONIZE, link.request_id(), Flags.NONE)
            else:
                data = encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NONE, fused)
            link.feed(data)
            await link.until_answered(1)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.launch_sync_count``; see the module doc."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["pair", "fused"])
    parser.add_argument("count", type=int)
    parser.add_argument("--backend", default="emulator")
    options = parser.parse_args(argv)
    asyncio.run(run(options.mode, options.count, options.backend))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
