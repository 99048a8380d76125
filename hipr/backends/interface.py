"""The one interface every GPU backend implements (hip, cuda, emulator).

Threading contract: the worker calls a backend only from session GPU threads, one
thread per session, many sessions at once. Before a session's first call, and again
after it changes device, the worker calls :meth:`Backend.bind_thread` on that thread
(HIP's current device and CUDA's current context are per host thread). A backend must
therefore be safe to call from several threads concurrently.

Every failure is raised as :class:`hipr.errors.HipError` with HIP's code. Handles
(streams, events, modules, functions, graphs, graph execs) are opaque objects owned by
the backend; the worker never sends them over the wire, it maps them to per-session ids.
``stream=None`` always means the device's default (null) stream.

Optional fast path: a backend may name, in ``inline_calls`` (a frozenset of method
names), the calls that never wait for the GPU and do not depend on which thread calls
them. The worker then runs such a call on its event-loop thread (after
:meth:`Backend.bind_thread` there) whenever the session's GPU thread has nothing queued,
saving a thread round trip. ``inline_when`` (a mapping of method name to a predicate
over the call's arguments) does the same for calls that are quick for some arguments
only, such as a kernel over few elements where kernels run on the host. A backend may
also offer ``work_done(streams) -> bool``, a non-blocking "has everything this session
issued (on ``streams`` and the default stream) finished?", which lets a device
synchronisation on an idle device be answered at once. A backend may also offer
``memcpy_dtoh_if_quick(dst, src, stream, spin_seconds) -> bool`` with
``quick_dtoh_bytes``: a small copy back made on the loop when the stream's work ends
within the poll, else nothing copied (the worker then makes the usual copy). Backends
without them (a fault-injecting wrapper, say) keep every call on the session's thread.

Bulk data: a backend whose device memory is host memory (the emulator) may offer
``host_window(dst, size) -> memoryview``, a writable view of those device bytes; the
worker then receives a synchronous upload straight into it instead of into a buffer that
is copied afterwards. A GPU backend may offer ``reserve_payload_buffers(count, size)``
and ``payload_buffer(size)``: page-locked host buffers that uploads are received into
and downloads filled from, so that its copies are DMAs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from hipr.errors import HipError, HipErrorCode

#: An opaque backend object: a stream, event, module, function, graph or graph exec.
Handle = Any
Dim3 = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class DeviceProperties:
    """What users look for in a device. ``arch`` is gcnArchName on AMD (``gfx942:sramecc+``)
    and ``sm_90`` style on NVIDIA."""

    name: str
    arch: str
    total_memory: int
    multiprocessor_count: int
    warp_size: int
    max_threads_per_block: int
    clock_rate_khz: int
    pci_bus_id: str
    major: int = 0
    minor: int = 0
    max_shared_memory_per_block: int = 0
    #: More ``hipDeviceProp_t`` fields by their HIP names (``maxThreadsDim``,
    #: ``maxGridSize``, ``l2CacheSize``...): ints or lists of ints, as far as the runtime
    #: tells them (:mod:`hipr.backends._hipprops`). ``hipr.hip`` serves them.
    hip_props: dict[str, int | list[int]] = field(default_factory=dict, compare=False)

    def to_wire(self) -> dict[str, Any]:
        """The CBOR map sent to clients."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BackendStats:
    """Live resources the backend holds, for leak checks and status pages."""

    allocations: int = 0
    allocated_bytes: int = 0
    streams: int = 0
    events: int = 0
    modules: int = 0
    graphs: int = 0
    graph_execs: int = 0

    def is_zero(self) -> bool:
        """True when nothing is held."""
        return not any(asdict(self).values())


