"""The facade's one session per process, and the calling convention every function follows.

Like the HIP runtime's implicit context, the first call connects, to ``$HIPR_URL``
(default ``tcp://127.0.0.1:18515``) with ``$HIPR_TOKEN``, and every thread shares that
session; :func:`connect` chooses explicitly. A failure never escapes as a Python exception:
:func:`hip_call` turns a :class:`~hipr.errors.HipError` (a lost worker included) into the
error enum at the head of the result tuple, as hip-python returns it, and remembers it for
``hipGetLastError``. The message behind the code is kept too (:func:`last_error_message`).
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hipr.client import connect as _client_connect
from hipr.client.api import DEFAULT_URL
from hipr.errors import HipConnectionError, HipError

F = TypeVar("F", bound=Callable[..., tuple[Any, ...]])

_lock = threading.Lock()
#: The client session (``hipr.connect``'s object; typed loosely because the client may
#: return a multi-worker variant with the same methods).
Gpu = Any
_gpu: Gpu | None = None
_state = threading.local()


def connect(url: str | None = None, *, token: str | None = None, **options: Any) -> Gpu:
    """Connect the facade to ``url`` (default ``$HIPR_URL``, else ``tcp://127.0.0.1:18515``)
    with ``token`` (default ``$HIPR_TOKEN``); a session the facade held is closed first.
    ``options`` go to :func:`hipr.connect` (``timeout=``, ``link=``, transport options).
    Returns the :class:`hipr.Gpu` behind the facade, usable alongside it."""
    global _gpu
    url = url or os.environ.get("HIPR_URL") or DEFAULT_URL
    if token is None:
        token = os.environ.get("HIPR_TOKEN")
    with _lock:
        old, _gpu = _gpu, None
        if old is not None:
            _close_quietly(old)
        try:
            _gpu = _client_connect(url, token=token, **options)
        except HipError:
            raise
        except Exception as exc:  # a refused or unreachable link, whatever raised it
            raise HipConnectionError(message=f"cannot reach a hipr worker at {url}: {exc}") from exc
        return _gpu


def disconnect() -> None:
    """End the facade's session (its memory, streams and modules are freed by the worker).
    The next call connects again."""
    global _gpu
    with _lock:
        old, _gpu = _gpu, None
    if old is not None:
        _close_quietly(old)


def _close_quietly(gpu: Gpu) -> None:
    try:
        gpu.close()
    except Exception:  # the worker may be gone already; the session is over either way
        pass


def gpu() -> Gpu:
    """The session, connected on first use."""
    current = _gpu
    if current is not None:
        return current
    with _lock:
        if _gpu is not None:
            return _gpu
    return connect()


def current() -> Gpu | None:
    """The session if one is open, without connecting."""
    return _gpu


atexit.register(disconnect)


# --- the calling convention -------------------------------------------------------------


def set_last_error(code: Any, message: str) -> None:
    """Remember a failure for hipGetLastError / hipPeekAtLastError (per thread, as HIP)."""
    _state.code = code
    _state.message = message


def peek_last_error() -> tuple[Any, str]:
    """(code, message) of this thread's last failure; (None, "") when there was none."""
    return getattr(_state, "code", None), getattr(_state, "message", "")


def last_error_message() -> str:
    """The message behind this thread's last failing call ("" when none failed): what the
    error enum alone cannot say, e.g. which unsupported function was called."""
    return peek_last_error()[1]


def clear_last_error() -> None:
    """Forget this thread's last failure (hipGetLastError does, after reading it)."""
    _state.code = None
    _state.message = ""


def hip_call(results: int, error: Callable[[HipError], Any]) -> Callable[[F], F]:
    """Make ``fn`` follow hip-python's convention: ``fn`` returns its full success tuple
    (error enum first); a HipError it raises becomes ``(error(exc), None, ...)`` with
    ``results`` Nones, so the tuple keeps its shape and unpacking never fails."""
    tail = (None,) * results

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
            try:
                return fn(*args, **kwargs)
            except HipError as exc:
                code = error(exc)
                set_last_error(code, f"{fn.__name__}: {exc}")
                return (code, *tail)

        return call  # type: ignore[return-value]

    return decorate
