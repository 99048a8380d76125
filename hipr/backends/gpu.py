"""One GPU backend over two runtimes: the logic of the cuda and hip backends, once.

:class:`GpuBackend` implements :class:`~hipr.backends.base.Backend`: argument checks,
handle wrappers and their ledger, pinned staging of asynchronous copies, captures and
graphs, launches with packed arguments, the compile cache, error mapping and stats.
It calls the GPU only through a :class:`Runtime`: the functions and flags named in
:mod:`hipr.backends.callmap`, and a small adapter for the few places where the two
runtimes differ in shape (probing the driver, binding a thread, device properties,
graph node parameter blocks, how a compiled program is read back).
:mod:`~hipr.backends.runtime_cuda` drives cuda-bindings' driver API and NVRTC, as HIP
itself does on NVIDIA; :mod:`~hipr.backends.runtime_hip` drives hip-python. A fix made
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
  (:class:`~hipr.backends._gpu_common.PinnedStaging`): the caller's buffer may be
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

import contextlib
import ctypes
import re
import threading
from collections.abc import Callable, Sequence
from functools import partial
from itertools import pairwise
from typing import Any, Protocol, TypeVar

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
    PinnedPayloads,
    PinnedStaging,
    ReusedLaunchExtra,
    check_dims,
    host_address,
    live,
    release_refs,
)
from hipr.backends.base import BackendStats, BackendUnavailable, DeviceProperties, Dim3, Handle
from hipr.backends.callmap import DriverCalls, RtcCalls, RuntimeConstants
from hipr.backends.errmap import rtc_error
from hipr.backends.imagekind import check_image
from hipr.errors import HipError, HipErrorCode
from hipr.kernels.args import MAX_ARGS_BYTES
from hipr.kernels.builtins import BUILTIN_SOURCE

__all__ = ["GpuBackend", "Runtime", "RuntimeBase", "import_bindings"]

E = HipErrorCode
_T = TypeVar("_T")

#: Success is 0 in CUresult, hipError_t, nvrtcResult and hiprtcResult alike.
_SUCCESS = 0
#: CUDA_ERROR_INVALID_VALUE and hipErrorInvalidValue share the number.
_INVALID_VALUE = 1
#: A parameter-info query stops here even if the driver never says "past the end".
_MAX_PARAMS = 4096


class Runtime(Protocol):
    """One GPU runtime as :class:`GpuBackend` drives it.

    Most of it is data: the function names (:attr:`calls`, :attr:`rtc_calls`) and flags
    (:meth:`constants`) from :mod:`hipr.backends.callmap`. The methods cover what the
    two runtimes do differently in shape. :class:`RuntimeBase` implements the calling
    and error plumbing; an adapter adds the rest.
    """

    #: The backend's name: ``"cuda"`` or ``"hip"``.
    name: str
    #: Names of the driver functions the shared logic calls.
    calls: DriverCalls[str]
    #: Names of the run-time compiler functions the shared logic calls.
    rtc_calls: RtcCalls[str]
    #: (size function, read function) pairs that read a compiled program back, tried in
    #: order: an empty or failed size moves on to the next, and the last one must work.
    rtc_images: tuple[tuple[str, str], ...]
    #: The function that says a kernel parameter's (offset, size), or None where the
    #: runtime has none (arguments then go to the launch exactly as packed).
    param_info_call: str | None
    #: The "not ready" result of stream and event queries.
    not_ready: int
    #: The driver function that issues many host-to-device copies in one call, or None
    #: where hipr cannot call one (:meth:`copy_batch`).
    batch_copy_call: str | None

    def open(self) -> int:
        """Initialise the runtime; the number of usable devices. Raises
        :class:`~hipr.backends.BackendUnavailable` when there is no usable one."""
        ...

    def constants(self) -> RuntimeConstants[Any]:
        """The flags and values the shared logic passes (after :meth:`open`)."""
        ...

    def call(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn``: its outputs, or its failure as HipError."""
        ...

    def raw(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn`` and return its result tuple unchecked."""
        ...

    def function(self, fn: str) -> Callable[..., Any]:
        """Driver function ``fn`` itself, for a caller that calls it many times (its
        result tuples unchecked, as :meth:`raw`'s)."""
        ...

    def provides(self, fn: str) -> bool:
        """True when the loaded binding has driver function ``fn``."""
        ...

    def error(self, code: int, call: str) -> HipError:
        """The HipError (with HIP's code) for result ``code`` of driver call ``call``."""
        ...

    def rtc_call(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn``: its outputs, or its failure as HipError."""
        ...

    def rtc_raw(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn`` and return its result tuple unchecked."""
        ...

    def bind(self, device: int) -> None:
        """Make ``device`` current on the calling thread."""
        ...

    def release(self) -> None:
        """Give back what :meth:`open` and :meth:`bind` took (at backend close)."""
        ...

    def read_properties(self, device: int) -> DeviceProperties:
        """Read ``device``'s properties from the runtime (the backend caches them)."""
        ...

    def compile_options(self, options: Sequence[str], arch: str) -> list[str]:
        """The compiler options for a compile for ``arch``: the user's, translated and
        completed for this runtime's compiler."""
        ...

    def program_headers(self) -> tuple[list[bytes], list[bytes]]:
        """(header contents, include names) every program is created with."""
        ...

    def output_buffer(self, size: int) -> bytes | bytearray:
        """A buffer of ``size`` bytes of the kind the compiler binding writes into."""
        ...

    def loadable_image(self, image: bytes) -> bytes:
        """``image`` as the module loader wants it."""
        ...

    def memset_node_args(self, device: int, ptr: int, value: int, size: int) -> tuple[Any, ...]:
        """The arguments after (graph, dependencies, count) of a 1-byte memset node."""
        ...

    def memcpy_node_args(self, device: int, dst: int, src: int, size: int) -> tuple[Any, ...]:
        """The arguments after (graph, dependencies, count) of a device-to-device copy
        node."""
        ...

    def kernel_node_params(
        self, function: Any, grid: Dim3, block: Dim3, shared_mem: int, extra: int
    ) -> Any:
        """The parameter block of a kernel node whose arguments go through ``extra``."""
        ...

    def copy_batch(
        self, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: Any
    ) -> None:
        """Issue the host-to-device copies ``srcs[i] -> dsts[i]`` of ``sizes[i]`` bytes in
        one call (:attr:`batch_copy_call`) on ``stream``: in stream order as a whole, in
        no order among themselves, so no two may overlap. The sources are read in
        stream order: the caller keeps them until a fence or a synchronise behind the
        batch has completed. Raises the runtime's failure as HipError."""
        ...


def _outputs(result: Sequence[Any]) -> Any:
    """A binding's outputs after its result code: None, one value, or a tuple."""
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def import_bindings(
    load: Callable[[], tuple[Any, Any]],
    *,
    backend: str,
    package: str,
    library: str,
    missing: tuple[type[Exception], ...] = (ImportError,),
    broken: tuple[type[Exception], ...] = (),
) -> tuple[Any, Any]:
    """``load()``'s (driver, compiler) binding modules, or BackendUnavailable: naming
    ``package`` when an exception in ``missing`` says it is not installed, ``library``
    when one in ``broken`` says its native library could not be loaded."""
    try:
        return load()
    except missing as exc:
        raise BackendUnavailable(
            E.hipErrorInsufficientDriver,
            f"{backend} backend unavailable: the {package} package is not installed "
            f"(pip install 'hipr[{backend}]'): {exc}",
            library=package,
        ) from exc
    except broken as exc:
        raise BackendUnavailable(
            E.hipErrorInsufficientDriver,
            f"{backend} backend unavailable: could not load {library} ({exc})",
            library=library,
        ) from exc


class RuntimeBase:
    """The plumbing every runtime adapter shares: calling its binding modules (every
    function returns ``(result, outputs...)``) and turning failures into
    :class:`~hipr.errors.HipError` or :class:`~hipr.backends.BackendUnavailable`.

    A subclass sets the class attributes, :meth:`load_bindings` and :meth:`error`, and
    implements the rest of :class:`Runtime`. ``api``/``rtc_api`` replace the binding
    modules (tests run the adapters on simulated ones); with ``api`` None both are
    imported."""

    name: str
    #: The native library named in "backend unavailable" messages.
    library: str
    #: The compiler's native library, named when it cannot be loaded.
    rtc_library: str
    # The data half of Runtime, set by each adapter (see Runtime for what each means).
    calls: DriverCalls[str]
    rtc_calls: RtcCalls[str]
    rtc_images: tuple[tuple[str, str], ...]
    param_info_call: str | None
    not_ready: int
    batch_copy_call: str | None = None

    def __init__(self, api: Any = None, rtc_api: Any = None) -> None:
        if api is None:
            api, real_rtc = self.load_bindings()
            rtc_api = rtc_api or real_rtc
        self.api: Any = api
        self.rtc_api: Any = rtc_api

    @staticmethod
    def load_bindings() -> tuple[Any, Any]:
        """Import the (driver, compiler) binding modules, or raise BackendUnavailable."""
        raise NotImplementedError

    def error(self, code: int, call: str) -> HipError:
        """The HipError for result ``code`` of driver call ``call``."""
        raise NotImplementedError

    def call(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn``; raise its failure as HipError, return its outputs."""
        result = getattr(self.api, fn)(*args)
        err = int(result[0])
        if err != _SUCCESS:
            raise self.error(err, fn)
        return _outputs(result)

    def raw(self, fn: str, *args: Any) -> Any:
        """Call driver function ``fn``; its result tuple, unchecked."""
        return getattr(self.api, fn)(*args)

    def function(self, fn: str) -> Callable[..., Any]:
        """Driver function ``fn`` itself (see :meth:`Runtime.function`)."""
        function: Callable[..., Any] = getattr(self.api, fn)
        return function

    def provides(self, fn: str) -> bool:
        """True when the driver binding has ``fn`` (older ones lack newer calls)."""
        return getattr(self.api, fn, None) is not None

    def copy_batch(
        self, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: Any
    ) -> None:
        """A runtime without :attr:`batch_copy_call` has none (the backend never asks)."""
        raise HipError(E.hipErrorNotSupported, f"the {self.name} runtime has no batch copy")

    def rtc_call(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn``; raise its failure as HipError, return its
        outputs. A compiler library that cannot be loaded is hipErrorNotSupported: the
        backend still runs precompiled code."""
        try:
            result = getattr(self.rtc_api, fn)(*args)
        except (OSError, RuntimeError) as exc:
            raise HipError(
                E.hipErrorNotSupported,
                f"{self.name} backend cannot compile: could not load {self.rtc_library} ({exc})",
            ) from exc
        err = int(result[0])
        if err != _SUCCESS:
            raise rtc_error(err, fn)
        return _outputs(result)

    def rtc_raw(self, fn: str, *args: Any) -> Any:
        """Call compiler function ``fn``; its result tuple, unchecked."""
        return getattr(self.rtc_api, fn)(*args)

    def unavailable(self, code: int, reason: str) -> BackendUnavailable:
        """BackendUnavailable with HIP code ``code``, naming this runtime's library."""
        return BackendUnavailable(
            code, f"{self.name} backend unavailable: {reason}", library=self.library
        )

    def could_not_load(self, exc: BaseException) -> BackendUnavailable:
        """BackendUnavailable for a native library that failed to load."""
        # hip-python's loader quotes bytes reprs ("failed to dlopen 'b'libamdhip64.so''");
        # people read this line, so it shows the names as text.
        text = re.sub(r"b'([^']*)'", r"\1", str(exc))
        return self.unavailable(
            E.hipErrorInsufficientDriver, f"could not load {self.library} ({text})"
        )

    def no_device(self, vendor: str) -> BackendUnavailable:
        """BackendUnavailable for a runtime that loaded but sees no GPU of ``vendor``."""
        return self.unavailable(
            E.hipErrorNoDevice, f"{self.library} loaded but sees no {vendor} GPU"
        )


class _LaneState:
    """One lane: a session thread's device, its default streams and a capture on them.
    Attributes appear as they are first set (``device``, ``default_streams``,
    ``ptds_capture``); readers use ``getattr`` with a default."""


class _ThreadLanes(threading.local):
    """Each thread's current lane: its own, or one it borrows in ``run_in_lane``."""

    def __init__(self) -> None:
        self.state = _LaneState()


def _quick_htod(dst: int, src: Any, stream: Handle | None = None) -> bool:
    """A host-to-device copy that cannot wait for the GPU: on a stream, small enough to
    be staged in the stream's carve block (no synchronise; an allocation only when the
    pool has no block to carve from)."""
    return isinstance(stream, GpuStream) and memoryview(src).nbytes <= PinnedStaging.MAX_CARVED


def _quick_htod_many(pieces: Sequence[tuple[int, Any]], stream: Handle | None = None) -> bool:
    """:func:`_quick_htod` for every piece of a :meth:`GpuBackend.memcpy_htod_many`."""
    limit = PinnedStaging.MAX_CARVED
    return isinstance(stream, GpuStream) and all(
        memoryview(src).nbytes <= limit for _, src in pieces
    )


#: Answers to a batch of copies that mean "not here" rather than "these copies are
#: wrong": the driver lacks the call (older than its binding), or does not support it.
_BATCH_UNSUPPORTED = frozenset({int(E.hipErrorNotSupported), int(E.hipErrorNotFound)})


def _packed(pieces: Sequence[tuple[int, memoryview]], base: int) -> list[tuple[int, int, int]]:
    """(destination, source, bytes) of each non-empty piece, the pieces' bytes lying side
    by side from ``base`` in their order."""
    copies = []
    offset = base
    for dst, src in pieces:
        nbytes = src.nbytes
        if nbytes:
            copies.append((dst, offset, nbytes))
            offset += nbytes
    return copies


class GpuBackend:
    """:class:`~hipr.backends.base.Backend` over one :class:`Runtime` (see module doc)."""

    #: Calls that never wait for the GPU: the worker may run them on its event loop,
    #: in the session's lane (:meth:`run_in_lane`), so that they land on the session's
    #: own default stream, in order with the work its GPU thread issued.
    inline_calls: frozenset[str] = frozenset(
        {
            "device_count",
            "device_properties",
            "mem_get_info",
            "launch",
            "event_record",
            "stream_wait_event",
            "stream_query",
            "event_query",
            "event_elapsed_ms",
            "graph_launch",
        }
    )

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        #: ``"cuda"`` or ``"hip"``: the runtime's name.
        self.name: str = runtime.name
        self._count = runtime.open()
        self._calls = runtime.calls
        self._k = runtime.constants()
        k = self._k
        # The launch ``extra`` array's marker words, converted once (every launch uses them).
        self._extra_words = (
            int(k.launch_buffer_pointer),
            int(k.launch_buffer_size),
            int(k.launch_end),
        )
        # Bound once: the hot path pays no lookup of the runtime on each call.
        self._call: Callable[..., Any] = runtime.call
        self._launch_kernel = runtime.function(self._calls.launch_kernel)
        #: Each OS thread's reused launch ``extra`` (the loop's and every session's).
        self._launch_extras = threading.local()
        self._props: dict[int, DeviceProperties] = {}
        self._builtin: dict[int, GpuModule] = {}
        self._builtin_lock = threading.Lock()
        self._ledger = Ledger()
        self._lanes = _ThreadLanes()
        #: The device whose context the worker's loop thread has current (run_in_lane).
        self._loop_ctx = threading.local()
        self._code_cache = CodeCache()
        # Parameter-space sizes by function address; cleared when a module goes, since
        # a later module's function may reuse the address.
        self._param_sizes: dict[int, int | None] = {}
        self._staging = PinnedStaging(self)
        self._payloads = PinnedPayloads(self)
        #: Small copies of one MEMCPY_HTOD_MANY go to the runtime as one batch
        #: (:meth:`Runtime.copy_batch`); False once it turned a batch down.
        batch_call = runtime.batch_copy_call
        self._batch_copies = batch_call is not None and runtime.provides(batch_call)
        # Pinned buffers of captures on streams this backend did not start capturing
        # (joined into a capture through an event): no graph to hand them to, so they
        # live until close().
        self._orphan_refs: list[PinnedBlock] = []
        self._bound_devices: set[int] = set()
        self._closed = False
        #: Calls that are quick for some arguments (see ``Backend.inline_when``): a small
        #: async copy on a stream only stages its bytes and queues the copy.
        self.inline_when: dict[str, Callable[..., bool]] = {
            "memcpy_htod": _quick_htod,
            "memcpy_htod_many": _quick_htod_many,
        }

    # --- plumbing ------------------------------------------------------------------------

    @property
    def _tls(self) -> Any:
        """The calling thread's current lane state (see ``run_in_lane``)."""
        return self._lanes.state

    def _current(self) -> int:
        """The calling thread's device, binding device 0 first if it never bound."""
        device: int | None = getattr(self._tls, "device", None)
        if device is None:
            self.bind_thread(0)
            return 0
        return device

    def _stream(self, stream: Handle | None) -> Any:
        if stream is None:
            return self._default_stream()
        return live(stream, GpuStream, "stream")

    def _default_stream(self) -> Any:
        """The lane's default stream on its current device: a stream of its own rather
        than the per-thread default stream, so that the lane's work stays in order
        whichever thread issues it (the session's GPU thread or the worker's loop)."""
        device = self._current()
        streams: dict[int, Any] | None = getattr(self._tls, "default_streams", None)
        if streams is None:
            streams = self._tls.default_streams = {}
        raw = streams.get(device)
        if raw is None:
            raw = self._call(self._calls.stream_create, self._k.stream_flags)
            streams[device] = raw
        return raw

    # --- lanes: a session's thread state, borrowed by the worker's event loop -----------

    def current_lane(self) -> _LaneState:
        """The calling thread's state (device, default streams, capture): the session
        keeps it to run calls inline, on its event loop, as if on this thread."""
        self._current()
        return self._lanes.state

    def run_in_lane(self, lane: _LaneState, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the calling thread with ``lane``'s state and context (its
        owner thread must be idle). Makes the lane's device current here when needed.
        The lane object itself is borrowed, so what ``fn`` changes in it (a default
        stream made) stays with the lane; a swap of one reference keeps this cheap on
        the hot path of every inline launch and query."""
        lanes = self._lanes
        saved = lanes.state
        device = getattr(lane, "device", 0)
        if self._loop_ctx.__dict__.get("device") != device:
            self._rt.bind(device)
            self._loop_ctx.device = device
        lanes.state = lane
        try:
            return fn(*args)
        finally:
            lanes.state = saved

    def work_done(self, streams: Sequence[Handle]) -> bool:
        """True when the lane's default stream and ``streams`` have no pending work
        (asked without waiting); raises a failed kernel's error, as a query does."""
        query, fn = self._query, self._calls.stream_query
        for raw in getattr(self._tls, "default_streams", {}).values():
            if not query(fn, raw):
                return False
        return all(query(fn, live(s, GpuStream, "stream")) for s in streams)

    def release_thread(self) -> None:
        """Destroy the calling thread's default streams (its session is ending)."""
        streams: dict[int, Any] = getattr(self._tls, "default_streams", None) or {}
        for device, raw in list(streams.items()):
            self._rt.bind(device)
            self._rt.raw(self._calls.stream_destroy, raw)
        streams.clear()

    def _check_device(self, device: int) -> None:
        if not isinstance(device, int) or not 0 <= device < self._count:
            raise HipError(E.hipErrorInvalidDevice, f"device {device!r} not in [0, {self._count})")

    def _track(self, bucket: set[_T], obj: _T) -> _T:
        """Enter ``obj`` in the ledger's ``bucket``."""
        with self._ledger.lock:
            bucket.add(obj)
        return obj

    def _destroy(
        self,
        obj: Handle,
        cls: type,
        what: str,
        fn: str,
        bucket: set[Any],
        then: Callable[[Any], None] | None = None,
    ) -> None:
        """Destroy a wrapped runtime object with ``fn``. Once the runtime agreed, the
        ledger forgets it and the wrapper is refused from then on; ``then(obj)`` runs
        under the ledger's lock, to hand on what the object held."""
        raw = live(obj, cls, what)
        self._current()
        self._call(fn, raw)
        with self._ledger.lock:
            bucket.discard(obj)
            obj.handle = None
            if then is not None:
                then(obj)

    def _query(self, fn: str, handle: Any) -> bool:
        """A stream or event query: True when done, False when not ready."""
        (err,) = self._rt.raw(fn, handle)
        if int(err) == self._rt.not_ready:
            return False
        if int(err) != _SUCCESS:
            raise self._rt.error(int(err), fn)
        return True

    # --- payload buffers ----------------------------------------------------------------

    def reserve_payload_buffers(self, count: int, block_bytes: int) -> int:
        """Pin ``count`` host buffers of ``block_bytes`` for the worker to receive large
        payloads into and to fill downloads from (:class:`PinnedPayloads`); the number
        held (fewer when the runtime refuses more). Portable, so every device's copies
        DMA from them directly; allocated under device 0's context, on the calling
        thread (not the event loop's: pinning takes milliseconds)."""
        self.bind_thread(0)
        return self._payloads.reserve(count, block_bytes)

    def payload_buffer(self, size: int) -> memoryview | None:
        """A free pinned payload buffer's first ``size`` bytes, or None."""
        return self._payloads.take(size)

    def payload_buffer_figures(self) -> dict[str, int]:
        """``{held, in_use, bytes}`` of the pinned payload buffers (status, metrics)."""
        return self._payloads.figures()

    # Staging hooks (StagingOps).
    def host_alloc(self, size: int) -> int:
        """Portable pinned host memory, for the staging pool."""
        return int(self._call(self._calls.host_alloc, size, self._k.host_alloc_flags))

    def host_free(self, ptr: int) -> None:
        """Free pinned host memory of the staging pool."""
        self._call(self._calls.host_free, ptr)

    def fence_after(self, stream: Any) -> Any:
        """A timing-free event recorded on ``stream`` now."""
        ev = self._call(self._calls.event_create, self._k.fence_flags)
        try:
            self._call(self._calls.event_record, ev, stream)
        except HipError:
            self._rt.raw(self._calls.event_destroy, ev)
            raise
        return ev

    def fence_done(self, fence: Any) -> bool:
        """Has the fence completed? An error (a poisoned context) counts as done: the
        work it guards will never run."""
        (err,) = self._rt.raw(self._calls.event_query, fence)
        return int(err) != self._rt.not_ready

    def fence_destroy(self, fence: Any) -> None:
        """Destroy a fence, ignoring errors (it is ours and no longer needed)."""
        self._rt.raw(self._calls.event_destroy, fence)

    def _capture_refs(self, stream: Handle | None, raw: Any) -> list[PinnedBlock] | None:
        """Where a copy's pinned block must live when ``raw`` is being captured, else None."""
        if isinstance(stream, GpuStream) and stream.capture_refs is not None:
            return stream.capture_refs
        if stream is None and getattr(self._tls, "ptds_capture", None) is not None:
            refs: list[PinnedBlock] = self._tls.ptds_capture
            return refs
        status = self._call(self._calls.stream_is_capturing, raw)
        if int(status) == int(self._k.capture_status_none):
            return None
        return self._orphan_refs

    # --- devices -----------------------------------------------------------------------

    def device_count(self) -> int:
        """Visible devices."""
        return self._count

    def device_properties(self, device: int) -> DeviceProperties:
        """Properties of ``device`` (read once, then cached: they do not change)."""
        self._check_device(device)
        cached = self._props.get(device)
        if cached is not None:
            return cached
        props = self._rt.read_properties(device)
        self._props[device] = props
        return props

    def bind_thread(self, device: int) -> None:
        """Make ``device`` current on the calling thread."""
        self._check_device(device)
        self._rt.bind(device)
        self._tls.device = device
        with self._ledger.lock:
            self._bound_devices.add(device)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        self._current()
        free, total = self._call(self._calls.mem_get_info)
        return int(free), int(total)

    def synchronize(self) -> None:
        """Wait for all work on the current device (all sessions', as hipDeviceSynchronize
        does); reports a kernel's asynchronous failure."""
        self._current()
        self._call(self._calls.synchronize)
        self._staging.reclaim()

    # --- memory -------------------------------------------------------------------------

    def malloc(self, size: int) -> int:
        """Device memory; hipErrorOutOfMemory when the device is full."""
        if size < 0:
            raise HipError(E.hipErrorInvalidValue, f"negative size {size}")
        self._current()
        if size == 0:
            return 0
        ptr = int(self._call(self._calls.malloc, size))
        with self._ledger.lock:
            self._ledger.allocations[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        """Free a :meth:`malloc` allocation (blocks until the device is done with it)."""
        if ptr == 0:
            return
        self._current()
        self._call(self._calls.free, ptr)
        with self._ledger.lock:
            self._ledger.allocations.pop(ptr, None)

    def memcpy_htod(self, dst: int, src: memoryview, stream: Handle | None = None) -> None:
        """Host to device. Without a stream it returns once the copy is done; with one,
        ``src`` is staged through pinned memory and the copy runs asynchronously."""
        self._current()
        raw = self._stream(stream)
        addr, nbytes, keep = host_address(src, writable=False)
        if nbytes == 0:
            return
        copy = self._calls.memcpy_htod_async
        self._staging.reclaim()
        if stream is None and getattr(self._tls, "ptds_capture", None) is None:
            self._call(copy, dst, addr, nbytes, raw)
            self._call(self._calls.stream_synchronize, raw)
            return
        refs = self._capture_refs(stream, raw)
        if refs is None and nbytes <= PinnedStaging.MAX_CARVED and isinstance(stream, GpuStream):
            pinned = self._staging.carve(stream, nbytes, partial(self.fence_after, raw))
            ctypes.memmove(pinned, addr, nbytes)
            del keep
            # A failed copy leaves its piece unused: the block still retires in order.
            self._call(copy, dst, pinned, nbytes, raw)
            return
        if refs is None and nbytes > PinnedStaging.MAX_STAGED:
            self._call(copy, dst, addr, nbytes, raw)
            self._call(self._calls.stream_synchronize, raw)
            return
        block = self._staging.take(nbytes)
        ctypes.memmove(block.ptr, addr, nbytes)
        del keep
        try:
            self._call(copy, dst, block.ptr, nbytes, raw)
        except HipError:
            self._staging.give_back([block])
            raise
        if refs is not None:
            with self._ledger.lock:
                refs.append(block)
        else:
            self._staging.retire([self.fence_after(raw)], [block])

    def memcpy_htod_many(
        self, pieces: Sequence[tuple[int, memoryview]], stream: Handle | None = None
    ) -> None:
        """Small host-to-device copies, in order, as :meth:`memcpy_htod` of each. On a
        stream they are carved side by side from the stream's pinned block, the device,
        stream and capture state looked up once for all; on the default stream all are
        issued and one synchronise covers them, where one copy after another would wait
        for each (the pieces' bytes must stay valid only until this returns). Either
        way the copies go to the runtime as one batch where it can (:meth:`_batchable`)."""
        if stream is not None or getattr(self._tls, "ptds_capture", None) is not None:
            self._carve_many(pieces, stream)
            return
        self._current()
        raw = self._stream(None)
        self._staging.reclaim()
        # The pieces side by side in one buffer: one address to look up, not one each.
        joined = b"".join(src for _, src in pieces)
        base, _, keep = host_address(joined, writable=False)
        copies = _packed(pieces, base)
        try:
            if self._batchable(pieces):
                self._issue_batch(copies, raw)
            else:
                copy = self._calls.memcpy_htod_async
                for dst, addr, nbytes in copies:
                    self._call(copy, dst, addr, nbytes, raw)
        except HipError:
            # The copies already issued still read their bytes: wait for them first.
            with contextlib.suppress(HipError):
                self._call(self._calls.stream_synchronize, raw)
            raise
        self._call(self._calls.stream_synchronize, raw)
        del keep

    def _carve_many(self, pieces: Sequence[tuple[int, memoryview]], stream: Handle | None) -> None:
        """:meth:`memcpy_htod_many`'s pieces on a stream that is not being captured, side by
        side in one region of the stream's carve block (a batch up to a block's size, as
        hipr's client sends), with one look-up of the device, the stream and its capture
        state for the whole batch (one capture query, a driver call, instead of one per
        copy). A larger batch is carved piece by piece; anything else (a capture, a piece
        too large to carve) goes through :meth:`memcpy_htod` one by one."""
        self._current()
        raw = self._stream(stream)
        self._staging.reclaim()
        if not isinstance(stream, GpuStream) or self._capture_refs(stream, raw) is not None:
            for dst, src in pieces:
                self.memcpy_htod(dst, src, stream)
            return
        fence = partial(self.fence_after, raw)
        staging = self._staging
        total = sum(src.nbytes for _, src in pieces)
        if 0 < total <= PinnedStaging.MIN_BLOCK:
            # The pieces side by side in one carved region: one carve and one copy into
            # pinned memory for the batch, not one of each per piece.
            base = staging.carve(stream, total, fence)
            ctypes.memmove(base, b"".join(src for _, src in pieces), total)
            copies = _packed(pieces, base)
            if self._batchable(pieces):
                self._issue_batch(copies, raw)
                return
            copy = self._calls.memcpy_htod_async
            for dst, pinned, nbytes in copies:
                # A failed copy leaves its piece unused: the block still retires in order.
                self._call(copy, dst, pinned, nbytes, raw)
            return
        copy = self._calls.memcpy_htod_async
        for dst, src in pieces:  # a batch larger than a carve block (not from hipr's client)
            nbytes = src.nbytes
            if not nbytes:
                continue
            if nbytes > PinnedStaging.MAX_CARVED:
                self.memcpy_htod(dst, src, stream)
                continue
            pinned = staging.carve(stream, nbytes, fence)
            ctypes.memmove(pinned, src.tobytes(), nbytes)
            self._call(copy, dst, pinned, nbytes, raw)

    def _batchable(self, pieces: Sequence[tuple[int, memoryview]]) -> bool:
        """True when ``pieces`` (destination, bytes) may go to the runtime as batches: it
        has the call, and no two pieces write a byte in common (a batch keeps no order
        among its copies, so only then does it end as the copies one after another)."""
        if not self._batch_copies or len(pieces) < 2:
            return False
        # The same start twice (one word written again and again) is the common overlap,
        # found without sorting.
        if len({dst for dst, _ in pieces}) < len(pieces):
            return False
        spans = sorted((dst, src.nbytes) for dst, src in pieces)
        return all(a + n <= b for (a, n), (b, _) in pairwise(spans))

    def _issue_batch(self, copies: list[tuple[int, int, int]], raw: Any) -> None:
        """Issue host-to-device copies (destination, source, bytes) that write no byte in
        common: one batch call, or one call each for a single copy and where the runtime
        turns batches down as unsupported (a driver older than its binding: one call each
        from then on). The sources stay valid until a fence or synchronise behind the
        copies (a carved region's block retires in order, failed or not)."""
        if len(copies) > 1 and self._batch_copies:
            dsts, srcs, sizes = zip(*copies, strict=True)
            try:
                self._rt.copy_batch(dsts, srcs, sizes, raw)
            except HipError as exc:
                if exc.code not in _BATCH_UNSUPPORTED:
                    raise
                self._batch_copies = False
            except RuntimeError:  # the binding could not find the driver's function
                self._batch_copies = False
            else:
                return
        copy = self._calls.memcpy_htod_async
        for dst, pinned, nbytes in copies:
            self._call(copy, dst, pinned, nbytes, raw)

    def memcpy_dtoh(self, dst: memoryview, src: int, stream: Handle | None = None) -> None:
        """Device to host; returns once the bytes are in ``dst``."""
        self._current()
        raw = self._stream(stream)
        addr, nbytes, keep = host_address(dst, writable=True)
        if nbytes == 0:
            return
        self._call(self._calls.memcpy_dtoh_async, addr, src, nbytes, raw)
        self._call(self._calls.stream_synchronize, raw)
        del keep

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Handle | None = None) -> None:
        """Device to device; without a stream it returns once done."""
        self._current()
        raw = self._stream(stream)
        if size == 0:
            return
        self._call(self._calls.memcpy_dtod_async, dst, src, size, raw)
        if stream is None:
            self._sync_default(raw)

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """Set bytes; without a stream it returns once done."""
        self._current()
        raw = self._stream(stream)
        if size == 0:
            return
        self._call(self._calls.memset_d8_async, ptr, value & 0xFF, size, raw)
        if stream is None:
            self._sync_default(raw)

    def _sync_default(self, raw: Any) -> None:
        # A "synchronous" call on the default stream while it is being captured is
        # recorded into the graph, not run; synchronising then would break the capture.
        if getattr(self._tls, "ptds_capture", None) is None:
            self._call(self._calls.stream_synchronize, raw)

    # --- streams and events --------------------------------------------------------------

    def stream_create(self) -> Handle:
        """A non-blocking stream on the current device (see module doc)."""
        device = self._current()
        raw = self._call(self._calls.stream_create, self._k.stream_flags)
        return self._track(self._ledger.streams, GpuStream(raw, device))

    def stream_destroy(self, stream: Handle) -> None:
        """Destroy a stream; its pending work still completes."""
        if isinstance(stream, GpuStream) and stream.carve is not None:
            # Its small copies' block retires behind a fence the stream can still take.
            raw = live(stream, GpuStream, "stream")
            self._current()
            self._staging.retire_carve(stream, partial(self.fence_after, raw))
        fn, streams = self._calls.stream_destroy, self._ledger.streams
        self._destroy(stream, GpuStream, "stream", fn, streams, self._orphan_capture_refs)

    def _orphan_capture_refs(self, stream: GpuStream) -> None:
        # A capture still running on it: its staged buffers have no graph to go to.
        if stream.capture_refs:
            self._orphan_refs.extend(stream.capture_refs)

    def stream_synchronize(self, stream: Handle | None) -> None:
        """Wait for the stream's work."""
        self._current()
        self._call(self._calls.stream_synchronize, self._stream(stream))
        self._staging.reclaim()

    def stream_query(self, stream: Handle | None) -> bool:
        """True when the stream has no pending work."""
        self._current()
        return self._query(self._calls.stream_query, self._stream(stream))

    def stream_wait_event(self, stream: Handle | None, event: Handle) -> None:
        """Later work on ``stream`` waits for ``event``."""
        self._current()
        raw_event = live(event, GpuEvent, "event")
        self._call(self._calls.stream_wait_event, self._stream(stream), raw_event, 0)

    def event_create(self) -> Handle:
        """An event with timing enabled."""
        device = self._current()
        raw = self._call(self._calls.event_create, self._k.event_flags)
        return self._track(self._ledger.events, GpuEvent(raw, device))

    def event_destroy(self, event: Handle) -> None:
        """Destroy an event."""
        self._destroy(event, GpuEvent, "event", self._calls.event_destroy, self._ledger.events)

    def event_record(self, event: Handle, stream: Handle | None) -> None:
        """Record ``event`` on ``stream``."""
        self._current()
        self._call(self._calls.event_record, live(event, GpuEvent, "event"), self._stream(stream))

    def event_synchronize(self, event: Handle) -> None:
        """Wait for the event."""
        self._current()
        self._call(self._calls.event_synchronize, live(event, GpuEvent, "event"))
        self._staging.reclaim()

    def event_query(self, event: Handle) -> bool:
        """True once the event completed."""
        self._current()
        return self._query(self._calls.event_query, live(event, GpuEvent, "event"))

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """Milliseconds between two completed events (hipErrorNotReady if not yet)."""
        self._current()
        ms = self._call(
            self._calls.event_elapsed_time,
            live(start, GpuEvent, "event"),
            live(end, GpuEvent, "event"),
        )
        return float(ms)

    # --- modules and kernels -------------------------------------------------------------

    def compile(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """HIP C++ to a code object for the current device with the runtime's compiler
        (NVRTC with a HIP prelude, or hiprtc); hipErrorInvalidSource with the compiler
        log when the source is refused. Cached in-process by sha256 of (source,
        effective options, arch)."""
        device = self._current()
        arch = self.device_properties(device).arch
        opts = self._rt.compile_options(options, arch)
        key = CodeCache.key(source, opts, arch)
        cached = self._code_cache.get(key)
        if cached is not None:
            return cached
        image = self._compile_program(source, name, opts)
        self._code_cache.put(key, image)
        return image

    def _compile_program(self, source: str, name: str, opts: list[str]) -> bytes:
        rtc = self._rt.rtc_calls
        headers, includes = self._rt.program_headers()
        prog = self._rt.rtc_call(
            rtc.create_program,
            source.encode(),
            (name or "kernel.hip").encode(),
            len(headers),
            headers,
            includes,
        )
        try:
            (err,) = self._rt.rtc_raw(
                rtc.compile_program, prog, len(opts), [o.encode() for o in opts]
            )
            log = self._program_log(prog)
            if int(err) != _SUCCESS:
                raise rtc_error(int(err), f"{rtc.compile_program} of {name!r}", log)
            return self._program_image(prog)
        finally:
            self._rt.rtc_raw(rtc.destroy_program, prog)

    def _program_image(self, prog: Any) -> bytes:
        *fallbacks, (size_fn, read_fn) = self._rt.rtc_images
        for try_size, try_read in fallbacks:
            try:
                size = int(self._rt.rtc_call(try_size, prog))
            except HipError:
                size = 0  # e.g. a virtual architecture: there is no CUBIN, only PTX
            if size > 0:
                return self._read_program(try_read, prog, size)
        return self._read_program(read_fn, prog, int(self._rt.rtc_call(size_fn, prog)))

    def _read_program(self, fn: str, prog: Any, size: int) -> bytes:
        buf = self._rt.output_buffer(size)
        self._rt.rtc_call(fn, prog, buf)
        return bytes(buf)

    def _program_log(self, prog: Any) -> str:
        rtc = self._rt.rtc_calls
        size = int(self._rt.rtc_call(rtc.program_log_size, prog))
        if size <= 1:
            return ""
        buf = self._rt.output_buffer(size)
        self._rt.rtc_call(rtc.program_log, prog, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace")

    def module_load(self, image: bytes) -> Handle:
        """Load a code object (on CUDA: a CUBIN, fatbin or PTX image) on the current
        device."""
        device = self._current()
        check_image(self._rt.name, image)
        raw = self._call(self._calls.module_load_data, self._rt.loadable_image(bytes(image)))
        return self._track(self._ledger.modules, GpuModule(raw, device))

    def module_unload(self, module: Handle) -> None:
        """Unload a module; the shared built-in module is left loaded."""
        live(module, GpuModule, "module")
        if module.builtin:
            return
        fn, modules = self._calls.module_unload, self._ledger.modules
        self._destroy(module, GpuModule, "module", fn, modules, self._forget_param_sizes)

    def _forget_param_sizes(self, module: GpuModule) -> None:
        # A later module's function may reuse an address whose parameter size is known.
        self._param_sizes.clear()

    def module_get_function(self, module: Handle, name: str) -> Handle:
        """A kernel of the module; hipErrorNotFound when it has none of that name."""
        raw = live(module, GpuModule, "module")
        self._current()
        return self._call(self._calls.module_get_function, raw, name.encode())

    def builtin_module(self) -> Handle:
        """hipr's built-in kernels, compiled and loaded once per device."""
        device = self._current()
        with self._builtin_lock:
            module = self._builtin.get(device)
            if module is None:
                image = self.compile(BUILTIN_SOURCE, "hipr_builtins.hip", ())
                raw = self._call(self._calls.module_load_data, image)
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
        """A kernel launch with ``args`` through the ``extra`` buffer-pointer path."""
        check_dims(grid, block)
        raw_stream, extra = self._launch_target(stream)
        self._issue(function, (*grid, *block), shared_mem, raw_stream, extra, args)

    def launcher(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
    ) -> Callable[[bytes], None]:
        """:meth:`launch` of one configuration, made ready once for many launches (a
        batch): the geometry's check, the stream and the thread's ``extra`` array are
        looked up here, and each call costs the argument buffer's copy and the runtime's
        launch. Call it on the thread that runs the launches."""
        check_dims(grid, block)
        raw_stream, extra = self._launch_target(stream)
        return partial(self._issue, function, (*grid, *block), shared_mem, raw_stream, extra)

    def _issue(
        self,
        function: Handle,
        dims: tuple[int, ...],
        shared_mem: int,
        raw_stream: Any,
        extra: ReusedLaunchExtra,
        args: bytes,
    ) -> None:
        """The runtime's launch of ``args`` (grid and block in ``dims``), the rest ready."""
        packed = self._fit_args(function, args)
        if len(packed) <= extra.capacity:
            address = extra.fill(packed)
        else:  # more than the protocol carries (a direct caller): a buffer of its own
            fresh = self._extra(packed)
            address = fresh.address
        # The runtime's function bound once (the launch is the hot path): no look-up by
        # name, no generic result handling, per launch.
        result = self._launch_kernel(function, *dims, shared_mem, raw_stream, None, address)
        err = int(result[0])
        if err != _SUCCESS:
            raise self._rt.error(err, self._calls.launch_kernel)

    def _launch_target(self, stream: Handle | None) -> tuple[Any, ReusedLaunchExtra]:
        """The raw stream of a launch and the calling thread's reused ``extra`` array."""
        # The lane's device and default stream read once (the launch is the hot path;
        # _current() and _stream() would each look the lane up again).
        lane = self._lanes.state
        device = getattr(lane, "device", None)
        if device is None:
            device = self._current()
        if stream is None:
            defaults: dict[int, Any] | None = getattr(lane, "default_streams", None)
            raw_stream = defaults.get(device) if defaults else None
            if raw_stream is None:
                raw_stream = self._default_stream()
        else:
            raw_stream = live(stream, GpuStream, "stream")
        extra: ReusedLaunchExtra | None = getattr(self._launch_extras, "extra", None)
        if extra is None:
            pointer, size, end = self._extra_words
            extra = ReusedLaunchExtra(
                MAX_ARGS_BYTES, buffer_pointer=pointer, buffer_size=size, end=end
            )
            self._launch_extras.extra = extra
        return raw_stream, extra

    def _param_size(self, function: Any) -> int | None:
        """Bytes of ``function``'s parameter space (end of its last parameter), from the
        runtime's parameter-info call; None where it cannot say (HIP; CUDA before 12.4)."""
        call = self._rt.param_info_call
        if call is None:
            return None
        key = int(function)
        if key in self._param_sizes:
            return self._param_sizes[key]
        size: int | None = None
        if self._rt.provides(call):
            end, index = 0, 0
            while index < _MAX_PARAMS:
                result = self._rt.raw(call, function, index)
                err = int(result[0])
                if err != _SUCCESS:
                    # Past the last parameter the driver says INVALID_VALUE; anything
                    # else (NOT_SUPPORTED, ...) means it cannot tell us.
                    size = end if err == _INVALID_VALUE else None
                    break
                end = int(result[1]) + int(result[2])
                index += 1
        self._param_sizes[key] = size
        return size

    def function_params(self, function: Handle) -> list[tuple[int, int, bool]]:
        """Each parameter's (offset, size) from the runtime's parameter-info call
        (``cuFuncGetParamInfo``, CUDA 12.4+); pointer-ness is not reported there.
        hipErrorNotSupported on HIP (reading the code object's ``amdhsa.kernels`` metadata
        is later work) and on older CUDA drivers."""
        call = self._rt.param_info_call
        if call is None or not self._rt.provides(call):
            raise HipError(
                HipErrorCode.hipErrorNotSupported,
                "this runtime cannot report a kernel's parameter layout",
            )
        params: list[tuple[int, int, bool]] = []
        while len(params) < _MAX_PARAMS:
            result = self._rt.raw(call, function, len(params))
            err = int(result[0])
            if err == _INVALID_VALUE:
                break  # past the last parameter
            if err != _SUCCESS:
                raise HipError(
                    HipErrorCode.hipErrorNotSupported,
                    f"{call} failed ({err}): the kernel's parameter layout is unknown",
                )
            params.append((int(result[1]), int(result[2]), False))
        return params

    def function_attribute(self, function: Handle, attribute: int, value: int | None) -> int:
        """A kernel's attribute (CUfunction_attribute numbering), set to ``value`` first
        when one is given; hipErrorNotSupported where the runtime adapter cannot (HIP for
        now)."""
        call = getattr(self._rt, "function_attribute", None)
        if call is None:
            raise HipError(
                HipErrorCode.hipErrorNotSupported,
                "kernel attributes are served on cuda workers only",
            )
        self._current()
        return int(call(function, attribute, value))

    def function_occupancy(
        self, function: Handle, query: str, numbers: dict[str, Any]
    ) -> dict[str, int]:
        """The driver's occupancy figure ``query`` for a kernel (see the FUNCTION_OCCUPANCY
        handler); hipErrorNotSupported where the runtime adapter cannot (HIP for now)."""
        call = getattr(self._rt, "function_occupancy", None)
        if call is None:
            raise HipError(
                HipErrorCode.hipErrorNotSupported, "occupancy is served on cuda workers only"
            )
        self._current()
        result: dict[str, int] = call(function, query, numbers)
        return result

    def _fit_args(self, function: Any, args: bytes) -> bytes:
        """``args`` without zero tail padding past the kernel's last parameter.

        A packer that rounds the buffer up to the largest alignment, as ``sizeof`` of a
        struct would, leaves bytes the kernel does not have, and CUDA refuses such a
        launch with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. HIP does not care, so the same
        client code must work here: trailing zeros shorter than one alignment unit (16
        bytes) are dropped; anything else goes to the driver unchanged, to be judged."""
        size = self._param_size(function)
        if size is None or len(args) <= size:
            return args
        tail = args[size:]
        if len(tail) < 16 and not any(tail):
            return args[:size]
        return args

    def _extra(self, args: bytes) -> LaunchExtra:
        pointer, size, end = self._extra_words
        return LaunchExtra(args, buffer_pointer=pointer, buffer_size=size, end=end)

    def _drop_carves(self) -> None:
        """At close: the carve blocks of streams never destroyed go back to the pool once
        their devices have finished the copies that read them."""
        with self._ledger.lock:
            carved = [s for s in self._ledger.streams if s.carve is not None]
        for device in sorted({s.device for s in carved}):
            self.bind_thread(device)
            with contextlib.suppress(HipError):  # a failed context reads nothing more
                self._call(self._calls.synchronize)
        for stream in carved:
            if stream.carve is not None:
                self._staging.give_back([stream.carve.block])
                stream.carve = None

    # --- graphs -------------------------------------------------------------------------

    def stream_begin_capture(self, stream: Handle) -> None:
        """Capture ``stream``'s work (relaxed mode, so other sessions carry on)."""
        self._current()
        raw = self._stream(stream)
        self._call(self._calls.stream_begin_capture, raw, self._k.capture_mode)
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
            graph_raw = self._call(self._calls.stream_end_capture, raw)
        except HipError:
            self._staging.give_back(blocks)  # captured copies never ran
            raise
        graph = GpuGraph(graph_raw, device, HostRefs(blocks=blocks, owners=1))
        return self._track(self._ledger.graphs, graph)

    def graph_create(self) -> Handle:
        """An empty graph."""
        device = self._current()
        raw = self._call(self._calls.graph_create, 0)
        return self._track(self._ledger.graphs, GpuGraph(raw, device, HostRefs(owners=1)))

    def graph_destroy(self, graph: Handle) -> None:
        """Destroy a graph; its instantiations live on (and keep its host buffers)."""
        fn, graphs = self._calls.graph_destroy, self._ledger.graphs
        self._destroy(graph, GpuGraph, "graph", fn, graphs, self._release_refs)

    def _add_node(self, fn: str, raw: Any, deps: list[Any], *params: Any) -> Handle:
        return self._call(fn, raw, deps or None, len(deps), *params)

    def _add_copy_node(
        self,
        graph: Handle,
        dependencies: Sequence[Handle],
        size: int,
        fn: str,
        params: Callable[[int], tuple[Any, ...]],
    ) -> Handle:
        """A memset or copy node made by ``fn`` with ``params(device)`` after (graph,
        dependencies, count); for ``size`` 0 an empty node, which keeps the dependency
        chain without handing the runtime a zero-byte operation."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        deps = list(dependencies)
        if size == 0:
            return self._add_node(self._calls.graph_add_empty_node, raw, deps)
        return self._add_node(fn, raw, deps, *params(graph.device))

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> Handle:
        """A 1-byte-element memset node (an empty node when ``size`` is 0)."""
        return self._add_copy_node(
            graph,
            dependencies,
            size,
            self._calls.graph_add_memset_node,
            lambda device: self._rt.memset_node_args(device, ptr, value & 0xFF, size),
        )

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> Handle:
        """A device-to-device copy node (an empty node when ``size`` is 0)."""
        return self._add_copy_node(
            graph,
            dependencies,
            size,
            self._calls.graph_add_memcpy_node,
            lambda device: self._rt.memcpy_node_args(device, dst, src, size),
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
        extra = self._extra(self._fit_args(function, args))
        p = self._rt.kernel_node_params(function, grid, block, shared_mem, extra.address)
        node = self._add_node(self._calls.graph_add_kernel_node, raw, deps, p)
        del extra  # the driver copied the argument bytes into the node
        return node

    def graph_instantiate(self, graph: Handle) -> Handle:
        """An executable graph; it shares the graph's host buffers."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        exec_raw = self._call(self._calls.graph_instantiate, raw, 0)
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
        self._call(self._calls.graph_launch, raw, s)
        refs = graph_exec.refs
        if refs.blocks:
            # Its staged buffers may be freed only after this launch has read them.
            fence = self.fence_after(s)
            with self._ledger.lock:
                done = [f for f in refs.fences if self.fence_done(f)]
                refs.fences = [f for f in refs.fences if f not in done] + [fence]
            for f in done:
                self.fence_destroy(f)

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """Destroy an executable graph."""
        fn, execs = self._calls.graph_exec_destroy, self._ledger.execs
        self._destroy(graph_exec, GpuGraphExec, "graph exec", fn, execs, self._release_refs)

    def _release_refs(self, owner: GpuGraph | GpuGraphExec) -> None:
        release_refs(self._staging, owner.refs)

    # --- accounting ----------------------------------------------------------------------

    def stats(self) -> BackendStats:
        """Live resources created through this backend (built-in modules not counted)."""
        return self._ledger.stats()

    def close(self) -> None:
        """Free staging memory and the built-in modules, then give back what the runtime
        holds (on CUDA, the primary contexts)."""
        if self._closed:
            return
        self._closed = True
        for device, module in list(self._builtin.items()):
            try:
                self.bind_thread(device)
                self._call(self._calls.module_unload, module.handle)
            except HipError:
                pass
        self._builtin.clear()
        if self._bound_devices:
            try:
                self._drop_carves()
                self.bind_thread(min(self._bound_devices))
                self._staging.close(wait=lambda: self._call(self._calls.synchronize))
                self._payloads.close()
                for block in self._orphan_refs:
                    self.host_free(block.ptr)
                self._orphan_refs.clear()
            except HipError:
                pass
        self._rt.release()
        self._lanes = _ThreadLanes()
