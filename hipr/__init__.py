"""hipr: use a remote GPU from Python over HIP.

``hipr.connect(url)`` (sync) and ``hipr.aconnect(url)`` (async) return a remote device
that speaks HIP: queries, memory, copies, streams, events, run-time compiled kernels,
graphs. Every failure is a :class:`HipError` carrying HIP's own error code. Several
URLs (a list, or commas) give one client over all their workers' devices, and
:func:`pick_device` chooses a device for new work.
"""

from hipr._version import __version__
from hipr.client import (
    AsyncGpu,
    AsyncMultiGpu,
    DeviceLoad,
    DevicePtr,
    Event,
    Function,
    Gpu,
    Graph,
    GraphExec,
    GraphNode,
    Module,
    MultiGpu,
    Stream,
    aconnect,
    apick_device,
    connect,
    pick_device,
)
from hipr.errors import (
    AuthError,
    ContextLostError,
    HipConnectionError,
    HipError,
    HipErrorCode,
    HipTimeoutError,
    ProtocolError,
    QuotaError,
    SessionLostError,
    VersionMismatchError,
)
from hipr.observability import log as _log  # noqa: F401  (logging that never raises, even unconfigured)

__all__ = [
    "AsyncGpu",
    "AsyncMultiGpu",
    "AuthError",
    "ContextLostError",
    "DeviceLoad",
    "DevicePtr",
    "Event",
    "Function",
    "Gpu",
    "Graph",
    "GraphExec",
    "GraphNode",
    "HipConnectionError",
    "HipError",
    "HipErrorCode",
    "HipTimeoutError",
    "Module",
    "MultiGpu",
    "ProtocolError",
    "QuotaError",
    "SessionLostError",
    "Stream",
    "VersionMismatchError",
    "__version__",
    "aconnect",
    "apick_device",
    "connect",
    "pick_device",
]
