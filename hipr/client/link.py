"""The client's side of a session without I/O: request ids, the resend buffer, reply
routing and how a request is cut into frames.

Both client I/O layers drive this one core (the h11/httpcore pattern): the async
:class:`~hipr.client.connection.ClientConnection` over anyio streams and the blocking
:class:`~hipr.client.blocking.BlockingConnection` over plain sockets in the caller's
thread. Neither duplicates the protocol's rules; each only moves bytes and waits.

Exactly-once over a flaky link works like this. Request ids increase in the order
requests go on the wire (the I/O layer assigns them under its send lock). Every request
stays in an ordered resend buffer until a reply to it, or to a later request, proves
that the worker ran it (the worker runs a session's requests in order). After a
reconnect the I/O layer sends RESUME and re-sends the buffer in order; the worker skips
fire-and-forget requests it already ran and answers replied ones from its reply cache.
"""

from __future__ import annotations

import contextvars
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog

from hipr.cpus import auto_spin_wait
from hipr.errors import HipConnectionError, HipError, ProtocolError, SessionLostError
from hipr.protocol.codec import Frame, encode_frame_parts
from hipr.protocol.header import MAGIC, MAX_REQUEST_ID, Flags
from hipr.protocol.messages import LaunchConfig, LaunchKernel, LaunchKernels
from hipr.protocol.opcodes import Opcode

log = structlog.get_logger("hipr.client")

Buffer = bytes | bytearray | memoryview
Part = bytes | bytearray | memoryview
#: ``progress(done_bytes, total_bytes)``, called as a large copy's chunks go or come, on
#: the thread that sends or reads them: it should return quickly and not call the Gpu
#: (a download's callback runs while that thread holds the link for its readers).
Progress = Callable[[int, int], None]
#: ``on_event(kind, details)``: kind is disconnected, reconnecting, resumed or session_lost.
EventCallback = Callable[[str, dict[str, Any]], None]
#: The absolute deadline (time.monotonic) of the public call under way in this context:
#: ``timeout=`` on a sync API call sets it; every blocking request of the call obeys it.
DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "hipr_deadline", default=None
)
#: A request whose frames all fit in one write of at most this many bytes is batched.
SMALL_REQUEST = 4096


class ReplySink(Protocol):
    """Where a reply's bulk bytes go, chunk by chunk; ``reset`` before a replayed reply."""

    def write(self, chunk: memoryview) -> None:
        """Take the next chunk."""
        ...

    def reset(self) -> None:
        """Forget what was written: the reply is coming again from its start."""
        ...


