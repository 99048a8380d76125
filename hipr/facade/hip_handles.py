"""hip-python's handle types (``ihipStream_t`` and the rest) around hipr's client
handles, and unwrapping them with hipErrorInvalidHandle for anything else."""

from __future__ import annotations

from typing import Any

from hipr.errors import HipError, HipErrorCode


class HandleBox:
    """A hip-python style handle around the hipr client handle it stands for."""

    __slots__ = ("_h",)

    def __init__(self, handle: Any) -> None:
        self._h = handle

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._h!r}>"

    def __int__(self) -> int:
        return int(getattr(self._h, "id", 0))


class ihipStream_t(HandleBox):  # hip-python's name
    """A stream (``hipStreamCreate``); ``None`` or ``0`` is the default stream."""

    __slots__ = ()


class ihipEvent_t(HandleBox):  # hip-python's name
    """An event (``hipEventCreate``)."""

    __slots__ = ()


class ihipModule_t(HandleBox):  # hip-python's name
    """A loaded code object (``hipModuleLoadData``)."""

    __slots__ = ()


class ihipModuleSymbol_t(HandleBox):  # hip-python's name
    """A kernel of a module (``hipModuleGetFunction``)."""

    __slots__ = ()


class ihipGraph(HandleBox):  # hip-python's name
    """A graph (``hipStreamEndCapture``, ``hipGraphCreate``)."""

    __slots__ = ()


class hipGraphExec(HandleBox):  # hip-python's name
    """An instantiated graph (``hipGraphInstantiate``)."""

    __slots__ = ()


def unbox(obj: Any, cls: type[HandleBox], what: str) -> Any:
    """The hipr handle inside ``obj``, or hipErrorInvalidHandle when it is not a ``cls``."""
    if isinstance(obj, cls):
        return obj._h
    raise HipError(
        HipErrorCode.hipErrorInvalidHandle, f"expected a {what}, got {type(obj).__name__}"
    )


def unbox_stream(stream: Any) -> Any:
    """The hipr stream of ``stream``; None for the default stream (None or 0)."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return None
    return unbox(stream, ihipStream_t, "stream (ihipStream_t)")
