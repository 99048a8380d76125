"""The hip backend: AMD GPUs through hip-python (``hip.hip`` and ``hip.hiprtc``).

A method-for-method mirror of :mod:`hipr.backends.cuda`, with the same choices (see
that module's docstring): ``stream=None`` is ``hipStreamPerThread``, streams are
created non-blocking, "synchronous" calls are async on that stream plus a
synchronise, async host-to-device copies go through pinned staging buffers, captures
run in relaxed mode, and launches pass the packed argument bytes through
``extra`` (``HIP_LAUNCH_PARAM_BUFFER_POINTER``/``..._SIZE``/``..._END``).

Every hip-python call returns ``(hipError_t, outputs...)``; :meth:`HipBackend._hip_call`
turns any failure into :class:`~hipr.errors.HipError` with the same code. Without
ROCm, hip-python imports fine and its first call raises ``RuntimeError: failed to
dlopen 'libamdhip64.so'``; the constructor probes with ``hipGetDeviceCount`` and turns
that into :class:`~hipr.backends.BackendUnavailable`.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from hipr.backends import BackendUnavailable
from hipr.backends._gpu_common import (
    CodeCache,
    GpuEvent,
    GpuGraph,
    GpuGraphExec,
    GpuModule,
    GpuStream,
    HostRefs,
    LaunchExtra,
    Ledger,
    PinnedBlock,
    PinnedStaging,
    check_dims,
    cstr,
    host_address,
    live,
    release_refs,
)
from hipr.backends.base import BackendStats, DeviceProperties, Dim3, Handle
from hipr.backends.errmap import hip_error_name, rtc_error
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.builtins import BUILTIN_SOURCE

E = HipErrorCode

_LIBHIP = "libamdhip64.so"
_HIP_SUCCESS = 0
_HIP_NOT_READY = int(E.hipErrorNotReady)
#: ``hipStreamPerThread`` is ``(hipStream_t)2`` in HIP's headers; hip-python has no name.
_STREAM_PER_THREAD = 2


def hiprtc_options(options: Sequence[str], arch: str) -> list[str]:
    """The hiprtc options: the user's, ``--offload-arch=<gcnArchName>`` first unless
    they chose a target; an NVIDIA target is refused."""
    out: list[str] = []
    has_arch = False
    for opt in options:
        if opt.startswith(("--gpu-architecture", "-arch")) or (
            opt.startswith("--offload-arch=")
            and opt.split("=", 1)[1].startswith(("sm_", "compute_"))
        ):
            raise HipError(
                E.hipErrorInvalidValue,
                f"{opt} names a target this worker's AMD GPU ({arch}) cannot run",
            )
        if opt.startswith("--offload-arch"):
            has_arch = True
        out.append(opt)
    if not has_arch:
        out.insert(0, f"--offload-arch={arch}")
    return out


def _import_hip() -> tuple[Any, Any]:
    """(hip, hiprtc) modules of hip-python, or BackendUnavailable."""
    try:
        from hip import hip, hiprtc
    except ImportError as exc:
        raise BackendUnavailable(
            E.hipErrorInsufficientDriver,
            f"hip backend unavailable: the hip-python package is not installed "
            f"(pip install 'hipr[hip]'): {exc}",
            library="hip-python",
        ) from exc
    return hip, hiprtc


class HipBackend:
    """:class:`~hipr.backends.base.Backend` over HIP (see module doc).

    ``_hip``/``_hiprtc`` replace the hip-python modules; tests use them to run this
    class without ROCm."""

    name = "hip"

    def __init__(self, *, _hip: Any = None, _hiprtc: Any = None) -> None:
        if _hip is None:
            _hip, real_rtc = _import_hip()
            _hiprtc = _hiprtc or real_rtc
        self._hip: Any = _hip
        self._rtc: Any = _hiprtc
        try:
            result = _hip.hipGetDeviceCount()
        except (OSError, RuntimeError) as exc:
            raise BackendUnavailable(
                E.hipErrorInsufficientDriver,
                f"hip backend unavailable: could not load {_LIBHIP} ({exc})",
                library=_LIBHIP,
            ) from exc
        err = int(result[0])
        count = int(result[1]) if err == _HIP_SUCCESS else 0
        if err not in (_HIP_SUCCESS, int(E.hipErrorNoDevice)):
            code = E.hipErrorInsufficientDriver if err == 35 else E.hipErrorNoDevice
            raise BackendUnavailable(
                code,
                f"hip backend unavailable: hipGetDeviceCount in {_LIBHIP} failed with "
                f"{hip_error_name(err)} ({err})",
                library=_LIBHIP,
            )
        if count < 1:
            raise BackendUnavailable(
                E.hipErrorNoDevice,
                f"hip backend unavailable: {_LIBHIP} loaded but sees no AMD GPU",
                library=_LIBHIP,
            )
        self._count = count
        self._props: dict[int, DeviceProperties] = {}
        self._builtin: dict[int, GpuModule] = {}
        self._builtin_lock = threading.Lock()
        self._ledger = Ledger()
        self._tls = threading.local()
        self._ptds = _hip.ihipStream_t.fromObj(_STREAM_PER_THREAD)
        self._code_cache = CodeCache()
        self._staging = PinnedStaging(self)
        self._orphan_refs: list[PinnedBlock] = []
        self._bound_devices: set[int] = set()
        self._closed = False

    # --- plumbing ------------------------------------------------------------------------

    def _hip_call(self, fn: str, *args: Any) -> Any:
        """Call hip function ``fn``; a non-success result raises HipError with the same
        code; returns the outputs (None, one value, or a tuple)."""
        result = getattr(self._hip, fn)(*args)
        err = int(result[0])
        if err != _HIP_SUCCESS:
            raise HipError(err, f"{fn} failed: {hip_error_name(err)} ({err})")
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def _current(self) -> int:
        device: int | None = getattr(self._tls, "device", None)
        if device is None:
            self.bind_thread(0)
            return 0
        return device

    def _stream(self, stream: Handle | None) -> Any:
        if stream is None:
            return self._ptds
        return live(stream, GpuStream, "stream")

    def _check_device(self, device: int) -> None:
        if not isinstance(device, int) or not 0 <= device < self._count:
            raise HipError(E.hipErrorInvalidDevice, f"device {device!r} not in [0, {self._count})")

    # Staging hooks (StagingOps).
    def host_alloc(self, size: int) -> int:
        """Portable pinned host memory, for the staging pool."""
        return int(self._hip_call("hipHostMalloc", size, int(self._hip.hipHostMallocPortable)))

    def host_free(self, ptr: int) -> None:
        """Free pinned host memory of the staging pool."""
        self._hip_call("hipHostFree", ptr)

    def fence_after(self, stream: Any) -> Any:
        """A timing-free event recorded on ``stream`` now."""
        ev = self._hip_call("hipEventCreateWithFlags", int(self._hip.hipEventDisableTiming))
        try:
            self._hip_call("hipEventRecord", ev, stream)
        except HipError:
            self._hip.hipEventDestroy(ev)
            raise
        return ev

    def fence_done(self, fence: Any) -> bool:
        """Has the fence completed? Errors count as done (the work will never run)."""
        (err,) = self._hip.hipEventQuery(fence)
        return int(err) != _HIP_NOT_READY

    def fence_destroy(self, fence: Any) -> None:
        """Destroy a fence, ignoring errors."""
        self._hip.hipEventDestroy(fence)

    def _capture_refs(self, stream: Handle | None, raw: Any) -> list[PinnedBlock] | None:
        if isinstance(stream, GpuStream) and stream.capture_refs is not None:
            return stream.capture_refs
        if stream is None and getattr(self._tls, "ptds_capture", None) is not None:
            refs: list[PinnedBlock] = self._tls.ptds_capture
            return refs
        status = self._hip_call("hipStreamIsCapturing", raw)
        if int(status) == int(self._hip.hipStreamCaptureStatus.hipStreamCaptureStatusNone):
            return None
        return self._orphan_refs

    # --- devices -----------------------------------------------------------------------

    def device_count(self) -> int:
        """Visible AMD devices."""
        return self._count

    def device_properties(self, device: int) -> DeviceProperties:
        """Properties of ``device``, from hipDeviceProp_t (cached)."""
        self._check_device(device)
        cached = self._props.get(device)
        if cached is not None:
            return cached
        p = self._hip_call("hipGetDeviceProperties", device)
        bus = self._hip_call("hipDeviceGetPCIBusId", 64, device)
        props = DeviceProperties(
            name=cstr(p.name),
            arch=cstr(p.gcnArchName),
            total_memory=int(p.totalGlobalMem),
            multiprocessor_count=int(p.multiProcessorCount),
            warp_size=int(p.warpSize),
            max_threads_per_block=int(p.maxThreadsPerBlock),
            clock_rate_khz=int(p.clockRate),
            pci_bus_id=cstr(bus),
            major=int(p.major),
            minor=int(p.minor),
            max_shared_memory_per_block=int(p.sharedMemPerBlock),
        )
        self._props[device] = props
        return props

    def bind_thread(self, device: int) -> None:
        """hipSetDevice on the calling thread."""
        self._check_device(device)
        self._hip_call("hipSetDevice", device)
        self._tls.device = device
        with self._ledger.lock:
            self._bound_devices.add(device)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        self._current()
        free, total = self._hip_call("hipMemGetInfo")
        return int(free), int(total)

    def synchronize(self) -> None:
        """hipDeviceSynchronize; reports a kernel's asynchronous failure."""
        self._current()
        self._hip_call("hipDeviceSynchronize")
        self._staging.reclaim()

    # --- memory -------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """Device memory; hipErrorOutOfMemory when the device is full."""
        if size < 0:
            raise HipError(E.hipErrorInvalidValue, f"negative size {size}")
        self._current()
        if size == 0:
            return 0
        ptr = int(self._hip_call("hipMalloc", size))
        with self._ledger.lock:
            self._ledger.allocations[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        """Free a :meth:`malloc` allocation."""
        if ptr == 0:
            return
        self._current()
        self._hip_call("hipFree", ptr)
        with self._ledger.lock:
            self._ledger.allocations.pop(ptr, None)

    def memcpy_htod(self, dst: int, src: memoryview, stream: Handle | None = None) -> None:
        """Host to device; with a stream, staged through pinned memory (see cuda.py)."""
        self._current()
        raw = self._stream(stream)
        addr, nbytes, keep = host_address(src, writable=False)
        if nbytes == 0:
            return
        self._staging.reclaim()
        if stream is None and getattr(self._tls, "ptds_capture", None) is None:
            self._hip_call("hipMemcpyHtoDAsync", dst, addr, nbytes, raw)
            self._hip_call("hipStreamSynchronize", raw)
            return
        refs = self._capture_refs(stream, raw)
        if refs is None and nbytes > PinnedStaging.MAX_STAGED:
            self._hip_call("hipMemcpyHtoDAsync", dst, addr, nbytes, raw)
            self._hip_call("hipStreamSynchronize", raw)
            return
        block = self._staging.take(nbytes)
        ctypes.memmove(block.ptr, addr, nbytes)
        del keep
        try:
            self._hip_call("hipMemcpyHtoDAsync", dst, block.ptr, nbytes, raw)
        except HipError:
            self._staging.give_back([block])
            raise
        if refs is not None:
            with self._ledger.lock:
                refs.append(block)
        else:
            self._staging.retire([self.fence_after(raw)], [block])

    def memcpy_dtoh(self, dst: memoryview, src: int, stream: Handle | None = None) -> None:
        """Device to host; returns once the bytes are in ``dst``."""
        self._current()
        raw = self._stream(stream)
        addr, nbytes, keep = host_address(dst, writable=True)
        if nbytes == 0:
            return
        self._hip_call("hipMemcpyDtoHAsync", addr, src, nbytes, raw)
        self._hip_call("hipStreamSynchronize", raw)
        del keep

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Handle | None = None) -> None:
        """Device to device; without a stream it returns once done."""
        self._current()
        raw = self._stream(stream)
        if size == 0:
            return
        self._hip_call("hipMemcpyDtoDAsync", dst, src, size, raw)
        if stream is None:
            self._sync_default(raw)

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """Set bytes; without a stream it returns once done."""
        self._current()
        raw = self._stream(stream)
        if size == 0:
            return
        self._hip_call("hipMemsetD8Async", ptr, value & 0xFF, size, raw)
        if stream is None:
            self._sync_default(raw)

    def _sync_default(self, raw: Any) -> None:
        if getattr(self._tls, "ptds_capture", None) is None:
            self._hip_call("hipStreamSynchronize", raw)

    # --- streams and events --------------------------------------------------------------

    def stream_create(self) -> Handle:
        """A non-blocking stream on the current device."""
        device = self._current()
        raw = self._hip_call("hipStreamCreateWithFlags", int(self._hip.hipStreamNonBlocking))
        stream = GpuStream(raw, device)
        with self._ledger.lock:
            self._ledger.streams.add(stream)
        return stream

    def stream_destroy(self, stream: Handle) -> None:
        """Destroy a stream; its pending work still completes."""
        raw = live(stream, GpuStream, "stream")
        self._current()
        self._hip_call("hipStreamDestroy", raw)
        with self._ledger.lock:
            self._ledger.streams.discard(stream)
            if stream.capture_refs:
                self._orphan_refs.extend(stream.capture_refs)
            stream.handle = None

    def stream_synchronize(self, stream: Handle | None) -> None:
        """Wait for the stream's work."""
        self._current()
        self._hip_call("hipStreamSynchronize", self._stream(stream))
        self._staging.reclaim()

    def stream_query(self, stream: Handle | None) -> bool:
        """True when the stream has no pending work."""
        self._current()
        (err,) = self._hip.hipStreamQuery(self._stream(stream))
        if int(err) == _HIP_NOT_READY:
            return False
        if int(err) != _HIP_SUCCESS:
            raise HipError(int(err), f"hipStreamQuery failed: {hip_error_name(int(err))}")
        return True

    def stream_wait_event(self, stream: Handle | None, event: Handle) -> None:
        """Later work on ``stream`` waits for ``event``."""
        self._current()
        self._hip_call(
            "hipStreamWaitEvent", self._stream(stream), live(event, GpuEvent, "event"), 0
        )

    def event_create(self) -> Handle:
        """An event with timing enabled."""
        device = self._current()
        raw = self._hip_call("hipEventCreateWithFlags", int(self._hip.hipEventDefault))
        event = GpuEvent(raw, device)
        with self._ledger.lock:
            self._ledger.events.add(event)
        return event

    def event_destroy(self, event: Handle) -> None:
        """Destroy an event."""
        raw = live(event, GpuEvent, "event")
        self._current()
        self._hip_call("hipEventDestroy", raw)
        with self._ledger.lock:
            self._ledger.events.discard(event)
            event.handle = None

    def event_record(self, event: Handle, stream: Handle | None) -> None:
        """Record ``event`` on ``stream``."""
        self._current()
        self._hip_call("hipEventRecord", live(event, GpuEvent, "event"), self._stream(stream))

    def event_synchronize(self, event: Handle) -> None:
        """Wait for the event."""
        self._current()
        self._hip_call("hipEventSynchronize", live(event, GpuEvent, "event"))
        self._staging.reclaim()

    def event_query(self, event: Handle) -> bool:
        """True once the event completed."""
        self._current()
        (err,) = self._hip.hipEventQuery(live(event, GpuEvent, "event"))
        if int(err) == _HIP_NOT_READY:
            return False
        if int(err) != _HIP_SUCCESS:
            raise HipError(int(err), f"hipEventQuery failed: {hip_error_name(int(err))}")
        return True

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """Milliseconds between two completed events."""
        self._current()
        ms = self._hip_call(
            "hipEventElapsedTime", live(start, GpuEvent, "event"), live(end, GpuEvent, "event")
        )
        return float(ms)

    # --- modules and kernels -------------------------------------------------------------

    def compile(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """HIP C++ to a code object via hiprtc; hipErrorInvalidSource with the log when
        the source is refused. Cached by sha256 of (source, options, arch)."""
        device = self._current()
        arch = self.device_properties(device).arch
        opts = hiprtc_options(options, arch)
        key = CodeCache.key(source, opts, arch)
        cached = self._code_cache.get(key)
        if cached is not None:
            return cached
        image = self._hiprtc_compile(source, name, opts)
        self._code_cache.put(key, image)
        return image

    def _rtc_call(self, fn: str, *args: Any, log: str = "") -> Any:
        try:
            result = getattr(self._rtc, fn)(*args)
        except (OSError, RuntimeError) as exc:
            raise HipError(
                E.hipErrorNotSupported,
                f"hip backend cannot compile: could not load libhiprtc ({exc})",
            ) from exc
        err = int(result[0])
        if err != 0:
            raise rtc_error(err, fn, log)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def _hiprtc_compile(self, source: str, name: str, opts: list[str]) -> bytes:
        # hiprtc ships hip/hip_runtime.h itself: no prelude needed.
        prog = self._rtc_call(
            "hiprtcCreateProgram", source.encode(), (name or "kernel.hip").encode(), 0, [], []
        )
        try:
            (err,) = self._rtc.hiprtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
            log = self._program_log(prog)
            if int(err) != 0:
                raise rtc_error(int(err), f"hiprtcCompileProgram of {name!r}", log)
            size = int(self._rtc_call("hiprtcGetCodeSize", prog))
            code = bytearray(size)
            self._rtc_call("hiprtcGetCode", prog, code)
            return bytes(code)
        finally:
            self._rtc.hiprtcDestroyProgram(prog)

    def _program_log(self, prog: Any) -> str:
        size = int(self._rtc_call("hiprtcGetProgramLogSize", prog))
        if size <= 1:
            return ""
        buf = bytearray(size)
        self._rtc_call("hiprtcGetProgramLog", prog, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace")

    def module_load(self, image: bytes) -> Handle:
        """Load a code object on the current device."""
        device = self._current()
        raw = self._hip_call("hipModuleLoadData", bytes(image))
        module = GpuModule(raw, device)
        with self._ledger.lock:
            self._ledger.modules.add(module)
        return module

    def module_unload(self, module: Handle) -> None:
        """Unload a module; the shared built-in module is left loaded."""
        raw = live(module, GpuModule, "module")
        if module.builtin:
            return
        self._current()
        self._hip_call("hipModuleUnload", raw)
        with self._ledger.lock:
            self._ledger.modules.discard(module)
            module.handle = None

    def module_get_function(self, module: Handle, name: str) -> Handle:
        """A kernel of the module; hipErrorNotFound when absent."""
        raw = live(module, GpuModule, "module")
        self._current()
        return self._hip_call("hipModuleGetFunction", raw, name.encode())

    def builtin_module(self) -> Handle:
        """hipr's built-in kernels, compiled and loaded once per device."""
        device = self._current()
        with self._builtin_lock:
            module = self._builtin.get(device)
            if module is None:
                image = self.compile(BUILTIN_SOURCE, "hipr_builtins.hip", ())
                raw = self._hip_call("hipModuleLoadData", image)
                module = GpuModule(raw, device, builtin=True)
                self._builtin[device] = module
            return module

    def launch(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
        args: bytes,
    ) -> None:
        """hipModuleLaunchKernel with ``args`` through ``extra``."""
        check_dims(grid, block)
        self._current()
        extra = self._extra(args)
        self._hip_call(
            "hipModuleLaunchKernel",
            function,
            *grid,
            *block,
            shared_mem,
            self._stream(stream),
            None,
            extra.address,
        )

    def _extra(self, args: bytes) -> LaunchExtra:
        h = self._hip
        return LaunchExtra(
            args,
            buffer_pointer=int(h.HIP_LAUNCH_PARAM_BUFFER_POINTER),
            buffer_size=int(h.HIP_LAUNCH_PARAM_BUFFER_SIZE),
            end=int(h.HIP_LAUNCH_PARAM_END),
        )

    # --- graphs -------------------------------------------------------------------------

    def stream_begin_capture(self, stream: Handle) -> None:
        """Capture ``stream``'s work (relaxed mode)."""
        self._current()
        raw = self._stream(stream)
        mode = self._hip.hipStreamCaptureMode.hipStreamCaptureModeRelaxed
        self._hip_call("hipStreamBeginCapture", raw, mode)
        if isinstance(stream, GpuStream):
            stream.capture_refs = []
        else:
            self._tls.ptds_capture = []

    def stream_end_capture(self, stream: Handle) -> Handle:
        """Stop capturing; the graph, which keeps the capture's staged host buffers."""
        device = self._current()
        raw = self._stream(stream)
        if isinstance(stream, GpuStream):
            blocks, stream.capture_refs = stream.capture_refs or [], None
        else:
            blocks, self._tls.ptds_capture = getattr(self._tls, "ptds_capture", None) or [], None
        try:
            graph_raw = self._hip_call("hipStreamEndCapture", raw)
        except HipError:
            self._staging.give_back(blocks)
            raise
        graph = GpuGraph(graph_raw, device, HostRefs(blocks=blocks, owners=1))
        with self._ledger.lock:
            self._ledger.graphs.add(graph)
        return graph

    def graph_create(self) -> Handle:
        """An empty graph."""
        device = self._current()
        graph = GpuGraph(self._hip_call("hipGraphCreate", 0), device, HostRefs(owners=1))
        with self._ledger.lock:
            self._ledger.graphs.add(graph)
        return graph

    def graph_destroy(self, graph: Handle) -> None:
        """Destroy a graph; its instantiations live on."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        self._hip_call("hipGraphDestroy", raw)
        with self._ledger.lock:
            self._ledger.graphs.discard(graph)
            graph.handle = None
            release_refs(self._staging, graph.refs)

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> Handle:
        """A 1-byte-element memset node (an empty node when ``size`` is 0)."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        deps = list(dependencies)
        if size == 0:
            return self._hip_call("hipGraphAddEmptyNode", raw, deps or None, len(deps))
        params = self._hip.hipMemsetParams(
            dst=ptr, elementSize=1, width=size, height=1, pitch=size, value=value & 0xFF
        )
        return self._hip_call("hipGraphAddMemsetNode", raw, deps or None, len(deps), params)

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> Handle:
        """A device-to-device copy node (an empty node when ``size`` is 0)."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        deps = list(dependencies)
        if size == 0:
            return self._hip_call("hipGraphAddEmptyNode", raw, deps or None, len(deps))
        kind = self._hip.hipMemcpyKind.hipMemcpyDeviceToDevice
        return self._hip_call(
            "hipGraphAddMemcpyNode1D", raw, deps or None, len(deps), dst, src, size, kind
        )

    def graph_add_kernel(
        self,
        graph: Handle,
        dependencies: Sequence[Handle],
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        args: bytes,
    ) -> Handle:
        """A kernel node; ``args`` through ``extra`` as in :meth:`launch`."""
        raw = live(graph, GpuGraph, "graph")
        check_dims(grid, block)
        self._current()
        deps = list(dependencies)
        extra = self._extra(args)
        p = self._hip.hipKernelNodeParams()
        p.func = function
        # dim3 members are read-only attributes of a mutable struct: set its fields.
        g, b = p.gridDim, p.blockDim
        g.x, g.y, g.z = (int(v) for v in grid)
        b.x, b.y, b.z = (int(v) for v in block)
        p.sharedMemBytes = shared_mem
        p.kernelParams = None
        p.extra = extra.address
        node = self._hip_call("hipGraphAddKernelNode", raw, deps or None, len(deps), p)
        del extra
        return node

    def graph_instantiate(self, graph: Handle) -> Handle:
        """An executable graph; it shares the graph's host buffers."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        exec_raw = self._hip_call("hipGraphInstantiateWithFlags", raw, 0)
        with self._ledger.lock:
            graph.refs.owners += 1
            gexec = GpuGraphExec(exec_raw, graph.device, graph.refs)
            self._ledger.execs.add(gexec)
        return gexec

    def graph_launch(self, graph_exec: Handle, stream: Handle | None) -> None:
        """Launch an executable graph on ``stream``."""
        raw = live(graph_exec, GpuGraphExec, "graph exec")
        self._current()
        s = self._stream(stream)
        self._hip_call("hipGraphLaunch", raw, s)
        refs = graph_exec.refs
        if refs.blocks:
            fence = self.fence_after(s)
            with self._ledger.lock:
                done = [f for f in refs.fences if self.fence_done(f)]
                refs.fences = [f for f in refs.fences if f not in done] + [fence]
            for f in done:
                self.fence_destroy(f)

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """Destroy an executable graph."""
        raw = live(graph_exec, GpuGraphExec, "graph exec")
        self._current()
        self._hip_call("hipGraphExecDestroy", raw)
        with self._ledger.lock:
            self._ledger.execs.discard(graph_exec)
            graph_exec.handle = None
            release_refs(self._staging, graph_exec.refs)

    # --- accounting ----------------------------------------------------------------------

    def stats(self) -> BackendStats:
        """Live resources created through this backend (built-in modules not counted)."""
        return self._ledger.stats()

    def close(self) -> None:
        """Free staging memory and the built-in modules."""
        if self._closed:
            return
        self._closed = True
        for device, module in list(self._builtin.items()):
            try:
                self.bind_thread(device)
                self._hip_call("hipModuleUnload", module.handle)
            except HipError:
                pass
        self._builtin.clear()
        if self._bound_devices:
            try:
                self.bind_thread(min(self._bound_devices))
                self._staging.close(wait=lambda: self._hip_call("hipDeviceSynchronize"))
                for block in self._orphan_refs:
                    self.host_free(block.ptr)
                self._orphan_refs.clear()
            except HipError:
                pass
        self._tls = threading.local()
