"""One client's link to the worker, from its handshake to its end.

After the handshake (HELLO, or RESUME of a detached session) the link is served by three
parts, each in its own module: the reader (``link_reader``: frames decoded off the link,
heartbeats answered at once, in push mode or by a reader task), the executor
(``request_executor``: a session's requests run in order, as HIP orders a client's
calls) and the writer (``link_writer``: whole frames, never interleaved). A bounded
queue between reader and executor (``frame_queue``) bounds the memory one client can
make the worker hold. Under process isolation the link is relayed to its tenant's
process instead (``tenant_relay``). When the link ends, its session is freed or kept
for a RESUME.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import anyio.abc
import structlog
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSAttribute

from hipr._version import __version__
from hipr.backends.interface import Backend
from hipr.errors import (
    HipError,
    HipErrorCode,
    ProtocolError,
    QuotaError,
    VersionMismatchError,
)
from hipr.handlers.args import Args
from hipr.handlers.registry import REGISTRY, HandlerRegistry
from hipr.observability.observer import WorkerObserver
from hipr.protocol import messages as m
from hipr.protocol.bounded_cbor import CborLimits
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame
from hipr.protocol.header import (
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    Flags,
    version_major,
    version_text,
)
from hipr.protocol.opcodes import Opcode, opcode_name
from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.state import Session
from hipr.transports.base import TransportAttribute, stream_capability
from hipr.worker.config import WorkerConfig
from hipr.worker.data_links import DataLink
from hipr.worker.fairness import FairScheduler
from hipr.worker.frame_queue import FrameQueue
from hipr.worker.isolation import TenantProcesses
from hipr.worker.link_reader import LinkReader, count_protocol_error
from hipr.worker.link_writer import LINK_ERRORS, LinkWriter
from hipr.worker.payloads import PayloadBuffers
from hipr.worker.recovery import ContextRecovery
from hipr.worker.request_executor import Closing, RequestExecutor
from hipr.worker.slow_links import FrameClock
from hipr.worker.tenant_relay import RECEIVE_SIZE, relay, resume_target
from hipr.worker.tenants import Tenant, TenantRegistry

__all__ = ["Worker", "WorkerConnection"]


class Worker(Protocol):
    """What a connection needs of the worker that accepted it (``hipr.worker.server``
    implements it; connections never import the server)."""

    config: WorkerConfig
    backend: Backend
    observer: WorkerObserver
    isolation: TenantProcesses | None
    recovery: ContextRecovery
    tenants: TenantRegistry
    chunk_bytes: int
    handshake_timeout: float
    draining: bool
    busy_poll: BusyPoll
    #: Turns between the heavy connections of all tenants (``hipr.worker.fairness``).
    fair: FairScheduler

    def authenticate(self, hello: Args, stream: anyio.abc.ByteStream) -> Tenant:
        """The tenant a HELLO's credentials name, or AuthError."""
        ...

    def check_max_clients(self) -> None:
        """Refuse one more client over the worker-wide max_clients."""
        ...

    def open_session(self, tenant: Tenant, peer: str) -> Session:
        """A new session for an authenticated client."""
        ...

    def session_named(self, args: Args) -> Session:
        """The live session a RESUME's or DATA_LINK's credentials name, or an error."""
        ...

    async def resume(self, args: Args, connection: WorkerConnection) -> Session:
        """The detached session a RESUME names, now attached to ``connection``."""
        ...

    def detach(self, session: Session) -> None:
        """Keep a session whose link dropped for a later RESUME."""
        ...

    def forget(self, session: Session) -> None:
        """Drop a closed session from the registry."""
        ...

    async def handshake_refused(self, peer: str, error: HipError) -> None:
        """A HELLO or RESUME from ``peer`` was refused with ``error``: count it, and
        slow a source that keeps failing authentication, before the answer goes."""
        ...


log = structlog.get_logger("hipr.connection")

#: Seconds without a large payload after which a connection lets its buffers go.
PAYLOAD_IDLE = 1.0


