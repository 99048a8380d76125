"""A fuzz campaign against a live worker, with its oracles.

Many fuzz connections run at once, each at a random stage (before HELLO, after it,
mid-copy), sending the frames of :mod:`hipr.testing.fuzz`. Alongside, a well-behaved
client writes, reads back and verifies data the whole time. The oracles:

- **no crash**: the worker logs no unexpected exception (:class:`LogWatch`) and its
  serve task survives;
- **no hang**: every fuzz exchange ends, with its replies or with a close, within
  ``bound`` seconds;
- **every request answered**: each well-framed request that asks for a reply gets one
  (success or HipError) unless the connection ends at an earlier frame that ends it;
- **service goes on**: the good client sees no error and no wrong byte;
- **no leak**: afterwards the backend holds nothing and no session is registered.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import numpy as np

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.backends.interface import Backend
from hipr.errors import HipError, ProtocolError
from hipr.protocol.codec import DEFAULT_MAX_PAYLOAD, Frame, FrameDecoder, encode_frame
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode
from hipr.testing.fuzz import (
    FuzzFrame,
    IdSource,
    Stage,
    Targets,
    frame_of,
    hello_frame,
    mutate_args,
    nasty_cbor_frame,
    structured_frame,
    without_kernels,
)
from hipr.testing.fuzz_bytes import RawMutator, random_frames
from hipr.testing.harness import (
    DeviceMemory,
    LogWatch,
    device_memory_used,
    leaks,
    raw_connect,
    wait_for_no_sessions,
    warm_up,
    write_tenants,
)
from hipr.testing.leak_trace import LeakTrace
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker

#: The well-behaved client's device when the worker has several and none is asked for:
#: the last one (fuzz sessions stay on the others).
#: The worker's frame limit during fuzzing: small, so oversized frames are cheap to send.
FUZZ_MAX_FRAME = 1 << 20
_LINK_ERRORS = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


@dataclass
class FuzzOptions:
    """How much to fuzz and how."""

    seed: int = 0
    #: Stop after about this many fuzz frames ...
    frames: int = 10_000
    #: ... or after this many seconds, whichever comes first (None: no deadline).
    seconds: float | None = None
    #: Fuzz connections open at once (per process).
    concurrency: int = 8
    #: Fuzzer processes; 0 runs the fuzzers in the worker's own process and loop.
    processes: int = 0
    #: Seconds within which every exchange must end: longer is a hang.
    bound: float = 5.0
    #: Where the worker listens (``tcp://127.0.0.1:0`` or a ``unix://`` path).
    listen: str = "tcp://127.0.0.1:0"
    #: Print crashes and hangs as they happen.
    echo: bool = False
    #: Seconds between progress lines on stderr (None: quiet).
    progress: float | None = None
    #: Replay: run only these connection indices (each connection's frames depend only
    #: on the seed and its index), one after another.
    only: tuple[int, ...] = ()
    #: The well-behaved client's device; None: the worker's last. Fuzz sessions stay off
    #: it when the worker has other devices, and share it when it has one.
    good_device: int | None = None
    #: Whether fuzzed kernels may write past their allocation or fault the device (see
    #: ``Targets.kernel_faults``); None: only on the emulator, whose kernels check their
    #: bounds and whose faults are its own. On a GPU a stray write lands in another
    #: client's memory and a fault poisons the context of every session on the device.
    kernel_faults: bool | None = None
    #: Set by :func:`run_fuzz_campaign` from the worker's devices: the device that fuzz
    #: sessions never make current (None: they share the good client's).
    reserved_device: int | None = None


@dataclass
class FuzzReport:
    """What a campaign saw."""

    frames: int = 0
    connections: int = 0
    replies: int = 0
    error_replies: int = 0
    closes: int = 0
    by_stage: Counter[str] = field(default_factory=Counter)
    hangs: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    good_verified: int = 0
    good_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The worker's devices, the good client's, and whether fuzzed kernels could fault.
    devices: int = 0
    good_device: int = 0
    kernel_faults: bool = True
    memory: DeviceMemory = field(default_factory=DeviceMemory)
    #: The leak trace's findings (``trace=True``): who made what is still held.
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every oracle held."""
        return not (self.hangs or self.violations or self.crashes or self.leaks or self.good_errors)

    def merge(self, other: FuzzReport) -> None:
        """Add the fuzzer-side figures of another process's report."""
        self.frames += other.frames
        self.connections += other.connections
        self.replies += other.replies
        self.error_replies += other.error_replies
        self.closes += other.closes
        self.by_stage.update(other.by_stage)
        self.hangs += other.hangs
        self.violations += other.violations

    def summary(self) -> str:
        """One line for logs and assertion messages."""
        stages = ", ".join(f"{k} {v}" for k, v in sorted(self.by_stage.items()))
        return (
            f"{self.frames} frames on {self.connections} connections in {self.seconds:.1f} s "
            f"({stages}); {self.replies} replies ({self.error_replies} errors), "
            f"{self.closes} closes; crashes {self.crashes[:3]}, hangs {self.hangs[:3]}, "
            f"violations {self.violations[:3]}, leaks {self.leaks}, good client "
            f"{self.good_verified} verified, errors {self.good_errors[:3]}"
        )


