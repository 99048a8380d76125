"""Synchronizes that wait for a kernel still running, on every backend: the device's,
a stream's and an event's return only once the kernel has finished (what it wrote is
there), whichever thread of the worker answers them, and an earlier fire-and-forget
failure is reported by such a wait, once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import hipr
from hipr.client import AsyncGpu
from hipr.errors import HipErrorCode as E
from tests.conformance.conftest import Target

pytestmark = pytest.mark.anyio

#: A kernel that runs for a while, then writes its mark (GPU backends compile it).
SPIN_SOURCE = r"""
extern "C" __global__ void spin_then_mark(unsigned long long cycles, int* mark, int value) {
    long long start = clock64();
    while (clock64() - start < (long long)cycles) {
    }
    *mark = value;
}
"""
#: About 30 ms on a GPU clocked near 1.7 GHz.
SPIN_CYCLES = 50_000_000
#: The emulator's long kernel: a fill of this many floats (tens of ms in numpy).
EMULATED_FILL = 32 << 20


class LongKernel:
    """Launches a kernel that runs for tens of milliseconds and then leaves ``value``
    where :meth:`mark` reads it."""

    def __init__(self, gpu: AsyncGpu, target: Target) -> None:
        self.gpu = gpu
        self.target = target
        self.kernel: Any = None
        self.out: Any = None

    async def setup(self) -> None:
        if self.target.has_compiler:
            module = await self.gpu.compile(SPIN_SOURCE, "spin.hip")
            self.kernel = await module.function("spin_then_mark")
            self.out = await self.gpu.malloc(4)
        else:
            self.kernel = await self.gpu.builtin("fill_f32")
            self.out = await self.gpu.malloc(4 * EMULATED_FILL)

    async def launch(self, value: int, stream: Any = None) -> None:
        if self.target.has_compiler:
            args = [np.uint64(SPIN_CYCLES), self.out, np.int32(value)]
            await self.kernel.launch(1, 1, args, stream=stream)
        else:
            args = [self.out, np.float32(value), np.uint64(EMULATED_FILL)]
            await self.kernel.launch(EMULATED_FILL // 256, 256, args, stream=stream)

    async def mark(self) -> int:
        if self.target.has_compiler:
            return int(np.frombuffer(await self.gpu.memcpy_dtoh(self.out, 4), np.int32)[0])
        last = self.out + 4 * (EMULATED_FILL - 1)
        return int(np.frombuffer(await self.gpu.memcpy_dtoh(last, 4), np.float32)[0])


async def test_each_wait_returns_once_the_kernel_has_finished(target: Target) -> None:
    async with hipr.aconnect(target.url) as gpu:
        kernel = LongKernel(gpu, target)
        await kernel.setup()
        stream = await gpu.stream_create()
        event = await gpu.event_create()

        async def device_wait() -> None:
            await gpu.synchronize()

        async def event_wait() -> None:
            await event.record(stream)
            await event.synchronize()

        waits: list[tuple[Callable[[], Awaitable[None]], Any]] = [
            (device_wait, None),
            (stream.synchronize, stream),
            (event_wait, stream),
        ]
        value = 0
        for _ in range(3):
            for wait, on in waits:
                value += 1
                await kernel.launch(value, stream=on)
                await wait()
                assert await kernel.mark() == value, wait
        await stream.destroy()
        await event.destroy()


async def test_a_refused_launch_is_reported_by_the_wait_after_it(target: Target) -> None:
    async with hipr.aconnect(target.url) as gpu:
        kernel = LongKernel(gpu, target)
        await kernel.setup()
        await kernel.launch(1)
        fill = await gpu.builtin("fill_f32")
        # Not this session's memory: the worker refuses the launch; the fire-and-forget
        # launch has no reply, so the synchronize that follows reports it.
        await fill.launch(1, 1, [hipr.DevicePtr(0x10, 64), np.float32(1), np.uint64(1)])
        with pytest.raises(hipr.HipError) as err:
            await gpu.synchronize()
        assert err.value.code == E.hipErrorInvalidValue
        assert "not inside an allocation" in err.value.message
        await kernel.launch(2)
        await gpu.synchronize()  # reported once
        assert await kernel.mark() == 2
