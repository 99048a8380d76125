"""Hostile clients: attacks on a worker, and what each costs the other tenant.

Each attack is an async function of a :class:`Target` (the worker's URL, two tenants'
tokens, the limits in force) that misbehaves on purpose until the worker has dealt
with it, and returns a few notes (what the attacker saw). :data:`ATTACKS` lists them
by name; more are added by appending to it (the flood attacks of fair service are
rows of the same table).

:func:`measure` runs one attack while a well-behaved client of the other tenant keeps
calling, and reports that client's latency against its own unloaded baseline taken
just before, and the worker's idle, peak and settled RSS. ``scripts/reliability-report
--hostile`` runs every attack against a fresh worker process (:func:`main_hostile`);
tests/hostile/ runs them against an in-process worker and asserts the bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from hipr.protocol.codec import ARGS_LENGTH, encode_frame
from hipr.protocol.header import HEADER, MAGIC, PROTOCOL_VERSION, Flags
from hipr.protocol.opcodes import Opcode
from hipr.testing.floods import FloodStats, flood_fire_and_forget, flood_unread_replies
from hipr.testing.harness import RawClient, raw_connect, rss_bytes
from hipr.worker.tenants import new_token, token_hash

_LINK_ENDS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


@dataclass(frozen=True)
class Target:
    """The worker under attack and what the attacks need to know of it."""

    url: str
    #: Tokens of the attacking tenant (``alice``) and of the other one (``bob``).
    alice: str
    bob: str
    max_frame_bytes: int = 64 << 20
    max_hello_bytes: int = 64 << 10
    handshake_timeout: float = 5.0
    frame_timeout: float = 30.0
    #: Connections the idle-connection attack opens.
    idle_connections: int = 1000
    #: Seconds the wrong-token flood lasts.
    flood_seconds: float = 3.0
    #: Connections the bad-magic flood opens.
    flood_connections: int = 1000


Attack = Callable[[Target], Awaitable[dict[str, Any]]]


def _tcp(url: str) -> tuple[str, int]:
    host, _, port = url[len("tcp://") :].rstrip("/").rpartition(":")
    return host.strip("[]"), int(port)


async def _connect(target: Target, local_host: str | None = None) -> anyio.abc.ByteStream:
    if local_host is not None and target.url.startswith("tcp://"):
        host, port = _tcp(target.url)
        return await anyio.connect_tcp(host, port, local_host=local_host)
    return await raw_connect(target.url)


def _head(opcode: int, payload_length: int, args_length: int) -> bytes:
    """A frame's header and the CBOR part's length prefix, for a payload sent apart."""
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, opcode, 1, 0, payload_length) + ARGS_LENGTH.pack(
        args_length
    )


def _array_head(count: int) -> bytes:
    """The CBOR head of an array of ``count`` items (major type 4, 4-byte length)."""
    return b"\x9a" + struct.pack(">I", count)


async def _answer(stream: anyio.abc.ByteStream, timeout: float) -> tuple[str | None, bool]:
    """What the worker said (an error's message) and whether it closed the link,
    reading for at most ``timeout`` seconds."""
    from hipr.errors import HipError
    from hipr.protocol.codec import FrameDecoder

    decoder = FrameDecoder()
    message: str | None = None
    with anyio.move_on_after(timeout):
        while True:
            try:
                decoder.feed(await stream.receive())
            except _LINK_ENDS:
                return message, True
            for frame in decoder.frames():
                if Flags.ERROR in frame.flags:
                    message = HipError.from_wire(frame.args).message
    return message, False


async def _send_bomb(
    target: Target, opcode: int, item: bytes, size: int, *, token: str | None = None
) -> dict[str, Any]:
    """One frame whose CBOR is an array of ``size`` bytes of ``item`` (an empty map or
    array), sent in 1 MiB pieces from one reused buffer; after a HELLO with ``token``
    when given (an authenticated bomb), else as the HELLO itself."""
    stream = await _connect(target)
    sent = 0
    try:
        if token is not None:
            await stream.send(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"token": token}))
            await _read_one(stream)
        count = size - 5
        head = _head(opcode, ARGS_LENGTH.size + size, size) + _array_head(count)
        piece = item * (1 << 20)
        with contextlib.suppress(*_LINK_ENDS):
            first = min(len(piece), count)
            await stream.send(head + piece[:first])
            sent = first
            while sent < count:
                n = min(len(piece), count - sent)
                await stream.send(piece[:n])
                sent += n
        message, closed = await _answer(stream, 10.0)
    finally:
        await anyio.aclose_forcefully(stream)
    return {"sent": sent, "answer": message, "closed": closed}


async def _await_answers(streams: list[anyio.abc.ByteStream], timeout: float) -> tuple[int, int]:
    """Wait on every stream at once for the worker's answer or close: (how many got an
    error answer, how many the worker closed)."""
    refused = closed = 0

    async def one(stream: anyio.abc.ByteStream) -> None:
        nonlocal refused, closed
        message, ended = await _answer(stream, timeout)
        # Counted after the await: ``closed += await ...`` would lose updates.
        refused += message is not None
        closed += ended

    async with anyio.create_task_group() as tg:
        for stream in streams:
            tg.start_soon(one, stream)
    return refused, closed


async def _read_one(stream: anyio.abc.ByteStream) -> None:
    from hipr.protocol.codec import FrameDecoder

    decoder = FrameDecoder()
    with anyio.fail_after(10):
        while decoder.next_frame() is None:
            decoder.feed(await stream.receive())


async def hello_bomb_maps(target: Target) -> dict[str, Any]:
    """A HELLO of 32 MiB of empty maps, no token needed (refused from its header)."""
    return await _send_bomb(target, Opcode.HELLO, b"\xa0", 32 << 20)


async def hello_bomb_arrays(target: Target) -> dict[str, Any]:
    """A HELLO of 8 MiB of empty arrays."""
    return await _send_bomb(target, Opcode.HELLO, b"\x80", 8 << 20)


async def hello_bomb_that_fits(target: Target) -> dict[str, Any]:
    """A HELLO of empty maps exactly as large as a HELLO may be, ten times over."""
    size = target.max_hello_bytes - ARGS_LENGTH.size
    notes: dict[str, Any] = {}
    for _ in range(10):
        notes = await _send_bomb(target, Opcode.HELLO, b"\xa0", size)
    return notes


async def session_bomb_arrays(target: Target) -> dict[str, Any]:
    """Tenant alice, authenticated, sends a request whose CBOR is 8 MiB of empty arrays."""
    return await _send_bomb(target, Opcode.MALLOC, b"\x80", 8 << 20, token=target.alice)


async def session_bomb_maps(target: Target) -> dict[str, Any]:
    """The same with 32 MiB of empty maps."""
    return await _send_bomb(target, Opcode.MALLOC, b"\xa0", 32 << 20, token=target.alice)


async def unfinished_hellos(target: Target, count: int = 20) -> dict[str, Any]:
    """``count`` connections announce a HELLO of ``max_frame_bytes`` and send 1 MiB of
    it; ``count`` more announce one of ``max_hello_bytes`` and send all but its last
    byte, then wait to be closed (the handshake timeout)."""
    streams: list[anyio.abc.ByteStream] = []
    refused = closed = 0
    try:
        big = _head(Opcode.HELLO, target.max_frame_bytes - 1024, target.max_frame_bytes - 1028)
        for _ in range(count):
            stream = await _connect(target)
            streams.append(stream)
            with contextlib.suppress(*_LINK_ENDS):
                await stream.send(big + b"\xa0" * (1 << 20))
        limit = target.max_hello_bytes
        for _ in range(count):
            stream = await _connect(target)
            streams.append(stream)
            with contextlib.suppress(*_LINK_ENDS):
                await stream.send(_head(Opcode.HELLO, limit, limit - 4) + b"\xa0" * (limit - 5))

        refused, closed = await _await_answers(streams, target.handshake_timeout + 5)
    finally:
        for stream in streams:
            await anyio.aclose_forcefully(stream)
    return {"connections": len(streams), "answered_error": refused, "closed": closed}


async def idle_connections(target: Target) -> dict[str, Any]:
    """``target.idle_connections`` connections that send nothing, held until the worker
    closes them (its handshake timeout, or at once over its caps)."""
    streams: list[anyio.abc.ByteStream] = []
    failed = closed = 0
    try:
        for _ in range(target.idle_connections):
            try:
                streams.append(await _connect(target))
            except OSError:
                failed += 1

        closed = (await _await_answers(streams, target.handshake_timeout + 5))[1]
    finally:
        for stream in streams:
            await anyio.aclose_forcefully(stream)
    return {"opened": len(streams), "connect_failed": failed, "closed": closed}


async def bad_magic_flood(target: Target) -> dict[str, Any]:
    """``target.flood_connections`` connections, one after the other, that speak HTTP
    instead (a scanner): protocol errors, each with its own text."""
    answered = 0
    count = target.flood_connections
    for i in range(count):
        try:
            stream = await _connect(target)
        except OSError:
            continue
        try:
            with contextlib.suppress(*_LINK_ENDS):
                await stream.send(f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            message = (await _answer(stream, 5.0))[0]
            answered += message is not None
        finally:
            await anyio.aclose_forcefully(stream)
    return {"connections": count, "answered_error": answered}


async def wrong_token_flood(target: Target, parallel: int = 16) -> dict[str, Any]:
    """HELLOs with wrong tokens from one source, ``parallel`` at a time, for
    ``target.flood_seconds``; then one wrong token from another source address
    (127.0.0.2), which must not wait for the first source's backoff."""
    attempts = 0
    slowest = 0.0
    deadline = time.monotonic() + target.flood_seconds

    async def guess() -> None:
        nonlocal attempts, slowest
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                stream = await _connect(target)
            except OSError:
                await anyio.sleep(0.01)
                continue
            try:
                with contextlib.suppress(*_LINK_ENDS):
                    await stream.send(
                        encode_frame(Opcode.HELLO, 1, Flags.NONE, {"token": new_token()})
                    )
                    await _answer(stream, 10.0)
            finally:
                await anyio.aclose_forcefully(stream)
            attempts += 1
            slowest = max(slowest, time.monotonic() - started)

    async with anyio.create_task_group() as tg:
        for _ in range(parallel):
            tg.start_soon(guess)
    notes: dict[str, Any] = {
        "attempts": attempts,
        "per_second": round(attempts / target.flood_seconds, 1),
        "slowest_s": round(slowest, 3),
    }
    if target.url.startswith("tcp://127."):
        started = time.monotonic()
        stream = await _connect(target, local_host="127.0.0.2")
        try:
            await stream.send(encode_frame(Opcode.HELLO, 1, Flags.NONE, {"token": new_token()}))
            await _answer(stream, 10.0)
        finally:
            await anyio.aclose_forcefully(stream)
        notes["other_source_s"] = round(time.monotonic() - started, 3)
    return notes


