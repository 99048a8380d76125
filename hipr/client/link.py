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
import enum
import random
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from hipr.client.handshake import (
    Handshake,
    HandshakeReader,
    check_first_bytes,
    handshake_reply,
)
from hipr.client.options import (
    _BATCHES_SINCE_MINOR,
    BATCH_BYTES,
    BATCH_COPY_BYTES,
    BATCH_ITEMS,
    LinkOptions,
)
from hipr.client.requests import (
    Buffer,
    DirectSink,
    EventCallback,
    LaunchPlan,
    Part,
    Pending,
    Progress,
    ReplySink,
    RequestLink,
    Sent,
    byte_view,
    describe,
)
from hipr.errors import (
    AuthError,
    HipError,
    HipTimeoutError,
    SessionLostError,
    VersionMismatchError,
)
from hipr.protocol.codec import Frame, encode_frame, encode_frame_parts
from hipr.protocol.header import MAX_REQUEST_ID, Flags
from hipr.protocol.messages import LaunchConfig, LaunchKernel, LaunchKernels
from hipr.protocol.opcodes import Opcode, opcode_name

__all__ = [  # what the I/O layers, the API and older imports find here
    "BATCH_BYTES",
    "BATCH_COPY_BYTES",
    "BATCH_ITEMS",
    "DEADLINE",
    "PING_FRAME",
    "PONG_FRAME",
    "Beat",
    "Buffer",
    "DirectSink",
    "EventCallback",
    "Handshake",
    "HandshakeReader",
    "LaunchPlan",
    "LinkOptions",
    "LinkState",
    "Part",
    "Pending",
    "Progress",
    "ReplySink",
    "RequestLink",
    "Sent",
    "byte_view",
    "check_first_bytes",
    "describe",
    "handshake_reply",
    "launch_key",
]

log = structlog.get_logger("hipr.client")

#: The absolute deadline (time.monotonic) of the public call under way in this context:
#: ``timeout=`` on a sync API call sets it; every blocking request of the call obeys it.
DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "hipr_deadline", default=None
)
#: A request whose frames all fit in one write of at most this many bytes is batched.
SMALL_REQUEST = 4096


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


class Beat(enum.Enum):
    """What a link's heartbeat check (:meth:`LinkState._beat`) asks of its I/O layer."""

    #: Nothing to do.
    QUIET = 0
    #: Write :data:`PING_FRAME`.
    PING = 1
    #: Nothing heard for ``heartbeat_timeout``: take the link for dead and resume.
    DEAD = 2


