"""What a handler receives (:class:`Request`) and may return (:class:`Reply`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from hipr.errors import HipError
from hipr.handlers.args import Args

if TYPE_CHECKING:
    from hipr.sessions.state import Session


T = TypeVar("T")


class RequestLink(Protocol):
    """The connection, as seen by a handler that streams bulk data."""

    async def receive_data(self, request_id: int) -> tuple[memoryview, bool]:
        """The next continuation chunk of the request and whether it is the last."""
        ...

    async def send_chunk(self, request_id: int, opcode: int, bulk: memoryview | bytes) -> None:
        """Send part of the reply's bulk data (a REPLY|MORE frame)."""
        ...

    def chunk_buffer(self, size: int) -> memoryview:
        """A writable buffer of ``size`` bytes for one chunk of bulk data, reused by the
        connection once nothing refers to it (its contents undefined)."""
        ...

    def placing(self, request_id: int, window: memoryview) -> AbstractContextManager[bool]:
        """While open, the request's continuation chunks may be received straight into
        ``window`` (the request's whole destination); yields whether they can."""
        ...

    def answer_from_gpu_thread(self, request: Request) -> Callable[[], object] | None:
        """For a request whose reply is an empty success once its wait on the session's
        GPU thread returns: what that thread may call right then to send the reply
        itself (unless an earlier fire-and-forget error must be reported), sooner than
        the event loop would; None where the link cannot."""
        ...

    def reply_target(self, request: Request) -> tuple[int, bytes] | None:
        """For a request whose reply is an empty success once its work is seen done on
        the event loop (a native launch-and-wait): a socket descriptor and that reply's
        bytes, for the native call to send the moment it sees the work done, with the
        connection's other writes held back until :meth:`reply_written`; None where the
        link cannot (no plain socket, a frame queued, an earlier error pending)."""
        ...

    def reply_written(self, request: Request, target: tuple[int, bytes], sent: int) -> None:
        """After :meth:`reply_target`: the socket took ``sent`` bytes of the reply (0 or
        negative: none, and the reply goes the usual way); writes go on."""
        ...


@dataclass(slots=True)
class Request:
    """One decoded request."""

    #: The raw opcode (it may name no handler) and its name for messages.
    opcode: int
    name: str
    request_id: int
    args: Args
    bulk: memoryview
    no_reply: bool
    #: Continuation DATA frames follow this one.
    more: bool
    link: RequestLink

    async def receive_data(self) -> memoryview | None:
        """The next chunk of this request's bulk data (None when all has arrived)."""
        if not self.more:
            return None
        chunk, last = await self.link.receive_data(self.request_id)
        if last:
            self.more = False
        return chunk

    async def drain(self) -> None:
        """Discard the rest of the request's bulk data (after refusing it)."""
        while await self.receive_data() is not None:
            pass

    async def send_chunk(self, bulk: memoryview | bytes) -> None:
        """Send one chunk of the reply's bulk data ahead of the final reply."""
        await self.link.send_chunk(self.request_id, self.opcode, bulk)

    def chunk_buffer(self, size: int) -> memoryview:
        """A buffer for one chunk of a streamed reply (see :meth:`RequestLink.chunk_buffer`)."""
        return self.link.chunk_buffer(size)

    def placing(self, window: memoryview) -> AbstractContextManager[bool]:
        """Receive the rest of this request's bulk data straight into ``window`` where
        the link can (see :meth:`RequestLink.placing`); a chunk so received lies at its
        offset in ``window`` already."""
        return self.link.placing(self.request_id, window)

    def answer_on_gpu_thread(self) -> Callable[[], object] | None:
        """A wait's ``then`` (``Session.gpu``): the GPU thread sends this request's empty
        reply itself when the wait returns (see
        :meth:`RequestLink.answer_from_gpu_thread`). Only for a handler that then
        returns ``{}``."""
        return self.link.answer_from_gpu_thread(self)

    def reply_target(self) -> tuple[int, bytes] | None:
        """Where a native call may send this request's empty reply itself (see
        :meth:`RequestLink.reply_target`); pair with :meth:`reply_written`."""
        return self.link.reply_target(self)

    def reply_written(self, target: tuple[int, bytes], sent: int) -> None:
        """What became of the reply sent to :meth:`reply_target`'s descriptor."""
        self.link.reply_written(self, target, sent)


@dataclass(slots=True)
class Reply:
    """A result with bulk bytes after it; a handler may also return a plain result."""

    result: Any = None
    bulk: bytes | bytearray | memoryview = field(default=b"")


def or_restore(fn: Callable[..., Any], *restores: Callable[[], None]) -> Callable[..., Any]:
    """``fn``, which on failure first runs ``restores``. A destroy that the runtime refuses
    leaves its object alive: the handle goes back to the session's table so that the
    session's teardown frees it, instead of leaking it for the life of the worker."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            for restore in restores:
                restore()
            raise

    return call


async def run_ordered(
    session: Session, request: Request, fn: Callable[..., Any], *args: Any
) -> None:
    """Run a backend call that returns nothing: queued without waiting when the request is
    fire-and-forget (its error then goes to the next synchronising call), awaited otherwise."""
    if request.no_reply:
        post_ordered(session, request, fn, *args)
    else:
        await session.gpu(fn, *args)


def admit_each(
    session: Session,
    request: Request,
    items: Sequence[T],
    check: Callable[[int, T], None],
    plural: str,
) -> tuple[list[tuple[int, T]], HipError | None]:
    """The items of a batch request (protocol 1.1) that may run, as (index, item), and
    the first refusal by position. Each item counts as the request it stands for against
    max_request_rate (the request itself already took one), so those past what the
    bucket allows are refused; ``check(index, item)`` refuses an item by raising a
    HipError. A refused item stops none of the others; ``plural`` names the items in
    the rate's refusal ("launches 51 to 200 of LAUNCH_KERNELS were refused")."""
    count = len(items)
    allowed = 1 + session.gate.admit_requests(count - 1) if count > 1 else count
    admitted: list[tuple[int, T]] = []
    refused: HipError | None = None
    for index, item in enumerate(items[:allowed]):
        try:
            check(index, item)
        except HipError as exc:
            refused = refused or exc
            continue
        admitted.append((index, item))
    if refused is None and allowed < count:
        refused = session.gate.over_rate(
            f" ({plural} {allowed + 1} to {count} of {request.name} were refused)"
        )
    return admitted, refused


async def run_batch(
    session: Session, request: Request, call: Sequence[Any] | None, refused: HipError | None
) -> None:
    """The admitted part of a batch request, ``call`` (a backend call and its arguments;
    None when nothing was admitted), run as :func:`run_ordered` runs it; then the
    batch's error, if any: its first refusal, else the failure of the call (waited
    for, it comes back here rather than with a later synchronisation)."""
    failure: HipError | None = None
    if call is not None:
        try:
            await run_ordered(session, request, *call)
        except HipError as exc:
            failure = exc
    error = refused or failure
    if error is not None:
        raise error


def post_ordered(session: Session, request: Request, fn: Callable[..., Any], *args: Any) -> None:
    """:func:`run_ordered` for a fire-and-forget request, without the coroutine (what a
    handler's synchronous variant calls)."""
    session.gpu_post(request.name, request.request_id, fn, *args)
