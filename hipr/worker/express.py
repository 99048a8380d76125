"""The express path of the busiest request an unmodified program sends: one LAUNCH_KERNEL
with ``synchronize`` (PyTorch's ``x.add_(1); torch.cuda.synchronize()``), arriving alone
in a read, answered from the loop's I/O callback through the native launch-and-wait.

The usual path for that request (the decoder, the pump, ``RequestExecutor.answer_now``,
the handler's request objects, the bookkeeping before the reply) cost the worker about
half of the tiny op's time on the H200 hosts (``benchmarks/proxy/stages.py``). Here the
frame is read where it lies and checked by the handler's own function
(``hipr.handlers.module.launch_arguments``: the same rules, the same pointer-ownership
check). A payload equal to the last one checked is not checked again while no function,
allocation or module global of the session has gone since (their tables' ``removals``):
a check that once passed can only fail after a removal. The launch and its wait are one
native call that also sends the reply; the request's bookkeeping (its reply kept for a
resend, its metrics) follows the send. From the second time the same payload comes, that
call is packed once (``Session.prepare_waited``) and made again with only the reply's
socket and request id patched in (``Session.launch_waited_again``), while the session's
streams and lane stay as they were.

A lone small MEMCPY_DTOH (PyTorch's ``item()``) is taken here too: the handler's own
``quick_copy_back`` (the same checks, the same short poll of the stream, the same bytes)
answers it, and anything it declines goes the usual way, which does not poll for that
request again. The usual path spent 26 µs of Python around that copy on an H100
(``benchmarks/proxy/stages.py --client torch_item``: decoding, the pump, the executor's
inline answer, the handler, the reply).

It only ever takes a request it can finish exactly as the usual path would. Anything
else (another opcode, flags, a frame not alone in the read, a resend, a stream, a
refusal, a pending earlier error, a tenant's rate spent, a backend without the native
call) goes the usual way untouched; a request it launched whose kernel still runs, or
whose launch the runtime refused, or whose kernel faulted, is handed to the usual path
as launched (``Session.launched_pending``), which waits and answers without launching
again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import cbor2

from hipr.errors import HipError
from hipr.handlers.args import Args
from hipr.handlers.memory import quick_copy_back
from hipr.handlers.module import launch_arguments
from hipr.protocol.codec import FrameDecoder, encode_frame
from hipr.protocol.header import HEADER, HEADER_SIZE, MAGIC, REQUEST_ID_AT, Flags
from hipr.protocol.opcodes import Opcode

if TYPE_CHECKING:
    from hipr.sessions.state import PreparedExpress, Session

__all__ = ["ExpressConnection", "ExpressLaunch"]


class ExpressConnection(Protocol):
    """What the express path asks of its connection's executor
    (``hipr.worker.request_executor`` implements it; this module never imports it)."""

    session: Session

    def express_ready(self, request_id: int) -> bool:
        """True when a lone request read just now may be answered here."""
        ...

    def reserve_reply(self) -> int:
        """A socket descriptor for the native call's reply, writes held; -1: none."""
        ...

    def release_reply(self, data: bytes, sent: int) -> None:
        """After :meth:`reserve_reply`: what the socket took of ``data``."""
        ...

    def finish_express(
        self, request_id: int, reply: bytes, sent: int, started: float, name: str = "LAUNCH_KERNEL"
    ) -> None:
        """The request (an opcode's ``name``) ran: the rest of its reply sent, kept,
        counted."""
        ...


_LAUNCH = int(Opcode.LAUNCH_KERNEL)
_NAME = "LAUNCH_KERNEL"
_COPY_BACK = int(Opcode.MEMCPY_DTOH)
_COPY_BACK_NAME = "MEMCPY_DTOH"
_REPLY = Flags.REPLY
#: The reply's bytes with request id 0: the packed call patches each request's in at
#: ``REQUEST_ID_AT``.
_REPLY_TEMPLATE = encode_frame(_LAUNCH, 0, _REPLY, {})
#: The header and the CBOR part's length prefix, read in one unpack.
_HEAD = type(HEADER)(HEADER.format + "I")
_HEAD_SIZE = _HEAD.size
#: Larger reads go the usual way: a launch's arguments are a few hundred bytes, and the
#: decoder's scan of large CBOR parts (``hipr.protocol.bounded_cbor``) stays its own.
_MAX_FRAME = 1024


