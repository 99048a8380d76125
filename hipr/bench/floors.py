"""The machine's floors (issue 13): what plain blocking sockets, and the runtime called
in-process, do with the same work as hipr's synchronous client.

* A **blocking-socket server** in a process of its own (a thread per connection, nothing
  else running in it, so the bench process's GIL cannot distort it; its sockets and the
  client's set up as hipr's: TCP_NODELAY, and on unix hipr's send buffer) answering: an
  echo of fixed request and reply sizes (24 B -> 32 B, a null call's frames), a sink (a copy's
  bytes pushed, or a burst of small one-way messages, then a one-byte ack) and a source
  (a copy's bytes pulled). The client side is blocking sockets too, receiving straight
  into the destination array, as the sync client does.
* A **uvloop echo** (an asyncio protocol on uvloop, also in its own process) answering the
  same echo: what an event-loop server costs over a blocking one.
* The **local runtime** doing the GPU work in this process through hipr's own backend
  object (and CuPy where it imports): launch + synchronize, 1,000 launches then one
  synchronize, 256 MiB copies and a 2048³ SGEMM. On the emulator, the emulator in-process.

One listener serves every floor through a tiny command protocol: a 24-byte command
``<4sIQQ`` (kind, a, b, c), then the command's traffic, then the next command.

=======  ==========================================================================
ECHO     ``c`` round trips of an ``a``-byte request answered by a ``b``-byte reply
SINK     receive ``b`` bytes, then answer one byte
SOURCE   send ``b`` bytes
=======  ==========================================================================

A stream's server receives into (or sends from) one 1 MiB buffer, which stays in the
CPU's cache; with ``a`` set it walks a ring of ``a`` bytes instead, as a copy's bytes
must land in (or come from) memory the GPU then reads: the **ring floor**
(``Floors.gbs("push_ring")``). On the H200 hosts a 64 MiB ring read from 3 % above to
28 % below the cached buffer, host to host (docs/gpu-runs/2026-11-26-ring-floor.txt).

``python -m hipr.bench.floors --listen URL... [--uvloop]`` serves them and prints
``{"urls": [...]}`` once listening (``hipr bench`` starts it; run it on a worker's machine
to measure a remote link's floor, then ``hipr bench URL --floor URL``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hipr.transports.unix import size_send_buffer

COMMAND = struct.Struct("<4sIQQ")
ECHO, SINK, SOURCE = b"ECHO", b"SINK", b"SRCE"
#: The null call's frames: a 24-byte header out, a 32-byte reply back (issue 13's floor).
ECHO_REQUEST, ECHO_REPLY = 24, 32
#: What the server receives or sends per call when streaming.
PIECE = 1 << 20
#: The ring floor's ring: the worker's pinned payload buffers by default (64 MiB).
RING_BYTES = 64 << 20
#: The largest ring a client may ask the server for.
MAX_RING_BYTES = 1 << 30


# --- addresses ------------------------------------------------------------------------


def _address(url: str) -> tuple[int, Any]:
    """(socket family, address) of a ``tcp://host:port`` or ``unix:///path`` URL."""
    scheme, _, rest = url.partition("://")
    if scheme == "unix":
        return socket.AF_UNIX, rest
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        return socket.AF_INET, (host.strip("[]") or "127.0.0.1", int(port or 0))
    raise ValueError(f"floors run over tcp:// and unix:// only, not {url!r}")


def _listen(url: str) -> tuple[socket.socket, str]:
    family, address = _address(url)
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    elif os.path.exists(address):
        os.unlink(address)
    sock.bind(address)
    sock.listen(16)
    if family == socket.AF_INET:
        url = f"tcp://{address[0]}:{sock.getsockname()[1]}"
    return sock, url


def connect(url: str) -> socket.socket:
    """A blocking socket to a floor server, set up as hipr's are: TCP_NODELAY on tcp,
    hipr's send buffer on unix (``hipr.transports.unix.size_send_buffer``), so that a
    ratio compares like with like."""
    family, address = _address(url)
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_UNIX:
        size_send_buffer(sock)
    sock.connect(address)
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    n = view.nbytes
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("the peer closed the connection")
        got += k


# --- the blocking server --------------------------------------------------------------


