"""What the pieces of a launch cost on this host, and what a second thread pays for them.

    python -m benchmarks.pieces [--backend emulator|cuda|hip] [--count N]

Prints microseconds per call of the pieces a fire-and-forget launch goes through in
one process, so that a host's figures can be read against each other:

- the wire: decoding a launch frame (``FrameDecoder.next_frame``), ``cbor2`` alone, the
  worker's argument checks (``Args``) and the client's frame encoding;
- the client: packing a launch's arguments (a device pointer and two numpy scalars,
  ``pack_args``) and building its wire arguments (``launch_args``, which packs too);
- the backend: ``launch`` on the calling thread, N launches then a synchronize, and
  the runtime's own launch function called with every argument made ready (the floor
  under ``launch``; GPU backends only);
- the GIL: the same launches from a second thread, while this one waits, and while
  it runs Python (decoding CBOR in a loop) at several ``sys.setswitchinterval`` values.

The last rows show the interpreter lock's convoy: a thread whose calls drop the lock
for microseconds at a time (cuda-bindings' calls do) must take it back after each one,
and while another thread runs Python it waits up to the switch interval to get it. On
the H100 host (2026-11-25) a 5.4 µs launch took 4,807 µs from a second thread while
the main thread decoded CBOR; the emulator's launches, pure Python, show no convoy.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2
import numpy as np

from hipr.handlers.args import Args
from hipr.kernels.kernel_args import pack_args
from hipr.protocol.codec import FrameDecoder, encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode

#: A 1-thread fill_f32 launch's arguments, as the sync client sends them.
LAUNCH_WIRE: dict[str, Any] = {
    "function": 1,
    "grid": [1],
    "block": [1],
    "shared_mem": 0,
    "args": bytes(24),
    "ptrs": [0],
    "stream": None,
}
SWITCH_INTERVALS = (0.005, 0.0005, 0.00005)


def per_call(fn: Callable[[], object], count: int) -> float:
    """Microseconds per call of ``fn``, over ``count`` calls."""
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count * 1e6


def _check_launch_args() -> None:
    args = Args(LAUNCH_WIRE, "LAUNCH_KERNEL")
    args.handle("function")
    args.dim3("grid")
    args.dim3("block")
    args.integer("shared_mem", high=1 << 20, default=0)
    args.blob("args", max_length=4096)
    args.int_list("ptrs", max_items=256, high=4096)
    args.handle("stream", optional=True)


def wire_pieces(count: int) -> dict[str, float]:
    """Per-call costs of decoding, checking and encoding a launch frame."""
    frames = b"".join(
        encode_frame(Opcode.LAUNCH_KERNEL, i + 1, Flags.NO_REPLY, LAUNCH_WIRE) for i in range(count)
    )
    decoder = FrameDecoder()
    decoder.feed(frames)
    payload = cbor2.dumps(LAUNCH_WIRE)
    from hipr.client.objects import DevicePtr, launch_args

    class _Function:  # what launch_args reads of a client Function
        def _check(self) -> int:
            return 1

    values = [DevicePtr(1 << 40, 64), np.float32(1.0), np.uint64(1)]
    function = _Function()
    return {
        "client: pack a launch's arguments": per_call(lambda: pack_args(values), count),
        "client: a launch's wire arguments": per_call(
            lambda: launch_args(function, 1, 1, values, 0),  # type: ignore[arg-type]
            count,
        ),
        "decode a launch frame": per_call(decoder.next_frame, count),
        "cbor2.loads of its arguments": per_call(lambda: cbor2.loads(payload), count),
        "the worker's argument checks": per_call(_check_launch_args, count),
        "encode a launch frame": per_call(
            lambda: encode_frame(Opcode.LAUNCH_KERNEL, 5, Flags.NO_REPLY, LAUNCH_WIRE), count
        ),
    }


def backend_pieces(backend_name: str, count: int) -> dict[str, float]:
    """Launch costs through a hipr backend: on this thread, then from a second thread
    while this one waits or runs Python."""
    from hipr.backends import load_backend

    backend = load_backend(backend_name)
    results: dict[str, float] = {}
    try:
        backend.bind_thread(0)
        word = backend.malloc(4096)
        fill = backend.module_get_function(backend.builtin_module(), "fill_f32")
        packed = pack_args([np.uint64(word), np.float32(1.0), np.uint64(1)]).data
        one = (1, 1, 1)

        def launch() -> None:
            backend.launch(fill, one, one, 0, None, packed)

        for _ in range(2):  # the first round warms up
            backend.synchronize()
            results["backend launch, this thread"] = per_call(launch, count)
        backend.synchronize()
        runtime_launch = _runtime_launch(backend, fill, packed)
        if runtime_launch is not None:
            results["the runtime's launch call alone (binding, arguments ready)"] = per_call(
                runtime_launch, count
            )
            backend.synchronize()
        driver_launch = _driver_launch(backend, fill, packed)
        if driver_launch is not None:
            results["the driver's launch through ctypes (arguments ready)"] = per_call(
                driver_launch, count
            )
            backend.synchronize()
        launcher = getattr(backend, "launcher", None)
        if launcher is not None:
            batch_launch = launcher(fill, one, one, 0, None)
            results["backend launcher(), per launch"] = per_call(
                lambda: batch_launch(packed), count
            )
            backend.synchronize()
        results.update(_from_a_second_thread(backend, launch, count))
        backend.synchronize()
        backend.free(word)
    finally:
        backend.close()
    return results


def _runtime_launch(backend: Any, fill: Any, packed: bytes) -> Callable[[], object] | None:
    """The GPU runtime's launch function itself (cuda-bindings' ``cuLaunchKernel``, or
    hip-python's ``hipModuleLaunchKernel``) with every argument made ready beforehand:
    the floor under the backend's ``launch``, whose own Python the difference is. None
    on the emulator."""
    runtime = getattr(backend, "_rt", None)
    if runtime is None:
        return None
    from hipr.backends._launch_extra import ReusedLaunchExtra

    call = runtime.function(backend._calls.launch_kernel)
    pointer, size, end = backend._extra_words
    extra = ReusedLaunchExtra(len(packed), buffer_pointer=pointer, buffer_size=size, end=end)
    extra.fill(packed)
    stream = backend._default_stream()

    def launch() -> object:
        # ``extra`` named here keeps its buffers alive: the runtime reads them.
        return call(fill, 1, 1, 1, 1, 1, 1, 0, stream, None, extra.address)

    launch()
    return launch


def _driver_launch(backend: Any, fill: Any, packed: bytes) -> Callable[[], object] | None:
    """CUDA's ``cuLaunchKernel`` called from ``libcuda.so.1`` through ctypes, handles and
    ``extra`` made ready: what a launch costs without cuda-bindings' argument
    conversion. None on other backends."""
    if getattr(backend, "name", "") != "cuda":
        return None
    import ctypes

    from hipr.backends._launch_extra import ReusedLaunchExtra

    driver = ctypes.CDLL("libcuda.so.1")
    launch_kernel = driver.cuLaunchKernel
    launch_kernel.restype = ctypes.c_int
    launch_kernel.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p]
    launch_kernel.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
    pointer, size, end = backend._extra_words
    extra = ReusedLaunchExtra(len(packed), buffer_pointer=pointer, buffer_size=size, end=end)
    extra.fill(packed)
    function = int(fill)
    stream = int(backend._default_stream())

    def launch() -> object:
        # ``extra`` named here keeps its buffers alive: the driver reads them.
        return launch_kernel(function, 1, 1, 1, 1, 1, 1, 0, stream, None, extra.address)

    if launch() != 0:
        return None
    return launch


def _from_a_second_thread(backend: Any, launch: Callable[[], None], count: int) -> dict[str, float]:
    batches: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    done = threading.Event()

    def gpu_thread() -> None:
        backend.bind_thread(0)
        while (batch := batches.get()) is not None:
            for _ in range(batch):
                launch()
            done.set()

    payload = cbor2.dumps(LAUNCH_WIRE)
    thread = threading.Thread(target=gpu_thread, name="pieces-gpu")
    thread.start()
    results: dict[str, float] = {}
    saved = sys.getswitchinterval()
    try:
        runs = [("second thread, this one waiting", saved, False)]
        runs += [
            (f"second thread, this one running Python, switch {s * 1e6:g} µs", s, True)
            for s in SWITCH_INTERVALS
        ]
        for label, interval, busy in runs:
            sys.setswitchinterval(interval)
            done.clear()
            start = time.perf_counter()
            batches.put(count)
            while not done.is_set():
                if busy:
                    cbor2.loads(payload)
                else:
                    done.wait(0.001)
            results[label] = (time.perf_counter() - start) / count * 1e6
    finally:
        sys.setswitchinterval(saved)
        batches.put(None)
        thread.join()
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.pieces``; see the module doc."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pieces", description=__doc__)
    parser.add_argument("--backend", default="emulator")
    parser.add_argument("--count", type=int, default=5000)
    options = parser.parse_args(argv)
    figures = wire_pieces(options.count)
    figures.update(backend_pieces(options.backend, options.count))
    width = max(len(name) for name in figures)
    print(f"per call, µs ({options.backend}, Python {sys.version.split()[0]})")
    for name, value in figures.items():
        print(f"  {name:<{width}}  {value:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
