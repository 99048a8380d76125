"""hip-python's enums, rebuilt from :mod:`hipr.facade.catalog` as :class:`enum.IntEnum`
classes with the same names, members and values (``hip.hipError_t.hipSuccess``,
``hiprtc.hiprtcResult.HIPRTC_SUCCESS``), so results compare and print as they do there."""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import Any

from hipr.facade.catalog import HIP_ENUM_ROWS, HIPRTC_ENUM_ROWS


def _parse(rows: tuple[str, ...]) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for row in rows:
        enum_name, member, value = row.split(" ")
        out.setdefault(enum_name, []).append((member, int(value)))
    return out


_HIP_ROWS = _parse(HIP_ENUM_ROWS)
_HIPRTC_ROWS = _parse(HIPRTC_ENUM_ROWS)
_built: dict[str, Any] = {}
_lock = threading.Lock()


def _make(name: str, members: list[tuple[str, int]], module: str) -> Any:
    return IntEnum(name, members, module=module)  # type: ignore[misc]


def _build(name: str, rows: dict[str, list[tuple[str, int]]], module: str) -> Any:
    with _lock:
        built: Any = _built.get(f"{module}.{name}")
        if built is None:
            # Members sharing a value become aliases, as in hip-python (hipDeviceAttribute_t).
            built = _make(name, rows[name], module)
            _built[f"{module}.{name}"] = built
        return built


def hip_enum_names() -> list[str]:
    """Every enum of hip-python's ``hip`` module."""
    return list(_HIP_ROWS)


def hiprtc_enum_names() -> list[str]:
    """Every enum of hip-python's ``hiprtc`` module."""
    return list(_HIPRTC_ROWS)


def hip_enum(name: str) -> Any:
    """The ``hip`` enum class ``name`` (built once, on first use); KeyError if unknown."""
    return _build(name, _HIP_ROWS, "hipr.hip")


def hiprtc_enum(name: str) -> Any:
    """The ``hiprtc`` enum class ``name`` (built once, on first use); KeyError if unknown."""
    return _build(name, _HIPRTC_ROWS, "hipr.hiprtc")


# The enums every program meets are built at import; the other ~80 when first named.
hipError_t: Any = hip_enum("hipError_t")
hipMemcpyKind: Any = hip_enum("hipMemcpyKind")
hipDeviceAttribute_t: Any = hip_enum("hipDeviceAttribute_t")
hipStreamCaptureMode: Any = hip_enum("hipStreamCaptureMode")
hipStreamCaptureStatus: Any = hip_enum("hipStreamCaptureStatus")
hiprtcResult: Any = hiprtc_enum("hiprtcResult")

hipSuccess: Any = hipError_t.hipSuccess
HIPRTC_SUCCESS: Any = hiprtcResult.HIPRTC_SUCCESS


def hip_error(code: int) -> Any:
    """``hipError_t(code)``, or ``hipErrorUnknown`` for a value HIP lacks."""
    try:
        return hipError_t(code)
    except ValueError:
        return hipError_t.hipErrorUnknown
