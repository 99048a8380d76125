"""API coroutines whose sync form is one send, made without running the coroutine.

A launch, a fire-and-forget copy and a synchronize are the calls a program makes most,
and on the sync client each coroutine layer is a measurable part of their cost
(``benchmarks.pieces``). Such a method declares with :func:`sends` the request builder
that its coroutine sends too (one builder: the two forms cannot drift) and how the
blocking connection sends what it builds; :class:`~hipr.client.sync.SyncProxy` binds
that send directly. A wrapper of the method (the multi-worker client's routing) is
another function and declares nothing, so it runs its coroutine and its checks.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "_hipr_sends"


class Send(enum.Enum):
    """How the blocking connection sends a declared method's request (its method name)."""

    #: Fire-and-forget: ``post(opcode, args, data)`` from the builder's triple.
    POST = "post"
    #: A synchronize: ``wait_for_reply(opcode, args, data)``; an error reply raises.
    WAIT = "wait_for_reply"
    #: A kernel launch: ``post_launch(plan, bytes)`` from the builder's pair.
    LAUNCH = "post_launch"


def sends(how: Send, builder: Callable[..., Any]) -> Callable[[F], F]:
    """Declare that the decorated coroutine method only sends what ``builder`` (a method
    of the same class, taking the same arguments) returns, ``how`` says which way."""

    def mark(method: F) -> F:
        setattr(method, _MARK, (how, builder))
        return method

    return mark


def declared_send(method: Any) -> tuple[Send, Callable[..., Any]] | None:
    """What :func:`sends` declared of ``method`` (a function or a bound method), if any."""
    found: tuple[Send, Callable[..., Any]] | None = getattr(method, _MARK, None)
    return found