@runtime_checkable
class Backend(Protocol):
    """A GPU runtime as the worker sees it. See the module docstring for threading."""

    #: ``"hip"``, ``"cuda"`` or ``"emulator"``.
    name: str

    # --- devices -------------------------------------------------------------------
    def device_count(self) -> int:
        """Visible devices."""
        ...

    def device_properties(self, device: int) -> DeviceProperties:
        """Properties of ``device``; hipErrorInvalidDevice when out of range."""
        ...

    def bind_thread(self, device: int) -> None:
        """Make ``device`` current on the calling thread (set device / push context)."""
        ...

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the calling thread's current device."""
        ...

    def synchronize(self) -> None:
        """Wait for all work on the current device."""
        ...

    # --- memory (addresses are plain ints; ranges were checked by the worker) -------
    def malloc(self, size: int) -> int:
        """Allocate ``size`` bytes on the current device; hipErrorOutOfMemory when full."""
        ...

    def free(self, ptr: int) -> None:
        """Free an allocation made by :meth:`malloc`."""
        ...

    def memcpy_htod(self, dst: int, src: memoryview, stream: Handle | None = None) -> None:
        """Copy host bytes to the device. With a stream the copy is ordered on it, and
        ``src`` stays valid only until this call returns: copy it if needed later."""
        ...

    def memcpy_dtoh(self, dst: memoryview, src: int, stream: Handle | None = None) -> None:
        """Copy ``dst.nbytes`` device bytes into the writable host buffer ``dst``;
        returns once the bytes are in ``dst``."""
        ...

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Handle | None = None) -> None:
        """Copy between device ranges (they may overlap only as memmove allows)."""
        ...

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """Set ``size`` bytes to the byte ``value``."""
        ...

    # --- streams and events -----------------------------------------------------------
    def stream_create(self) -> Handle:
        """A new stream on the current device."""
        ...

    def stream_destroy(self, stream: Handle) -> None:
        """Destroy a stream (its pending work still completes)."""
        ...

    def stream_synchronize(self, stream: Handle | None) -> None:
        """Wait for the stream's work."""
        ...

    def stream_query(self, stream: Handle | None) -> bool:
        """True when the stream has no pending work."""
        ...

    def stream_wait_event(self, stream: Handle | None, event: Handle) -> None:
        """Make later work on ``stream`` wait for ``event``."""
        ...

    def event_create(self) -> Handle:
        """A new event with timing enabled."""
        ...

    def event_destroy(self, event: Handle) -> None:
        """Destroy an event."""
        ...

    def event_record(self, event: Handle, stream: Handle | None) -> None:
        """Record ``event`` on ``stream``."""
        ...

    def event_synchronize(self, event: Handle) -> None:
        """Wait for the event."""
        ...

    def event_query(self, event: Handle) -> bool:
        """True when the event has completed."""
        ...

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """Milliseconds between two completed events."""
        ...

    # --- modules and kernels ----------------------------------------------------------
    def compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """Compile HIP C++ source for the current device; a compile error raises
        HipError (hipErrorInvalidSource) whose message carries the compiler log.
        ``headers`` are ``(include name, contents)`` pairs the source may ``#include``
        (hiprtcCreateProgram's headers)."""
        ...

    def program_link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """Link ``(hiprtcJITInputType, code, name)`` inputs (relocatable code of a
        ``-fgpu-rdc`` compile, PTX, CUBINs, ...) for the current device with the runtime's
        linker: (the loadable image, the linker's information log). A link error raises
        HipError with ``rtc_result`` HIPRTC_ERROR_LINKING and the error log;
        hipErrorNotSupported where the backend has no linker."""
        ...

    def module_load(self, image: bytes) -> Handle:
        """Load a code object."""
        ...

    def module_unload(self, module: Handle) -> None:
        """Unload a module; its functions become invalid."""
        ...

    def module_get_function(self, module: Handle, name: str) -> Handle:
        """A kernel of a loaded module; hipErrorNotFound when absent."""
        ...

    def builtin_module(self) -> Handle:
        """Load the built-in kernels (hipr.kernels) as a module of this backend."""
        ...

    def function_params(self, function: Handle) -> list[tuple[int, int, bool]]:
        """``(offset, size, is_pointer)`` of each parameter of a kernel, in order, so that
        a client given bare argument pointers (``kernelParams``) can pack them;
        hipErrorNotSupported where the runtime cannot tell. ``is_pointer`` is False where
        the runtime does not say."""
        ...

    def launch(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
        args: bytes,
    ) -> None:
        """Launch with ``args`` packed with C alignment (the runtime's ``extra``
        buffer-pointer path). Asynchronous: failures may surface at a later sync."""
        ...

    # --- graphs -----------------------------------------------------------------------
    def stream_begin_capture(self, stream: Handle) -> None:
        """Start capturing the work issued on ``stream`` into a graph."""
        ...

    def stream_end_capture(self, stream: Handle) -> Handle:
        """Stop capturing; the captured graph."""
        ...

    def graph_create(self) -> Handle:
        """An empty graph."""
        ...

    def graph_destroy(self, graph: Handle) -> None:
        """Destroy a graph (its instantiations live on)."""
        ...

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> Handle:
        """A memset node; returns the node."""
        ...

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> Handle:
        """A device-to-device copy node; returns the node."""
        ...

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
        """A kernel node; returns the node."""
        ...

    def graph_instantiate(self, graph: Handle) -> Handle:
        """An executable graph."""
        ...

    def graph_launch(self, graph_exec: Handle, stream: Handle | None) -> None:
        """Launch an executable graph on ``stream``."""
        ...

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """Destroy an executable graph."""
        ...

    # --- accounting -------------------------------------------------------------------
    def stats(self) -> BackendStats:
        """What the backend holds now, across all sessions."""
        ...

    def close(self) -> None:
        """Release the runtime at worker shutdown."""
        ...


class BackendUnavailable(HipError):
    """A backend's runtime could not be loaded here: its Python package or native
    library is missing, the driver is too old, or it sees no device. The message is one
    line naming the library, e.g. ``cuda backend unavailable: could not load
    libcuda.so.1 (...)``; ``details["library"]`` names it too."""

    kind: ClassVar[str] = "backend_unavailable"
    default_code: ClassVar[int] = HipErrorCode.hipErrorNoDevice

    def __init__(self, code: int | None = None, message: str = "", **details: Any) -> None:
        # One line: this text ends up in logs and CLI errors, where a multi-line
        # loader traceback would bury the library's name.
        super().__init__(code, " ".join(message.split()), **details)

    @property
    def library(self) -> str:
        """The library (or package) that could not be used."""
        return str(self.details.get("library", ""))
