"""The served hip-python functions, by name: each registered with hip-python's result
count and calling convention (:func:`hipr.facade.session.hip_call`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hipr.errors import HipError
from hipr.facade import session
from hipr.facade.catalog import HIP_FUNCTIONS
from hipr.facade.enums import hip_error

#: Every served function, by name.
HIP_API: dict[str, Callable[..., tuple[Any, ...]]] = {}


def _hip_error(exc: HipError) -> Any:
    return hip_error(exc.code)


def served(fn: Callable[..., tuple[Any, ...]]) -> Any:
    """Register ``fn`` under its name with hip-python's result count for it."""
    wrapped = session.hip_call(HIP_FUNCTIONS.get(fn.__name__, 0), _hip_error)(fn)
    HIP_API[fn.__name__] = wrapped
    return wrapped
