"""Floods by one tenant, and what they do to another tenant's calls (issue 29, fair service).

Two attacks, each an ``async`` function that a report or a test runs for a given time:

- :func:`flood_fire_and_forget`: one connection sends fire-and-forget MEMSETs as fast as
  the worker takes them (batches of frames in one write, never reading).
- :func:`flood_unread_replies`: one connection sends MEMSETs that each want a reply and
  never reads a reply: the worker must stop reading from it once its unsent replies
  back up, instead of decoding and queueing requests without bound.

:func:`victim_calls` is the other tenant: small calls one after another (a 4 KiB
upload, answered in the worker's I/O callback, then a 4 KiB download, answered by the
connection's executor), each timed. :func:`fairness_under_flood` measures the victim
unloaded, then during a flood, each side in a process of its own (so the worker's
loop, not the client's, is what is measured), and returns the figures the hostile
report quotes: the victim's median and worst call against its baseline, and the
worker's RSS when its process id is known.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import anyio.to_process

from hipr.protocol.codec import encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.testing.harness import RawClient, percentile
from hipr.worker.isolation import process_rss

#: Frames written in one send: a write of ~110 KB, as a client batching its posts would.
BATCH_FRAMES = 2000
#: The victim's buffer: small calls, so what is timed is the worker's service, not copying.
VICTIM_BYTES = 4096


@dataclass
class FloodStats:
    """What one flood sent, and how the worker took it."""

    attack: str
    seconds: float
    #: Frames the worker's socket took (written in full; the last write may be partial).
    frames_sent: int = 0
    bytes_sent: int = 0
    #: Frames sent in each second of the flood: a worker that stops reading shows as
    #: zeros once the socket buffers between the two are full.
    frames_per_second: list[int] = field(default_factory=list)
    #: Seconds the flood's writes waited for the worker to read (back-pressure).
    blocked_seconds: float = 0.0
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """For JSON reports."""
        return asdict(self)


@dataclass
class CallTimes:
    """The victim's calls in one phase, seconds each."""

    times: list[float]
    errors: int = 0

    @property
    def median(self) -> float:
        """The median call (0 when none completed)."""
        return statistics.median(self.times) if self.times else 0.0

    @property
    def worst(self) -> float:
        """The slowest call."""
        return max(self.times, default=0.0)

    @property
    def mean(self) -> float:
        """The mean call: a few long stalls among many quick calls show here, not in
        the median (a victim stalled for a second, then served at once, still makes
        hundreds of quick calls)."""
        return statistics.fmean(self.times) if self.times else 0.0

    @property
    def p90(self) -> float:
        """The 90th percentile call."""
        return percentile(sorted(self.times), 0.9)


@dataclass
class FairnessFigures:
    """One attack's row: the victim's calls unloaded and during the flood, the worker's RSS."""

    attack: str
    #: The victim's calls before the flood and after it, unloaded both.
    baseline: CallTimes
    after: CallTimes
    loaded: CallTimes
    flood: FloodStats
    #: The worker's resident set before the flood and its peak during it (0: not known).
    rss_idle: int = 0
    rss_peak: int = 0

    @property
    def unloaded_median(self) -> float:
        """The victim's unloaded median: the mean of the medians before and after the
        flood (a shared machine's own load drifts over a run; this follows it)."""
        return (self.baseline.median + self.after.median) / 2

    @property
    def unloaded_worst(self) -> float:
        """The victim's slowest unloaded call."""
        return max(self.baseline.worst, self.after.worst)

    @property
    def median_ratio(self) -> float:
        """The victim's median call during the flood over its unloaded median."""
        base = self.unloaded_median
        return self.loaded.median / base if base else math.inf

    def summary(self) -> str:
        """One line for a report."""
        mib = 1 << 20
        rss = (
            f"; worker RSS {self.rss_idle / mib:.0f} -> peak {self.rss_peak / mib:.0f} MiB"
            if self.rss_idle
            else ""
        )
        return (
            f"{self.attack}: victim median {self.loaded.median * 1e3:.2f} ms "
            f"(unloaded {self.baseline.median * 1e3:.2f} before, "
            f"{self.after.median * 1e3:.2f} after: {self.median_ratio:.1f}x), "
            f"mean {self.loaded.mean * 1e3:.2f} ms (unloaded {self.baseline.mean * 1e3:.2f}), "
            f"p90 {self.loaded.p90 * 1e3:.1f} ms, "
            f"worst {self.loaded.worst * 1e3:.1f} ms (unloaded {self.unloaded_worst * 1e3:.1f}), "
            f"{len(self.loaded.times)} calls during the flood; flood sent "
            f"{self.flood.frames_sent:,} frames{rss}"
        )


