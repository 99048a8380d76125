"""A launch with ``synchronize`` (protocol 1.3) spends the tenant's request rate as the
two requests it stands for: each launch one, the synchronize one more."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import numpy as np
import pytest

from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipError
from hipr.kernels.kernel_args import pack_args
from hipr.protocol import Flags, FrameDecoder, Opcode, encode_frame
from hipr.transports import connect
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import new_token, token_hash

pytestmark = pytest.mark.anyio

TOKEN = new_token()
#: A bucket of 50 that refills slowly: what a burst of requests spends stays readable.
TENANTS = f"""
[tenants.carol]
tokens = ["{token_hash(TOKEN)}"]
max_request_rate = 20
max_request_burst = 50
"""


@pytest.fixture
async def worker(anyio_backend: str, short_tmp: Path) -> AsyncIterator[Worker]:
    tenants = short_tmp / "tenants.toml"
    tenants.write_text(TENANTS)
    config = WorkerConfig(tenants_file=tenants, resume_grace=0.0, isolation="none")
    backend = EmulatorBackend(device_count=1, total_memory=64 << 20)
    async with running_worker(config, backend, [f"unix://{short_tmp}/f.sock"]) as running:
        yield running


async def test_the_synchronize_of_a_fused_launch_counts_as_a_request(worker: Worker) -> None:
    stream = await connect(worker.bound_urls[0])
    decoder = FrameDecoder()
    ids = iter(range(1, 1000))

    async def exchange(data: bytes, count: int) -> list[tuple[bool, object]]:
        await stream.send(data)
        found: list[tuple[bool, object]] = []
        with anyio.fail_after(10):
            while len(found) < count:
                frame = decoder.next_frame()
                if frame is None:
                    decoder.feed(await stream.receive())
                elif frame.request_id:
                    found.append((Flags.ERROR in frame.flags, frame.args))
        return found

    def frame(opcode: Opcode, args: object, flags: Flags = Flags.NONE) -> bytes:
        return encode_frame(opcode, next(ids), flags, args)

    try:
        await stream.send(encode_frame(Opcode.HELLO, 0, Flags.NONE, {"token": TOKEN}))
        with anyio.fail_after(10):
            while decoder.next_frame() is None:
                decoder.feed(await stream.receive())
        [(_, out)] = await exchange(frame(Opcode.MALLOC, {"size": 64}), 1)
        assert isinstance(out, dict)
        [(_, fill)] = await exchange(frame(Opcode.MODULE_BUILTIN, {"name": "fill_f32"}), 1)
        assert isinstance(fill, dict)
        packed = pack_args([np.uint64(out["ptr"]), np.float32(1.0), np.uint64(1)])
        launch = {"function": fill["function"], "grid": [1], "block": [1], "ptrs": [0],
                  **packed.to_wire(), "synchronize": True}  # fmt: skip
        await anyio.sleep(0.1)  # what the setup spent is a few requests of the 50
        # 40 fused requests in one write: 80 requests' worth, where 40 would fit.
        replies = await exchange(
            b"".join(frame(Opcode.LAUNCH_KERNEL, launch) for _ in range(40)), 40
        )
    finally:
        await stream.aclose()
    answered = sum(1 for error, _ in replies if not error)
    refused = [args for error, args in replies if error]
    assert 18 <= answered <= 30, answered
    for args in refused:
        error = HipError.from_wire(args)
        assert "max_request_rate" in str(error)
