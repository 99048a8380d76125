"""What a socket's receive costs by the memory it lands in, and with a DMA behind it.

    python -m benchmarks.receive_memory [--rounds 3] [--mib 256]

A blocking unix stream of ``--mib`` MiB (sender in a process of its own, 1 MiB send
buffers, as the worker's links), received by a plain Python ``recv_into`` loop:

- **kinds**: into 4 MiB slices of a 64 MiB ring of a bytearray, of ``cuMemHostAlloc``
  memory (the worker's pinned payload buffers), of ``mmap`` with ``MADV_HUGEPAGE`` then
  ``cuMemHostRegister``, and of that mmap unregistered; GB/s and the receiving thread's
  CPU per GiB;
- **rings**: received into slices of a pinned ring and copied to the GPU slice by slice
  (``cuMemcpyHtoDAsync`` on a stream, each slice reused only after its event), for 4 MiB
  slices of a 64 MiB ring (the worker's shape), 1 MiB of 4 MiB and 256 KiB of 1 MiB
  (cache-resident), beside the receive alone.

The CUDA rows need cuda-bindings and a GPU; without them only the host kinds run.
Medians of the streams after the first. A benchmark: it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MIB = 1 << 20
RING = 64 * MIB
SLICE = 4 * MIB
STREAMS = 6

try:
    from cuda.bindings import driver as cu
except ImportError:  # no GPU stack: the host kinds only
    cu = None


def _ok(result: Any) -> Any:
    error = result[0] if isinstance(result, tuple) else result
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed: {result}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def _pinned(size: int) -> tuple[int, memoryview]:
    ptr = int(_ok(cu.cuMemHostAlloc(size, cu.CU_MEMHOSTALLOC_PORTABLE)))
    return ptr, memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def _huge(register: bool) -> memoryview:
    area = mmap.mmap(-1, RING)
    area.madvise(mmap.MADV_HUGEPAGE)
    for offset in range(0, RING, 4096):  # fault in (huge pages where the kernel grants them)
        area[offset] = 0
    if register:
        address = ctypes.addressof(ctypes.c_char.from_buffer(area))
        _ok(cu.cuMemHostRegister(address, RING, cu.CU_MEMHOSTREGISTER_PORTABLE))
    return memoryview(area)


def _stream(size: int, receive: Callable[[socket.socket], None]) -> tuple[float, float]:
    """Median GB/s and receiving CPU s/GiB of ``STREAMS`` streams of ``size`` bytes."""
    a, b = socket.socketpair()
    for end in (a, b):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MIB)
    pid = os.fork()
    if pid == 0:  # the sender
        b.close()
        data = memoryview(b"\7" * size)
        for _ in range(STREAMS):
            a.sendall(data)
            a.recv(1)
        os._exit(0)
    a.close()
    rates, cpu = [], []
    for _ in range(STREAMS):
        start, thread_start = time.perf_counter(), time.thread_time()
        receive(b)
        b.sendall(b"1")
        rates.append(size / (time.perf_counter() - start) / 1e9)
        cpu.append((time.thread_time() - thread_start) / (size / 2**30))
    os.waitpid(pid, 0)
    b.close()
    return statistics.median(rates[1:]), statistics.median(cpu[1:])


def _into_ring(ring: memoryview, size: int, slice_bytes: int) -> Callable[[socket.socket], None]:
    def receive(sock: socket.socket) -> None:
        got = at = 0
        while got < size:
            room = min(slice_bytes - at % slice_bytes, size - got)
            got += (n := sock.recv_into(ring[at : at + room], room))
            at = (at + n) % ring.nbytes

    return receive


def _to_gpu(ring_bytes: int, slice_bytes: int, size: int) -> Callable[[socket.socket], None]:
    base, ring = _pinned(ring_bytes)
    device = int(_ok(cu.cuMemAlloc(size)))
    stream = _ok(cu.cuStreamCreate(0))
    slots = ring_bytes // slice_bytes
    flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    events = [_ok(cu.cuEventCreate(flags)) for _ in range(slots)]
    used = [False] * slots

    def receive(sock: socket.socket) -> None:
        got = k = 0
        while got < size:
            slot = k % slots
            at = slot * slice_bytes
            if used[slot]:
                _ok(cu.cuEventSynchronize(events[slot]))
            want = min(slice_bytes, size - got)
            filled = 0
            while filled < want:
                filled += sock.recv_into(ring[at + filled : at + want], want - filled)
            _ok(cu.cuMemcpyHtoDAsync(device + got, base + at, want, stream))
            _ok(cu.cuEventRecord(events[slot], stream))
            used[slot] = True
            got += want
            k += 1
        _ok(cu.cuStreamSynchronize(stream))

    return receive


def main(argv: list[str] | None = None) -> int:
    """Run both tables (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args(argv)
    size = args.mib * MIB
    kinds: dict[str, memoryview] = {"bytearray": memoryview(bytearray(RING))}
    gpu = False
    if cu is not None:
        try:
            _ok(cu.cuInit(0))
            device = _ok(cu.cuDeviceGet(0))
            _ok(cu.cuCtxSetCurrent(_ok(cu.cuDevicePrimaryCtxRetain(device))))
            gpu = True
        except RuntimeError as exc:
            print(f"no GPU ({exc}): the host kinds only")
    if gpu:
        kinds["cuMemHostAlloc"] = _pinned(RING)[1]
        kinds["THP + cuMemHostRegister"] = _huge(register=True)
    kinds["THP mmap"] = _huge(register=False)
    for round_ in range(args.rounds):
        for name, ring in kinds.items():
            gbs, cpu = _stream(size, _into_ring(ring, size, SLICE))
            print(f"round {round_} kinds: {name:24} {gbs:.2f} GB/s, receiver {cpu:.3f} s/GiB",
                  flush=True)  # fmt: skip
        if not gpu:
            continue
        for label, ring_bytes, slice_bytes in (
            ("4 MiB slices of 64 MiB", RING, SLICE),
            ("1 MiB slices of 4 MiB", 4 * MIB, MIB),
            ("256 KiB slices of 1 MiB", MIB, MIB // 4),
        ):
            with_dma, _ = _stream(size, _to_gpu(ring_bytes, slice_bytes, size))
            alone, _ = _stream(size, _into_ring(_pinned(ring_bytes)[1], size, slice_bytes))
            print(f"round {round_} rings: {label:24} receive + DMA {with_dma:.2f} GB/s; "
                  f"receive alone {alone:.2f} GB/s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