async def drip(target: Target, interval: float = 0.0) -> dict[str, Any]:
    """Tenant alice, authenticated, begins a frame and sends one byte of it every
    ``interval`` seconds (a tenth of ``frame_timeout`` by default, at most 3 s): the
    link is never silent, and no frame ever completes. Seconds until it is closed."""
    interval = interval or min(3.0, target.frame_timeout / 10)
    client = await RawClient.open(target.url, target.alice)
    frame = encode_frame(Opcode.MALLOC, 99, Flags.NONE, {"size": 4096})
    started = time.monotonic()
    closed = False
    try:
        with anyio.move_on_after(target.frame_timeout * 3 + 30):
            for i in range(10**6):
                try:
                    await client.stream.send(frame[i % len(frame) : i % len(frame) + 1])
                except _LINK_ENDS:
                    closed = True
                    break
                with anyio.move_on_after(interval):
                    try:
                        while True:
                            await client.stream.receive()  # the worker's PINGs
                    except _LINK_ENDS:
                        closed = True
                if closed:
                    break
    finally:
        await client.aclose()
    return {"closed": closed, "closed_after_s": round(time.monotonic() - started, 1)}


#: Every attack, by name, in the order the report runs them.
def _flood_notes(stats: FloodStats) -> dict[str, Any]:
    return {
        "frames_sent": stats.frames_sent,
        "frames_per_second": stats.frames_per_second,
        "blocked_s": round(stats.blocked_seconds, 2),
        **({"ended": stats.error} if stats.error else {}),
    }