class WorkerConnection:
    """One client connection to the worker (module doc)."""

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
        config = worker.config
        # Until the handshake is over, frames are at most max_hello_bytes (refused from
        # their header); every frame's CBOR is bounded (hipr.protocol.bounded_cbor).
        self._decoder = FrameDecoder(
            min(config.max_frame_bytes, config.max_hello_bytes), CborLimits(config.max_cbor_items)
        )
        #: Called once the handshake is over, whatever its outcome (the worker's
        #: count of unfinished handshakes).
        self.on_handshake_over: Callable[[], None] | None = None
        self._log = log.bind(peer=peer)
        self.writer = LinkWriter(stream)
        self.reader = LinkReader(
            worker,
            stream,
            peer,
            self._decoder,
            FrameQueue(),
            self.writer,
            PayloadBuffers(pinned=getattr(worker.backend, "payload_buffer", None)),
            self._log,
        )
        #: Runs the session's requests, once the handshake is over.
        self.executor: RequestExecutor | None = None
        #: The executor's slice and turns (``hipr.worker.fairness``); its tenant's once
        #: the session is known.
        self._turns = worker.fair.member("")
        #: True when the session must be freed at the end, not kept for a RESUME.
        self._ends_session = False
        self._draining = False
        self._reader_scope: anyio.CancelScope | None = None
        #: Set when a kernel fault poisoned the context: told to the client, then closed.
        self._lost: HipError | None = None
        self._done = anyio.Event()

    # --- what others call -------------------------------------------------------------
    async def send(
        self,
        opcode: int,
        request_id: int,
        flags: Flags,
        args: Any = None,
        bulk: bytes | bytearray | memoryview = b"",
    ) -> None:
        """Send one frame; frames from several tasks never interleave."""
        await self.writer.send(opcode, request_id, flags, args, bulk)

    async def send_error(self, opcode: int, request_id: int, error: HipError) -> None:
        """An error reply (a worker-initiated one with opcode and request id 0)."""
        await self.writer.send_error(opcode, request_id, error)

    @property
    def finished(self) -> anyio.Event:
        """Set once the connection has ended and let go of its session."""
        return self._done

    async def abandon(self) -> None:
        """Let go of the session for a RESUME on another connection: drop this link, let
        the request under way finish (its reply is kept for the resent request), return
        once the session is free."""
        await anyio.aclose_forcefully(self.stream)
        await self._done.wait()

    def lose_context(self, error: HipError) -> None:
        """A kernel fault poisoned the context (``hipr.worker.recovery``): finish the
        request under way, tell the client ``error``, end the session and close."""
        self._lost = error
        self.drain()

    def drain(self) -> None:
        """Worker shutdown: finish the request under way, then say goodbye and close."""
        self._draining = True
        if self.executor is not None:
            self.executor.draining = True
        self.reader.end_push()
        if self._reader_scope is not None:
            self._reader_scope.cancel()

    # --- lifecycle ------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the connection to its end, then free everything it made."""
        try:
            with anyio.fail_after(self.worker.handshake_timeout):
                hello = await self._receive_first_frame()
            if hello is None:
                return
            self.session = await self._handshake(hello)
            self._handshake_over()
            if self.session is None:
                return
            await self._serve(self.session)
        except TimeoutError:
            self._log.info("handshake timed out")
            self.worker.observer.refused("handshake_timeout", self.peer)
        except LINK_ERRORS as exc:
            self._log.info("link lost", error=repr(exc))
        except ProtocolError as exc:
            self._ends_session = True
            self._log.warning("protocol error", error=str(exc))
            count_protocol_error(self.worker.observer, self.peer, exc)
            await self.writer.try_send_error(0, 0, exc)
        except Closing as closing:
            self._ends_session = True
            error = closing.args[0] if closing.args else None
            if isinstance(error, HipError):
                self._log.warning("closing connection", error=str(error))
                await self.writer.try_send_error(0, 0, error)
        finally:
            self._handshake_over()
            with anyio.CancelScope(shield=True):
                await self._finish()

    def attach(self, session: Session) -> RequestExecutor:
        """Serve ``session`` on this link (its handshake over): its executor, and the
        reader handing frames to it. Started by the connection itself (:meth:`run`), or
        by a benchmark that drives a connection by hand."""
        self.session = session
        self._log = self._log.bind(session=session.id, tenant=session.tenant)
        config = self.worker.config
        self._decoder.max_payload = config.max_frame_bytes
        self._turns = self.worker.fair.member(session.tenant)
        self._turns.weigh(session.gate.quotas.weight)
        tenant_frame_limit = session.gate.quotas.max_frame_bytes
        if tenant_frame_limit is not None:
            self._decoder.max_payload = min(self._decoder.max_payload, tenant_frame_limit)
        executor = self.executor = RequestExecutor(
            self.worker, session, self.registry, self.reader, self.writer, self._turns, self._log
        )
        executor.draining = self._draining
        self.reader.serve(session, self._turns, executor, self._log)
        return executor

    async def _serve(self, session: Session) -> None:
        """After the handshake: the reader, the heartbeat and the executor, until the
        link or the session ends."""
        executor = self.attach(session)
        reader = self.reader
        self._log.info("session started")
        # Caught inside the task group: leaving it would wrap them in an ExceptionGroup.
        ending: BaseException | None = None
        async with anyio.create_task_group() as tg:
            if not reader.start_push():
                tg.start_soon(self._pull)
            tg.start_soon(self._heartbeat)
            try:
                if not await executor.run():
                    self._ends_session = True
                if reader.protocol_error is not None:
                    await self.writer.try_send_error(0, 0, reader.protocol_error)
            except (Closing, *LINK_ERRORS) as exc:
                ending = exc
            tg.cancel_scope.cancel()
        if ending is not None:
            raise ending
        if self._draining:
            self._ends_session = True
            with anyio.move_on_after(2), contextlib.suppress(*LINK_ERRORS):
                if self._lost is not None:
                    await self.send_error(0, 0, self._lost)
                else:
                    await self.send(
                        Opcode.GOODBYE, 0, Flags.NONE, {"reason": "the worker is shutting down"}
                    )

    async def _pull(self) -> None:
        """The reader task (pull mode), in a cancel scope of its own: a drain stops the
        reading only, while the request under way finishes and its reply goes out. (A
        drain that cancelled the executor with it cut a reply short mid-write on TLS,
        and the client lost it: a kernel fault's error, say.)"""
        with anyio.CancelScope() as scope:
            self._reader_scope = scope
            if self._draining:
                scope.cancel()
            await self.reader.pull()

    def _handshake_over(self) -> None:
        over, self.on_handshake_over = self.on_handshake_over, None
        if over is not None:
            over()

    async def _finish(self) -> None:
        try:
            session = self.session
            if session is not None:
                session.flush_posts()  # posted work runs now, even while detached
                frames = self.reader.frames
                if frames.inflight:
                    session.gate.release_inflight(frames.inflight)
                    frames.inflight = 0
                self._turns.leave()
                executor = self.executor
                ends = self._ends_session or (executor is not None and executor.ends_session)
                if session.connection is self:
                    session.connection = None
                    if ends or self.worker.draining:
                        try:
                            await session.close()
                        finally:
                            self.worker.forget(session)
                            self._log.info("session ended")
                    else:
                        self.worker.detach(session)
                        self._log.info("session detached; waiting for a resume")
            await anyio.aclose_forcefully(self.stream)
        finally:
            self._done.set()

    async def _heartbeat(self) -> None:
        config = self.worker.config
        period = max(
            0.01, min(config.heartbeat_interval, config.heartbeat_timeout, config.frame_timeout) / 4
        )
        frame_clock = FrameClock(config.frame_timeout)
        reader = self.reader
        buffers = reader.payload_buffers
        pinged = time.monotonic()
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            if len(buffers) and now - buffers.last_taken > PAYLOAD_IDLE:
                buffers.release()  # no upload under way: memory back
            silent = now - reader.last_received
            if silent >= config.heartbeat_timeout:
                self._log.warning("link silent; treating it as dead", seconds=round(silent, 1))
                # Closing (not cancelling) lets the request under way finish cleanly.
                await anyio.aclose_forcefully(self.stream)
                return
            if frame_clock.overdue(now, *reader.frame_under_way()):
                # Bytes trickle in, so the link is not silent, but no frame completes.
                self._log.warning("frame not completed in time; closing the link")
                self.worker.observer.refused("frame_timeout", self.peer)
                await anyio.aclose_forcefully(self.stream)
                return
            # Every session hears from the worker, silent or not: a peer that keeps the
            # link busy without completing frames must still answer.
            if silent >= config.heartbeat_interval or now - pinged >= config.heartbeat_interval:
                pinged = now
                with contextlib.suppress(*LINK_ERRORS):
                    await self.send(Opcode.PING, 0, Flags.NONE)

    # --- the handshake ----------------------------------------------------------------
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
        try_send_error = self.writer.try_send_error
        if version_major(frame.header.version) != PROTOCOL_MAJOR:
            error = VersionMismatchError(
                message=f"this worker speaks protocol {version_text(PROTOCOL_VERSION)}; the client "
                f"sent {version_text(frame.header.version)}: upgrade the older side"
            )
            self._log.warning("version mismatch", client=version_text(frame.header.version))
            await try_send_error(frame.opcode, frame.request_id, error)
            return None
        if frame.opcode == Opcode.RESUME and frame.error is None:
            return await self._resume(frame)
        if frame.opcode == Opcode.DATA_LINK and frame.error is None:
            await self._data_link(frame)
            return None
        if frame.opcode != Opcode.HELLO:
            self._ends_session = True
            await try_send_error(
                frame.opcode,
                frame.request_id,
                ProtocolError(
                    message=f"the first frame must be HELLO, not {opcode_name(frame.opcode)}"
                ),
            )
            return None
        if frame.error is not None:
            await try_send_error(frame.opcode, frame.request_id, frame.error)
            return None
        try:
            args = Args(frame.args, "HELLO")
            client = args.text(m.Hello.client, default="unknown", max_length=256)
            tenant = self.worker.authenticate(args, self.stream)
            isolation = self.worker.isolation
            if isolation is not None:
                self.worker.check_max_clients()
                child = await isolation.child_for(tenant)
                hello = dict(frame.args)
                hello[m.Hello.token] = child.token
                first = encode_frame(
                    Opcode.HELLO, frame.request_id, Flags.NONE, hello, version=frame.header.version
                )
                await self._relay(isolation, child.url, first, tenant.name)
                return None
            await self.worker.recovery.admit()
            session = self.worker.open_session(tenant, self.peer)
        except HipError as exc:
            self._log.warning("handshake refused", error=str(exc))
            await self.worker.handshake_refused(self.peer, exc)
            await try_send_error(frame.opcode, frame.request_id, exc)
            return None
        reply = {
            **self._session_reply(session),
            "tenant": session.tenant,
            "max_frame_bytes": self.worker.config.max_frame_bytes,
            "heartbeat_interval": self.worker.config.heartbeat_interval,
            "resume_token": session.resume_token,
        }
        session.connection = self
        try:
            await self.send(Opcode.HELLO, frame.request_id, Flags.REPLY, reply)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.close()
                self.worker.forget(session)
            raise
        self._log.debug("hello", client=client)
        return session

    async def _relay(self, isolation: TenantProcesses, url: str, first: bytes, tenant: str) -> None:
        """Authenticated here: the tenant's process at ``url`` serves the link from now
        on, starting with ``first`` (``hipr.worker.tenant_relay``)."""
        self._handshake_over()  # no longer a pending handshake
        self._log = self._log.bind(tenant=tenant)
        await relay(
            isolation,
            self.stream,
            self._decoder,
            url,
            first,
            tenant,
            self.worker.config.max_frame_bytes,
            self._log,
        )

    def _session_reply(self, session: Session) -> dict[str, Any]:
        """What both HELLO and RESUME replies tell the client."""
        return {
            "protocol": PROTOCOL_VERSION,
            "worker_version": __version__,
            "backend": self.worker.backend.name,
            "session_id": session.id,
            "chunk_bytes": self.worker.chunk_bytes,
            "data_links": self.worker.config.data_links if self._can_carry_data_links() else 0,
        }

    def _can_carry_data_links(self) -> bool:
        """Whether this connection's transport could carry data links: a plain socket
        (tcp or unix), whose reads a thread can take over; not TLS."""
        stream = self.stream
        return (
            stream.extra(TLSAttribute.ssl_object, None) is None
            and stream.extra(SocketAttribute.raw_socket, None) is not None
        )

    async def _data_link(self, frame: Frame) -> None:
        """This connection becomes a data link of the session DATA_LINK names: answered,
        then its socket is read by a thread of its own (``hipr.worker.data_links``) and
        the connection ends here."""
        try:
            args = Args(frame.args, "DATA_LINK")
            isolation = self.worker.isolation
            if isolation is not None:
                target = await resume_target(isolation, self.worker.tenants, frame, args)
                await self._relay(isolation, *target)
                return
            session = self.worker.session_named(args)
            if not self.worker.config.data_links or not self._can_carry_data_links():
                raise HipError(
                    HipErrorCode.hipErrorNotSupported,
                    message="this worker offers no data links on this transport (TLS, or "
                    "data_links = 0): send the upload on the session's own link",
                )
        except HipError as exc:
            self._log.warning("data link refused", error=str(exc))
            await self.worker.handshake_refused(self.peer, exc)
            await self.writer.try_send_error(frame.opcode, frame.request_id, exc)
            return
        # No byte of the peer's may be read by the loop once the thread reads the socket.
        push = stream_capability(self.stream, TransportAttribute.push_delivery)
        if push is not None:
            push.pause_reading(True)
        raw = self.stream.extra(SocketAttribute.raw_socket)
        sock = socket.socket(fileno=os.dup(raw.fileno()))
        stripes = session.stripes
        link = DataLink(
            sock,
            stripes,
            getattr(self.worker.backend, "payload_buffer", None),
            self.worker.config.frame_timeout,
            self._log.bind(session=session.id, tenant=session.tenant),
        )
        index = stripes.add_link(link, self.worker.config.data_links)
        try:
            if index is None:
                limit = self.worker.config.data_links
                error = QuotaError(
                    message=f"the session holds its {limit} data links already",
                    quota="data_links",
                    limit=limit,
                )
                await self.writer.try_send_error(frame.opcode, frame.request_id, error)
                sock.close()
                return
            await self.send(Opcode.DATA_LINK, frame.request_id, Flags.REPLY, {"index": index})
            if self._decoder.buffered or (push is not None and push.unread_bytes):
                raise ProtocolError(message="a data link's chunks came before its DATA_LINK reply")
        except BaseException:
            stripes.remove_link(link)
            sock.close()
            raise
        await anyio.aclose_forcefully(self.stream)
        link.start()
        self.worker.observer.data_link_opened(session.tenant)
        self._log.info("data link attached", session=session.id, index=index)

    async def _resume(self, frame: Frame) -> Session | None:
        try:
            args = Args(frame.args, "RESUME")
            isolation = self.worker.isolation
            if isolation is not None:
                target = await resume_target(isolation, self.worker.tenants, frame, args)
                await self._relay(isolation, *target)
                return None
            session = await self.worker.resume(args, self)
        except HipError as exc:
            self._log.warning("resume refused", error=str(exc))
            await self.worker.handshake_refused(self.peer, exc)
            await self.writer.try_send_error(frame.opcode, frame.request_id, exc)
            return None
        reply = {
            **self._session_reply(session),
            "last_executed_id": session.last_executed_id,
        }
        try:
            await self.send(Opcode.RESUME, frame.request_id, Flags.REPLY, reply)
        except BaseException:
            session.connection = None
            self.worker.detach(session)
            raise
        self.worker.observer.session_resumed(session.tenant)
        self._log.info("session resumed", session=session.id)
        return session
