"""A launch + synchronize N times through the worker's I/O callback, for instruction
counts: as two frames (a fire-and-forget LAUNCH_KERNEL, then DEVICE_SYNCHRONIZE) or as
one request (protocol 1.3's LAUNCH_KERNEL with ``synchronize``).

    valgrind --tool=callgrind python -m benchmarks.launch_sync_count pair 200
    valgrind --tool=callgrind python -m benchmarks.launch_sync_count pair 1200

The difference of two runs' totals over the difference of their counts is the cost of one
launch + synchronize on the worker (interpreter start-up and set-up cancel out); run with
``PYTHONHASHSEED=0`` so that both runs hash alike. Same in-process connection as
``benchmarks.callback`` (its ``InProcessLink``), emulator backend by default.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from benchmarks.callback import InProcessLink
from hipr.backends import load_backend
from hipr.kernels.kernel_args import pack_args
from hipr.protocol.codec import encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker


async def run(mode: str, count: int, backend_name: str) -> None:
    """``count`` launch + synchronize rounds, each answered before the next."""
    backend = load_backend(backend_name)
    link = InProcessLink(Worker(WorkerConfig(spin_wait=0.0), backend))
    await link.start()
    try:
        fill = await link.call(Opcode.MODULE_BUILTIN, {"name": "fill_f32"})
        word = (await link.call(Opcode.MALLOC, {"size": 4096}))["ptr"]
        packed = pack_args([np.uint64(word), np.float32(1.0), np.uint64(1)])
        launch = {
            "function": fill["function"],
            "grid": [1],
            "block": [1],
            "shared_mem": 0,
            "args": packed.data,
            "ptrs": packed.pointer_offsets(),
            "stream": None,
        }
        fused = {**launch, "synchronize": True}
        for _ in range(count):
            if mode == "pair":
                data = encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NO_REPLY, launch)
                data += encode_frame(Opcode.DEVICE_SYNCHRONIZE, link.request_id(), Flags.NONE)
            else:
                data = encode_frame(Opcode.LAUNCH_KERNEL, link.request_id(), Flags.NONE, fused)
            link.feed(data)
            await link.until_answered(1)
    finally:
        await link.close()
        close = getattr(backend, "close", None)
        if close is not None:
            close()


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