async def fire_and_forget_flood(target: Target) -> dict[str, Any]:
    """Alice's fire-and-forget MEMSETs from one authenticated connection, as fast as
    the worker reads them, for ``target.flood_seconds`` (:mod:`hipr.testing.floods`)."""
    return _flood_notes(await flood_fire_and_forget(target.url, target.alice, target.flood_seconds))


async def unread_replies_flood(target: Target) -> dict[str, Any]:
    """Alice's MEMSETs that each want a reply, from a connection that never reads one."""
    return _flood_notes(await flood_unread_replies(target.url, target.alice, target.flood_seconds))


ATTACKS: list[tuple[str, Attack]] = [
    ("HELLO bomb: 32 MiB of empty maps", hello_bomb_maps),
    ("HELLO bomb: 8 MiB of empty arrays", hello_bomb_arrays),
    ("HELLO bomb: 10 x max_hello_bytes of empty maps", hello_bomb_that_fits),
    ("session bomb: 8 MiB of empty arrays", session_bomb_arrays),
    ("session bomb: 32 MiB of empty maps", session_bomb_maps),
    ("20 + 20 unfinished HELLOs", unfinished_hellos),
    ("idle connections", idle_connections),
    ("bad-magic flood", bad_magic_flood),
    ("wrong-token flood, 16 parallel", wrong_token_flood),
    ("one-byte drip after the handshake", drip),
    ("fire-and-forget flood, one connection", fire_and_forget_flood),
    ("unread-replies flood, one connection", unread_replies_flood),
]