#: A heartbeat: a PING outside the request sequence that the worker answers at once,
#: ahead of its queue, so that the client hears from a live link however busy it is.
PING_FRAME = encode_frame(Opcode.PING, 0)
#: The answer to the worker's own heartbeat.
PONG_FRAME = encode_frame(Opcode.PING, 0, Flags.REPLY)


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
        #: Small frames written but not yet sent: they leave together in one write.
        self._outbox: list[Part] = []
        self._outbox_bytes = 0
        #: A link is installed: frames can be written (else the resend carries them).
        self._link_open = False
        self._last_ping = 0.0
        self._last_attempt_error: BaseException | None = None

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

    def _link_installed(self) -> None:
        """A new link is up (after HELLO or RESUME): what was batched for the old one is
        in the resend buffer already, and silence counts from now."""
        self._last_received = self._last_ping = time.monotonic()
        self._outbox, self._outbox_bytes = [], 0
        self._drop_batch()
        self._link_open = True

    def _link_closed(self) -> None:
        """The link is gone: frames written from now on wait for the resend, which
        carries the unsent ones too."""
        self._link_open = False
        self._outbox, self._outbox_bytes = [], 0

    # --- heartbeats (one rule for both I/O layers) --------------------------------------
    def _beat(self, now: float, listening_since: float | None) -> Beat:
        """The heartbeat decision. A PING (answered at once by the worker, see
        :data:`PING_FRAME`) is due when nothing was heard for ``heartbeat_interval`` and
        none was sent for as long; the link is dead when nothing was heard for
        ``heartbeat_timeout`` while someone listened (``listening_since``: when the
        caller began to read; None for a caller that only polls now and then and so
        cannot judge silence: the sync client's keep-alive thread, an upload)."""
        heard = self._last_received
        if listening_since is not None:
            heard = max(heard, listening_since)
            if now - heard >= self.options.heartbeat_timeout:
                return Beat.DEAD
        if now - max(heard, self._last_ping) >= self.options.heartbeat_interval:
            self._last_ping = now
            return Beat.PING
        return Beat.QUIET

    def _tick_period(self) -> float:
        """How often the I/O layer checks :meth:`_beat` (and flushes) while idle: often
        enough that neither deadline is overrun by more than a quarter."""
        options = self.options
        return max(0.01, min(options.heartbeat_interval, options.heartbeat_timeout) / 4)

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

    def _handshake_reader(self, opcode: Opcode, args: dict[str, Any]) -> HandshakeReader:
        return HandshakeReader(self.url, opcode, args, self._max_payload)

    def _hello(self, args: dict[str, Any]) -> HandshakeReader:
        """The first handshake of the session."""
        return self._handshake_reader(Opcode.HELLO, args)

    def _resume(self) -> HandshakeReader:
        """The handshake of a reconnection: RESUME with the session's secret."""
        return self._handshake_reader(Opcode.RESUME, self._resume_args())

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

    def _attempt_failed(self, exc: BaseException) -> bool:
        """A reconnection attempt failed with ``exc``: True to back off (:meth:`_backoff`)
        and try again; False when the worker refused the RESUME for good (session gone,
        token, version), and the session is lost now."""
        if isinstance(exc, SessionLostError | AuthError | VersionMismatchError):
            self._lose(SessionLostError(message=f"session {self.session_id} cannot resume: {exc}"))
            return False
        self._last_attempt_error = exc
        return True

    def _resumed(self, reply: dict[str, Any]) -> list[Sent]:
        """The worker took the RESUME (the new link is installed): what to send again."""
        self._last_attempt_error = None
        return self._to_resend(int(reply.get("last_executed_id", 0)))

    def _gave_up(self) -> None:
        """Every reconnection attempt failed: the session is lost."""
        options = self.options
        last_error = self._last_attempt_error
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

    def _deadline(self, timeout: float | None) -> float | None:
        """The absolute deadline (``time.monotonic``) of a request: its own ``timeout``,
        and the public call's (:data:`DEADLINE`), whichever comes first."""
        deadline = DEADLINE.get()
        if timeout is not None:
            mine = time.monotonic() + timeout
            deadline = mine if deadline is None else min(deadline, mine)
        return deadline

    def _timed_out(self, request_id: int, opcode: int, timeout: float | None) -> HipTimeoutError:
        """The request got no reply in time: its reply is dropped when it comes."""
        self._abandon(request_id)
        shown = timeout if timeout is not None else "the call's timeout"
        return HipTimeoutError(message=f"{opcode_name(opcode)} got no reply within {shown} s")

    def _stopped_waiting(self, request_id: int, pending: Pending) -> None:
        """The caller left before the reply (cancelled, interrupted)."""
        if request_id and not pending.finished:
            self._abandon(request_id)

    # --- fire-and-forget requests --------------------------------------------------------
    def _post_writes(self, opcode: int, args: Any, data: Buffer) -> Iterable[Part] | None:
        """A fire-and-forget request (under the send lock): None when it joined the open
        batch (nothing to write); else the writes that close that batch and open a new
        one with it, or that put it in the outbox as a frame of its own, its bytes
        copied so that the caller may reuse its buffer at once. After writes, the
        caller checks :meth:`_needs_barrier` (so the resend buffer may pass its bound by
        one batch at most) and arms a delayed flush (:meth:`_flush_due`)."""
        view = byte_view(data)
        item = self._batch_item(opcode, args, view)
        if item is not None:
            if self._add_to_batch(item):
                return None
            return self._new_batch_writes(opcode, args, item)
        if view.nbytes:
            view = memoryview(bytes(view))
        return self._submit_writes(self._track(opcode, Flags.NO_REPLY, args, view, None, None))

    def _launch_writes(self, plan: LaunchPlan, data: bytes) -> Iterable[Part] | None:
        """:meth:`_post_writes` of a kernel launch from its plan (``Function._launch_plan``):
        it joins a batch as its argument bytes, with the plan's wire arguments and the
        plan's key (one object, made once for every launch of that configuration)."""
        if self._batches:
            item = (plan.batch_key, data, None)
            if self._add_to_batch(item):
                return None
            return self._new_batch_writes(Opcode.LAUNCH_KERNEL, plan.wire, item)
        wire = {**plan.wire, _LAUNCH_ARGS: data}
        sent = self._track(Opcode.LAUNCH_KERNEL, Flags.NO_REPLY, wire, _NO_BYTES, None, None)
        return self._submit_writes(sent)

    def _needs_barrier(self) -> bool:
        """The resend buffer is over its bound: a BARRIER's reply acknowledges everything
        before it, so the caller sends one and waits."""
        return self._unacked_bytes > self.options.resend_buffer_bytes

    # --- what to write (the I/O layer writes each buffer, in order, under its send lock)
    def _submit_writes(self, sent: Sent, flush: bool = False) -> Iterable[Part]:
        """The writes of a request just tracked: the open batch first (its id is lower),
        then the request, into the outbox (small) or frame by frame (large); then the
        outbox when ``flush`` (a reply is awaited) or when it holds ``coalesce_bytes``.
        Whatever stays in the outbox waits for :meth:`_flush_writes` (see
        :meth:`_flush_due`)."""
        if self._batch is None and self._stage(sent):
            # The common case, without a generator: one small frame, nothing open.
            if flush or self._outbox_bytes >= self.options.coalesce_bytes:
                out = self._take_outbox()
                if out is not None:
                    return (out,)
            return ()
        return self._submit_writes_in_order(sent, flush)

    def _submit_writes_in_order(self, sent: Sent, flush: bool) -> Iterator[Part]:
        batch = self._close_batch()
        if batch is not None and not self._stage(batch):
            yield from self._stream_writes(batch)
        if not self._stage(sent):
            yield from self._stream_writes(sent)
        if flush or self._outbox_bytes >= self.options.coalesce_bytes:
            out = self._take_outbox()
            if out is not None:
                yield out

    def _new_batch_writes(self, opcode: int, args: Any, item: BatchItem) -> Iterator[Part]:
        filled = self._batch_filled(item)
        before = self._close_batch()
        # Its id is taken now, after the closed batch's: ids still follow wire order.
        self._open_batch(opcode, args, item)
        if before is not None and not self._stage(before):
            yield from self._stream_writes(before)
        if filled or self._outbox_bytes >= self.options.coalesce_bytes:
            out = self._take_outbox()
            if out is not None:
                yield out

    def _flush_writes(self) -> Iterator[Part]:
        """Everything written and not yet sent: the open batch, then the outbox."""
        batch = self._close_batch()
        if batch is not None and not self._stage(batch):
            yield from self._stream_writes(batch)
        out = self._take_outbox()
        if out is not None:
            yield out

    def _resend_writes(self, again: list[Sent]) -> Iterator[Part]:
        """The requests of :meth:`_resumed`, written again in order on the new link."""
        for sent in again:
            if not self._stage(sent):
                yield from self._stream_writes(sent)
        out = self._take_outbox()
        if out is not None:
            yield out

    def _flush_due(self) -> bool:
        """Something written waits to be sent: the I/O layer sends it after
        ``coalesce_delay`` unless another write takes it first."""
        return bool(self._outbox) or self._batch is not None

    def _stage(self, sent: Sent) -> bool:
        """Put a small request's frame in the outbox: True. False for a request to send
        frame by frame (:meth:`_stream_writes`)."""
        data = sent.data
        total = data.nbytes
        if total >= SMALL_REQUEST or total >= self.chunk_bytes:
            return False
        if self._link_open:
            parts = encode_frame_parts(sent.opcode, sent.request_id, sent.flags, sent.args, data)
            for part in parts:
                self._outbox.append(part)
                self._outbox_bytes += len(part)
        if sent.progress is not None:
            sent.progress(total, total)
        return True

    def _take_outbox(self) -> Part | None:
        """The outbox as one buffer to send, emptied; None when empty."""
        batch = self._outbox
        if not batch:
            return None
        self._outbox, self._outbox_bytes = [], 0
        return b"".join(batch) if len(batch) > 1 else batch[0]

    def _stream_writes(self, sent: Sent) -> Iterator[Part]:
        """A large request's writes: the outbox before it, then its frames from the
        caller's buffer (no copy), progress reported as chunks go, and a heartbeat
        slipped between chunks when one is due: a long upload holds the link and hears
        nothing back meanwhile, and the worker answers PINGs ahead of its queue, so a
        live link is never taken for dead mid-copy. Nothing without a link (the resend
        after reconnecting carries the request)."""
        if not self._link_open:
            return
        out = self._take_outbox()
        if out is not None:
            yield out
        total = sent.data.nbytes
        for parts, done in self._frames(sent):
            yield from parts
            if sent.progress is not None:
                sent.progress(done, total)
            if done < total and self._beat(time.monotonic(), None) is Beat.PING:
                yield PING_FRAME

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

    def _from_worker(self, frame: Frame) -> bytes | None:
        """Handle a worker-initiated frame (request id 0); the answer to write, if any
        (:data:`PONG_FRAME` for the worker's heartbeat)."""
        if frame.opcode == Opcode.PING:
            return None if frame.flags & _ANSWERED else PONG_FRAME
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
        return None

    @staticmethod
    def _result(pending: Pending) -> tuple[Any, bytes]:
        if pending.error is not None:
            raise pending.error
        return pending.result, bytes(pending.bulk) if pending.bulk else b""


_NO_BYTES = memoryview(b"")
_MORE = int(Flags.MORE)
_ERROR = int(Flags.ERROR)
_ANSWERED = Flags.REPLY | Flags.NO_REPLY


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
