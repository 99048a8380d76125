"""Reading a worker connection: frames decoded off the link and queued for its executor.

Under asyncio/uvloop a plain socket is served in push mode: the loop's transport hands
the bytes to :meth:`LinkReader.on_data` in its I/O callback, requests are decoded there
and queued (or answered there, ``RequestExecutor.answer_now``), and a large payload
is received straight into a buffer of its own. Elsewhere (trio, TLS) a reader task
pulls from the stream (:meth:`LinkReader.pull`). Either way heartbeats are answered at
once, out of order, and reading stops while the read-ahead or the tenant's in-flight
bytes are spent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from hipr.errors import ProtocolError
from hipr.observability.observer import WorkerObserver
from hipr.protocol.codec import ARGS_LENGTH, Frame, FrameDecoder
from hipr.protocol.header import HEADER_SIZE, Flags, Header
from hipr.protocol.opcodes import Opcode
from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.state import Session
from hipr.transports.base import PushDelivery, TransportAttribute, stream_capability
from hipr.worker.fairness import PUMP_FRAMES, PUMP_SECONDS, READER_FRAMES, TurnMember, frame_charge
from hipr.worker.frame_queue import READ_AHEAD_BYTES, FrameQueue
from hipr.worker.link_writer import LinkWriter
from hipr.worker.payloads import PayloadBuffers, Placements
from hipr.worker.slow_links import HEADER_UNDER_WAY

__all__ = ["RECEIVE_INTO_BYTES", "LinkReader", "count_protocol_error"]

#: Payloads at least this large are received straight into their own buffer (push mode).
RECEIVE_INTO_BYTES = 256 << 10
#: A frame's header and its arguments' length prefix: all of a DATA frame before its bulk.
_HEAD_BYTES = HEADER_SIZE + ARGS_LENGTH.size
_MORE = int(Flags.MORE)
_DATA = int(Opcode.DATA)


class _Observed(Protocol):
    """What the reader reads of the worker."""

    observer: WorkerObserver
    busy_poll: BusyPoll


class Executor(Protocol):
    """What the push reader asks of the connection's executor
    (``hipr.worker.request_executor`` implements it; the reader never imports it)."""

    def answer_now(self, frame: Frame) -> bool:
        """Run ``frame`` here in the I/O callback if it can be; False to queue it."""
        ...

    def answer_express(self, data: bytes) -> bool:
        """Answer a read that is one whole express request (``hipr.worker.express``)
        here; False, taking nothing, when the bytes must be decoded as usual."""
        ...


def count_protocol_error(observer: WorkerObserver, peer: str, exc: ProtocolError) -> None:
    """Count a protocol error, and a frame refused by a limit (``details["refused"]``:
    its size, or its CBOR's items or depth) by the peer that sent it."""
    observer.protocol_error(exc.kind)
    refused = exc.details.get("refused")
    if refused:
        observer.refused(str(refused), peer)


class LinkReader:
    """The reading side of one connection (module doc)."""

    def __init__(
        self,
        worker: _Observed,
        stream: anyio.abc.ByteStream,
        peer: str,
        decoder: FrameDecoder,
        frames: FrameQueue,
        writer: LinkWriter,
        payload_buffers: PayloadBuffers,
        log: Any,
    ) -> None:
        self.worker = worker
        self.stream = stream
        self.peer = peer
        self.decoder = decoder
        self.frames = frames
        self.writer = writer
        self.log = log
        #: Set by :meth:`serve` once the handshake is over.
        self.session: Session | None = None
        self.turns: TurnMember | None = None
        self.executor: Executor | None = None
        #: When bytes last arrived (the heartbeat's silence).
        self.last_received = time.monotonic()
        #: Push mode (asyncio): the stream's delivery hands bytes to :meth:`on_data`.
        self.push: PushDelivery | None = None
        #: Push mode: a decoded frame waiting for read-ahead or in-flight room.
        self.held_frame: Frame | None = None
        #: Push mode: the protocol error that ended reading, for the connection to send.
        self.protocol_error: ProtocolError | None = None
        #: Push mode: a large frame whose payload the loop receives straight into
        #: ``_payload`` (see :meth:`_receive_payload_into`), and how much has arrived.
        self._payload_header: Header | None = None
        self._payload: memoryview | None = None
        self._payload_filled = 0
        self._payload_placed = False
        #: Push mode: a large payload just arrived and more bulk follows (its frame had
        #: MORE): the next read takes only the next frame's head (:meth:`_payload_target`).
        self._head_next = False
        #: Push mode: the read under way is that head's, into ``_head``.
        self._reading_head = False
        self._head = memoryview(bytearray(_HEAD_BYTES))
        self.payload_buffers = payload_buffers
        #: Push mode: where a streamed upload's DATA payloads land (RequestLink.placing).
        self.placements = Placements()
        #: Push mode: the rest of a read is decoded in the loop's next pass (a slice ran out).
        self._pump_later = False

    def serve(
        self,
        session: Session,
        turns: TurnMember,
        executor: Executor,
        log: Any,
    ) -> None:
        """The handshake is over: frames from now on go to ``executor``'s queue."""
        self.log = log
        self.session = session
        self.turns = turns
        self.executor = executor

    def frame_under_way(self) -> tuple[object | None, int]:
        """The frame being received and its payload length, for the frame clock; None
        while the executor has work queued (reading may be held back by the worker
        itself then) or no frame is under way."""
        if not self.frames.executor_waiting:
            return None, 0
        header = self._payload_header or self.decoder.partial_header()
        if header is not None:
            return header, header.payload_length
        return (HEADER_UNDER_WAY if self.decoder.buffered else None), 0

    def _protocol_failed(self, exc: ProtocolError) -> None:
        self.log.warning("protocol error", error=str(exc))
        count_protocol_error(self.worker.observer, self.peer, exc)
        self.protocol_error = exc
        self.end_push()

    # --- pull mode: a reader task (trio, TLS) --------------------------------------
    async def _read_frames(self, on_frame: Callable[[Frame], Awaitable[None]]) -> None:
        """Read until end of stream, handing each frame to ``on_frame``."""
        decoder = self.decoder
        while True:
            # Frames may already be buffered behind the handshake: hand them over first.
            for frame in decoder.frames():
                await on_frame(frame)
            try:
                data = await self.stream.receive(decoder.receive_size())
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            self.last_received = time.monotonic()
            self.worker.busy_poll.note_activity()
            decoder.feed(data)

    async def pull(self) -> None:
        """The reader task: queue frames for the executor until the stream ends."""
        session, turns, frames = self.session, self.turns, self.frames
        assert session is not None and turns is not None
        handed = 0

        async def on_frame(frame: Frame) -> None:
            nonlocal handed
            handed += 1
            if not turns.heavy:
                turns.scheduler.light_at = self.last_received
            if handed >= READER_FRAMES:
                # A read of many small frames: let other connections in (fair service).
                handed = 0
                await anyio.lowlevel.checkpoint()
            if frame.opcode == Opcode.PING and not frame.flags & Flags.MORE:
                # Answered at once, out of order: a heartbeat must not wait for the GPU.
                if not frame.flags & (Flags.REPLY | Flags.NO_REPLY):
                    await self.writer.send(Opcode.PING, frame.request_id, Flags.REPLY, {})
                return
            while frames.inflight > READ_AHEAD_BYTES:
                await frames.drained.wait()
            size = frame_charge(frame.header.payload_length)
            await session.gate.hold_inflight(size, frames.inflight)
            frames.inflight += size
            # No event-loop pass per frame: the queue is bounded in bytes, not frames.
            frames.put(frame)

        try:
            await self._read_frames(on_frame)
        except ProtocolError as exc:
            self.log.warning("protocol error", error=str(exc))
            count_protocol_error(self.worker.observer, self.peer, exc)
            await self.writer.try_send_error(0, 0, exc)
        finally:
            frames.close()

    # --- push mode: requests decoded in the loop's I/O callback (asyncio) ------------
    def start_push(self) -> bool:
        """Under asyncio, on a plain socket: let the stream's delivery hand arriving
        bytes straight to the decoder, in place of a reader task that the loop would
        wake for every request (one event-loop pass and its bookkeeping, about a tenth
        of a null request's round trip). False elsewhere (trio, TLS): run :meth:`pull`."""
        push = stream_capability(self.stream, TransportAttribute.push_delivery)
        if push is None:
            return False
        self.push = self.writer.push = push
        self.pump()  # frames already decoded behind the handshake go first
        push.deliver_to(self.on_data, self.end_push, self._payload_target, self._payload_filled_by)
        return True

    def end_push(self) -> None:
        """Push mode's end of input (end of stream, a broken link, a protocol error or
        a drain): no more requests; the executor finishes those queued."""
        if self.push is not None:
            self.frames.close()

    def _receive_payload_into(self) -> None:
        """A large frame under way in the decoder: take it over, so that the rest of its
        payload is received straight into a buffer of its own (one copy, from the
        kernel) instead of piece by piece and joined (benchmarks/README.md, "Worker").
        The buffers are anonymous mappings reused while the upload runs
        (``hipr.worker.payloads``): fresh pages are committed only as bytes fill them,
        so a client that announces a large frame (within ``max_frame_bytes``) and sends
        nothing costs address space, not memory."""
        decoder = self.decoder
        header = decoder.partial_header()
        if header is None or header.payload_length < RECEIVE_INTO_BYTES or self.frames.closed:
            return
        header, head = decoder.take_partial()
        self._payload_header = header
        placed = self.placements.target(header, head)
        if placed is not None:
            # The bulk goes straight to its destination; the empty arguments' length
            # prefix, already in ``head``, is not kept.
            self._payload = placed
            self._payload_filled = len(head) - ARGS_LENGTH.size
            self._payload_placed = True
            return
        buffer = self.payload_buffers.take(header.payload_length)
        buffer[: len(head)] = head
        self._payload = buffer
        self._payload_filled = len(head)

    def _payload_target(self) -> memoryview | None:
        if self._payload is None:
            if self._head_next and not self.decoder.buffered:
                # The next DATA frame of an upload: read its head alone, so that its
                # bulk lands in a payload buffer of its own from the first byte. Read
                # into the scratch buffer with it, the bulk's first 256 KiB were copied
                # four times over (into bytes, the decoder, its hand-over and the
                # payload buffer): a sixteenth of every 4 MiB chunk, and as many
                # percent of an upload's speed against the socket's.
                self._reading_head = True
                return self._head
            return None
        return self._payload[self._payload_filled :]

    def _payload_filled_by(self, nbytes: int) -> None:
        if self._reading_head:
            self._reading_head = self._head_next = False
            self.on_data(self._head[:nbytes].tobytes())
            return
        self.last_received = time.monotonic()
        self._payload_filled += nbytes
        payload = self._payload
        assert payload is not None and self._payload_header is not None
        if self._payload_filled < payload.nbytes:
            return
        header = self._payload_header
        try:
            frame = (
                Frame(header, None, payload)
                if self._payload_placed
                else self.decoder.decode_payload(header, payload)
            )
        except ProtocolError as exc:  # over the CBOR limits: refused, the link ends
            self._payload = self._payload_header = None
            self._protocol_failed(exc)
            return
        self._payload = self._payload_header = None
        self._payload_filled = 0
        self._payload_placed = False
        if header.opcode == _DATA or int(header.flags) & _MORE:
            self.placements.note(frame)
            self._head_next = bool(int(header.flags) & _MORE)
        if self.frames.closed:
            return
        self.held_frame = frame  # taken first by the pump, in order
        self.pump()

    def on_data(self, data: bytes) -> None:
        """Push mode: bytes arrived (the loop's I/O callback)."""
        if self.frames.closed:
            return
        now = self.last_received = time.monotonic()
        self._head_next = False  # a read into the scratch buffer: that chance passed
        turns = self.turns
        assert turns is not None
        if not turns.heavy:
            turns.scheduler.light_at = now  # heavy connections share the loop now
        executor = self.executor
        if executor is not None:
            try:
                answered = executor.answer_express(data)
            except Exception:  # a bug here must end this connection, not the loop's callback
                self.log.exception("the express path failed")
                self.end_push()
                return
            if answered:
                self.worker.busy_poll.note_activity()
                return
        self.decoder.feed(data)
        self.pump()
        # After the requests are taken (or answered here): the spinner's start is not
        # paid before them.
        self.worker.busy_poll.note_activity()

    def pump(self) -> None:
        """Queue the decoded requests for the executor, answering heartbeats at once
        (and a lone request, where its handler can, ``RequestExecutor.answer_now``),
        as far as the read-ahead bound and the tenant's in-flight bytes allow; at the
        first frame that must wait, reading pauses until the executor makes room."""
        session = self.session
        push = self.push
        executor = self.executor
        frames = self.frames
        decoder = self.decoder
        assert session is not None and executor is not None
        # Frames taken in this pass of the loop, and since when (fair service: a read
        # of thousands of small frames is taken a slice per pass).
        taken = 0
        started = 0.0
        try:
            while not frames.closed:
                frame = self.held_frame
                if frame is None:
                    taken += 1
                    if taken > 1:
                        if taken == 2:
                            started = time.perf_counter()
                        elif taken > PUMP_FRAMES or time.perf_counter() - started >= PUMP_SECONDS:
                            self._pump_next_pass()
                            return
                    frame = decoder.next_frame()
                    if frame is None:
                        break
                    header = frame.header
                    # Plain ints: an IntFlag test costs more than the rest of this line.
                    if header.opcode == _DATA or int(header.flags) & _MORE:
                        self.placements.note(frame)
                else:
                    self.held_frame = None
                writable = push is None or push.writable_now
                if not writable and frames.queued:
                    # Replies wait unread by the peer: read nothing more from it until it
                    # reads (the executor's next send waits for that, then pumps again).
                    self.held_frame = frame
                    if push is not None:
                        push.pause_reading(True)
                    return
                if frame.opcode == Opcode.PING and not frame.flags & Flags.MORE:
                    if writable or frame.flags & (Flags.REPLY | Flags.NO_REPLY):
                        self.writer.pong(frame)
                        continue
                    # Its answer would wait unsent: the executor answers it, in order, as
                    # its send allows (a peer that never reads cannot pile up answers).
                elif executor.answer_now(frame):
                    continue
                size = frame_charge(frame.header.payload_length)
                if frames.inflight > READ_AHEAD_BYTES or not session.gate.try_hold_inflight(
                    size, frames.inflight
                ):
                    self.held_frame = frame
                    if push is not None:
                        push.pause_reading(True)
                    return
                frames.inflight += size
                frames.put(frame)
        except ProtocolError as exc:
            self._protocol_failed(exc)
            return
        except Exception:  # a bug here must end this connection, not the loop's callback
            self.log.exception("decoding requests failed")
            self.end_push()
            return
        if frames.executor_waiting:
            session.flush_posts()  # a burst answered here, cut by the end of the read
        if push is not None:
            self._receive_payload_into()
            push.pause_reading(False)

    def _pump_next_pass(self) -> None:
        """The pump's slice of this pass is used up: stop reading, and take the rest of
        what was read in the loop's next pass, after the other connections' turns."""
        push = self.push
        assert push is not None and self.session is not None
        push.pause_reading(True)
        if self.frames.executor_waiting:
            self.session.flush_posts()  # what was answered here starts meanwhile
        if not self._pump_later:
            self._pump_later = True
            asyncio.get_running_loop().call_soon(self._pump_rest)

    def _pump_rest(self) -> None:
        self._pump_later = False
        if not self.frames.closed:
            self.pump()
