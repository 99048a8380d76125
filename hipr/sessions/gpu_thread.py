"""One OS thread per session for its GPU calls, awaitable from trio or asyncio.

HIP's current device and CUDA's current context belong to a host thread, and a
session's calls are ordered: so each session gets a thread of its own, and the event
loop never blocks on a GPU call. Completion is signalled back to the loop without
blocking the GPU thread (``call_soon_threadsafe`` / ``run_sync_soon``), which keeps a
fire-and-forget call to one queue put.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import structlog

from hipr.sessions.loop_wakeup import LoopWaker

T = TypeVar("T")
log = structlog.get_logger("hipr.gpu_thread")
_STOP = object()


class _Call:
    __slots__ = ("args", "done", "error", "fn", "on_error", "result", "then", "waker")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        waker: Callable[[Callable[[], object]], object] | None,
        done: anyio.Event | None,
        on_error: Callable[[BaseException], None] | None,
        then: Callable[[], object] | None = None,
    ) -> None:
        self.fn = fn
        self.args = args
        self.waker = waker
        self.done = done
        self.on_error = on_error
        self.then = then
        self.result: Any = None
        self.error: BaseException | None = None


class PendingCall(Generic[T]):
    """A call queued on a :class:`GpuThread`; await :meth:`result` for its outcome."""

    __slots__ = ("_item",)

    def __init__(self, item: _Call) -> None:
        self._item = item

    async def result(self) -> T:
        """The call's return value, or its exception raised here."""
        assert self._item.done is not None
        await self._item.done.wait()
        if self._item.error is not None:
            raise self._item.error
        return self._item.result  # type: ignore[no-any-return]


class GpuThread:
    """A dedicated thread that runs submitted callables in submission order."""

    #: Fire-and-forget calls batched before the thread is woken for them.
    MAX_BATCH = 256

    def __init__(self, name: str, on_work: Callable[[GpuThread], None] | None = None) -> None:
        """``on_work(self)`` is called (on the caller's thread) each time work is posted or
        submitted: the worker's busy polling keeps the threads that may be busy."""
        self._on_work = on_work
        self._queue: queue.SimpleQueue[_Call | list[_Call] | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._closed = False
        # Posted calls wait here until flush(): waking the thread once per batch instead
        # of once per call keeps a stream of small launches off the GIL hand-off path.
        self._batch: list[_Call] = []
        # Calls handed over (written by the loop only) and finished (by this thread only):
        # each counter has one writer, so comparing them needs no lock.
        self._handed = 0
        self._finished = 0

    @property
    def idle(self) -> bool:
        """True when nothing is queued, batched or running: a call made elsewhere now
        (inline on the event loop) cannot overtake earlier work of the session."""
        return not self._batch and self._finished == self._handed

    def _main(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, list):
                for call in item:
                    self._run(call)
            else:
                assert isinstance(item, _Call)
                self._run(item)

    def _run(self, item: _Call) -> None:
        try:
            item.result = item.fn(*item.args)
        except BaseException as exc:  # handed to the awaiting task, never lost
            item.error = exc
            if item.on_error is not None:
                item.on_error(exc)
        else:
            if item.then is not None:
                try:
                    item.then()
                except Exception:  # the result still reaches the waiter, which answers
                    log.exception("a call's follow-up failed on the GPU thread")
        # Counted before the waiter wakes: it must find the thread idle again.
        self._finished += 1
        if item.waker is not None and item.done is not None:
            item.waker(item.done.set)

    def flush(self) -> None:
        """Hand the posted calls to the thread (the caller is about to wait, or more
        should not be held back)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._handed += len(batch)
            self._queue.put(batch)

    def submit(
        self, fn: Callable[..., T], *args: Any, then: Callable[[], object] | None = None
    ) -> PendingCall[T]:
        """Queue ``fn(*args)`` and return at once; await the result later. Lets a handler
        keep several calls in flight (chunk k on the GPU while chunk k+1 arrives).
        ``then()`` runs on this thread right after ``fn`` returns (not when it raises),
        before the waiter is woken: a reply sent from here leaves without waiting for
        the event loop's wake-up."""
        if self._closed:
            raise RuntimeError("GPU thread is closed")
        item = _Call(fn, args, LoopWaker().call_soon, anyio.Event(), None, then)
        self.flush()  # everything posted before runs before this call
        self._handed += 1
        if self._on_work is not None:
            self._on_work(self)
        self._queue.put(item)
        return PendingCall(item)

    async def call(
        self, fn: Callable[..., T], *args: Any, then: Callable[[], object] | None = None
    ) -> T:
        """Run ``fn(*args)`` on the thread after everything submitted before; its result
        (``then`` as in :meth:`submit`).

        Cancelling the caller does not stop a call already running on the GPU: the
        result is dropped, and later calls still run in order.
        """
        return await self.submit(fn, *args, then=then).result()

    def post(
        self, fn: Callable[..., Any], *args: Any, on_error: Callable[[BaseException], None]
    ) -> None:
        """Queue ``fn(*args)`` without waiting; ``on_error`` runs on the GPU thread. It
        starts at the next :meth:`flush` (or submit), at the latest after MAX_BATCH posts."""
        if self._closed:
            raise RuntimeError("GPU thread is closed")
        self._batch.append(_Call(fn, args, None, None, on_error))
        if self._on_work is not None:
            self._on_work(self)
        if len(self._batch) >= self.MAX_BATCH:
            self.flush()

    async def close(self) -> None:
        """Finish queued work, then stop the thread (waits without blocking the loop)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._queue.put(_STOP)
        await anyio.to_thread.run_sync(self._thread.join)