class RequestLink(Protocol):
    """What the API needs of a connection, async or blocking (both implement it)."""

    #: True when requests block the thread instead of suspending (the sync client).
    inline: bool
    session_id: str

    @property
    def broken(self) -> HipError | None: ...

    async def request(
        self,
        opcode: Opcode,
        args: Any = None,
        data: Buffer = b"",
        *,
        sink: ReplySink | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> tuple[Any, bytes]:
        """Send a request and wait for its reply."""
        ...

    async def notify(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        """Send a fire-and-forget request."""
        ...

    def begin_close(self) -> None:
        """The session is ending on purpose."""
        ...

    async def aclose(self) -> None:
        """Close for good."""
        ...


@runtime_checkable
class DirectSink(ReplySink, Protocol):
    """A sink whose destination a connection may receive into straight from the socket."""

    def window(self, nbytes: int) -> memoryview | None:
        """Where the next ``nbytes`` go; None when they would not fit."""
        ...

    def advance(self, nbytes: int) -> None:
        """``nbytes`` were written into the last window."""
        ...


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """Heartbeats, reconnection and batching of one client connection."""

    #: Send a heartbeat when nothing was received for this long (seconds).
    heartbeat_interval: float = 5.0
    #: A link silent for this long is dead.
    heartbeat_timeout: float = 15.0
    #: Reconnection gives up after this many attempts ...
    reconnect_attempts: int = 10
    #: ... or this many seconds, whichever comes first.
    reconnect_timeout: float = 60.0
    #: First backoff delay; doubled after each failed attempt, with jitter.
    reconnect_delay: float = 0.05
    reconnect_max_delay: float = 5.0
    #: Bytes of unacknowledged requests kept for resending before the client waits.
    resend_buffer_bytes: int = 64 << 20
    #: Fire-and-forget bytes batched into one write.
    coalesce_bytes: int = 64 << 10
    #: Longest a fire-and-forget frame waits for its batch (seconds).
    coalesce_delay: float = 0.002
    #: Time for one connection attempt and its handshake.
    connect_timeout: float = 30.0
    #: How long the synchronous client polls its socket without sleeping while it waits
    #: for a reply, before it blocks (seconds; ``None``: :func:`auto_spin_wait`). A
    #: reply that arrives within it is seen without the kernel waking a sleeping thread,
    #: which costs tens of µs on a virtual machine: CUDA's ``cudaDeviceScheduleSpin``
    #: for a remote call. ``0`` always blocks at once; a value as long as a kernel
    #: (``0.01``) spins through it, one core busy meanwhile. The async client never spins.
    spin_wait: float | None = None
    #: While spinning is on (``spin_wait``): a device's, stream's or event's synchronize
    #: that outlasts the spin sleeps through most of its expected wait (learned from the
    #: last ones) and polls again from shortly before its end until shortly after (at
    #: most 250 µs each side), so that the reply finds the caller running
    #: (:mod:`hipr.client.wait_forecast`). ``False``: block after the spin, as before.
    forecast_waits: bool = True
    #: Fire-and-forget launches of one kernel configuration (function, geometry, shared
    #: memory, stream, pointer offsets), and fire-and-forget host-to-device copies of
    #: at most :data:`BATCH_COPY_BYTES` on one stream, that follow each other go to the
    #: worker as one frame, LAUNCH_KERNELS or MEMCPY_HTOD_MANY (protocol 1.1; a worker
    #: before it gets one frame each). The frame leaves when anything else is sent,
    #: after ``coalesce_delay``, or at once when it holds :data:`BATCH_ITEMS` items or
    #: :data:`BATCH_BYTES`, so nothing waits longer than in a batched write, and a long
    #: run is pipelined: the worker issues one frame while the client fills the next.
    batch_posts: bool = True

    def spin_seconds(self) -> float:
        """The spin window in force: ``spin_wait``, or the automatic choice."""
        return auto_spin_wait() if self.spin_wait is None else max(0.0, self.spin_wait)


#: Launches or copies one batch frame carries at most (the worker takes up to 4,096). A
#: full batch is sent at once: small enough that the worker starts early and issues a
#: frame while the client posts the next, where frames of 1,024 sent whole at the
#: synchronize made the worker wait for the client (benchmarks/README.md has the A/B).
BATCH_ITEMS = 64
#: Bytes one batch frame carries at most: launch argument buffers, or copied bytes.
BATCH_BYTES = 64 << 10
#: Fire-and-forget host-to-device copies of at most this many bytes are batched.
BATCH_COPY_BYTES = 4096
#: The protocol minor from which a worker takes LAUNCH_KERNELS and MEMCPY_HTOD_MANY.
_BATCHES_SINCE_MINOR = 1


#: A request as a batch takes it: (what its batch shares, its bytes, a copy's address).
BatchItem = tuple[tuple[Any, ...], bytes, int | None]


@dataclass(slots=True)
class _OpenBatch:
    """The LAUNCH_KERNELS or MEMCPY_HTOD_MANY request still open for more launches of
    its configuration, or more copies on its stream."""

    key: tuple[Any, ...]
    sent: Sent
    #: Launch argument buffers, or the copies' bytes.
    items: list[bytes]
    #: The copies' destinations (empty for launches).
    dsts: list[int]
    nbytes: int


@dataclass(slots=True)
class Pending:
    """A request waiting for its reply. ``finished`` is the truth; the I/O layer adds
    its own way to wake the waiter (``waiter``: an anyio Event, or None for blocking
    callers, which are woken through the connection's condition)."""

    opcode: int
    sink: ReplySink | None = None
    waiter: Any = None
    finished: bool = False
    result: Any = None
    error: HipError | None = None
    bulk: bytearray | None = None


@dataclass(slots=True)
class Sent:
    """A request on the wire, kept until the worker has provably run it."""

    request_id: int
    opcode: int
    flags: Flags
    args: Any
    data: memoryview
    progress: Progress | None = None
    #: Bytes of its arguments beyond the usual few (a batch's launch buffers).
    extra: int = 0

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + 64 + self.extra


def describe(error: BaseException | None) -> str:
    """An error in a few words, for 'could not reconnect' messages."""
    if error is None:
        return "none"
    if isinstance(error, TimeoutError):
        return "timed out"
    return str(error) or type(error).__name__


def byte_view(data: Buffer) -> memoryview:
    """A flat byte view of any C-contiguous buffer, without copying it."""
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        try:
            view = view.cast("B")
        except TypeError as exc:
            raise HipError(
                1, f"host buffer must be C-contiguous ({exc}); use numpy.ascontiguousarray"
            ) from None
    return view


@dataclass(slots=True)
class Handshake:
    """What HELLO or RESUME answered, and the bytes that arrived behind the answer."""

    reply: dict[str, Any]
    leftover: list[Frame] = field(default_factory=list)


def check_first_bytes(url: str, data: bytes | bytearray | memoryview) -> None:
    """Refuse a peer whose first bytes are not a frame's magic: it is no hipr worker.

    ``data`` is what arrived first on the connection (any length); the error quotes it,
    so that an HTTP server (the worker's metrics port) or an SSH banner is recognisable."""
    head = bytes(data[: len(MAGIC)])
    if head and not MAGIC.startswith(head):
        said = bytes(data[:40]).split(b"\n", 1)[0].strip().decode("ascii", "replace")
        web = said.startswith(("HTTP/", "<"))
        hint = " (a web server: the worker's metrics port?)" if web else ""
        raise HipConnectionError(
            message=f"{url} is not a hipr worker: it answered {said!r}{hint}; "
            "check the host and port (a worker listens on 18515 by default)"
        )


def handshake_reply(frame: Frame, opcode: int, url: str) -> dict[str, Any] | None:
    """The worker's answer to HELLO/RESUME in ``frame``; None for a frame to skip (a
    heartbeat that crossed the handshake); raises the worker's refusal."""
    if frame.request_id != 0 or frame.opcode not in (opcode, 0):
        return None
    if Flags.ERROR in frame.flags:
        raise HipError.from_wire(frame.args)
    if frame.error is not None:
        raise frame.error
    if not isinstance(frame.args, dict):
        raise ProtocolError(message=f"unexpected handshake reply from {url}")
    return frame.args


class LinkState:
    """Session state shared by the async and blocking client connections."""

    def __init__(
        self,
        url: str,
        max_payload: int,
        options: LinkOptions | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        self.url = url
        self.options = options or LinkOptions()
        self.chunk_bytes = 1 << 20
        self.session_id = ""
        self._max_payload = max_payload
        self._on_event = on_event
        self._resume_token = ""
        self._pending: dict[int, Pending] = {}
        self._unacked: OrderedDict[int, Sent] = OrderedDict()
        self._unacked_bytes = 0
        self._next_id = 1
        self._last_received = time.monotonic()
        self._broken: HipError | None = None
        self._closing = False
        self._retry_deadline = 0.0
        self._retry_delay = 0.0
        #: The worker takes batch frames (protocol 1.1) and the options allow them.
        self._batches = False
        #: The batch of launches or copies not yet written to the outbox (LinkOptions).
        self._batch: _OpenBatch | None = None

    # --- events and failure ----------------------------------------------------------
    def _emit(self, kind: str, **details: Any) -> None:
        log.info(kind, url=self.url, session=self.session_id, **details)
        if self._on_event is not None:
            try:
                self._on_event(kind, details)
            except Exception:  # a user callback must not take the connection down
                log.exception("on_event callback failed", event=kind)

    @property
    def broken(self) -> HipError | None:
        """Why the session can no longer be used, if it can't."""
        return self._broken

    def _wake(self, pending: Pending) -> None:
        """Wake whoever waits for ``pending`` (the I/O layer's way)."""
        raise NotImplementedError

    def _lose(self, error: HipError) -> None:
        if self._broken is None:
            self._broken = error
            if isinstance(error, SessionLostError):
                self._emit("session_lost", error=error.message)
        self._fail_all(error)

    def _fail_all(self, error: HipError) -> None:
        self._broken = self._broken or error
        pending_list = list(self._pending.values())
        self._pending.clear()
        for pending in pending_list:
            pending.error = pending.error or error
            pending.finished = True
            self._wake(pending)

    def begin_close(self) -> None:
        """The session is ending on purpose: a link that drops from now on (the worker
        closes it after GOODBYE) is not a reason to reconnect."""
        self._closing = True

    def _accept_handshake(self, reply: dict[str, Any]) -> None:
        self.session_id = str(reply.get("session_id", ""))
        self._resume_token = str(reply.get("resume_token", ""))
        self.chunk_bytes = int(reply.get("chunk_bytes", self.chunk_bytes))
        protocol = reply.get("protocol", 0)
        self._batches = (
            self.options.batch_posts
            and isinstance(protocol, int)
            and protocol & 0xFF >= _BATCHES_SINCE_MINOR
        )

    # --- batches of launches and copies (call under the send lock) --------------------
    def _batch_item(self, opcode: int, args: Any, data: memoryview) -> BatchItem | None:
        """How a fire-and-forget request joins a batch: (what its batch shares, its
        launch buffer or copied bytes, its copy's destination); None when it goes as
        a frame of its own (another kind of request, a large copy, no 1.1 worker)."""
        if not self._batches or type(args) is not dict:
            return None
        if opcode == Opcode.LAUNCH_KERNEL and type(args.get(_LAUNCH_ARGS)) is bytes:
            return launch_key(args), args[_LAUNCH_ARGS], None
        if (
            opcode == Opcode.MEMCPY_HTOD
            and 0 < data.nbytes <= BATCH_COPY_BYTES
            and args.get("size") == data.nbytes
            and type(args.get("dst")) is int
        ):
            # The bytes are taken now: the caller may reuse its buffer at once.
            return ("copy", args.get("stream")), bytes(data), args["dst"]
        return None

    def _open_batch(self, opcode: int, args: dict[str, Any], item: BatchItem) -> None:
        """Start a batch with this request: its request id is taken now, so that ids
        follow wire order (nothing else is written before the batch closes)."""
        key, piece, dst = item
        if opcode == Opcode.LAUNCH_KERNEL:
            items = [piece]
            wire = {**args, _BATCH_ARGS: items}
            sent = self._track(Opcode.LAUNCH_KERNELS, Flags.NO_REPLY, wire, _NO_BYTES, None, None)
            self._batch = _OpenBatch(key, sent, items, [], len(piece))
            return
        wire = {"stream": args.get("stream")}
        sent = self._track(Opcode.MEMCPY_HTOD_MANY, Flags.NO_REPLY, wire, _NO_BYTES, None, None)
        sent.extra = len(piece)
        self._unacked_bytes += len(piece)
        assert dst is not None
        self._batch = _OpenBatch(key, sent, [piece], [dst], len(piece))

    def _add_to_batch(self, item: BatchItem) -> bool:
        """Put a request in the open batch when it shares the batch's configuration or
        stream and there is room: True. False: the caller writes the open batch
        (:meth:`_close_batch`) and opens another (:meth:`_open_batch`)."""
        key, piece, dst = item
        batch = self._batch
        if (
            batch is None
            or len(batch.items) >= BATCH_ITEMS
            or batch.nbytes + len(piece) > BATCH_BYTES
            or (batch.key is not key and batch.key != key)  # a plan's key is one object
        ):
            return False
        batch.items.append(piece)
        batch.nbytes += len(piece)
        if dst is not None:
            batch.dsts.append(dst)
        # Its bytes, and a CBOR head or two (a launch buffer's, a copy's two integers).
        grown = len(piece) + 12
        batch.sent.extra += grown
        self._unacked_bytes += grown
        return True

    def _batch_filled(self, item: BatchItem) -> bool:
        """After :meth:`_add_to_batch` refused ``item``: True when the open batch has its
        configuration (so it was refused for want of room) and must be sent at once;
        False when ``item`` starts another configuration, and the closed batch may wait
        in the outbox for the next write (alternating kernels then share one write)."""
        return self._batch is not None and self._batch.key == item[0]

    def _close_batch(self) -> Sent | None:
        """The open batch, closed to further items, for the I/O layer to write; a batch
        of one goes as LAUNCH_KERNEL or MEMCPY_HTOD, the frames the worker answers alone."""
        batch, self._batch = self._batch, None
        if batch is None:
            return None
        sent = batch.sent
        items = batch.items
        if sent.opcode == Opcode.LAUNCH_KERNELS:
            if len(items) == 1:
                sent.opcode = Opcode.LAUNCH_KERNEL
                sent.args = {**sent.args, _LAUNCH_ARGS: items[0]}
            return sent
        stream = sent.args["stream"]
        if len(items) == 1:
            sent.opcode = Opcode.MEMCPY_HTOD
            sent.args = {"dst": batch.dsts[0], "size": len(items[0]), "stream": stream}
            sent.data = memoryview(items[0])
        else:
            sent.args = {"dst": batch.dsts, "size": [len(i) for i in items], "stream": stream}
            sent.data = memoryview(b"".join(items))
        # The bytes are counted in data now, no longer as extra.
        self._unacked_bytes -= sent.extra
        sent.extra = 0
        self._unacked_bytes += sent.data.nbytes
        return sent

    def _drop_batch(self) -> None:
        """A new link: the open batch is in the resend buffer and goes from there."""
        self._close_batch()

    def _resume_args(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "resume_token": self._resume_token}

    # --- reconnection schedule (shared by both I/O layers) --------------------------
    def _attempts(self) -> Iterator[tuple[int, float]]:
        """Reconnection attempts: (number, seconds this attempt may take), until
        ``reconnect_attempts`` or ``reconnect_timeout`` run out; emits ``reconnecting``
        before each. After a failed one, wait :meth:`_backoff` seconds."""
        options = self.options
        self._retry_deadline = time.monotonic() + options.reconnect_timeout
        self._retry_delay = options.reconnect_delay
        for attempt in range(1, options.reconnect_attempts + 1):
            remaining = self._retry_deadline - time.monotonic()
            if remaining <= 0:
                return
            self._emit("reconnecting", attempt=attempt)
            yield attempt, min(remaining, options.connect_timeout)
            self._retry_delay = min(self._retry_delay * 2, options.reconnect_max_delay)

    def _backoff(self) -> float:
        """Seconds to wait after a failed attempt: the delay so far (doubling), never past
        the deadline, with full jitter so that clients cut off together don't come back
        in lockstep."""
        left = max(0.0, self._retry_deadline - time.monotonic())
        return min(self._retry_delay, left) * random.uniform(0.5, 1.0)

    def _cannot_resume(self, exc: HipError) -> None:
        """The worker refused the RESUME for good (session gone, token, version)."""
        self._lose(SessionLostError(message=f"session {self.session_id} cannot resume: {exc}"))

    def _gave_up(self, last_error: BaseException | None) -> None:
        """Every reconnection attempt failed: the session is lost."""
        options = self.options
        self._lose(
            SessionLostError(
                message=f"lost the link to {self.url} and could not reconnect within "
                f"{options.reconnect_attempts} attempts / {options.reconnect_timeout:g} s "
                f"(last error: {describe(last_error)}); the session and its handles are gone"
            )
        )

    # --- requests --------------------------------------------------------------------
    def _track(
        self,
        opcode: int,
        flags: Flags,
        args: Any,
        data: memoryview,
        pending: Pending | None,
        progress: Progress | None,
    ) -> Sent:
        """Give the request the next id and keep it for resending (call under the send
        lock, so that ids follow wire order)."""
        request_id = self._next_id
        self._next_id = 1 if request_id >= MAX_REQUEST_ID else request_id + 1
        if pending is not None:
            self._pending[request_id] = pending
        sent = Sent(request_id, opcode, flags, args, data, progress)
        self._unacked[request_id] = sent
        self._unacked_bytes += sent.nbytes
        return sent

    def _forget_sent(self, request_id: int) -> None:
        sent = self._unacked.pop(request_id, None)
        if sent is not None:
            self._unacked_bytes -= sent.nbytes

    def _abandon(self, request_id: int) -> None:
        """The caller stopped waiting (timeout): drop its reply when it comes, and keep
        a private copy of the bytes a resend may still need (the caller has its buffer
        back now)."""
        self._pending.pop(request_id, None)
        sent = self._unacked.get(request_id)
        if sent is not None and sent.data.nbytes:
            sent.data = memoryview(bytes(sent.data))

    def _frames(self, sent: Sent) -> Iterator[tuple[list[Part], int]]:
        """The request's frames: (buffers of one frame, bulk bytes sent once it is out).
        Large requests continue in DATA frames of at most ``chunk_bytes``."""
        chunk = self.chunk_bytes
        data = sent.data
        first, rest = data[:chunk], data[chunk:]
        head_flags = sent.flags | (Flags.MORE if rest.nbytes else Flags.NONE)
        yield (
            encode_frame_parts(sent.opcode, sent.request_id, head_flags, sent.args, first),
            (first.nbytes),
        )
        offset = 0
        while offset < rest.nbytes:
            piece = rest[offset : offset + chunk]
            offset += piece.nbytes
            more = Flags.MORE if offset < rest.nbytes else Flags.NONE
            yield (
                encode_frame_parts(Opcode.DATA, sent.request_id, more, None, piece),
                first.nbytes + offset,
            )

    @staticmethod
    def _is_small(sent: Sent, chunk_bytes: int) -> bool:
        return sent.data.nbytes < min(SMALL_REQUEST, chunk_bytes)

    def _to_resend(self, last_executed: int) -> list[Sent]:
        """What to send again after RESUME, in order: everything the worker may not have
        run (fire-and-forget requests up to ``last_executed`` ran)."""
        again = []
        for request_id, sent in list(self._unacked.items()):
            if request_id <= last_executed and Flags.NO_REPLY in sent.flags:
                self._forget_sent(request_id)
                continue
            pending = self._pending.get(request_id)
            if pending is not None:
                pending.bulk = None
                if pending.sink is not None:
                    pending.sink.reset()
            again.append(sent)
        return again

    # --- replies ---------------------------------------------------------------------
    def _deliver(self, frame: Frame) -> None:
        """Apply a reply frame (request id != 0) to its request; wakes its waiter when
        the reply is complete."""
        header = frame.header
        # Plain int tests: IntFlag operators cost more than the rest of a test, and this
        # runs for every reply.
        flags = int(header.flags)
        request_id = header.request_id
        final = not flags & _MORE
        if final and header.opcode != Opcode.PING:
            # Requests run in order: an answer to this one proves all earlier ones ran.
            unacked = self._unacked
            while unacked:
                first = next(iter(unacked))
                if first > request_id:
                    break
                self._forget_sent(first)
        pending = self._pending.get(request_id)
        if pending is None:
            return  # the caller timed out and left; the reply is dropped
        if frame.error is not None:
            pending.error = frame.error
        elif flags & _ERROR:
            pending.error = HipError.from_wire(frame.args)
        else:
            if frame.bulk.nbytes:
                if pending.sink is not None:
                    try:
                        pending.sink.write(frame.bulk)
                    except HipError as exc:
                        pending.error = exc
                else:
                    if pending.bulk is None:
                        pending.bulk = bytearray()
                    pending.bulk += frame.bulk
            if not final:
                return
            pending.result = frame.args
        if not final:
            return
        del self._pending[request_id]
        pending.finished = True
        self._wake(pending)

    def _from_worker(self, frame: Frame) -> bool:
        """Handle a worker-initiated frame (request id 0); True when it is a heartbeat
        the I/O layer must answer with a PING reply."""
        if frame.opcode == Opcode.PING and Flags.REPLY not in frame.flags:
            return True
        if frame.opcode == Opcode.GOODBYE:
            reason = frame.args.get("reason", "") if isinstance(frame.args, dict) else ""
            self._lose(SessionLostError(message=f"the worker ended the session: {reason}"))
        elif Flags.ERROR in frame.flags:
            error = HipError.from_wire(frame.args)
            self._lose(
                error
                if isinstance(error, SessionLostError)
                else SessionLostError(message=f"the worker closed the session: {error}")
            )
        return False

    @staticmethod
    def _result(pending: Pending) -> tuple[Any, bytes]:
        if pending.error is not None:
            raise pending.error
        return pending.result, bytes(pending.bulk) if pending.bulk else b""


_NO_BYTES = memoryview(b"")
_MORE = int(Flags.MORE)
_ERROR = int(Flags.ERROR)


#: The keys of a launch (hipr.protocol.messages): its argument buffer, a batch's buffers,
#: and what the launches of one LAUNCH_KERNELS share (LaunchConfig's keys and the stream).
_LAUNCH_ARGS = LaunchKernel.args
_BATCH_ARGS = LaunchKernels.args
_FUNCTION = LaunchConfig.function
_GRID = LaunchConfig.grid
_BLOCK = LaunchConfig.block
_SHARED_MEM = LaunchConfig.shared_mem
_PTRS = LaunchConfig.ptrs
_STREAM = LaunchKernel.stream


def launch_key(wire: dict[str, Any]) -> tuple[Any, ...]:
    """What the launches of one LAUNCH_KERNELS share (compared, never hashed: the lists
    stay lists): the values of LaunchConfig's keys and the stream."""
    return (
        "launch",
        wire.get(_FUNCTION),
        wire.get(_GRID),
        wire.get(_BLOCK),
        wire.get(_SHARED_MEM),
        wire.get(_STREAM),
        wire.get(_PTRS),
    )
