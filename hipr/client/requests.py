"""What a request is to the client: where its reply's bytes go, the link the API sends
it over (async or blocking, one protocol), the caller's wait for its reply, and what is
kept of it for resending."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from hipr.errors import HipError
from hipr.protocol.header import Flags
from hipr.protocol.opcodes import Opcode

Buffer = bytes | bytearray | memoryview
Part = bytes | bytearray | memoryview
#: ``progress(done_bytes, total_bytes)``, called as a large copy's chunks go or come, on
#: the thread that sends or reads them: it should return quickly and not call the Gpu
#: (a download's callback runs while that thread holds the link for its readers).
Progress = Callable[[int, int], None]
#: ``on_event(kind, details)``: kind is disconnected, reconnecting, resumed or session_lost.
EventCallback = Callable[[str, dict[str, Any]], None]


class ReplySink(Protocol):
    """Where a reply's bulk bytes go, chunk by chunk; ``reset`` before a replayed reply."""

    def write(self, chunk: memoryview) -> None:
        """Take the next chunk."""
        ...

    def reset(self) -> None:
        """Forget what was written: the reply is coming again from its start."""
        ...


class LaunchPlan(Protocol):
    """What a link needs of a kernel's launch plan (``hipr.client.objects.LaunchPlan``):
    the launches' wire arguments but their bytes, and what a batch of them shares."""

    @property
    def wire(self) -> dict[str, Any]: ...
    @property
    def batch_key(self) -> tuple[Any, ...]: ...


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

    async def launch(self, plan: LaunchPlan, data: bytes) -> None:
        """Send a fire-and-forget kernel launch from its plan and argument bytes."""
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
