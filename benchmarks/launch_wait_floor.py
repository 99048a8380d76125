"""The floor under the worker's launch + wait: one tiny kernel launched and waited for in
one process with no worker, three ways, on a CUDA host.

    python -m benchmarks.launch_wait_floor [--count 3000] [--rounds 2]

- ``cuda-bindings loop``: ``cuLaunchKernel`` then ``cuStreamQuery`` until done, in Python
  through cuda-bindings (what the worker's Python path calls);
- ``ctypes loop``: the same two calls through ctypes;
- ``one native call``: ``hipr.backends._launch_wait`` (the worker's native
  launch-and-wait), with the C side's own time from the launch's return to the kernel
  seen done.

Medians and 90th percentiles of ``count`` launches each, per round. What the worker
spends on a fused launch + synchronize beyond these is its own
(``benchmarks/proxy/stages.py`` splits it)."""

from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
import sys
import time
from collections.abc import Callable

#: One float incremented: the tiny op's kernel, as PTX (no compiler needed).
PTX = b"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 p){
 .reg .b64 %rd<3>; .reg .f32 %f<3>;
 ld.param.u64 %rd1, [p];
 cvta.to.global.u64 %rd2, %rd1;
 ld.global.f32 %f1, [%rd2];
 add.f32 %f2, %f1, 0f3F800000;
 st.global.f32 [%rd2], %f2;
 ret;
}
"""


def _ok(result: tuple[object, ...]) -> object:
    if int(result[0]) != 0:  # type: ignore[call-overload]
        raise SystemExit(f"CUDA call failed: {result}")
    return result[1] if len(result) == 2 else None


def _stats(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    median = statistics.median(ordered) * 1e6
    return f"{median:7.2f} {ordered[int(len(ordered) * 0.9)] * 1e6:7.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch_wait_floor")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from cuda.bindings import driver as d

    from hipr.backends._launch_wait import DONE, entry_address, load_launch_wait

    _ok(d.cuInit(0))
    ctx = _ok(d.cuDevicePrimaryCtxRetain(_ok(d.cuDeviceGet(0))))
    _ok(d.cuCtxSetCurrent(ctx))
    fn = _ok(d.cuModuleGetFunction(_ok(d.cuModuleLoadData(PTX + b"\0")), b"k"))
    ptr = _ok(d.cuMemAlloc(4))
    stream = _ok(d.cuStreamCreate(1))
    args_buffer = ctypes.create_string_buffer(struct.pack("<Q", int(ptr)), 8)  # type: ignore[call-overload]
    size = ctypes.c_size_t(8)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(args_buffer), 2, ctypes.addressof(size), 0)
    not_ready = int(d.CUresult.CUDA_ERROR_NOT_READY)
    lib = ctypes.CDLL("libcuda.so.1")
    launch, query = lib.cuLaunchKernel, lib.cuStreamQuery
    launch.argtypes = [ctypes.c_void_p, *(ctypes.c_uint,) * 7, *(ctypes.c_void_p,) * 3]
    query.argtypes = [ctypes.c_void_p]
    native = load_launch_wait(entry_address(launch), entry_address(query), not_ready)
    if native is None:
        raise SystemExit("the native launch-and-wait could not be built or loaded")
    f, s, e = int(fn), int(stream), ctypes.addressof(extra)  # type: ignore[call-overload]

    def bindings() -> None:
        d.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, None, e)
        while int(d.cuStreamQuery(stream)[0]) == not_ready:
            pass

    def through_ctypes() -> None:
        launch(f, 1, 1, 1, 32, 1, 1, 0, s, None, e)
        while query(s) == not_ready:
            pass

    polled: list[float] = []

    def one_native_call() -> None:
        if native.run(f, (1, 1, 1, 32, 1, 1), 0, s, [], e, 1.0) != DONE:
            raise SystemExit("the native call did not see the kernel done")
        polled.append(native.results().polled_ns / 1e9)

    def timed(step: Callable[[], None]) -> list[float]:
        seconds = []
        for _ in range(args.count):
            started = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - started)
        return seconds

    for round_ in range(args.rounds):
        print(f"round {round_}: launch + wait, median / p90 µs over {args.count}")
        print(f"  cuda-bindings loop    {_stats(timed(bindings))}")
        print(f"  ctypes loop           {_stats(timed(through_ctypes))}")
        polled.clear()
        native_seconds = timed(one_native_call)
        print(f"  one native call       {_stats(native_seconds)}   (launch return -> done in C: "
              f"{statistics.median(polled) * 1e6:.2f})")  # fmt: skip
    value = ctypes.c_float()
    _ok(d.cuMemcpyDtoH(ctypes.addressof(value), ptr, 4))
    expected = 3 * args.count * args.rounds
    print(f"kernel ran {int(value.value)} times (expected {expected})")
    return 0 if int(value.value) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