# --- measuring ----------------------------------------------------------------------


@dataclass
class Outcome:
    """One attack's cost to the other tenant and to the worker's memory."""

    name: str
    baseline_ms: list[float]
    loaded_ms: list[float]
    rss_idle: int
    rss_peak: int
    rss_after: int
    seconds: float
    notes: dict[str, Any] = field(default_factory=dict)
    #: Worker log lines written during the attack, where they were counted.
    log_lines: int | None = None
    #: Counters that moved during the attack (``/metrics`` names without ``hipr_``).
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def baseline_median_ms(self) -> float:
        """The other tenant's median call before the attack."""
        return statistics.median(self.baseline_ms) if self.baseline_ms else 0.0

    @property
    def median_ms(self) -> float:
        """Its median call during the attack."""
        return statistics.median(self.loaded_ms) if self.loaded_ms else 0.0

    @property
    def worst_ms(self) -> float:
        """Its slowest call during the attack."""
        return max(self.loaded_ms, default=0.0)

    @property
    def stalls(self) -> int:
        """Calls during the attack over the baseline's slowest by more than 100 ms."""
        bound = self.baseline_worst_ms + 100
        return sum(1 for ms in self.loaded_ms if ms > bound)

    @property
    def baseline_worst_ms(self) -> float:
        """Its slowest call before the attack."""
        return max(self.baseline_ms, default=0.0)


async def _calls(gpu: Any, count: int, until: anyio.Event | None = None) -> list[float]:
    """Latencies (ms) of small calls: at least ``count``, and until ``until`` is set."""
    found: list[float] = []
    while len(found) < count or (until is not None and not until.is_set()):
        started = time.perf_counter()
        await gpu.mem_get_info()
        found.append((time.perf_counter() - started) * 1000)
        await anyio.sleep(0.002)
    return found


async def measure(
    target: Target,
    name: str,
    attack: Callable[[], Awaitable[dict[str, Any]]],
    rss: Callable[[], int] = rss_bytes,
    *,
    baseline_calls: int = 200,
    settle: float = 2.0,
) -> Outcome:
    """Run ``attack`` while tenant bob calls the worker, and compare."""
    import hipr

    prepare = getattr(attack, "prepare", None)
    if prepare is not None:
        await prepare()  # an attacker's own start is no part of its attack
    async with hipr.aconnect(target.url, token=target.bob, timeout=30) as gpu:
        await _calls(gpu, 20)  # warm
        baseline = await _calls(gpu, baseline_calls)
        rss_idle = rss()
        peak = rss_idle
        done = anyio.Event()
        notes: dict[str, Any] = {}

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss())
                await anyio.sleep(0.01)

        async def run_attack() -> None:
            try:
                notes.update(await attack())
            finally:
                done.set()

        started = time.monotonic()
        loaded: list[float] = []

        async def call_while() -> None:
            # As many calls as the baseline at least: a quick attack's aftermath counts.
            loaded.extend(await _calls(gpu, baseline_calls, done))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            tg.start_soon(call_while)
            tg.start_soon(run_attack)
        seconds = time.monotonic() - started
        await anyio.sleep(settle)
        rss_after = rss()
    return Outcome(name, baseline, loaded, rss_idle, peak, rss_after, seconds, notes)


