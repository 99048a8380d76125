"""What the reliability tests share: a log watch that counts worker crashes, a tenants
file for fuzzers and well-behaved clients, leak checks, and the worker's RSS."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import struct
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog
from anyio.from_thread import start_blocking_portal

from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend, BackendStats
from hipr.errors import HipError
from hipr.protocol.codec import DEFAULT_MAX_PAYLOAD, Frame, FrameDecoder, encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.worker.config import WorkerConfig
from hipr.worker.server import Worker, running_worker
from hipr.worker.tenants import new_token, token_hash

#: Log events that the worker writes when something it did not expect went wrong.
CRASH_EVENTS = frozenset({"handler failed", "connection task failed"})


@dataclass(slots=True)
class Crash:
    """One unexpected exception the worker logged."""

    event: str
    error: str


@dataclass
class LogWatch:
    """Receives every structlog event while installed and drops it (keeps runs quiet and
    memory flat); counts events by level and records exceptions as crashes.

    An exception of a type in ``expected`` (e.g. an injected GPU-thread crash) is counted
    in :attr:`expected` instead. ``echo`` prints crashes to stderr as they happen.
    """

    expected_types: tuple[type[BaseException], ...] = ()
    echo: bool = False
    levels: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    crashes: list[Crash] = field(default_factory=list)
    expected: int = 0

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """The structlog processor: count, classify, drop."""
        event = str(event_dict.get("event", ""))
        self.levels[method_name] += 1
        self.events[event] += 1
        exc_info = event_dict.get("exc_info")
        if exc_info or event in CRASH_EVENTS:
            error = _exception_of(exc_info)
            if error is not None and isinstance(error, self.expected_types):
                self.expected += 1
            else:
                crash = Crash(event, repr(error))
                self.crashes.append(crash)
                if self.echo:
                    print(f"worker crash: {crash.event}: {crash.error}", file=sys.stderr)
        raise structlog.DropEvent

    @contextmanager
    def installed(self) -> Iterator[LogWatch]:
        """Route structlog through this watch for the block, then restore the old set-up."""
        old = structlog.get_config()
        structlog.configure(
            processors=[self],
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            logger_factory=structlog.ReturnLoggerFactory(),
            cache_logger_on_first_use=False,
        )
        try:
            yield self
        finally:
            structlog.configure(**old)


def _exception_of(exc_info: object) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        value = exc_info[1]
        return value if isinstance(value, BaseException) else None
    if exc_info:
        return sys.exc_info()[1]
    return None


@dataclass(frozen=True, slots=True)
class FuzzTenants:
    """A tenants file with a quota-bound ``fuzz`` tenant and an unbounded ``good`` one."""

    path: Path
    fuzz_token: str
    good_token: str


def write_tenants(
    directory: Path,
    *,
    fuzz_memory: int = 32 << 20,
    fuzz_sessions: int = 512,
    extra: str = "",
) -> FuzzTenants:
    """Write ``tenants.toml`` in ``directory``: fuzzers cannot starve the good client."""
    fuzz, good = new_token(), new_token()
    path = directory / "tenants.toml"
    path.write_text(
        f"""
[tenants.fuzz]
tokens = ["{token_hash(fuzz)}"]
max_device_memory = {fuzz_memory}
max_sessions = {fuzz_sessions}
max_streams = 64
max_events = 64
max_modules = 16
max_graphs = 32

[tenants.good]
tokens = ["{token_hash(good)}"]
{extra}
"""
    )
    return FuzzTenants(path, fuzz, good)


async def wait_for_no_sessions(worker: Any, timeout: float = 10.0) -> bool:
    """True once ``worker.sessions`` is empty (sessions end just after their socket does)."""
    with anyio.move_on_after(timeout):
        while worker.sessions:
            await anyio.sleep(0.01)
        return True
    return False


def leaks(backend: Backend, worker: Any, baseline: BackendStats | None = None) -> list[str]:
    """What is still held beyond ``baseline`` (resources the backend keeps for itself, such
    as a shared built-in module), and live sessions; empty when clean."""
    found: list[str] = []
    now = dataclasses.asdict(backend.stats())
    base = dataclasses.asdict(baseline or BackendStats())
    over = {k: v - base[k] for k, v in now.items() if v > base[k]}
    if over:
        found.append(f"backend holds more than at the start: {over}")
    if worker.sessions:
        found.append(f"{len(worker.sessions)} sessions still registered")
    figures = getattr(backend, "payload_buffer_figures", None)
    lent = figures()["in_use"] if figures is not None else 0
    if lent:
        found.append(f"{lent} pinned payload buffers still lent out with every session gone")
    return found


def _memory_used(backend: Backend) -> list[int]:
    """On a thread of the caller's own: bytes in use on each device (total minus free)."""
    used = []
    for device in range(backend.device_count()):
        backend.bind_thread(device)
        free, total = backend.mem_get_info()
        used.append(total - free)
    return used