def _serve_blocking_connection(conn: socket.socket) -> None:
    head = memoryview(bytearray(COMMAND.size))
    scratch = memoryview(bytearray(PIECE))
    source = memoryview(b"\7" * PIECE)
    rings: dict[int, memoryview] = {}
    with conn:
        if conn.family == socket.AF_INET:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            size_send_buffer(conn)
        while True:
            try:
                _recv_exactly(conn, head)
            except (EOFError, OSError):
                return
            kind, a, b, c = COMMAND.unpack(head)
            if kind == ECHO:
                request = scratch[:a]
                reply = b"\0" * b
                for _ in range(c):
                    _recv_exactly(conn, request)
                    conn.sendall(reply)
            elif kind == SINK:
                got = 0
                ring, at = _ring(rings, a), 0
                while got < b:
                    if ring is None:
                        k = conn.recv_into(scratch[: min(PIECE, b - got)])
                    else:  # PIECE at a time along the ring, as a copy's chunks land
                        n = min(PIECE, b - got, ring.nbytes - at)
                        k = conn.recv_into(ring[at : at + n])
                        at = (at + k) % ring.nbytes
                    if not k:
                        return
                    got += k
                conn.sendall(b"\1")
            elif kind == SOURCE:
                sent = 0
                ring, at = _ring(rings, a), 0
                while sent < b:
                    n = min(PIECE, b - sent)
                    if ring is None:
                        conn.sendall(source[:n])
                    else:
                        n = min(n, ring.nbytes - at)
                        conn.sendall(ring[at : at + n])
                        at = (at + n) % ring.nbytes
                    sent += n
            else:
                return


def _ring(rings: dict[int, memoryview], size: int) -> memoryview | None:
    """The connection's ring of ``size`` bytes (made on first use; None for 0: the cached
    1 MiB buffer)."""
    if size <= 0:
        return None
    size = min(size, MAX_RING_BYTES)
    ring = rings.get(size)
    if ring is None:
        ring = rings[size] = memoryview(bytearray(b"\7") * size)
    return ring


def serve_blocking(urls: Sequence[str]) -> list[str]:
    """Serve the floors on ``urls`` from daemon threads (one per connection); the bound
    URLs. Runs until the process exits."""
    bound: list[str] = []
    for url in urls:
        sock, name = _listen(url)
        bound.append(name)

        def accept(sock: socket.socket = sock) -> None:
            while True:
                conn, _ = sock.accept()
                threading.Thread(
                    target=_serve_blocking_connection, args=(conn,), daemon=True
                ).start()

        threading.Thread(target=accept, daemon=True).start()
    return bound


# --- the uvloop echo server -----------------------------------------------------------


def _echo_protocol_class() -> type:
    import asyncio

    class EchoProtocol(asyncio.Protocol):
        """The ECHO command only, parsed from what arrives, replies written at once."""

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.buffer = bytearray()
            self.left = 0  # round trips still due in the current ECHO
            self.request = 0
            self.reply = b""
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data: bytes) -> None:
            buf = self.buffer
            buf += data
            while True:
                if self.left == 0:
                    if len(buf) < COMMAND.size:
                        return
                    kind, a, b, c = COMMAND.unpack_from(buf)
                    del buf[: COMMAND.size]
                    if kind != ECHO:
                        self.transport.close()
                        return
                    self.request, self.reply, self.left = a, b"\0" * b, c
                    continue
                if len(buf) < self.request:
                    return
                del buf[: self.request]
                self.left -= 1
                self.transport.write(self.reply)

    return EchoProtocol


async def _serve_uvloop(urls: Sequence[str], ready: Callable[[list[str]], None]) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    protocol = _echo_protocol_class()
    bound: list[str] = []
    for url in urls:
        sock, name = _listen(url)
        sock.setblocking(False)
        await loop.create_server(protocol, sock=sock)
        bound.append(name)
    ready(bound)
    await asyncio.Event().wait()


# --- clients --------------------------------------------------------------------------


