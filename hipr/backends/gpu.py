"""One GPU backend over two runtimes: the logic of the cuda and hip backends, once.

:class:`GpuBackend` implements :class:`~hipr.backends.interface.Backend`: argument checks,
handle wrappers and their ledger, pinned staging of asynchronous copies, captures and
graphs, launches with packed arguments, the compile cache, error mapping and stats.
It calls the GPU only through a :class:`Runtime`: the functions and flags named in
:mod:`hipr.backends._callmap`, and a small adapter for the few places where the two
runtimes differ in shape (probing the driver, binding a thread, device properties,
graph node parameter blocks, how a compiled program is read back).
:mod:`~hipr.backends._runtime_cuda` drives cuda-bindings' driver API and NVRTC, as HIP
itself does on NVIDIA; :mod:`~hipr.backends._runtime_hip` drives hip-python. A fix made
here lands on both, and the CUDA machines test it for both.

Choices worth knowing:

* **Current device.** A session thread binds a device with :meth:`GpuBackend.bind_thread`
  (on CUDA: makes the device's primary context current, retained once); a thread that
  never bound gets device 0 on its first call, as HIP does.
* **Streams.** ``stream=None`` is the *per-thread* default stream, not the legacy NULL
  stream. All sessions share one context per device, and the legacy stream would order
  one tenant's work behind every other tenant's blocking streams (and invalidate their
  graph captures). Since each session runs on its own thread, the per-thread stream is
  that session's own default stream. Streams are created non-blocking for the same
  reason. "Synchronous" calls are async calls on that stream plus a synchronise, so
  nothing ever touches the legacy stream.
* **Async host-to-device copies** go through a pinned staging buffer
  (:class:`~hipr.backends._pinned.PinnedStaging`): the caller's buffer may be
  reused as soon as the call returns, the copy stays asynchronous, and it can be
  captured into a graph (the graph then keeps the pinned buffer until it and all its
  instantiations are destroyed and their launches have finished). Copies over 64 MiB
  outside a capture are issued from the caller's buffer and the stream is synchronised.
* **Captures** run in relaxed mode: sessions of other tenants keep allocating and
  freeing on their threads while one session captures.
* **Launches** pass the client's packed argument bytes through the driver API's
  ``extra`` array (buffer pointer, buffer size, end), never re-laid out.
* ``malloc(0)`` returns 0 and ``free(0)`` does nothing, as hipMalloc/hipFree do.
"""

from __future__ import annotations

from hipr.backends._gpu_graphs import GpuGraphs
from hipr.backends._gpu_memory import GpuMemory
from hipr.backends._gpu_streams import GpuStreams
from hipr.backends._runtime import Runtime, RuntimeBase, import_bindings

__all__ = ["GpuBackend", "Runtime", "RuntimeBase", "import_bindings"]


class GpuBackend(GpuMemory, GpuStreams, GpuGraphs):
    """:class:`~hipr.backends.interface.Backend` over one :class:`Runtime` (see module doc):
    the core (:class:`~hipr.backends._gpu_core.GpuCore`) with memory, streams and
    events, kernels and graphs (graphs build on kernels: a kernel node's arguments)."""
