"""The launch and the stream query, called straight into the driver library through
ctypes instead of through its Python bindings.

A fused tiny launch + synchronize spends two runtime calls on the worker: the launch,
then stream queries until the kernel is seen done. Through cuda-bindings they cost
~11 µs and ~3 µs a query on an H200 host, where the driver's own work is ~2 µs and
well under 1 µs (``benchmarks.proxy.stages``, docs/gpu-runs/2026-11-26-h200-proxy-
stages.txt): the bindings convert and check every argument and build a result tuple.
These two calls take only integers (handles, dimensions, the ``extra`` array's
address), so a ctypes function with fixed argument types does the same call for a
fraction of that. Everything else keeps going through the bindings.

Only a library the bindings already loaded is used (``RTLD_NOLOAD``), so both paths
call the same driver; where it is not loaded, or lacks the symbols, there are no
direct calls and the bindings serve as before.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DirectCalls", "load_direct_calls"]

_P = ctypes.c_void_p
_U = ctypes.c_uint


@dataclass(frozen=True)
class DirectCalls:
    """The driver's launch and stream query as plain functions returning the result
    code (an ``int``): ``launch(function, gx, gy, gz, bx, by, bz, shared_mem, stream,
    kernel_params, extra)`` with handles as addresses, ``stream_query(stream)``."""

    launch: Callable[..., int]
    stream_query: Callable[[int | None], int]


def load_direct_calls(library: str, launch: str, stream_query: str) -> DirectCalls | None:
    """``library``'s ``launch`` (the driver API's ``cuLaunchKernel`` signature) and
    ``stream_query``, if the library is already loaded in this process and has them;
    else None."""
    try:
        lib = ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        launch_fn = getattr(lib, launch)
        query_fn = getattr(lib, stream_query)
    except (OSError, AttributeError):
        return None
    # cuLaunchKernel(CUfunction, 3 x grid, 3 x block, sharedMemBytes, CUstream,
    # void** kernelParams, void** extra); hipModuleLaunchKernel has the same shape.
    launch_fn.argtypes = (_P, _U, _U, _U, _U, _U, _U, _U, _P, _P, _P)
    launch_fn.restype = ctypes.c_int
    query_fn.argtypes = (_P,)
    query_fn.restype = ctypes.c_int
    return DirectCalls(launch=launch_fn, stream_query=query_fn)
