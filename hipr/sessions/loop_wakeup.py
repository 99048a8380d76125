"""Waking a task of the running event loop, in the loop's own terms (asyncio or trio).

anyio's portable primitives look their backend up on every creation and wait (about
5 µs of each small request on the worker); the worker's per-request wake-ups use the
loop's own: a future or a trio event from the loop itself, ``call_soon_threadsafe`` or
a trio token from another thread (a session's GPU thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import sniffio

__all__ = ["LoopWaker", "OneShot"]


class OneShot:
    """A one-shot wake-up of the task that waits on it: an asyncio future or a trio event."""

    __slots__ = ("_fire", "_wait")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """``loop``: the running asyncio loop, or None under trio (``LoopWaker.asyncio_loop``)."""
        if loop is None:
            import trio

            event = trio.Event()
            self._fire: Callable[[], object] = event.set
            self._wait: Callable[[], Awaitable[object]] = event.wait
        else:
            future = loop.create_future()

            def fire() -> None:
                if not future.done():
                    future.set_result(None)

            self._fire = fire
            self._wait = lambda: future

    def set(self) -> None:
        """Wake the waiter (again: no effect)."""
        self._fire()

    async def wait(self) -> None:
        """Until :meth:`set` (at once if it was)."""
        await self._wait()


class LoopWaker:
    """The running event loop, looked up once (create it on the loop): what wakes one of
    its tasks, from the loop (:meth:`one_shot`) or from another thread (:attr:`call_soon`)."""

    __slots__ = ("asyncio_loop", "call_soon")

    def __init__(self) -> None:
        if sniffio.current_async_library() == "trio":
            import trio

            #: The running asyncio loop, or None under trio.
            self.asyncio_loop: asyncio.AbstractEventLoop | None = None
            #: Thread-safe: run a callback on the loop soon.
            self.call_soon: Callable[[Callable[[], object]], object] = (
                trio.lowlevel.current_trio_token().run_sync_soon
            )
        else:
            loop = asyncio.get_running_loop()
            self.asyncio_loop = loop
            self.call_soon = loop.call_soon_threadsafe

    def one_shot(self) -> OneShot:
        """A fresh one-shot wake-up of a task of this loop."""
        return OneShot(self.asyncio_loop)
