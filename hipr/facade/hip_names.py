"""What the facade serves of hip-python's names, and the answer for the rest.

A hip-python function hipr cannot serve yet still exists in ``hipr.hip``/``hipr.hiprtc``:
calling it returns ``hipErrorNotSupported`` in a tuple of hip-python's shape (its results
None), warns once naming the function, and leaves the same message for
``hipr.hip.last_error_message()``, so a program fails where it calls it, with the name,
never with an AttributeError deep inside. Enums, struct names and constants resolve too.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.facade import session
from hipr.facade.catalog import (
    HIP_CONSTANTS,
    HIP_FUNCTIONS,
    HIP_TYPES,
    HIPRTC_CONSTANTS,
    HIPRTC_FUNCTIONS,
    HIPRTC_TYPES,
)
from hipr.facade.enums import hip_enum, hip_enum_names, hipError_t, hiprtc_enum, hiprtc_enum_names
from hipr.facade.hip_api import HIP_API
from hipr.facade.rtc_api import HIPRTC_API


class NotSupportedWarning(UserWarning):
    """A program called a hip-python function that hipr does not serve."""


#: Every served name, ``hip`` and ``hiprtc`` functions together, sorted.
SUPPORTED: tuple[str, ...] = tuple(sorted([*HIP_API, *HIPRTC_API]))

_stubs: dict[str, Callable[..., tuple[Any, ...]]] = {}
_warned: set[str] = set()
_lock = threading.Lock()


def _message(module: str, name: str) -> str:
    return (
        f"{module}.{name} is not supported by hipr yet (hipErrorNotSupported); "
        "hipr.hip.SUPPORTED lists what is served"
    )


def _stub(module: str, name: str, results: int) -> Callable[..., tuple[Any, ...]]:
    message = _message(module, name)

    def not_supported(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        with _lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            warnings.warn(message, NotSupportedWarning, stacklevel=2)
        code = hipError_t.hipErrorNotSupported
        session.set_last_error(code, message)
        return (code, *(None,) * results)

    not_supported.__name__ = not_supported.__qualname__ = name
    not_supported.__doc__ = f"Not served by hipr: returns hipErrorNotSupported. ({message})"
    return not_supported


def _unsupported_type(module: str, name: str) -> type:
    message = f"{module}.{name} is not supported by hipr yet"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise HipError(HipErrorCode.hipErrorNotSupported, message)

    return type(name, (), {"__init__": __init__, "__doc__": message + "."})


def resolve(module: str, name: str) -> Any:
    """``hipr.hip``'s / ``hipr.hiprtc``'s answer for a name not defined in the module: an
    enum, a constant, a struct type that refuses construction, or a function returning
    hipErrorNotSupported. AttributeError for names hip-python does not have either."""
    is_hip = module == "hip"
    functions = HIP_FUNCTIONS if is_hip else HIPRTC_FUNCTIONS
    enum_names = hip_enum_names() if is_hip else hiprtc_enum_names()
    if name in enum_names:
        return hip_enum(name) if is_hip else hiprtc_enum(name)
    constants = HIP_CONSTANTS if is_hip else HIPRTC_CONSTANTS
    if name in constants:
        return constants[name]
    key = f"{module}.{name}"
    if name in functions:
        with _lock:
            stub = _stubs.get(key)
            if stub is None:
                stub = _stubs[key] = _stub(f"hipr.{module}", name, functions[name])
        return stub
    if name in (HIP_TYPES if is_hip else HIPRTC_TYPES):
        with _lock:
            cls = _stubs.get(key)
            if cls is None:
                cls = _stubs[key] = _unsupported_type(f"hipr.{module}", name)  # type: ignore[assignment]
        return cls
    raise AttributeError(f"module 'hipr.{module}' has no attribute {name!r}")


def names(module: str) -> list[str]:
    """Every hip-python name of ``module`` (for ``dir()``)."""
    if module == "hip":
        return sorted({*HIP_FUNCTIONS, *HIP_TYPES, *HIP_CONSTANTS, *hip_enum_names()})
    return sorted({*HIPRTC_FUNCTIONS, *HIPRTC_TYPES, *HIPRTC_CONSTANTS, *hiprtc_enum_names()})


def coverage_rows() -> list[tuple[str, str, bool]]:
    """(module, function, served) for every function of hip-python's ``hip`` and ``hiprtc``."""
    rows = [("hip", n, n in HIP_API) for n in sorted(HIP_FUNCTIONS)]
    rows += [("hiprtc", n, n in HIPRTC_API) for n in sorted(HIPRTC_FUNCTIONS)]
    return rows


def coverage_markdown() -> str:
    """``docs/hip-facade.md``: the coverage table against hip-python's function list."""
    rows = coverage_rows()
    served = [r for r in rows if r[2]]
    lines = [
        "# `hipr.hip` and `hipr.hiprtc`: coverage of hip-python",
        "",
        "`from hipr import hip, hiprtc` gives hip-python's names, enums and calling convention "
        'over a hipr worker (see docs/guide.md, "Running hip-python programs remotely"). This '
        "page lists every function of hip-python's `hip` and `hiprtc` modules and whether "
        "hipr serves it. A function not served exists all the same: it returns "
        "`hipErrorNotSupported` (its other results None), warns once with its name, and "
        "`hipr.hip.last_error_message()` names it. `hipr.hip.SUPPORTED` is the served list.",
        "",
        f"**Served: {len(served)} of {len(rows)} functions** "
        f"({sum(1 for r in served if r[0] == 'hip')} of "
        f"{sum(1 for r in rows if r[0] == 'hip')} in `hip`, "
        f"{sum(1 for r in served if r[0] == 'hiprtc')} of "
        f"{sum(1 for r in rows if r[0] == 'hiprtc')} in `hiprtc`). All "
        f"{len(hip_enum_names()) + len(hiprtc_enum_names())} enums resolve with hip-python's "
        "members and values.",
        "",
        "## Served",
        "",
        "| module | function | notes |",
        "|---|---|---|",
    ]
    for module, name, _ in served:
        api = HIP_API if module == "hip" else HIPRTC_API
        doc = (api[name].__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(doc.split()).replace("|", "\\|")
        lines.append(f"| `{module}` | `{name}` | {doc} |")
    lines += ["", "## Not served (return `hipErrorNotSupported`)", ""]
    for module in ("hip", "hiprtc"):
        missing = [n for m, n, ok in rows if m == module and not ok]
        lines.append(f"`{module}` ({len(missing)}): " + ", ".join(f"`{n}`" for n in missing))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
