"""Handlers register by opcode with a decorator; each handler module owns one range.

A module of handlers declares ``OPCODE_RANGE`` (an :class:`OpcodeRange`) before its
first ``@handler``. A handler names the message it serves (``@handler(m.Malloc)``,
``hipr.protocol.messages``): whether the request may come fire-and-forget or stream its
bulk data is the declaration's, never restated here. Registering two handlers for one
opcode, an opcode outside the module's range, or one that nothing declares, raises
:class:`RegistrationError` at import: a wiring mistake must stop the worker from
starting, not surface as a wrong reply in production.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hipr.protocol.messages import Message, declared
from hipr.protocol.opcodes import Opcode, OpcodeRange, opcode_name

if TYPE_CHECKING:
    from hipr.handlers.context import Request
    from hipr.sessions.state import Session

HandlerFn = Callable[["Session", "Request"], Awaitable[Any]]
#: A handler's synchronous variant: the result now, or :data:`LATER`.
NowFn = Callable[["Session", "Request"], Any]


class _Later:
    """The type of :data:`LATER`."""

    def __repr__(self) -> str:
        return "LATER"


#: Returned by a handler's ``now`` variant that cannot answer without waiting (the GPU
#: still busy): the request then goes to the session's executor like any other.
LATER: Any = _Later()


class RegistrationError(RuntimeError):
    """A handler was wired wrongly (duplicate opcode, opcode outside its module's range)."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and what the dispatcher needs to know about it."""

    opcode: Opcode
    fn: HandlerFn
    #: May be sent with NO_REPLY (fire-and-forget); others are refused that way.
    fire_and_forget: bool
    #: Streams its request's bulk data itself (continuation DATA frames).
    streams_request: bool
    module: str
    #: A synchronous variant the worker may run right in its I/O callback when nothing
    #: else of the connection is under way (no task hand-off): it must not block, and
    #: answers :data:`LATER` when it cannot answer at once. Only requests whole in one
    #: frame reach it. Registered with :func:`answers_now`.
    now: NowFn | None = None
    #: The declaration of the request and its reply.
    message: type[Message] = Message

    @property
    def doc(self) -> str:
        """The handler's docstring, for generated protocol docs."""
        return (self.fn.__doc__ or "").strip()


class HandlerRegistry:
    """Opcode → handler."""

    def __init__(self) -> None:
        self._handlers: dict[int, HandlerSpec] = {}

    def register(
        self, message: type[Message] | Opcode, fn: HandlerFn, module_range: OpcodeRange
    ) -> None:
        """Add ``fn`` for ``message`` (or the declaration of an opcode); refuses
        duplicates, out-of-range opcodes and opcodes without a declaration."""
        where = f"{fn.__module__}.{fn.__qualname__}"
        message = _declaration(message, where)
        opcode = message.opcode
        if opcode.range is not module_range:
            raise RegistrationError(
                f"{where} registers {opcode.name} (0x{opcode.value:04x}) but its module owns "
                f"the {module_range.name} range 0x{module_range.value:02x}xx"
            )
        if (existing := self._handlers.get(opcode)) is not None:
            raise RegistrationError(
                f"{where} registers {opcode.name} (0x{opcode.value:04x}), already handled by "
                f"{existing.module}.{existing.fn.__qualname__}"
            )
        self._handlers[opcode] = HandlerSpec(
            opcode,
            fn,
            message.fire_and_forget,
            message.streams_request,
            fn.__module__,
            message=message,
        )

    def register_now(self, opcode: Opcode, fn: NowFn) -> None:
        """Add ``fn`` as the synchronous variant of ``opcode``'s registered handler."""
        spec = self._handlers.get(opcode)
        where = f"{fn.__module__}.{fn.__qualname__}"
        if spec is None:
            raise RegistrationError(f"{where} answers {opcode.name} now, which has no handler")
        if spec.now is not None:
            raise RegistrationError(f"{where} cannot answer {opcode.name} now: it already is")
        self._handlers[opcode] = replace(spec, now=fn)

    def get(self, opcode: int) -> HandlerSpec | None:
        """The handler of ``opcode``, or None for an unknown opcode."""
        return self._handlers.get(opcode)

    def specs(self) -> list[HandlerSpec]:
        """Every handler, by opcode."""
        return [self._handlers[k] for k in sorted(self._handlers)]


#: The worker's registry; handler modules fill it when imported.
REGISTRY = HandlerRegistry()


def _declaration(message: type[Message] | Opcode, where: str) -> type[Message]:
    """The declaration a handler serves: ``message`` itself, or the one of an opcode."""
    if isinstance(message, type) and issubclass(message, Message):
        if declared(message.opcode) is not message:
            raise RegistrationError(f"{where} serves {message.__name__}, which declares no opcode")
        return message
    found = declared(message)
    if found is None:
        raise RegistrationError(
            f"{where} registers {opcode_name(message)}, which hipr.protocol.messages does "
            "not declare"
        )
    return found


def handler(
    message: type[Message] | Opcode, *, registry: HandlerRegistry | None = None
) -> Callable[[HandlerFn], HandlerFn]:
    """Register the decorated coroutine as the handler of ``message`` (a declaration of
    ``hipr.protocol.messages``, or an opcode: its declaration).

    The decorated function's module must define ``OPCODE_RANGE`` first.
    """

    def decorate(fn: HandlerFn) -> HandlerFn:
        module = sys.modules.get(fn.__module__)
        module_range = getattr(module, "OPCODE_RANGE", None)
        if not isinstance(module_range, OpcodeRange):
            raise RegistrationError(
                f"{fn.__module__} must define OPCODE_RANGE (an OpcodeRange) before registering "
                f"{fn.__qualname__}"
            )
        (registry or REGISTRY).register(message, fn, module_range)
        return fn

    return decorate


def answers_now(
    message: type[Message] | Opcode, *, registry: HandlerRegistry | None = None
) -> Callable[[NowFn], NowFn]:
    """Register the decorated plain function as the synchronous variant of the handler
    of ``message`` (or an opcode; registered before it): see :attr:`HandlerSpec.now`."""
    opcode = message.opcode if isinstance(message, type) else message

    def decorate(fn: NowFn) -> NowFn:
        (registry or REGISTRY).register_now(opcode, fn)
        return fn

    return decorate
