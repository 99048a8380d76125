"""``timeout=`` on every public client call, added in one place.

A call that passes its timeout raises :class:`HipTimeoutError` and the session stays
usable: sending is shielded from cancellation (see ``ClientConnection._submit``), so a
timeout only ever abandons the wait for the reply. On the async client the whole call
runs under an anyio deadline; on the blocking one (no event loop) the deadline goes to
every request the call makes through :data:`~hipr.client.link.DEADLINE`.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio

from hipr.client.link import DEADLINE
from hipr.errors import HipTimeoutError

C = TypeVar("C", bound=type)


@contextmanager
def time_limit(name: str, timeout: float | None, inline: bool) -> Iterator[None]:
    """Bound a whole call of several requests by ``timeout`` seconds (None: no bound):
    through :data:`DEADLINE` where its coroutines run inline on a blocking connection
    (no event loop), else as an anyio deadline. Raises HipTimeoutError naming ``name``."""
    if timeout is None:
        yield
        return
    if inline:
        token = DEADLINE.set(time.monotonic() + timeout)
        try:
            yield
        except HipTimeoutError:
            raise HipTimeoutError(message=f"{name} did not complete within {timeout} s") from None
        finally:
            DEADLINE.reset(token)
        return
    try:
        with anyio.fail_after(timeout):
            yield
    except TimeoutError:
        raise HipTimeoutError(message=f"{name} did not complete within {timeout} s") from None


def _timed(name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(*args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        if timeout is None:
            return await method(*args, **kwargs)
        with time_limit(name, timeout, _runs_inline(args[0])):
            return await method(*args, **kwargs)

    return call


def _runs_inline(owner: Any) -> bool:
    """True when ``owner`` (an API object or a handle) talks over a blocking connection."""
    gpu = getattr(owner, "_gpu", owner)
    return bool(getattr(getattr(gpu, "_conn", None), "inline", False))


def with_timeouts(cls: C) -> C:
    """Give every public coroutine method of ``cls`` an optional ``timeout=`` (seconds)."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _timed(f"{cls.__name__}.{name}", member))
    return cls
