"""Same-run baselines: what the link and the runtime do with no hipr in the way.

* A bare anyio echo server and client: fixed-size messages over the same transport and
  event loop as the worker, answered with a reply of hipr's reply size, so the round
  trip carries the same bytes as hipr's and nothing else (no framing, no CBOR, no GPU
  thread).
* A bare anyio byte stream: a copy's bytes pushed or pulled in the chunk size hipr uses,
  no headers, no copy into a destination buffer on the receiving side.
* Local runtime copies: the backend called in this process, as a program on the GPU node
  would call it; what remote costs over local.

The server speaks a tiny command protocol so one listener serves every baseline: a
24-byte command (``kind, a, b, c``), then the command's traffic, then the next command.

=======  ==========================================================================
ECHO     ``a`` (req, reply) pairs follow as ``<II``; ``b`` round trips cycle them
SINK     receive ``b`` bytes (``c`` per receive), then answer one byte
SOURCE   send ``b`` bytes in pieces of ``c``
=======  ==========================================================================
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from hipr.transports import parse_url

COMMAND = struct.Struct("<4sIQQ")
PAIR = struct.Struct("<II")
ECHO, SINK, SOURCE = b"ECHO", b"SINK", b"SRCE"
#: What one receive asks for: the worker's own receive size, so both read alike.
RECEIVE_SIZE = 1 << 18

Pair = tuple[int, int]


class _Reader:
    """Exact-size reads over a byte stream, keeping what arrived beyond them."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self._left = b""

    async def exactly(self, n: int) -> bytes:
        data = self._left
        while len(data) < n:
            data += await self.stream.receive(max(RECEIVE_SIZE, n - len(data)))
        self._left = data[n:]
        return data[:n]

    async def discard(self, n: int, receive_size: int) -> None:
        got = len(self._left)
        self._left = b""
        while got < n:
            got += len(await self.stream.receive(receive_size))
        if got > n:  # a client never sends past a SINK's bytes before its ack
            raise RuntimeError("SINK: the client sent more bytes than announced")


# --- server ---------------------------------------------------------------------------


async def _serve_connection(stream: anyio.abc.ByteStream) -> None:
    reader = _Reader(stream)
    async with stream:
        while True:
            try:
                kind, a, b, c = COMMAND.unpack(await reader.exactly(COMMAND.size))
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            if kind == ECHO:
                raw = await reader.exactly(PAIR.size * a)
                pairs = [PAIR.unpack_from(raw, i * PAIR.size) for i in range(a)]
                replies = {reply: b"\0" * reply for _, reply in pairs}
                for i in range(b):
                    request, reply = pairs[i % a]
                    await reader.exactly(request)
                    await stream.send(replies[reply])
            elif kind == SINK:
                await reader.discard(b, c or RECEIVE_SIZE)
                await stream.send(b"\1")
            elif kind == SOURCE:
                piece = memoryview(b"\7" * c)
                sent = 0
                while sent < b:
                    n = min(c, b - sent)
                    await stream.send(piece[:n])  # type: ignore[arg-type]
                    sent += n
            else:
                raise RuntimeError(f"unknown baseline command {kind!r}")


async def listen(url: str) -> anyio.abc.Listener[Any]:
    """A listener for the baseline server at a ``tcp://`` or ``unix://`` URL."""
    parsed = parse_url(url)
    if parsed.scheme == "tcp":
        host, port = parsed.host_port("127.0.0.1", 0)
        return await anyio.create_tcp_listener(local_host=host, local_port=port)
    if parsed.scheme == "unix":
        return await anyio.create_unix_listener(parsed.path)
    raise ValueError(f"baselines run over tcp:// and unix:// only, not {url!r}")


def bound_url(url: str, listener: anyio.abc.Listener[Any]) -> str:
    """``url`` with port 0 replaced by the port the listener got."""
    if not url.startswith("tcp://"):
        return url
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    return url.rsplit(":", 1)[0] + f":{port}"