class FloorClient:
    """One blocking connection to a floor server (connect once, measure many times)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sock = connect(url)

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()

    def __enter__(self) -> FloorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def echo(
        self, count: int, request: int = ECHO_REQUEST, reply: int = ECHO_REPLY, warmup: int = 0
    ) -> list[float]:
        """Seconds of each of ``count`` round trips (after ``warmup`` untimed ones)."""
        sock = self.sock
        out = b"\0" * request
        into = memoryview(bytearray(reply))
        times: list[float] = []
        clock = time.perf_counter
        for n, keep in ((warmup, False), (count, True)):
            if n == 0:
                continue
            sock.sendall(COMMAND.pack(ECHO, request, reply, n))
            for _ in range(n):
                start = clock()
                sock.sendall(out)
                _recv_exactly(sock, into)
                if keep:
                    times.append(clock() - start)
        return times

    def push(self, data: memoryview, ring: int = 0) -> float:
        """Seconds to send ``data`` (one ``sendall``) and get the server's ack; with
        ``ring``, the server receives along a ring of that many bytes (module doc)."""
        start = time.perf_counter()
        self.sock.sendall(COMMAND.pack(SINK, ring, data.nbytes, 0))
        self.sock.sendall(data)
        _recv_exactly(self.sock, memoryview(bytearray(1)))
        return time.perf_counter() - start

    def pull(self, into: memoryview, ring: int = 0) -> float:
        """Seconds to ask for ``into.nbytes`` bytes and receive them straight into it;
        with ``ring``, the server sends them along a ring of that many bytes."""
        start = time.perf_counter()
        self.sock.sendall(COMMAND.pack(SOURCE, ring, into.nbytes, 0))
        _recv_exactly(self.sock, into)
        return time.perf_counter() - start

    def messages(self, size: int, count: int) -> float:
        """Seconds to send ``count`` one-way messages of ``size`` bytes, one ``sendall``
        each (as a fire-and-forget client sends a frame), until the server has them all."""
        message = b"\0" * size
        start = time.perf_counter()
        self.sock.sendall(COMMAND.pack(SINK, 0, size * count, 0))
        send = self.sock.sendall
        for _ in range(count):
            send(message)
        _recv_exactly(self.sock, memoryview(bytearray(1)))
        return time.perf_counter() - start


@dataclass(slots=True)
class Floors:
    """The link's floors for one transport, from one run."""

    transport: str
    url: str
    echo: list[float]
    push: list[float]
    pull: list[float]
    stream_size: int
    #: Seconds per one-way message of each size measured (fire-and-forget frames).
    message_seconds: dict[int, float] = field(default_factory=dict)
    uvloop_url: str = ""
    uvloop_echo: list[float] = field(default_factory=list)
    #: The same streams with the server's end along a :data:`RING_BYTES` ring (the
    #: ring floor, module doc); empty where not measured.
    push_ring: list[float] = field(default_factory=list)
    pull_ring: list[float] = field(default_factory=list)

    @property
    def echo_median(self) -> float:
        """Seconds of the median blocking echo."""
        return statistics.median(self.echo)

    def gbs(self, direction: str) -> float:
        """Median GB/s of the stream in ``push`` or ``pull``, or along the server's ring
        in ``push_ring`` or ``pull_ring`` (0.0 where not measured)."""
        times = {
            "push": self.push, "pull": self.pull,
            "push_ring": self.push_ring, "pull_ring": self.pull_ring,
        }[direction]  # fmt: skip
        if not times:
            return 0.0
        return self.stream_size / statistics.median(times) / 1e9


