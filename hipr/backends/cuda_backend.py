"""The cuda backend: NVIDIA GPUs through cuda-bindings' driver API and NVRTC.

A declaration: :class:`~hipr.backends.gpu.GpuBackend` (the logic, shared with the hip
backend, and its choices: per-thread default streams, non-blocking streams, pinned
staging of async copies, relaxed captures) over
:class:`~hipr.backends._runtime_cuda.CudaRuntime` (what CUDA calls things, HIP's error
translation, NVRTC with a HIP prelude).
"""

from __future__ import annotations

from typing import Any

from hipr.backends._runtime_cuda import (
    HIP_PRELUDE,
    PRELUDE_INCLUDE_NAMES,
    CudaRuntime,
    nvrtc_options,
)
from hipr.backends.gpu import GpuBackend

__all__ = ["HIP_PRELUDE", "PRELUDE_INCLUDE_NAMES", "CudaBackend", "nvrtc_options"]


class CudaBackend(GpuBackend):
    """:class:`~hipr.backends.interface.Backend` over the CUDA driver API.

    ``_driver``/``_nvrtc`` replace cuda-bindings' modules; tests use them to run this
    class without an NVIDIA driver."""

    def __init__(self, *, _driver: Any = None, _nvrtc: Any = None) -> None:
        super().__init__(CudaRuntime(_driver, _nvrtc))