async def _attacker(url: str, token: str) -> tuple[RawClient, int]:
    """A raw session of the attacking tenant and a small allocation to aim at."""
    client = await RawClient.open(url, token)
    result = await client.call(Opcode.MALLOC, {"size": 4096})
    return client, int(result["ptr"])


async def _flood(
    url: str, token: str, seconds: float, attack: str, frame: Callable[[int], bytes]
) -> FloodStats:
    """Write ``frame(ptr)`` over and over, ``BATCH_FRAMES`` to a write, for ``seconds``
    (``ptr``: a small allocation of the flooding session)."""
    stats = FloodStats(attack, seconds)
    client, ptr = await _attacker(url, token)
    batch = frame(ptr) * BATCH_FRAMES
    start = time.monotonic()
    end = start + seconds
    stats.frames_per_second = [0] * max(1, math.ceil(seconds))
    try:
        while (now := time.monotonic()) < end:
            with anyio.move_on_after(end - now) as scope:
                await client.stream.send(batch)
            waited = time.monotonic() - now
            if scope.cancelled_caught:
                stats.blocked_seconds += waited
                break
            if waited > 0.001:
                stats.blocked_seconds += waited
            stats.frames_sent += BATCH_FRAMES
            stats.bytes_sent += len(batch)
            second = min(int(time.monotonic() - start), len(stats.frames_per_second) - 1)
            stats.frames_per_second[second] += BATCH_FRAMES
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
        stats.error = repr(exc)  # the worker closed the link: the flood is over
    finally:
        await client.reset()
    return stats


async def flood_fire_and_forget(url: str, token: str, seconds: float) -> FloodStats:
    """Fire-and-forget MEMSETs of 16 bytes from one connection, for ``seconds``."""

    def frame(ptr: int) -> bytes:
        return encode_frame(Opcode.MEMSET, 0, Flags.NO_REPLY, {"ptr": ptr, "value": 1, "size": 16})

    return await _flood(url, token, seconds, "fire-and-forget flood", frame)


async def flood_unread_replies(url: str, token: str, seconds: float) -> FloodStats:
    """MEMSETs that each want a reply, from a connection that never reads, for ``seconds``."""

    def frame(ptr: int) -> bytes:
        return encode_frame(Opcode.MEMSET, 0, Flags.NONE, {"ptr": ptr, "value": 1, "size": 16})

    return await _flood(url, token, seconds, "unread-replies flood", frame)


#: The attacks by name, for reports and :func:`fairness_under_flood`.
FLOODS: dict[str, Callable[[str, str, float], Awaitable[FloodStats]]] = {
    "fire_and_forget": flood_fire_and_forget,
    "unread_replies": flood_unread_replies,
}


