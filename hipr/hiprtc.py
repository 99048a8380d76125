"""hip-python's ``hiprtc`` module over a hipr worker: programs compile on the worker's GPU
(``from hipr import hip, hiprtc``). Results are ``hiprtcResult`` first, as in hip-python;
functions hipr does not serve return ``hip.hipError_t.hipErrorNotSupported``."""

from __future__ import annotations

from typing import Any

from hipr.facade import hip_names as _names
from hipr.facade.enums import HIPRTC_SUCCESS, hiprtcResult
from hipr.facade.rtc_api import HIPRTC_API as _API
from hipr.facade.rtc_api import hiprtcProgram

globals().update(_API)

__all__ = ["HIPRTC_SUCCESS", "hiprtcProgram", "hiprtcResult", *_API]


def __getattr__(name: str) -> Any:
    """hip-python's other hiprtc names (enums; functions returning hipErrorNotSupported)."""
    value = _names.resolve("hiprtc", name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_names.names("hiprtc")})
