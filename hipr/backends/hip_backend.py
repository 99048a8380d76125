"""The hip backend: AMD GPUs through hip-python (``hip.hip`` and ``hip.hiprtc``).

A declaration: :class:`~hipr.backends.gpu.GpuBackend` (the logic, shared with the cuda
backend, which is where it is tested on real GPUs) over
:class:`~hipr.backends._runtime_hip.HipRuntime` (what HIP calls things, hiprtc).
"""

from __future__ import annotations

from typing import Any

from hipr.backends._runtime_hip import HipRuntime, hiprtc_options
from hipr.backends.gpu import GpuBackend

__all__ = ["HipBackend", "hiprtc_options"]


class HipBackend(GpuBackend):
    """:class:`~hipr.backends.interface.Backend` over HIP.

    ``_hip``/``_hiprtc`` replace the hip-python modules; tests use them to run this
    class without ROCm."""

    def __init__(self, *, _hip: Any = None, _hiprtc: Any = None) -> None:
        super().__init__(HipRuntime(_hip, _hiprtc))