async def serve(
    urls: Sequence[str],
    *,
    task_status: anyio.abc.TaskStatus[list[str]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the baseline protocol on ``urls`` until cancelled; reports the bound URLs."""
    listeners = [await listen(url) for url in urls]
    bound = [bound_url(url, lst) for url, lst in zip(urls, listeners, strict=True)]
    try:
        async with anyio.create_task_group() as tg:
            for listener in listeners:
                tg.start_soon(listener.serve, _serve_connection, tg)
            task_status.started(bound)
    finally:
        with anyio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()


# --- clients --------------------------------------------------------------------------


async def connect(url: str) -> anyio.abc.ByteStream:
    """A bare stream to the baseline server (anyio sets TCP_NODELAY, as hipr does)."""
    parsed = parse_url(url)
    if parsed.scheme == "tcp":
        host, port = parsed.host_port("127.0.0.1", 0)
        return await anyio.connect_tcp(host, port)
    return await anyio.connect_unix(parsed.path)


async def _start_echo(stream: anyio.abc.ByteStream, pairs: Sequence[Pair], count: int) -> None:
    head = COMMAND.pack(ECHO, len(pairs), count, 0)
    await stream.send(head + b"".join(PAIR.pack(*p) for p in pairs))


async def _echo_loop(
    stream: anyio.abc.ByteStream, reader: _Reader, pairs: Sequence[Pair], count: int
) -> list[float]:
    requests = {req: b"\0" * req for req, _ in pairs}
    times: list[float] = []
    clock = time.perf_counter
    for i in range(count):
        request, reply = pairs[i % len(pairs)]
        start = clock()
        await stream.send(requests[request])
        await reader.exactly(reply)
        times.append(clock() - start)
    return times


async def echo_round_trips(
    url: str, pairs: Sequence[Pair], count: int, warmup: int = 0
) -> list[float]:
    """Seconds of each of ``count`` round trips (request, reply sizes cycling ``pairs``)."""
    async with await connect(url) as stream:
        reader = _Reader(stream)
        if warmup:
            await _start_echo(stream, pairs, warmup)
            await _echo_loop(stream, reader, pairs, warmup)
        await _start_echo(stream, pairs, count)
        return await _echo_loop(stream, reader, pairs, count)


@dataclass(frozen=True, slots=True)
class ConcurrentResult:
    """Many clients at once: wall time from the common start, and every latency."""

    seconds: float
    latencies: list[float]


async def echo_concurrent(
    url: str, clients: int, pairs: Sequence[Pair], count: int
) -> ConcurrentResult:
    """``clients`` connections, each making ``count`` echo round trips, all at once."""
    streams = [await connect(url) for _ in range(clients)]
    go = anyio.Event()
    latencies: list[float] = []

    async def one(stream: anyio.abc.ByteStream) -> None:
        reader = _Reader(stream)
        await _start_echo(stream, pairs, count)
        await go.wait()
        latencies.extend(await _echo_loop(stream, reader, pairs, count))

    try:
        async with anyio.create_task_group() as tg:
            for stream in streams:
                tg.start_soon(one, stream)
            await anyio.sleep(0.05)  # every client has sent its command and waits
            start = time.perf_counter()
            go.set()
        seconds = time.perf_counter() - start
    finally:
        for stream in streams:
            await stream.aclose()
    return ConcurrentResult(seconds, latencies)


class StreamClient:
    """One bare stream connection for copy baselines (connect once, copy many times)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self._reader = _Reader(stream)

    @classmethod
    async def open(cls, url: str) -> StreamClient:
        """Connect to the baseline server."""
        return cls(await connect(url))

    async def aclose(self) -> None:
        """Close the connection."""
        await self.stream.aclose()

    async def push(self, data: memoryview, chunk: int) -> float:
        """Seconds to send ``data`` in ``chunk``-byte sends and get the server's ack."""
        size = data.nbytes
        start = time.perf_counter()
        await self.stream.send(COMMAND.pack(SINK, 0, size, RECEIVE_SIZE))
        for offset in range(0, size, chunk):
            await self.stream.send(data[offset : offset + chunk])  # type: ignore[arg-type]
        await self._reader.exactly(1)
        return time.perf_counter() - start

    async def pull(self, size: int, chunk: int) -> float:
        """Seconds to ask for ``size`` bytes and receive them all (not copied anywhere)."""
        start = time.perf_counter()
        await self.stream.send(COMMAND.pack(SOURCE, 0, size, chunk))
        got = 0
        while got < size:
            got += len(await self.stream.receive(RECEIVE_SIZE))
        return time.perf_counter() - start


# --- the runtime, locally -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalCopies:
    """Seconds of each local runtime copy of one size."""

    size: int
    htod: list[float]
    dtoh: list[float]


def local_runtime_copies(backend: Any, sizes: Sequence[int], repeats: int) -> list[LocalCopies]:
    """Copies through ``backend`` in this process, from and to pageable host memory (as
    the worker's own copies are): the same copy made without the link."""
    import numpy as np

    backend.bind_thread(0)
    largest = max(sizes)
    host = np.full(largest, 7, np.uint8).data
    out = np.ones(largest, np.uint8).data
    ptr = backend.malloc(largest)
    results: list[LocalCopies] = []
    try:
        for size in sizes:
            src = host[:size]
            dst = out[:size]
            backend.memcpy_htod(ptr, src)  # warm-up: first touch, staging, clocks
            backend.memcpy_dtoh(dst, ptr)
            htod: list[float] = []
            dtoh: list[float] = []
            for _ in range(repeats):
                start = time.perf_counter()
                backend.memcpy_htod(ptr, src)
                htod.append(time.perf_counter() - start)
                start = time.perf_counter()
                backend.memcpy_dtoh(dst, ptr)
                dtoh.append(time.perf_counter() - start)
            results.append(LocalCopies(size, htod, dtoh))
    finally:
        backend.free(ptr)
    return results


def local_malloc_free(backend: Any, pairs: int, size: int = 4096) -> float:
    """Seconds for ``pairs`` malloc/free pairs through ``backend`` in this process."""
    backend.bind_thread(0)
    start = time.perf_counter()
    for _ in range(pairs):
        backend.free(backend.malloc(size))
    return time.perf_counter() - start


# --- a baseline server in a process of its own ----------------------------------------


async def _serve_until_signalled(urls: Sequence[str]) -> None:
    import json
    import signal

    async with anyio.create_task_group() as tg:
        bound = await tg.start(serve, list(urls))
        print(json.dumps({"urls": bound}), flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                tg.cancel_scope.cancel()
                break


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hipr.bench.baselines --loop trio --listen tcp://127.0.0.1:0 ...``: serve
    the baselines, print ``{"urls": [...]}`` once listening, stop on SIGTERM or SIGINT.
    Run it on the worker's machine to compare a remote link fairly (``hipr bench
    --baseline URL``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hipr.bench.baselines")
    parser.add_argument("--loop", choices=("trio", "asyncio"), default="trio")
    parser.add_argument("--listen", action="append", required=True, metavar="URL")
    args = parser.parse_args(argv)
    anyio.run(_serve_until_signalled, args.listen, backend=args.loop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