# --- the report: each attack against a fresh worker process ---------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _proc_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _scrape(url: str) -> dict[str, float]:
    """The ``hipr_*`` counters of a metrics endpoint, summed over their labels."""
    totals: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if not line.startswith("hipr_") or "_total" not in line.split(" ")[0]:
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


@dataclass(frozen=True)
class HostileOptions:
    """How the hostile report runs."""

    idle_connections: int = 1000
    handshake_timeout: float = 5.0
    frame_timeout: float = 5.0
    flood_seconds: float = 5.0
    settle: float = 5.0
    baseline_calls: int = 200
    only: tuple[str, ...] = ()


@contextlib.contextmanager
def worker_process(directory: Path, options: HostileOptions) -> Iterator[tuple[Target, int, str]]:
    """A fresh ``hipr worker`` (emulator) with tenants alice and bob: the target, the
    worker's pid and the file its JSON log lines go to."""
    alice, bob = new_token(), new_token()
    tenants = directory / "tenants.toml"
    tenants.write_text(
        f'[tenants.alice]\ntokens = ["{token_hash(alice)}"]\n'
        f'[tenants.bob]\ntokens = ["{token_hash(bob)}"]\n'
    )
    port, metrics = _free_port(), _free_port()
    config = directory / "worker.toml"
    config.write_text(
        f'listen = ["tcp://127.0.0.1:{port}"]\nbackend = "emulator"\n'
        f'tenants_file = "{tenants}"\nmetrics_listen = "127.0.0.1:{metrics}"\n'
        f"handshake_timeout = {options.handshake_timeout}\n"
        f"frame_timeout = {options.frame_timeout}\n"
        # Both tenants in one process: the hard case (attacker and victim share the
        # loop and the heap); the default would give each tenant a process of its own.
        'isolation = "none"\n'
        'log_format = "json"\n[emulator]\ntotal_memory = "1GiB"\n'
    )
    log_path = directory / "worker.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "hipr", "worker", "--config", str(config)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the worker did not start: {log_path.read_text()}"
                        ) from None
                    time.sleep(0.1)
            target = Target(
                f"tcp://127.0.0.1:{port}",
                alice,
                bob,
                handshake_timeout=options.handshake_timeout,
                frame_timeout=options.frame_timeout,
                idle_connections=options.idle_connections,
                flood_seconds=options.flood_seconds,
            )
            yield target, process.pid, f"http://127.0.0.1:{metrics}/metrics"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class ProcessAttack:
    """Attack ``name`` run in a process of its own (its sockets and sends cost the
    attacker's process, not the one measuring the other tenant). :meth:`prepare`
    starts it and waits until it has imported what it needs (a Python start costs a
    second of CPU, which is no part of the attack); calling it runs the attack and
    returns its notes."""

    def __init__(self, name: str, target: Target) -> None:
        self.name = name
        self.target = target
        self._process: anyio.abc.Process | None = None

    async def prepare(self) -> None:
        """Start the attacker and wait for its word that it is ready."""
        code = (
            "import json,sys;from hipr.testing.hostile import attack_main;"
            "attack_main(sys.argv[1], json.loads(sys.argv[2]))"
        )
        self._process = await anyio.open_process(
            [sys.executable, "-c", code, self.name, json.dumps(self.target.__dict__)]
        )
        assert self._process.stdout is not None
        with anyio.fail_after(60):
            ready = await self._process.stdout.receive()
        if not ready.startswith(b"ready"):
            raise RuntimeError(f"the attacker did not start: {ready[:300]!r}")

    async def __call__(self) -> dict[str, Any]:
        if self._process is None:
            await self.prepare()
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        await process.stdin.send(b"go\n")
        output = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                output += await process.stdout.receive()
        await process.wait()
        text = output.decode().strip().splitlines()
        try:
            return dict(json.loads(text[-1])) if text else {"error": "no notes"}
        except ValueError:
            return {"error": text[-1][:300]}