class ExpressLaunch:
    """One connection's express path (module doc); :meth:`answer` is asked first for
    each read in push mode."""

    __slots__ = ("_call", "_decoder", "_executor", "_payload", "_prepared", "_stamp")

    def __init__(self, executor: ExpressConnection, decoder: FrameDecoder) -> None:
        self._executor = executor
        self._decoder = decoder
        #: The last payload checked, the session's removal counts then, and the launch
        #: it asked for (see :meth:`answer`).
        self._payload = b""
        self._stamp = (-1, -1, -1)
        self._call: tuple[Any, Any, Any, int, bytes] = (None, None, None, 0, b"")
        #: That launch packed once for the session's native call, from its second time
        #: on (``Session.prepare_waited``); None until then.
        self._prepared: PreparedExpress | None = None

    def _checked(self, payload: bytes) -> tuple[Any, Any, Any, int, bytes] | None:
        """The launch a fused request's payload asks for, checked by the handler's own
        ``launch_arguments``; None where the usual path must take it (malformed, not
        fused, a stream, a refusal: it refuses it again, in its words)."""
        try:
            # The decoder's own rule for map keys, as the handshake left it.
            args = cbor2.loads(payload[4:], strict_hashable_types=self._decoder.strict)
        except Exception:  # malformed: the decoder's own error, the usual way
            return None
        if type(args) is not dict or args.get("synchronize") is not True:
            return None
        stream = args.get("stream")
        if not (stream is None or (type(stream) is int and stream == 0)):
            return None
        try:
            return launch_arguments(self._executor.session, Args(args, _NAME))
        except HipError:
            return None

    def _copy_back(self, data: bytes, request_id: int) -> bool:
        """A lone MEMCPY_DTOH (PyTorch's ``item()``): answered here when the copy is
        small and its stream's work ends within a short poll, by the handler's own
        ``quick_copy_back`` (the same checks, the same poll, the same bytes); False, with
        nothing done but the poll noted for the request (the usual path does not poll
        for it again), where the usual path must take it: malformed, refused, a pending
        error, the tenant's rate spent, too large, or the stream still busy."""
        executor = self._executor
        session = executor.session
        if not executor.express_ready(request_id):
            return False
        try:
            args = cbor2.loads(data[HEADER_SIZE + 4 :], strict_hashable_types=self._decoder.strict)
        except Exception:  # malformed: the decoder's own error, the usual way
            return False
        if type(args) is not dict:
            return False
        gate = session.gate
        if not gate.try_admit_all(1):
            return False
        started = time.perf_counter()
        try:
            out = quick_copy_back(session, Args(args, _COPY_BACK_NAME), request_id)
        except HipError:
            # Refused (the usual path refuses it again, in its words: its checks come
            # first), or the runtime failed: the usual path makes the usual copy, which
            # reports the failure, rather than trying the quick one a second time.
            session.copy_back_polled = request_id
            out = None
        if out is None:
            gate.refund(1)
            return False
        reply = encode_frame(_COPY_BACK, request_id, _REPLY, {"size": out.nbytes}, out)
        executor.finish_express(request_id, reply, 0, started, _COPY_BACK_NAME)
        return True

    def answer(self, data: bytes) -> bool:
        """True when ``data`` was one whole LAUNCH_KERNEL with ``synchronize``, or one
        small MEMCPY_DTOH, and it was answered here; False, with nothing done but a
        launch handed over as launched (module doc), when the usual path must take the
        bytes."""
        size = len(data)
        if not _HEAD_SIZE <= size <= _MAX_FRAME:
            return False
        magic, _, opcode, request_id, flags, length, args_length = _HEAD.unpack_from(data)
        if (
            flags
            or magic != MAGIC
            or length != size - HEADER_SIZE
            or args_length != length - 4
            or args_length > self._decoder.scan_above  # the decoder would scan it first
        ):
            return False
        if opcode != _LAUNCH:
            return opcode == _COPY_BACK and self._copy_back(data, request_id)
        executor = self._executor
        session = executor.session
        if not executor.express_ready(request_id):
            return False
        payload = data[HEADER_SIZE:]
        stamp = (
            session.functions.removals,
            session.allocations.removals,
            session.module_globals.removals,
        )
        prepared = None
        repeated = payload == self._payload and stamp == self._stamp
        if repeated:
            # The same arguments as the last launch, checked then, and nothing they
            # named has gone since (a loop over one kernel: PyTorch's add_).
            call = self._call
            prepared = self._prepared
        else:
            checked = self._checked(payload)
            if checked is None:
                return False
            call = checked
            self._payload, self._stamp, self._call = payload, stamp, call
            self._prepared = None
        function, grid, block, shared_mem, blob = call
        gate = session.gate
        if not gate.try_admit_all(2):  # the launch's and the synchronize's requests
            return False
        started = time.perf_counter()
        fd = executor.reserve_reply()
        outcome = None
        reply = b""
        session.burst = False  # alone in its read: nothing follows it to batch with
        try:
            if prepared is not None:
                outcome = session.launch_waited_again(prepared, fd, request_id)
                if outcome is None:  # the session's streams or lane changed: packed anew below
                    self._prepared = prepared = None
                else:
                    reply = encode_frame(_LAUNCH, request_id, _REPLY, {})
            if outcome is None:
                reply = encode_frame(_LAUNCH, request_id, _REPLY, {})
                outcome = session.launch_waited(
                    function, grid, block, shared_mem, blob, None if fd < 0 else (fd, reply)
                )
        except HipError as fault:  # a faulted kernel: reported as the wait reports it
            session.defer_error(fault, _NAME, request_id)
            session.launched_pending = request_id
            return False
        finally:
            if fd >= 0:
                executor.release_reply(reply, 0 if outcome is None else outcome[2])
        if outcome is None:  # not here after all (a queued call, a capture, many streams)
            gate.refund(2)
            return False
        done, refused, sent = outcome
        if refused is not None or not done:
            # Launched, or refused by the runtime: the usual path waits for the session's
            # work and answers, the refusal first, without launching again.
            if refused is not None:
                session.defer_error(refused, _NAME, request_id)
            session.launched_pending = request_id
            return False
        executor.finish_express(request_id, reply, sent, started)
        if repeated and prepared is None:
            # A second launch of the same arguments: packed once for the next ones
            # (after the reply has left, so its cost is not the client's wait).
            try:
                self._prepared = session.prepare_waited(
                    function, grid, block, shared_mem, blob, _REPLY_TEMPLATE, REQUEST_ID_AT
                )
            except HipError:
                self._prepared = None
        return True