class _Link:
    """The fuzzer's end of one connection: sends bytes, collects replies by request id."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(DEFAULT_MAX_PAYLOAD)
        self.answered: dict[int, Frame] = {}
        self.stray: list[int] = []
        self.closed = False
        self.replies = 0
        self.errors = 0
        self.malformed: str | None = None
        #: Check that no request is answered twice (off once raw damage may repeat ids).
        self.strict = True

    async def _send(self, data: bytes, eof: bool) -> None:
        try:
            if data:
                await self.stream.send(data)
            if eof:
                await self.stream.send_eof()
        except _LINK_ERRORS:
            pass  # the worker closed first: what it answered is checked by the reader

    async def exchange(
        self, data: bytes, until: Callable[[], bool], bound: float, *, eof: bool = False
    ) -> bool:
        """Send ``data`` while reading replies until ``until()`` or a close; False when
        neither came within ``bound`` seconds (a hang)."""
        with anyio.move_on_after(bound) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send, data, eof)
                await self._read_until(until)
                tg.cancel_scope.cancel()
        return not scope.cancelled_caught

    async def _read_until(self, until: Callable[[], bool]) -> None:
        while not self.closed and not until():
            try:
                data = await self.stream.receive()
            except _LINK_ERRORS:
                self.closed = True
                return
            self.decoder.feed(data)
            try:
                for frame in self.decoder.frames():
                    self._on_frame(frame)
            except ProtocolError as exc:
                self.malformed = f"the worker sent a malformed frame: {exc}"
                self.closed = True
                return

    def _on_frame(self, frame: Frame) -> None:
        if Flags.REPLY not in frame.flags:
            if frame.request_id != 0 or frame.opcode not in (Opcode.PING, Opcode.GOODBYE):
                self.malformed = f"the worker sent a frame without REPLY: {frame.header}"
            return  # a heartbeat or the worker's goodbye: worker-initiated, id 0
        if Flags.MORE in frame.flags:
            return  # a chunk of a device-to-host reply; the final frame follows
        self.replies += 1
        if Flags.ERROR in frame.flags:
            self.errors += 1
            if not isinstance(HipError.from_wire(frame.args), HipError):
                self.malformed = f"unreadable error reply {frame.args!r:.100}"
        if self.strict and frame.request_id in self.answered and frame.request_id != 0:
            self.stray.append(frame.request_id)
        self.answered[frame.request_id] = frame

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except _LINK_ERRORS:
                pass


class FuzzCampaign:
    """One campaign: a worker, fuzz connections, the good client, the oracles."""

    def __init__(
        self, options: FuzzOptions, tokens: tuple[str, str], *, offset: int = 0, stride: int = 1
    ) -> None:
        self.options = options
        self.fuzz_token, self.good_token = tokens
        self.report = FuzzReport()
        self.url = ""
        #: This campaign runs connections offset, offset + stride, ... (one per process).
        self._offset = offset
        self._stride = stride
        self._connection_index = 0
        self._deadline = float("inf")

    # --- budget ----------------------------------------------------------------------------
    def _more(self) -> bool:
        return self.report.frames < self.options.frames and time.monotonic() < self._deadline

    def _hang(self, where: str, detail: bytes) -> None:
        message = (
            f"{where}: no answer nor close within {self.options.bound} s; sent {detail[:96].hex()}"
        )
        self.report.hangs.append(message)
        if self.options.echo:
            print("hang:", message)

    def _violation(self, message: str) -> None:
        self.report.violations.append(message)
        if self.options.echo:
            print("violation:", message)

    # --- one connection ----------------------------------------------------------------------
    async def fuzzer(self) -> None:
        """Open fuzz connections one after another until the budget is spent."""
        while self._more():
            index = self._offset + self._connection_index * self._stride
            self._connection_index += 1
            if self.options.only:
                if index >= len(self.options.only):
                    return
                index = self.options.only[index]
            rng = random.Random(f"{self.options.seed}:{index}")
            try:
                with anyio.fail_after(self.options.bound):
                    stream = await raw_connect(self.url)
            except (TimeoutError, HipError, OSError) as exc:
                self._violation(f"connection {index}: connect failed: {exc!r}")
                await anyio.sleep(0.05)
                continue
            link = _Link(stream)
            self.report.connections += 1
            try:
                await self._one_connection(rng, link, index)
            except Exception as exc:  # the fuzzer's own bug: report it, replayable, go on
                self._violation(f"connection {index}: the fuzzer failed: {exc!r}")
            finally:
                await link.aclose()
                self.report.replies += link.replies
                self.report.error_replies += link.errors
                self.report.closes += link.closed
                if link.malformed:
                    self._violation(f"connection {index}: {link.malformed}")
                if link.stray:
                    self._violation(f"connection {index}: replies for ids {link.stray[:5]} twice")

    async def _one_connection(self, rng: random.Random, link: _Link, index: int) -> None:
        ids = IdSource.seeded(rng)
        if rng.random() < 0.1:
            await self._pre_hello(rng, link, ids)
            return
        targets = await self._handshake(rng, link, ids)
        if targets is None:
            return
        for _ in range(rng.randrange(1, 40)):
            if not self._more():
                break
            roll = rng.random()
            if roll < 0.78:
                ended = await self._structured_batch(rng, link, ids, targets)
            elif roll < 0.92:
                ended = await self._mid_copy(rng, link, ids, targets)
            else:
                await self._raw_batch(rng, link, ids, targets, Stage.POST_HELLO)
                ended = True
            if ended or link.closed:
                return
        roll = rng.random()
        if roll < 0.5:
            goodbye = frame_of(Opcode.GOODBYE, ids.take())
            if not await link.exchange(goodbye.data, lambda: link.closed, self.options.bound):
                self._hang("goodbye", goodbye.data)
        elif roll < 0.75 and not await link.exchange(
            b"", lambda: False, self.options.bound, eof=True
        ):
            self._hang("eof after requests", b"")
        # else: drop the connection without a word; the worker must clean up alone.

    async def _handshake(self, rng: random.Random, link: _Link, ids: IdSource) -> Targets | None:
        """HELLO, then the resources the fuzz frames aim at."""
        size, size2 = rng.choice((16, 256, 4096, 65536)), rng.choice((16, 4096))
        kernel = rng.choice(("fill_f32", "reduce_sum_f32"))
        setup = [
            (Opcode.HELLO, None),
            (Opcode.MALLOC, {"size": size}),
            (Opcode.MALLOC, {"size": size2}),
            (Opcode.STREAM_CREATE, None),
            (Opcode.EVENT_CREATE, None),
            (Opcode.MODULE_BUILTIN, {"name": kernel}),
            (Opcode.GRAPH_CREATE, None),
        ]
        request_ids = [ids.take() for _ in setup]
        data = hello_frame(request_ids[0], self.fuzz_token) + b"".join(
            encode_frame(op, rid, Flags.NONE, args)
            for (op, args), rid in zip(setup[1:], request_ids[1:], strict=True)
        )
        if not await link.exchange(
            data, lambda: all(r in link.answered for r in request_ids), self.options.bound
        ):
            self._hang("handshake", data)
            return None
        results = [link.answered.get(r) for r in request_ids]

        def field_of(i: int, key: str, default: int) -> int:
            frame = results[i]
            if frame is None or Flags.ERROR in frame.flags or not isinstance(frame.args, dict):
                return default
            value = frame.args.get(key)
            return value if isinstance(value, int) else default

        if results[0] is None or Flags.ERROR in results[0].flags:
            return None
        t = Targets(
            reserved_device=self.options.reserved_device,
            kernel_faults=bool(self.options.kernel_faults),
            kernel=kernel,
            ptr=field_of(1, "ptr", 0x1000),
            size=size,
            ptr2=field_of(2, "ptr", 0x2000),
            size2=size2,
            stream=field_of(3, "stream", 1),
            event=field_of(4, "event", 1),
            module=field_of(5, "module", 1),
            function=field_of(5, "function", 1),
            graph=field_of(6, "graph", 1),
        )
        if not t.kernel_faults and (field_of(5, "function", -1) < 0 or field_of(1, "ptr", -1) < 0):
            # Without its kernel or its buffer the session could only launch blind: a
            # function handle that never exists keeps every launch refused.
            t.function = 2**64 - 1
        # A node and an executable graph, for the graph opcodes.
        node_id, exec_id = ids.take(), ids.take()
        data = encode_frame(
            Opcode.GRAPH_ADD_MEMSET,
            node_id,
            Flags.NONE,
            {"graph": t.graph, "dependencies": [], "ptr": t.ptr, "value": 1, "size": t.size},
        ) + encode_frame(Opcode.GRAPH_INSTANTIATE, exec_id, Flags.NONE, {"graph": t.graph})
        if not await link.exchange(
            data, lambda: node_id in link.answered and exec_id in link.answered, self.options.bound
        ):
            self._hang("handshake graph", data)
            return None
        node, exe = link.answered[node_id], link.answered[exec_id]
        if isinstance(node.args, dict) and isinstance(node.args.get("node"), int):
            t.node = node.args["node"]
        if isinstance(exe.args, dict) and isinstance(exe.args.get("exec"), int):
            t.graph_exec = exe.args["exec"]
        return t

    async def _pre_hello(self, rng: random.Random, link: _Link, ids: IdSource) -> None:
        """Abuse before (and of) the handshake, then EOF: the worker must close."""
        t = Targets(
            reserved_device=self.options.reserved_device,
            kernel_faults=bool(self.options.kernel_faults),
        )
        mutator = RawMutator(rng, FUZZ_MAX_FRAME)
        roll = rng.random()
        count = rng.randrange(1, 6)
        if roll < 0.25:
            blob = b"".join(structured_frame(rng, t, ids).data for _ in range(count))
        elif roll < 0.5:
            blob = mutator.mutate(hello_frame(ids.take(), self.fuzz_token), rng.randrange(1, 4))
            count = 1
        elif roll < 0.7:
            args = mutate_args(rng, {"client": "fuzz", "token": self.fuzz_token})
            blob = frame_of(Opcode.HELLO, ids.take(), Flags.NONE, args).data + b"".join(
                structured_frame(rng, t, ids).data for _ in range(count - 1)
            )
        elif roll < 0.85:
            blob = random_frames(rng, count)
        else:
            blob = bytes(mutator.garbage(bytearray()))
            count = 1
        self.report.frames += count
        self.report.by_stage[Stage.PRE_HELLO] += count
        link.strict = False
        if not await link.exchange(blob, lambda: False, self.options.bound, eof=True):
            self._hang("pre-hello", blob)

    async def _structured_batch(
        self, rng: random.Random, link: _Link, ids: IdSource, t: Targets
    ) -> bool:
        """Well-framed fuzz frames and a probe; True when the connection ended."""
        frames = [
            nasty_cbor_frame(rng, ids) if rng.random() < 0.08 else structured_frame(rng, t, ids)
            for _ in range(rng.randrange(1, 33))
        ]
        probe = frame_of(Opcode.SYNC_ERRORS, ids.take())
        data = b"".join(f.data for f in frames) + probe.data
        self.report.frames += len(frames)
        self.report.by_stage[Stage.POST_HELLO] += len(frames)
        if not await link.exchange(
            data, lambda: probe.request_id in link.answered, self.options.bound
        ):
            self._hang("structured batch", data)
            return True
        self._check_answers(frames, link, probe)
        return link.closed

    def _check_answers(self, frames: list[FuzzFrame], link: _Link, probe: FuzzFrame) -> None:
        """Every frame that asked for a reply got one, up to where the session ended."""
        if probe.request_id in link.answered:
            owed = [f for f in frames if f.expects_reply]
        else:
            first_end = next((i for i, f in enumerate(frames) if f.ends_session), len(frames))
            owed = [f for f in frames[:first_end] if f.expects_reply]
            if first_end == len(frames):
                self._violation(
                    "the worker closed a session that sent only well-framed requests: "
                    + ", ".join(f"0x{f.opcode:04x}/{f.flags.value:x}" for f in frames)
                )
        missing = [f for f in owed if f.request_id not in link.answered]
        if missing:
            self._violation(
                "requests left unanswered: "
                + ", ".join(f"0x{f.opcode:04x} id {f.request_id}" for f in missing[:5])
            )

    async def _mid_copy(self, rng: random.Random, link: _Link, ids: IdSource, t: Targets) -> bool:
        """A copy with MORE, then what should (or should not) follow it."""
        size = rng.choice((1, 8, 100, t.size))
        size = min(size, t.size)
        copy_id = ids.take()
        flags = Flags.MORE
        if rng.random() < 0.5:
            opcode, args = Opcode.MEMCPY_HTOD, {"dst": t.ptr, "size": size}
            if rng.random() < 0.3:
                flags |= Flags.NO_REPLY
                args["stream"] = t.stream
        else:
            opcode, args = Opcode.MALLOC_HTOD, {"size": size}
        first = rng.randrange(0, size + 1)
        payload = rng.randbytes(size)
        head = encode_frame(opcode, copy_id, flags, args, payload[:first])
        rest = payload[first:]
        roll = rng.random()
        expect_close = False
        frames = 1
        if roll < 0.3:  # completed properly, in pieces
            cut = rng.randrange(0, len(rest) + 1)
            tail = encode_frame(Opcode.DATA, copy_id, Flags.MORE, None, rest[:cut])
            tail += encode_frame(Opcode.DATA, copy_id, Flags.NONE, None, rest[cut:])
            frames += 2
        elif roll < 0.45:  # too many bytes
            extra = rest + rng.randbytes(rng.choice((1, 100)))
            more = rng.random() < 0.5
            tail = encode_frame(
                Opcode.DATA, copy_id, Flags.MORE if more else Flags.NONE, None, extra
            )
            if more:
                tail += encode_frame(Opcode.DATA, copy_id, Flags.NONE, None, b"x")
            frames += 1 + more
        elif roll < 0.55:  # ends early
            tail = encode_frame(Opcode.DATA, copy_id, Flags.NONE, None, rest[: len(rest) // 2])
            frames += 1
            if not rest:
                tail = encode_frame(Opcode.DATA, copy_id, Flags.NONE, None, b"")
        elif roll < 0.7:  # another request barges in
            tail = structured_frame(rng, t, ids).data
            expect_close = True
            frames += 1
        elif roll < 0.8:  # DATA of another request
            tail = encode_frame(Opcode.DATA, copy_id ^ 0x5A5A, Flags.NONE, None, rest)
            expect_close = True
            frames += 1
        else:  # damaged continuation, then EOF
            mutator = RawMutator(rng, FUZZ_MAX_FRAME)
            tail = mutator.mutate(
                encode_frame(Opcode.DATA, copy_id, Flags.NONE, None, rest), rng.randrange(1, 3)
            )
            self.report.frames += 2
            self.report.by_stage[Stage.MID_COPY] += 2
            link.strict = False
            if not await link.exchange(head + tail, lambda: False, self.options.bound, eof=True):
                self._hang("mid-copy raw", head + tail)
            return True
        self.report.frames += frames
        self.report.by_stage[Stage.MID_COPY] += frames
        probe = frame_of(Opcode.SYNC_ERRORS, ids.take())
        data = head + tail + probe.data
        if not await link.exchange(
            data, lambda: probe.request_id in link.answered, self.options.bound
        ):
            self._hang("mid-copy", data)
            return True
        if expect_close and not link.closed:
            self._violation(f"mid-copy interloper did not end the connection (0x{opcode:04x})")
        if not expect_close:
            if not link.closed and Flags.NO_REPLY not in flags and copy_id not in link.answered:
                self._violation(f"mid-copy request {copy_id} was not answered")
            if link.closed:
                self._violation("the worker closed the connection after a complete copy")
        return link.closed

    async def _raw_batch(
        self, rng: random.Random, link: _Link, ids: IdSource, t: Targets, stage: Stage
    ) -> None:
        """Byte-damaged frames, then EOF: the worker answers what it can and closes."""
        mutator = RawMutator(rng, FUZZ_MAX_FRAME)
        if t.kernel_faults:
            frames = [structured_frame(rng, t, ids).data for _ in range(rng.randrange(1, 9))]
        else:  # damaged bytes could turn a tamed kernel wild
            frames = [
                without_kernels(lambda: structured_frame(rng, t, ids)).data
                for _ in range(rng.randrange(1, 9))
            ]
        roll = rng.random()
        if roll < 0.6:
            i = rng.randrange(len(frames))
            frames[i] = mutator.mutate(frames[i], rng.randrange(1, 4))
            blob = b"".join(frames)
        elif roll < 0.85:
            blob = mutator.mutate(b"".join(frames), rng.randrange(1, 4))
        else:
            blob = random_frames(rng, len(frames))
        self.report.frames += len(frames)
        self.report.by_stage[stage] += len(frames)
        link.strict = False
        if not await link.exchange(blob, lambda: False, self.options.bound, eof=True):
            self._hang("raw batch", blob)

    async def progress(self, name: str) -> None:
        """Print this campaign's counters every ``options.progress`` seconds."""
        assert self.options.progress
        while True:
            await anyio.sleep(self.options.progress)
            r = self.report
            print(
                f"{name}: {r.frames:,} frames, {r.connections:,} connections, "
                f"{len(r.hangs)} hangs, {len(r.violations)} violations",
                file=sys.stderr,
                flush=True,
            )

    # --- the well-behaved client ------------------------------------------------------------
    async def good_client(self, stop: anyio.Event) -> None:
        """Write, read back and verify, with every kind of operation, until ``stop``."""
        rng = random.Random(f"{self.options.seed}:good")
        while not stop.is_set():
            try:
                async with hipr.aconnect(self.url, token=self.good_token, timeout=10) as gpu:
                    await self._good_session(gpu, rng, stop)
            except HipError as exc:
                self.report.good_errors.append(repr(exc))
                await anyio.sleep(0.05)

    async def _good_session(self, gpu: Any, rng: random.Random, stop: anyio.Event) -> None:
        # A kernel fault is state of the whole device (sticky on a real GPU): the good
        # client works on a device the fuzz tenant never makes current.
        assert self.options.good_device is not None
        await gpu.set_device(self.options.good_device)
        fill = await gpu.builtin("fill_f32")
        a, b = await gpu.malloc(1 << 16), await gpu.malloc(1 << 16)
        for _ in range(200):
            if stop.is_set():
                break
            n = rng.randrange(4, 1 << 16) & ~3
            data = rng.randbytes(n)
            await gpu.memcpy_htod(a, data)
            self._verify(await gpu.memcpy_dtoh(a, n) == data, "htod/dtoh round trip")
            value = rng.randrange(256)
            await gpu.memset(b, value, n)
            self._verify(await gpu.memcpy_dtoh(b, n) == bytes([value]) * n, "memset")
            await gpu.memcpy_dtod(b, a, n)
            self._verify(await gpu.memcpy_dtoh(b, n) == data, "dtod")
            x = np.float32(rng.uniform(-1e3, 1e3))
            await fill.launch(1, 64, [a, x, np.uint64(n // 4)])
            got = np.frombuffer(await gpu.memcpy_dtoh(a, n), dtype=np.float32)
            self._verify(bool(np.all(got == x)), "fill_f32 kernel")
            head = data[: min(n, 64)]
            p = await gpu.malloc_htod(head)
            self._verify(await gpu.memcpy_dtoh(p, len(head)) == head, "malloc_htod")
            await gpu.free(p)
            await anyio.lowlevel.checkpoint()
        await gpu.free(a)
        await gpu.free(b)

    def _verify(self, ok: bool, what: str) -> None:
        if ok:
            self.report.good_verified += 1
        else:
            self.report.good_errors.append(f"wrong result: {what}")


def placed(options: FuzzOptions, backend: Backend) -> FuzzOptions:
    """``options`` with the devices and kernel policy settled for ``backend``: the good
    client on the asked device or the last one; fuzz sessions kept off it when there are
    others; fuzzed kernels wild only on the emulator, and only where the fuzz sessions
    have a device of their own, unless asked."""
    count = backend.device_count()
    good = count - 1 if options.good_device is None else options.good_device
    if not 0 <= good < count:
        raise ValueError(f"the good client's device {good} does not exist ({count} visible)")
    kernel_faults = options.kernel_faults
    if kernel_faults is None:
        # A kernel fault is the whole device's (the emulator's as a GPU's): a wild kernel
        # on the good client's device would fail the good client's calls too.
        kernel_faults = isinstance(backend, EmulatorBackend) and count > 1
    return dataclasses.replace(
        options,
        good_device=good,
        kernel_faults=kernel_faults,
        reserved_device=good if count > 1 else None,
    )


async def run_fuzz_campaign(
    options: FuzzOptions,
    backend: Backend | None = None,
    watch: LogWatch | None = None,
    *,
    trace: bool = False,
) -> FuzzReport:
    """Start a worker, fuzz it per ``options`` alongside a good client, check the oracles.
    ``trace`` installs a :class:`~hipr.testing.leak_trace.LeakTrace` on a GPU backend,
    whose findings land in ``report.trace``."""
    backend = backend or EmulatorBackend(device_count=2, total_memory=256 << 20)
    options = placed(options, backend)
    tracer = LeakTrace.install(backend) if trace and hasattr(backend, "_ledger") else None
    watch = watch or LogWatch(echo=options.echo)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hipr-fuzz-") as tmp:
        tenants = write_tenants(Path(tmp))
        config = WorkerConfig(
            max_frame_bytes=FUZZ_MAX_FRAME,
            tenants_file=tenants.path,
            resume_grace=0.0,
            # The fuzzers aim at this process's own connection, session and backend code.
            isolation="none",
        )
        campaign = FuzzCampaign(options, (tenants.fuzz_token, tenants.good_token))
        if options.seconds is not None:
            campaign._deadline = started + options.seconds
        report = campaign.report
        report.devices = backend.device_count()
        report.good_device = options.good_device or 0
        report.kernel_faults = bool(options.kernel_faults)
        with watch.installed():
            try:
                async with running_worker(config, backend, [options.listen]) as worker:
                    campaign.url = worker.bound_urls[0]
                    report.memory.start = await device_memory_used(backend)
                    await warm_up(campaign.url, tenants.good_token)
                    await wait_for_no_sessions(worker)
                    baseline = backend.stats()
                    if tracer is not None:
                        tracer.mark_baseline()
                    report.memory.baseline = await device_memory_used(backend)
                    try:
                        await _drive(campaign, options)
                    except Exception as exc:  # the fuzzer's own failure, not the worker's
                        report.violations.append(f"fuzz driver failed: {exc!r}")
                        if options.echo:
                            traceback.print_exception(exc)
                    if not await wait_for_no_sessions(worker):
                        report.hangs.append("sessions still open 10 s after every client left")
                    report.leaks = leaks(backend, worker, baseline)
                    report.memory.end = await device_memory_used(backend)
                    if tracer is not None:
                        report.trace = tracer.report()
            except Exception as exc:  # the serve task died: the worst crash of all
                report.crashes.append(f"worker serve task died: {exc!r}")
                if options.echo:
                    traceback.print_exception(exc)
        report.crashes += [f"{c.event}: {c.error}" for c in watch.crashes]
    report.seconds = time.monotonic() - started
    return report


async def _drive(campaign: FuzzCampaign, options: FuzzOptions) -> None:
    stop = anyio.Event()
    async with anyio.create_task_group() as outer:
        outer.start_soon(campaign.good_client, stop)
        async with anyio.create_task_group() as side:
            if options.processes > 0:
                await _fuzz_in_processes(campaign, options)
            else:
                if options.progress:
                    side.start_soon(campaign.progress, "fuzzer")
                async with anyio.create_task_group() as fuzzers:
                    for _ in range(options.concurrency):
                        fuzzers.start_soon(campaign.fuzzer)
            side.cancel_scope.cancel()
        stop.set()


async def _fuzz_in_processes(campaign: FuzzCampaign, options: FuzzOptions) -> None:
    processes = options.processes
    share = dataclasses.replace(
        options,
        frames=-(-options.frames // processes),
        seconds=None if options.seconds is None else campaign._deadline - time.monotonic(),
        processes=0,
    )
    tokens = (campaign.fuzz_token, campaign.good_token)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [
            pool.submit(_fuzz_process, campaign.url, tokens, share, i, processes)
            for i in range(processes)
        ]
        for future in futures:
            campaign.report.merge(await anyio.to_thread.run_sync(future.result))


def _fuzz_process(
    url: str, tokens: tuple[str, str], options: FuzzOptions, offset: int, stride: int
) -> FuzzReport:
    """Entry point of a fuzzer process: fuzz the worker at ``url``, report what it saw."""

    async def main() -> FuzzReport:
        campaign = FuzzCampaign(options, tokens, offset=offset, stride=stride)
        campaign.url = url
        if options.seconds is not None:
            campaign._deadline = time.monotonic() + options.seconds
        async with anyio.create_task_group() as tg:
            if options.progress:
                tg.start_soon(campaign.progress, f"fuzzer {offset}")
            async with anyio.create_task_group() as fuzzers:
                for _ in range(options.concurrency):
                    fuzzers.start_soon(campaign.fuzzer)
            tg.cancel_scope.cancel()
        return campaign.report

    return anyio.run(main)