async def device_memory_used(backend: Backend) -> list[int] | None:
    """Bytes in use on each of ``backend``'s devices, as the runtime says (cuMemGetInfo,
    hipMemGetInfo: every process's use, not only this worker's), asked on a thread of
    anyio's pool so that the event loop's binding is left alone; None when it cannot
    say (the device refused: a failed context)."""
    try:
        return await anyio.to_thread.run_sync(_memory_used, backend)
    except HipError:
        return None


@dataclass
class DeviceMemory:
    """Bytes in use on each device at a campaign's steps: when its worker started, after
    the warm-up session (the runtime's one-time allocations at first use: module code,
    kernel stacks), and after every session had ended."""

    start: list[int] | None = None
    baseline: list[int] | None = None
    end: list[int] | None = None

    def lines(self) -> list[str]:
        """What the figures say, in words: the warm-up's one-time growth, and the end
        against the baseline."""
        if self.start is None or self.baseline is None or self.end is None:
            return [
                f"device memory in use: start {self.start}, baseline {self.baseline}, "
                f"end {self.end} (a device that cannot say is None)"
            ]
        mib = 1 << 20
        out = []
        for device, (start, base, end) in enumerate(
            zip(self.start, self.baseline, self.end, strict=True)
        ):
            out.append(
                f"device {device}: {start / mib:.1f} MiB in use at start, {base / mib:.1f} MiB "
                f"after the warm-up ({(base - start) / mib:+.1f} MiB: the runtime's one-time "
                f"allocations at first use), {end / mib:.1f} MiB after the campaign "
                f"({(end - base) / mib:+.1f} MiB against that baseline)"
            )
        return out

    @property
    def back_to_baseline(self) -> bool:
        """True when every device uses no more at the end than after the warm-up."""
        if self.baseline is None or self.end is None:
            return False
        return all(end <= base for base, end in zip(self.baseline, self.end, strict=True))


async def warm_up(url: str, token: str | None = None) -> None:
    """One session that loads what a backend keeps shared across sessions (the built-in
    kernels on every device) and uses every kind of object once on each device, so that
    a baseline taken afterwards excludes both it and what a GPU runtime allocates once,
    at first use, and keeps (kernel stacks, graph and event pools)."""
    import numpy as np

    import hipr

    async with hipr.aconnect(url, token=token, timeout=10) as gpu:
        for device in range(await gpu.device_count()):
            await gpu.set_device(device)
            fill = await gpu.builtin("fill_f32")
            n = 1 << 12
            a = await gpu.malloc(4 * n)
            await gpu.memcpy_htod(a, bytes(4 * n))
            await fill.launch(1, 64, [a, np.float32(1.0), np.uint64(n)])
            await gpu.memset(a, 0, 4 * n)
            stream: Any = await gpu.stream_create()
            event = await gpu.event_create()
            await gpu.memcpy_htod_async(a, bytes(64), stream)
            await event.record(stream)
            await event.synchronize()
            graph = await gpu.graph_create()
            await graph.add_memset(a, 1, 4 * n)
            exe = await graph.instantiate()
            await exe.launch()
            await gpu.memcpy_dtoh(a, 4 * n)
            for handle in (exe, graph, event, stream):
                await handle.destroy()
            await gpu.free(a)


