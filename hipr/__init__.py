"""hipr: use a remote GPU from Python over HIP.

``hipr.connect(url)`` (sync) and ``hipr.aconnect(url)`` (async) return a remote device
that speaks HIP: queries, memory, copies, streams, events, run-time compiled kernels,
graphs. Every failure is a :class:`HipError` carrying HIP's own error code.
"""

from hipr._version import __version__
from hipr.client import (
    AsyncGpu,
    DevicePtr,
    Event,
    Function,
    Gpu,
    Graph,
    GraphExec,
    GraphNode,
    Module,
    Stream,
    aconnect,
    connect,
)
from hipr.errors import (
    AuthError,
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
    "AuthError",
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
    "ProtocolError",
    "QuotaError",
    "SessionLostError",
    "Stream",
    "VersionMismatchError",
    "__version__",
    "aconnect",
    "connect",
]
