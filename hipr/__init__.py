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
    InvalidUrlError,
    ProtocolError,
    QuotaError,
    RunawayKernelError,
    SessionLostError,
    UsageError,
    VersionMismatchError,
)
from hipr.observability.log import log_to_stderr  # also: the library's quiet default

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
    "InvalidUrlError",
    "Module",
    "MultiGpu",
    "ProtocolError",
    "QuotaError",
    "RunawayKernelError",
    "SessionLostError",
    "Stream",
    "UsageError",
    "VersionMismatchError",
    "__version__",
    "aconnect",
    "apick_device",
    "connect",
    "log_to_stderr",
    "pick_device",
]
