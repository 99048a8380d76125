"""The worker's side of one connection: handshake, then requests executed in order.

Two tasks per connection. The reader decodes frames and answers PING at once (so a
long GPU call never starves heartbeats); the executor runs requests one by one, in
the order they arrived, as HIP orders a client's calls. A bounded channel between
them bounds the memory one client can make the worker hold.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import structlog

from hipr._version import __version__
from hipr.errors import HipError, HipErrorCode, ProtocolError, VersionMismatchError
from hipr.handlers.args import Args
from hipr.handlers.context import Reply, Request
from hipr.handlers.registry import REGISTRY, HandlerRegistry
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame_parts
from hipr.protocol.header import (
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    Flags,
    version_major,
    version_text,
)
from hipr.protocol.opcodes import Opcode, opcode_name
from hipr.session import Session, as_hip_error

if TYPE_CHECKING:
    from hipr.server import Worker

log = structlog.get_logger("hipr.connection")

RECEIVE_SIZE = 1 << 18
#: Frames read ahead of the executor: overlap for pipelined copies, bounded memory.
READ_AHEAD_FRAMES = 4
#: Requests whose reply never reports a pending fire-and-forget error.
_NOT_SYNCHRONISING = {Opcode.PING, Opcode.GOODBYE}


class _Closing(Exception):
    """The connection must end (after a fatal protocol error or a goodbye)."""


class WorkerConnection:
    """One client connection to the worker."""

    def __init__(
        self,
        worker: Worker,
        stream: anyio.abc.ByteStream,
        peer: str,
        registry: HandlerRegistry = REGISTRY,
    ) -> None:
        self.worker = worker
        self.stream = stream
        self.peer = peer
        self.registry = registry
        self.session: Session | None = None
        self._decoder = FrameDecoder(worker.config.max_frame_bytes)
        self._send_lock = anyio.Lock()
        self._frames_in, self._frames_out = anyio.create_memory_object_stream[Frame](
            READ_AHEAD_FRAMES
        )
        self._log = log.bind(peer=peer)
        #: Request bytes read but not yet taken by the executor (max_inflight_bytes).
        self._inflight = 0

    # --- sending -------------------------------------------------------------------
    async def send(
        self,
        opcode: int,
        request_id: int,
        flags: Flags,
        args: Any = None,
        bulk: bytes | bytearray | memoryview = b"",
    ) -> None:
        """Send one frame; frames from several tasks never interleave."""
        parts = encode_frame_parts(opcode, request_id, flags, args, bulk)
        async with self._send_lock:
            for part in parts:
                await self.stream.send(part)  # type: ignore[arg-type]

    async def send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        """An error reply."""
        await self.send(opcode, request_id, Flags.REPLY | Flags.ERROR, error.to_wire())

    async def send_chunk(self, request_id: int, opcode: int, bulk: memoryview | bytes) -> None:
        """Part of a reply's bulk data (RequestLink)."""
        await self.send(opcode, request_id, Flags.REPLY | Flags.MORE, None, bulk)

    # --- receiving -----------------------------------------------------------------
    async def _read_frames(self, on_frame: Callable[[Frame], Any]) -> None:
        """Read until end of stream, handing each frame to ``on_frame``."""
        while True:
            # Frames may already be buffered behind the handshake: hand them over first.
            for frame in self._decoder.frames():
                await on_frame(frame)
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            self._decoder.feed(data)

    async def receive_data(self, request_id: int) -> tuple[memoryview, bool]:
        """The next continuation chunk of ``request_id`` and whether it is the last."""
        try:
            frame = await self._next_frame()
        except anyio.EndOfStream:
            raise HipError(
                HipErrorCode.hipErrorInvalidValue, "connection closed in the middle of a copy"
            ) from None
        if frame.opcode != Opcode.DATA or frame.request_id != request_id:
            raise _Closing(
                ProtocolError(
                    message=f"expected DATA of request {request_id}, got "
                    f"{opcode_name(frame.opcode)} of request {frame.request_id}"
                )
            )
        return frame.bulk, Flags.MORE not in frame.flags

    # --- lifecycle -----------------------------------------------------------------
    async def run(self) -> None:
        """Serve the connection to its end, then free everything it made."""
        try:
            with anyio.fail_after(self.worker.handshake_timeout):
                hello = await self._receive_first_frame()
            if hello is None:
                return
            self.session = await self._handshake(hello)
            if self.session is None:
                return
            self._log = self._log.bind(session=self.session.id, tenant=self.session.tenant)
            tenant_frame_limit = self.session.gate.quotas.max_frame_bytes
            if tenant_frame_limit is not None:
                self._decoder.max_payload = min(self._decoder.max_payload, tenant_frame_limit)
            self._log.info("session started")
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._reader, tg.cancel_scope)
                await self._executor()
                tg.cancel_scope.cancel()
        except TimeoutError:
            self._log.info("handshake timed out")
        except ProtocolError as exc:
            self._log.warning("protocol error", error=str(exc))
            self.worker.observer.protocol_error(exc.kind)
            await self._try_send_error(0, 0, exc)
        except _Closing as closing:
            error = closing.args[0] if closing.args else None
            if isinstance(error, HipError):
                self._log.warning("closing connection", error=str(error))
                await self._try_send_error(0, 0, error)
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish()

    async def _finish(self) -> None:
        if self.session is not None:
            if self._inflight:
                self.session.gate.release_inflight(self._inflight)
                self._inflight = 0
            try:
                await self.session.close()
            finally:
                self.worker.forget(self.session)
                self._log.info("session ended")
        await self.stream.aclose()

    async def _try_send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        with anyio.move_on_after(2):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await self.send_error(opcode, request_id, error)

    async def _receive_first_frame(self) -> Frame | None:
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            try:
                data = await self.stream.receive(RECEIVE_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return None
            self._decoder.feed(data)

    async def _handshake(self, frame: Frame) -> Session | None:
        if version_major(frame.header.version) != PROTOCOL_MAJOR:
            error = VersionMismatchError(
                message=f"this worker speaks protocol {version_text(PROTOCOL_VERSION)}; the client "
                f"sent {version_text(frame.header.version)}: upgrade the older side"
            )
            self._log.warning("version mismatch", client=version_text(frame.header.version))
            await self._try_send_error(frame.opcode, frame.request_id, error)
            return None
        if frame.opcode != Opcode.HELLO:
            await self._try_send_error(
                frame.opcode,
                frame.request_id,
                ProtocolError(
                    message=f"the first frame must be HELLO, not {opcode_name(frame.opcode)}"
                ),
            )
            return None
        if frame.error is not None:
            await self._try_send_error(frame.opcode, frame.request_id, frame.error)
            return None
        try:
            args = Args(frame.args, "HELLO")
            client = args.text("client", default="unknown", max_length=256)
            session = await self.worker.open_session(args, self.stream, self.peer)
        except HipError as exc:
            self._log.warning("handshake refused", error=str(exc))
            await self._try_send_error(frame.opcode, frame.request_id, exc)
            return None
        reply = {
            "protocol": PROTOCOL_VERSION,
            "worker_version": __version__,
            "backend": self.worker.backend.name,
            "session_id": session.id,
            "tenant": session.tenant,
            "max_frame_bytes": self.worker.config.max_frame_bytes,
            "chunk_bytes": self.worker.chunk_bytes,
        }
        try:
            await self.send(Opcode.HELLO, frame.request_id, Flags.REPLY, reply)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
                self.worker.forget(session)
            raise
        self._log.debug("hello", client=client)
        return session

    async def _reader(self, scope: anyio.CancelScope) -> None:
        async def on_frame(frame: Frame) -> None:
            if frame.opcode == Opcode.PING and not frame.flags & Flags.MORE:
                await self.send(Opcode.PING, frame.request_id, Flags.REPLY, {})
                return
            assert self.session is not None
            size = frame.header.payload_length
            await self.session.gate.hold_inflight(size, self._inflight)
            self._inflight += size
            await self._frames_in.send(frame)

        try:
            await self._read_frames(on_frame)
        except ProtocolError as exc:
            self._log.warning("protocol error", error=str(exc))
            self.worker.observer.protocol_error(exc.kind)
            await self._try_send_error(0, 0, exc)
        finally:
            self._frames_in.close()

    async def _next_frame(self) -> Frame:
        """The next queued frame, released from the in-flight count."""
        frame = await self._frames_out.receive()
        size = frame.header.payload_length
        self._inflight -= size
        assert self.session is not None
        self.session.gate.release_inflight(size)
        return frame

    async def _executor(self) -> None:
        while True:
            try:
                frame = await self._next_frame()
            except anyio.EndOfStream:
                return
            if not await self._execute(frame):
                return

    async def _execute(self, frame: Frame) -> bool:
        """Run one request; False when the connection should end."""
        assert self.session is not None
        session = self.session
        no_reply = Flags.NO_REPLY in frame.flags
        more = Flags.MORE in frame.flags
        spec = self.registry.get(frame.opcode)
        name = opcode_name(frame.opcode)
        request = Request(
            Opcode(frame.opcode) if spec else Opcode.PING,
            frame.request_id,
            Args(None, name),
            frame.bulk,
            no_reply,
            more,
            self,
        )
        error: HipError | None = None
        result: Any = None
        started = time.perf_counter()
        if frame.opcode == Opcode.DATA:
            raise _Closing(
                ProtocolError(
                    message=f"DATA frame of request {frame.request_id} does not continue a request"
                )
            )
        if spec is None:
            error = HipError(HipErrorCode.hipErrorNotSupported, f"unknown opcode {name}")
        elif frame.error is not None:
            error = frame.error
        elif no_reply and not spec.fire_and_forget:
            error = HipError(
                HipErrorCode.hipErrorNotSupported, f"{name} cannot be sent fire-and-forget"
            )
        elif more and not spec.streams_request:
            error = ProtocolError(message=f"{name} takes no continuation data")
        elif frame.opcode not in _NOT_SYNCHRONISING and (quota := _over_rate(session)):
            error = quota
        elif (
            not no_reply
            and frame.opcode not in _NOT_SYNCHRONISING
            and (deferred := session.take_deferred_error())
        ):
            error = type(deferred.error)(
                deferred.error.code,
                f"{deferred.error.message} (from an earlier asynchronous {deferred.opcode}, "
                f"request {deferred.request_id}; this request did not run)",
            )
        if error is None:
            assert spec is not None
            try:
                request.args = Args(frame.args, name)
                result = await spec.fn(session, request)
            except HipError as exc:
                error = exc
            except _Closing:
                raise
            except Exception as exc:  # a handler bug must not take the worker down
                self._log.exception("handler failed", opcode=name)
                error = as_hip_error(exc, name)
        if request.more:
            await request.drain()
        observer = self.worker.observer
        observer.request_done(
            session.tenant,
            name,
            "ok" if error is None else error.name,
            time.perf_counter() - started,
        )
        if error is not None:
            quota = error.details.get("quota")
            if quota:
                observer.quota_rejected(session.tenant, str(quota))
            if no_reply:
                session.defer_error(error, name, frame.request_id)
            else:
                await self.send_error(frame.opcode, frame.request_id, error)
            return True
        if frame.opcode == Opcode.GOODBYE:
            # Free before answering: when the client's close() returns, all is released.
            with anyio.CancelScope(shield=True):
                await session.close()
        if not no_reply:
            reply = result if isinstance(result, Reply) else Reply(result)
            await self.send(frame.opcode, frame.request_id, Flags.REPLY, reply.result, reply.bulk)
        return frame.opcode != Opcode.GOODBYE


def _over_rate(session: Session) -> HipError | None:
    """The request-rate refusal, if the tenant's bucket is empty."""
    try:
        session.gate.admit_request()
    except HipError as exc:
        return exc
    return None