def attack_process(name: str, target: Target) -> ProcessAttack:
    """Attack ``name`` in a process of its own (see :class:`ProcessAttack`)."""
    return ProcessAttack(name, target)


def attack_main(name: str, fields: dict[str, Any]) -> None:
    """The attack process: say ``ready``, wait for a line on stdin, run attack ``name``
    on the target, print its notes as JSON."""
    attack = dict(ATTACKS)[name]
    target = Target(**fields)
    print("ready", flush=True)
    sys.stdin.readline()
    notes = anyio.run(attack, target)
    print(json.dumps(notes), flush=True)


def run_report(options: HostileOptions) -> list[Outcome]:
    """Every attack (or those named in ``options.only``) against a fresh worker."""
    outcomes: list[Outcome] = []
    for name, _ in ATTACKS:
        if options.only and not any(word.lower() in name.lower() for word in options.only):
            continue
        with tempfile.TemporaryDirectory(prefix="hipr-hostile-") as tmp:
            with worker_process(Path(tmp), options) as (target, pid, metrics_url):
                log_path = Path(tmp) / "worker.log"
                before = _scrape(metrics_url)
                lines_before = len(log_path.read_text().splitlines())
                outcome = anyio.run(
                    partial(
                        measure,
                        target,
                        name,
                        attack_process(name, target),
                        partial(_proc_rss, pid),
                        baseline_calls=options.baseline_calls,
                        settle=options.settle,
                    )
                )
                lines = log_path.read_text().splitlines()
                outcome.log_lines = len(lines) - lines_before
                after = _scrape(metrics_url)
                outcome.counters = {
                    key.removeprefix("hipr_").removesuffix("_total"): value - before.get(key, 0.0)
                    for key, value in after.items()
                    if value != before.get(key, 0.0)
                    and not key.startswith(("hipr_request", "hipr_sessions", "hipr_bytes"))
                }
        outcomes.append(outcome)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: done", file=sys.stderr, flush=True)
    return outcomes


def render(outcomes: list[Outcome], *, title: str) -> str:
    """The hostile section: one row per attack."""
    mib = 1 << 20
    lines = [
        title,
        "",
        "| attack | bob median (base) ms | bob worst (base) ms | stalls "
        "| RSS idle / peak / after MiB | log lines | counters | attacker saw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        counters = ", ".join(f"{k} {v:g}" for k, v in sorted(o.counters.items())) or "-"
        notes = ", ".join(f"{k} {v}" for k, v in o.notes.items() if k != "answer")
        if o.notes.get("answer"):
            notes += f"; answer: {str(o.notes['answer'])[:90]}"
        lines.append(
            f"| {o.name} | {o.median_ms:.2f} ({o.baseline_median_ms:.2f}) "
            f"| {o.worst_ms:.1f} ({o.baseline_worst_ms:.1f}) | {o.stalls} of {len(o.loaded_ms)} "
            f"| {o.rss_idle / mib:.0f} / {o.rss_peak / mib:.0f} / {o.rss_after / mib:.0f} "
            f"| {o.log_lines if o.log_lines is not None else '-'} | {counters} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def main_hostile(args: argparse.Namespace) -> int:
    """``scripts/reliability-report --hostile``: print the hostile section."""
    options = HostileOptions(
        idle_connections=args.idle_connections,
        settle=args.settle_seconds,
        only=tuple(args.only or ()),
    )
    started = time.monotonic()
    outcomes = run_report(options)
    title = (
        "## Hostile clients\n\n"
        f"Each attack against a fresh `hipr worker` process (emulator backend, tenants alice "
        f"and bob, handshake_timeout {options.handshake_timeout:g} s, frame_timeout "
        f"{options.frame_timeout:g} s), run from a process of its own while tenant bob calls "
        f"mem_get_info in a loop; bob's median and worst call during the attack against his "
        f"unloaded baseline (in parentheses) of {options.baseline_calls} calls just before, "
        "and how many of its calls took over 100 ms more than the baseline's slowest "
        "(stalls); "
        f"the worker's RSS idle, at its peak, and {options.settle:g} s after; worker log lines "
        f"written during the attack; /metrics counters that moved. "
        f"{time.monotonic() - started:.0f} s on {os.cpu_count()} CPUs."
    )
    text = render(outcomes, title=title)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    return 0