async def victim_calls(url: str, token: str, seconds: float) -> CallTimes:
    """Small calls one after another for ``seconds`` (at least 5): a 4 KiB upload, then
    a 4 KiB download of the same bytes, each timed as one call."""
    import hipr

    times: list[float] = []
    errors = 0
    payload = bytes(range(256)) * (VICTIM_BYTES // 256)
    out = bytearray(VICTIM_BYTES)
    async with hipr.aconnect(url, token=token, timeout=60) as gpu:
        ptr = await gpu.malloc(VICTIM_BYTES)
        await gpu.memcpy_htod(ptr, payload)  # warm: the first call pays set-up
        end = time.monotonic() + seconds
        while time.monotonic() < end or len(times) < 5:
            started = time.perf_counter()
            await gpu.memcpy_htod(ptr, payload)
            middle = time.perf_counter()
            await gpu.memcpy_dtoh(ptr, out=out)
            finished = time.perf_counter()
            times += [middle - started, finished - middle]
            if out != payload:
                errors += 1
        await gpu.free(ptr)
    return CallTimes(times, errors)


def run_flood(attack: str, url: str, token: str, seconds: float) -> FloodStats:
    """:data:`FLOODS` ``[attack]`` run to its end in this process (a process of its own)."""
    return anyio.run(FLOODS[attack], url, token, seconds)


def run_victim(url: str, token: str, seconds: float) -> CallTimes:
    """:func:`victim_calls` run to its end in this process (a process of its own)."""
    return anyio.run(victim_calls, url, token, seconds)


#: Runs ``function(*args)`` in another process and returns its result (the flood and
#: the victim: never in the worker's process, whose loop is what is measured).
InProcess = Callable[..., Awaitable[Any]]


async def in_new_processes(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in one of anyio's worker processes (started per event loop)."""
    return await anyio.to_process.run_sync(function, *args, cancellable=True)


async def fairness_under_flood(
    url: str,
    victim_token: str,
    attacker_token: str,
    attack: str,
    *,
    seconds: float = 4.0,
    baseline_seconds: float = 1.5,
    rss: Callable[[], int] | None = None,
    worker_pid: int | None = None,
    in_process: InProcess | None = None,
) -> FairnessFigures:
    """The victim's calls unloaded, then during ``attack`` (a key of :data:`FLOODS`)
    from another tenant, each client in a process of its own. The victim starts a
    quarter of the flood in (the flood's read-ahead is full by then) and stops before
    it ends; it is measured unloaded again once the flood is over. ``rss`` (or
    ``worker_pid``, on this machine) reads the worker's memory. ``in_process`` runs a
    client in another process (default: :func:`in_new_processes`; a test module that
    measures several floods may keep two processes for all of them)."""
    if rss is None and worker_pid is not None:
        pid = worker_pid

        def rss() -> int:
            return process_rss(pid)

    run_sync = in_process or in_new_processes
    baseline = await run_sync(run_victim, url, victim_token, baseline_seconds)
    rss_idle = rss() if rss else 0
    peak = [rss_idle]
    flood: list[FloodStats] = []
    loaded: list[CallTimes] = []

    async def attacker() -> None:
        flood.append(await run_sync(run_flood, attack, url, attacker_token, seconds))

    async def victim() -> None:
        await anyio.sleep(seconds / 4)
        loaded.append(await run_sync(run_victim, url, victim_token, seconds / 2))

    async def sample_rss() -> None:
        assert rss is not None
        while True:
            peak[0] = max(peak[0], rss())
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        if rss is not None:
            tg.start_soon(sample_rss)
        async with anyio.create_task_group() as clients:
            clients.start_soon(attacker)
            clients.start_soon(victim)
        tg.cancel_scope.cancel()
    after = await run_sync(run_victim, url, victim_token, baseline_seconds)
    return FairnessFigures(attack, baseline, after, loaded[0], flood[0], rss_idle, peak[0])


def main(argv: list[str] | None = None) -> int:
    """``python -m hipr.testing.floods URL VICTIM_TOKEN ATTACKER_TOKEN [SECONDS [PID]]``:
    both attacks against a running worker (whose RSS is read when its PID is given),
    one summary line each."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4, 5):
        print(main.__doc__, file=sys.stderr)
        return 2
    url, victim, attacker = args[:3]
    seconds = float(args[3]) if len(args) > 3 else 4.0
    pid = int(args[4]) if len(args) > 4 else None

    async def one(attack: str) -> FairnessFigures:
        return await fairness_under_flood(
            url, victim, attacker, attack, seconds=seconds, worker_pid=pid
        )

    for attack in FLOODS:
        print(anyio.run(one, attack).summary(), flush=True)
    return 0


if __name__ == "__main__":
    # Through the module's own name: results pickled back from the client processes
    # name their classes by it, not by ``__main__``.
    from hipr.testing.floods import main as _main

    raise SystemExit(_main())
