"""hip-python's ``hip`` module over a hipr worker: change ``from hip import hip`` to
``from hipr import hip`` and a hip-python program runs on a remote GPU.

Every call returns hip-python's tuple, ``hipError_t`` first. The first call connects to
``$HIPR_URL`` (default ``tcp://127.0.0.1:18515``) with ``$HIPR_TOKEN``; :func:`connect`
chooses explicitly. :data:`SUPPORTED` lists the served functions; hip-python's other
functions return ``hipErrorNotSupported``. See docs/hip-facade.md.
"""

from __future__ import annotations

from typing import Any

from hipr.facade import hip_names as _names
from hipr.facade.enums import (
    hipDeviceAttribute_t,
    hipError_t,
    hipMemcpyKind,
    hipStreamCaptureMode,
    hipStreamCaptureStatus,
)
from hipr.facade.hip_api import (
    HIP_API as _API,
)
from hipr.facade.hip_api import (
    hipGraphExec,
    ihipEvent_t,
    ihipGraph,
    ihipModule_t,
    ihipModuleSymbol_t,
    ihipStream_t,
)
from hipr.facade.launch import (
    HIP_LAUNCH_PARAM_BUFFER_POINTER,
    HIP_LAUNCH_PARAM_BUFFER_SIZE,
    HIP_LAUNCH_PARAM_END,
)
from hipr.facade.pointer import DeviceArray
from hipr.facade.props import dim3, hipDeviceProp_t
from hipr.facade.session import connect, disconnect, last_error_message

#: The served function names of ``hipr.hip`` and ``hipr.hiprtc``.
SUPPORTED: tuple[str, ...] = _names.SUPPORTED

globals().update(_API)

__all__ = [
    "HIP_LAUNCH_PARAM_BUFFER_POINTER",
    "HIP_LAUNCH_PARAM_BUFFER_SIZE",
    "HIP_LAUNCH_PARAM_END",
    "SUPPORTED",
    "DeviceArray",
    "connect",
    "dim3",
    "disconnect",
    "hipDeviceAttribute_t",
    "hipDeviceProp_t",
    "hipError_t",
    "hipGraphExec",
    "hipMemcpyKind",
    "hipStreamCaptureMode",
    "hipStreamCaptureStatus",
    "ihipEvent_t",
    "ihipGraph",
    "ihipModuleSymbol_t",
    "ihipModule_t",
    "ihipStream_t",
    "last_error_message",
    *_API,
]


def __getattr__(name: str) -> Any:
    """hip-python's other names: enums, constants, and functions returning
    hipErrorNotSupported (see :mod:`hipr.facade.hip_names`)."""
    value = _names.resolve("hip", name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_names.names("hip")})