def measure_floors(
    transport: str,
    url: str,
    *,
    echo_count: int,
    warmup: int,
    stream_size: int,
    stream_repeats: int,
    message_sizes: Sequence[int] = (),
    message_count: int = 0,
    uvloop_url: str = "",
) -> Floors:
    """Every floor of one transport: echo, stream both ways, one-way messages, uvloop."""
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(FloorClient(url))
        uv = stack.enter_context(FloorClient(uvloop_url)) if uvloop_url else None
        # Blocks of each echo in turn, so that drift on a shared machine (clocks ramping,
        # a neighbour's burst) hits both alike; a generous warm-up before either.
        echo: list[float] = []
        uvloop_echo: list[float] = []
        blocks = max(1, min(10, echo_count // 50))
        for c in (client, uv):
            if c is not None:
                c.echo(0, warmup=max(warmup, echo_count // 4))
        for i in range(blocks):
            n = echo_count // blocks + (1 if i < echo_count % blocks else 0)
            echo += client.echo(n)
            if uv is not None:
                uvloop_echo += uv.echo(n)
        host = np.full(stream_size, 7, np.uint8)
        out = np.ones(stream_size, np.uint8)
        push: list[float] = []
        pull: list[float] = []
        push_ring: list[float] = []
        pull_ring: list[float] = []
        for rep in range(stream_repeats + 1):  # the first round warms up
            # Cached and ring streams in turn, so that drift hits both alike.
            p, q = client.push(host.data), client.pull(out.data)
            pr, qr = client.push(host.data, RING_BYTES), client.pull(out.data, RING_BYTES)
            if rep:
                push.append(p)
                pull.append(q)
                push_ring.append(pr)
                pull_ring.append(qr)
        messages = {}
        for size in message_sizes:
            client.messages(size, min(warmup, message_count))
            messages[size] = client.messages(size, message_count) / message_count
    return Floors(
        transport, url, echo, push, pull, stream_size, messages, uvloop_url, uvloop_echo,
        push_ring, pull_ring,
    )  # fmt: skip


# --- the local runtime ----------------------------------------------------------------

#: A 2048³-capable tiled SGEMM in the dialect of hipr.kernels.builtins (HIP C++, compiled
#: by hiprtc on AMD and by NVRTC with hipr's HIP prelude on NVIDIA). N must be a multiple
#: of the tile.
SGEMM_TILE = 16
SGEMM_SOURCE = r"""
#include <hip/hip_runtime.h>
#define TILE 16

extern "C" __global__ void sgemm(const float* A, const float* B, float* C, int N) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int tx = hipThreadIdx_x, ty = hipThreadIdx_y;
  int row = hipBlockIdx_y * TILE + ty;
  int col = hipBlockIdx_x * TILE + tx;
  float acc = 0.0f;
  for (int t = 0; t < N; t += TILE) {
    As[ty][tx] = A[row * N + t + tx];
    Bs[ty][tx] = B[(t + ty) * N + col];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  C[row * N + col] = acc;
}
"""

#: The 1-thread kernel CuPy launches (CUDA dialect: CuPy compiles CUDA C++).
CUPY_FILL_SOURCE = r"""
extern "C" __global__ void fill_f32(float* out, float value, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += blockDim.x * gridDim.x) out[i] = value;
}
"""


def sgemm_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The SGEMM's A and B (seeded, so every run multiplies the same matrices)."""
    rng = np.random.default_rng(13)
    return (
        rng.standard_normal((n, n), dtype=np.float32),
        rng.standard_normal((n, n), dtype=np.float32),
    )


def sgemm_check(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """The largest relative error of a few entries of ``c`` against numpy (a kernel that
    computes the wrong thing must not be timed as if it worked)."""
    n = a.shape[0]
    worst = 0.0
    for i, j in ((0, 0), (n - 1, n - 1), (n // 3, 2 * n // 3), (n // 2, 1)):
        want = float(np.dot(a[i, :].astype(np.float64), b[:, j].astype(np.float64)))
        worst = max(worst, abs(float(c[i, j]) - want) / max(1.0, abs(want)))
    return worst


@dataclass(slots=True)
class LocalWork:
    """The same work as the sync-client benchmarks, done in this process."""

    backend: str
    sync: list[float] = field(default_factory=list)
    launch_sync: list[float] = field(default_factory=list)
    #: Seconds per launch of each batch (``batch`` launches then one synchronize).
    per_launch: list[float] = field(default_factory=list)
    copy_size: int = 0
    htod: list[float] = field(default_factory=list)
    dtoh: list[float] = field(default_factory=list)
    sgemm_n: int = 0
    sgemm: list[float] = field(default_factory=list)
    cupy_launch_sync: list[float] = field(default_factory=list)
    cupy_per_launch: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def timed(fn: Callable[[], Any], count: int) -> list[float]:
    """Seconds each of ``count`` calls of ``fn`` took."""
    clock = time.perf_counter
    times: list[float] = []
    for _ in range(count):
        start = clock()
        fn()
        times.append(clock() - start)
    return times


def _per_launch(
    launch: Callable[[], Any], sync: Callable[[], Any], batch: int, repeats: int
) -> list[float]:
    out: list[float] = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(batch):
            launch()
        sync()
        out.append((time.perf_counter() - start) / batch)
    return out


def local_work(
    backend: Any,
    *,
    count: int,
    warmup: int,
    batch: int,
    batch_repeats: int,
    copy_size: int,
    copy_repeats: int,
    sgemm_n: int,
    sgemm_runs: int,
) -> LocalWork:
    """Launch + synchronize, batches of launches, copies and SGEMM through ``backend``
    (a hipr backend object) called directly on this thread."""
    from hipr.kernels.kernel_args import pack_args

    work = LocalWork(backend.name)
    backend.bind_thread(0)
    word = backend.malloc(4096)
    module = backend.builtin_module()
    fill = backend.module_get_function(module, "fill_f32")
    args = pack_args([np.uint64(word), np.float32(1.0), np.uint64(1)]).data
    one = (1, 1, 1)

    def launch() -> None:
        backend.launch(fill, one, one, 0, None, args)

    def launch_sync() -> None:
        launch()
        backend.synchronize()

    try:
        timed(backend.synchronize, warmup)
        work.sync = timed(backend.synchronize, count)
        timed(launch_sync, warmup)
        work.launch_sync = timed(launch_sync, count)
        work.per_launch = _per_launch(launch, backend.synchronize, batch, batch_repeats)
    finally:
        backend.free(word)

    work.copy_size = copy_size
    host = np.full(copy_size, 7, np.uint8)
    out = np.ones(copy_size, np.uint8)
    ptr = backend.malloc(copy_size)
    try:
        for rep in range(copy_repeats + 1):  # the first round warms up
            h = timed(lambda: backend.memcpy_htod(ptr, host.data), 1)
            d = timed(lambda: backend.memcpy_dtoh(out.data, ptr), 1)
            if rep:
                work.htod += h
                work.dtoh += d
    finally:
        backend.free(ptr)

    if backend.name != "emulator":  # the emulator cannot compile: the sync rows say so
        work.sgemm_n = sgemm_n
        try:
            work.sgemm = _local_sgemm(backend, sgemm_n, sgemm_runs, work.notes)
        except Exception as exc:  # a figure missing is a note, not a failed run
            work.notes.append(f"local SGEMM: not measured ({type(exc).__name__}: {exc})")
    return work


def _local_sgemm(backend: Any, n: int, runs: int, notes: list[str]) -> list[float]:
    from hipr.kernels.kernel_args import pack_args

    image = backend.compile(SGEMM_SOURCE, "sgemm.hip", [])
    module = backend.module_load(image)
    fn = backend.module_get_function(module, "sgemm")
    a, b = sgemm_inputs(n)
    c = np.zeros_like(a)
    ptrs = [backend.malloc(a.nbytes) for _ in range(3)]
    try:
        backend.memcpy_htod(ptrs[0], a.reshape(-1).view(np.uint8).data)
        backend.memcpy_htod(ptrs[1], b.reshape(-1).view(np.uint8).data)
        args = pack_args([np.uint64(p) for p in ptrs] + [np.int32(n)]).data
        grid = (n // SGEMM_TILE, n // SGEMM_TILE, 1)
        block = (SGEMM_TILE, SGEMM_TILE, 1)

        def run() -> None:
            backend.launch(fn, grid, block, 0, None, args)
            backend.synchronize()

        run()  # warm-up: module load, clocks
        times = timed(run, runs)
        backend.memcpy_dtoh(c.reshape(-1).view(np.uint8).data, ptrs[2])
        error = sgemm_check(a, b, c)
        notes.append(f"local SGEMM {n}³: largest relative error of sampled entries {error:.1e}")
    finally:
        for p in ptrs:
            backend.free(p)
        backend.module_unload(module)
    return times


def cupy_launches(
    count: int, warmup: int, batch: int, batch_repeats: int
) -> tuple[list[float], list[float]]:
    """The 1-thread launch + synchronize and the batches, through CuPy's RawKernel: a
    second local reference, with none of hipr's code in the way."""
    import cupy  # type: ignore[import-not-found,import-untyped,unused-ignore]

    kernel = cupy.RawKernel(CUPY_FILL_SOURCE, "fill_f32")
    out = cupy.zeros(1024, dtype=cupy.float32)
    args = (out, np.float32(1.0), np.uint64(1))
    sync = cupy.cuda.runtime.deviceSynchronize

    def launch() -> None:
        kernel((1,), (1,), args)

    def launch_sync() -> None:
        launch()
        sync()

    timed(launch_sync, warmup)
    times = timed(launch_sync, count)
    per = _per_launch(launch, sync, batch, batch_repeats)
    del out
    cupy.get_default_memory_pool().free_all_blocks()
    return times, per


# --- a floor server in a process of its own -------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hipr.bench.floors --listen tcp://127.0.0.1:0 ... [--uvloop]``: serve the
    floors (blocking sockets, or the uvloop echo), print ``{"urls": [...]}`` once
    listening, run until SIGTERM or SIGINT."""
    import argparse
    import json
    import signal

    parser = argparse.ArgumentParser(prog="python -m hipr.bench.floors")
    parser.add_argument("--listen", action="append", required=True, metavar="URL")
    parser.add_argument("--uvloop", action="store_true", help="the uvloop echo server")
    args = parser.parse_args(argv)

    def ready(bound: list[str]) -> None:
        print(json.dumps({"urls": bound}), flush=True)

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if args.uvloop:
        import uvloop

        try:
            uvloop.run(_serve_uvloop(args.listen, ready))
        except KeyboardInterrupt:
            pass
        return 0
    ready(serve_blocking(args.listen))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
