"""The synchronous client: the async API run on a private event loop thread.

``hipr.connect(url)`` returns an object with exactly the async API's names; each call
runs the coroutine on a background event loop (an anyio blocking portal) and returns
its result. Handles come back wrapped the same way, so ``s.synchronize()`` works on a
stream from ``gpu.stream_create()``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from hipr.client.api import DEFAULT_URL, AsyncGpu, aconnect
from hipr.client.objects import _Handle

#: The event loop behind the sync API.
SYNC_LOOP = "asyncio"


def _unwrap(value: Any) -> Any:
    if isinstance(value, SyncProxy):
        return value._target
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    return value


class SyncProxy:
    """Wraps an async API object; its coroutine methods become blocking calls."""

    def __init__(self, target: Any, portal: BlockingPortal) -> None:
        self._target = target
        self._portal = portal

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        portal = self._portal

        def call(*args: Any, **kwargs: Any) -> Any:
            result = portal.call(
                _call_with,
                attr,
                [_unwrap(a) for a in args],
                {k: _unwrap(v) for k, v in kwargs.items()},
            )
            return SyncProxy(result, portal) if isinstance(result, _Handle) else result

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call

    def __repr__(self) -> str:
        return repr(self._target)

    def __eq__(self, other: object) -> bool:
        return bool(_unwrap(other) == self._target)

    def __hash__(self) -> int:
        return hash(self._target)


async def _call_with(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    return await fn(*args, **kwargs)


class Gpu(SyncProxy):
    """A remote device for synchronous code; use as a context manager or ``close()``."""

    def __init__(self, url: str = DEFAULT_URL, **options: Any) -> None:
        self._stack = contextlib.ExitStack()
        try:
            portal = self._stack.enter_context(start_blocking_portal(SYNC_LOOP))
            gpu: AsyncGpu = self._stack.enter_context(
                portal.wrap_async_context_manager(aconnect(url, **options))
            )
        except BaseException:
            self._stack.close()
            raise
        super().__init__(gpu, portal)

    def close(self) -> None:
        """End the session and stop the background loop."""
        self._stack.close()

    def __enter__(self) -> Gpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(url: str = DEFAULT_URL, **options: Any) -> Gpu:
    """Connect to a worker from synchronous code: ``with hipr.connect(url) as gpu: ...``.

    Takes the same options as :func:`hipr.aconnect` (``token=``, ``timeout=``, transport
    options).
    """
    return Gpu(url, **options)