def rss_bytes() -> int:
    """This process's resident set size now."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak is the best we have
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank; 0 when empty."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


async def raw_connect(url: str) -> anyio.abc.ByteStream:
    """A plain socket to a ``tcp://`` or ``unix://`` worker URL, without the transport
    registry (fuzzers open thousands of connections; the registry scans entry points)."""
    if url.startswith("unix://"):
        return await anyio.connect_unix(url[len("unix://") :])
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://") :].rstrip("/").rpartition(":")
        return await anyio.connect_tcp(host.strip("[]"), int(port))
    from hipr.transports import connect

    return await connect(url)


class RawClient:
    """A minimal client speaking raw frames, for tests that must misbehave on purpose:
    stop mid-copy, reset the link, never say goodbye."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(DEFAULT_MAX_PAYLOAD)
        self._next_id = 1
        self._replies: dict[int, Frame] = {}

    @classmethod
    async def open(cls, url: str, token: str | None = None, *, hello: bool = True) -> RawClient:
        """Connect and, with ``hello``, complete the handshake."""
        client = cls(await raw_connect(url))
        if hello:
            args: dict[str, Any] = {"client": "raw"}
            if token:
                args["token"] = token
            await client.call(Opcode.HELLO, args)
        return client

    def take_id(self) -> int:
        """A fresh request id."""
        request_id = self._next_id
        self._next_id += 1
        return request_id

    async def send(
        self,
        opcode: int,
        args: Any = None,
        bulk: bytes = b"",
        flags: Flags = Flags.NONE,
        request_id: int | None = None,
    ) -> int:
        """Send one frame; its request id."""
        request_id = self.take_id() if request_id is None else request_id
        await self.stream.send(encode_frame(opcode, request_id, flags, args, bulk))
        return request_id

    async def reply(self, request_id: int, timeout: float = 10.0) -> Frame:
        """The final reply to ``request_id`` (device-to-host chunks are skipped)."""
        with anyio.fail_after(timeout):
            while request_id not in self._replies:
                self._decoder.feed(await self.stream.receive())
                for frame in self._decoder.frames():
                    if Flags.REPLY in frame.flags and Flags.MORE not in frame.flags:
                        self._replies[frame.request_id] = frame
        return self._replies.pop(request_id)

    async def call(self, opcode: int, args: Any = None, bulk: bytes = b"") -> Any:
        """Send a request and return its result; a HipError for an error reply."""
        frame = await self.reply(await self.send(opcode, args, bulk))
        if Flags.ERROR in frame.flags:
            raise HipError.from_wire(frame.args)
        return frame.args

    async def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """Read until the worker closes the link; False if it did not within ``timeout``."""
        with anyio.move_on_after(timeout):
            while True:
                try:
                    await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return True
        return False

    async def reset(self) -> None:
        """Drop the link with a TCP reset (SO_LINGER 0) where the socket allows it."""
        try:
            sock = self.stream.extra(anyio.abc.SocketAttribute.raw_socket)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (anyio.TypedAttributeLookupError, OSError):
            pass
        await self.aclose()

    async def aclose(self) -> None:
        """Close the link without a goodbye."""
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (anyio.BrokenResourceError, OSError):
                pass


@asynccontextmanager
async def raw_client_to(backend: Backend) -> AsyncIterator[RawClient]:
    """A :class:`RawClient`, handshake done, to a worker serving ``backend`` on a free
    local TCP port with no resume grace (a closed link frees its session at once); the
    client and the worker end with the block."""
    config = WorkerConfig(resume_grace=0.0)
    async with running_worker(config, backend, ["tcp://127.0.0.1:0"]) as worker:
        client = await RawClient.open(worker.bound_urls[0])
        try:
            yield client
        finally:
            await client.aclose()


@contextmanager
def worker_in_thread(
    config: WorkerConfig, backend: Backend, url: str = "tcp://127.0.0.1:0", *, loop: str = "trio"
) -> Iterator[Worker]:
    """A worker serving ``backend`` at ``url`` on an event loop (``trio`` or ``asyncio``)
    in a thread of its own, for the block: blocking clients and CLI calls run beside it."""
    with (
        start_blocking_portal(loop) as portal,
        portal.wrap_async_context_manager(running_worker(config, backend, [url])) as worker,
    ):
        yield worker


@asynccontextmanager
async def worker_with_children(
    config: WorkerConfig, backend: Backend | None = None, url: str = "tcp://127.0.0.1:0"
) -> AsyncIterator[Worker]:
    """:func:`running_worker` of ``config`` serving ``backend`` (an emulator by default),
    its tenant processes (``isolation``) stopped with the block too: the worker's
    cancellation alone leaves them running."""
    served = EmulatorBackend() if backend is None else backend
    async with running_worker(config, served, [url]) as worker:
        try:
            yield worker
        finally:
            if worker.isolation is not None:
                await worker.isolation.aclose()
