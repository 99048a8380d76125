"""A backend that fails on purpose: wraps any :class:`~hipr.backends.interface.Backend` and makes
its calls raise, at a chosen probability or on a chosen schedule, deterministically.

Two kinds of fault are injected, both *before* the wrapped call runs (so a failed call
changes nothing on the device, as a refused runtime call does):

- a :class:`~hipr.errors.HipError` with one of ``codes``: the runtime refusing a call;
- an :class:`InjectedCrash` (not a HipError): a bug or a crash on the session's GPU
  thread, which the worker must survive and report as an internal error.

Whether call number *n* of method *m* fails depends only on ``(seed, m, n)``, never on
how the session threads interleave, so a failing run can be replayed with its seed.
``stats``, ``close`` and ``name`` never fail: they are the test's oracle and the
worker's shutdown.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from hipr.backends.interface import Backend, BackendStats, DeviceProperties, Dim3, Handle
from hipr.errors import HipError, HipErrorCode

T = TypeVar("T")

#: Every Backend method that may be made to fail.
BACKEND_METHODS: tuple[str, ...] = (
    "device_count",
    "device_properties",
    "bind_thread",
    "mem_get_info",
    "synchronize",
    "malloc",
    "free",
    "memcpy_htod",
    "memcpy_dtoh",
    "memcpy_dtod",
    "memset",
    "stream_create",
    "stream_destroy",
    "stream_synchronize",
    "stream_query",
    "stream_wait_event",
    "event_create",
    "event_destroy",
    "event_record",
    "event_synchronize",
    "event_query",
    "event_elapsed_ms",
    "compile",
    "program_link",
    "module_load",
    "module_unload",
    "module_get_function",
    "builtin_module",
    "function_params",
    "launch",
    "stream_begin_capture",
    "stream_end_capture",
    "graph_create",
    "graph_destroy",
    "graph_add_memset",
    "graph_add_memcpy",
    "graph_add_kernel",
    "graph_instantiate",
    "graph_launch",
    "graph_exec_destroy",
)

#: The calls that give a resource back. A failure here leaves the resource held on a
#: real runtime too, so leak checks run with these excluded (see :meth:`FaultBackend.spare`).
RELEASE_METHODS: frozenset[str] = frozenset(
    {
        "free",
        "stream_destroy",
        "event_destroy",
        "module_unload",
        "graph_destroy",
        "graph_exec_destroy",
    }
)

#: Optional hooks of the wrapped backend that the wrapper passes on untouched: a
#: session's teardown (its thread's default streams) and the pinned payload buffers. They
#: are not calls a client's request makes, so they are no injection point.
FORWARDED: frozenset[str] = frozenset(
    {"release_thread", "reserve_payload_buffers", "payload_buffer", "payload_buffer_figures"}
)

#: Errors a real runtime returns under pressure or misuse.
DEFAULT_CODES: tuple[HipErrorCode, ...] = (
    HipErrorCode.hipErrorOutOfMemory,
    HipErrorCode.hipErrorInvalidValue,
    HipErrorCode.hipErrorLaunchFailure,
    HipErrorCode.hipErrorIllegalAddress,
    HipErrorCode.hipErrorNotReady,
    HipErrorCode.hipErrorUnknown,
)


class InjectedCrash(RuntimeError):
    """A simulated crash on a GPU thread: deliberately not a HipError."""


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One fault the backend raised."""

    method: str
    call: int
    crash: bool
    code: int


def _unit(seed: int, method: str, call: int, salt: str) -> float:
    """A uniform number in [0, 1) fixed by its inputs (stable across runs and platforms)."""
    digest = hashlib.blake2b(f"{seed}:{method}:{call}:{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class FaultBackend:
    """Wraps ``inner``; each call of a method in ``methods`` fails with ``probability``.

    Of the failures, a share ``crash_share`` raise :class:`InjectedCrash`, the others a
    HipError with a code drawn from ``codes``. :meth:`fail_next` schedules failures of
    particular calls on top. Set :attr:`enabled` to False to pause injection.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        seed: int = 0,
        probability: float = 0.0,
        crash_share: float = 0.0,
        methods: Iterable[str] | None = None,
        codes: Sequence[HipErrorCode] = DEFAULT_CODES,
    ) -> None:
        if not 0.0 <= probability <= 1.0 or not 0.0 <= crash_share <= 1.0:
            raise ValueError("probability and crash_share must lie in [0, 1]")
        chosen = frozenset(BACKEND_METHODS if methods is None else methods)
        unknown = chosen - set(BACKEND_METHODS)
        if unknown:
            raise ValueError(f"not backend methods: {sorted(unknown)}")
        if not codes:
            raise ValueError("codes must name at least one error")
        self.inner = inner
        self.name = inner.name
        self.seed = seed
        self.probability = probability
        self.crash_share = crash_share
        self.methods = chosen
        self.codes = tuple(codes)
        #: Injection happens only while this is True.
        self.enabled = True
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._scheduled: Counter[tuple[str, bool]] = Counter()
        self._spared: frozenset[str] = frozenset()
        #: Faults injected so far, in the order they were raised (bounded: see ``max_log``).
        self.injected: list[InjectedFault] = []
        self.max_log = 10_000
        self.injected_count = 0
        #: Of which simulated crashes.
        self.crash_count = 0
        self.by_method: Counter[str] = Counter()

    @property
    def runs_work_at_submission(self) -> bool:
        """The inner backend's answer (the emulator's work is done when a call returns)."""
        return bool(getattr(self.inner, "runs_work_at_submission", False))

    # --- control ---------------------------------------------------------------------------
    def fail_next(self, method: str, *, crash: bool = False, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` fail (a crash when ``crash``),
        whatever the probability, while injection is enabled."""
        if method not in BACKEND_METHODS:
            raise ValueError(f"{method!r} is not a backend method")
        with self._lock:
            self._scheduled[(method, crash)] += times

    @contextmanager
    def spare(self, methods: Iterable[str] = RELEASE_METHODS) -> Iterator[None]:
        """Within the block, never fail ``methods`` (e.g. the releases of a final teardown)."""
        previous = self._spared
        self._spared = previous | frozenset(methods)
        try:
            yield
        finally:
            self._spared = previous

    def calls(self, method: str | None = None) -> int:
        """Calls seen so far, of ``method`` or of all methods."""
        with self._lock:
            return self._calls[method] if method else sum(self._calls.values())

    # --- the injection point ---------------------------------------------------------------
    def _decide(self, method: str) -> InjectedFault | None:
        with self._lock:
            call = self._calls[method]
            self._calls[method] = call + 1
            if not self.enabled or method in self._spared:
                return None
            for crash in (True, False):
                if self._scheduled[(method, crash)] > 0:
                    self._scheduled[(method, crash)] -= 1
                    return self._record(method, call, crash)
            if method not in self.methods or self.probability <= 0.0:
                return None
            if _unit(self.seed, method, call, "p") >= self.probability:
                return None
            crash = _unit(self.seed, method, call, "crash") < self.crash_share
            return self._record(method, call, crash)

    def _record(self, method: str, call: int, crash: bool) -> InjectedFault:
        index = int(_unit(self.seed, method, call, "code") * len(self.codes))
        fault = InjectedFault(method, call, crash, int(self.codes[index]))
        self.injected_count += 1
        self.crash_count += crash
        self.by_method[method] += 1
        if len(self.injected) < self.max_log:
            self.injected.append(fault)
        return fault

    def _call(self, method: str, fn: Callable[..., T], *args: Any) -> T:
        fault = self._decide(method)
        if fault is not None:
            if fault.crash:
                raise InjectedCrash(f"injected crash in {method} (call {fault.call})")
            raise HipError(fault.code, f"injected fault in {method} (call {fault.call})")
        return fn(*args)

    # --- devices ---------------------------------------------------------------------------
    def device_count(self) -> int:
        """See :meth:`Backend.device_count`."""
        return self._call("device_count", self.inner.device_count)

    def device_properties(self, device: int) -> DeviceProperties:
        """See :meth:`Backend.device_properties`."""
        return self._call("device_properties", self.inner.device_properties, device)

    def bind_thread(self, device: int) -> None:
        """See :meth:`Backend.bind_thread`."""
        self._call("bind_thread", self.inner.bind_thread, device)

    def mem_get_info(self) -> tuple[int, int]:
        """See :meth:`Backend.mem_get_info`."""
        return self._call("mem_get_info", self.inner.mem_get_info)

    def synchronize(self) -> None:
        """See :meth:`Backend.synchronize`."""
        self._call("synchronize", self.inner.synchronize)

    # --- memory ----------------------------------------------------------------------------
    def malloc(self, size: int) -> int:
        """See :meth:`Backend.malloc`."""
        return self._call("malloc", self.inner.malloc, size)

    def free(self, ptr: int) -> None:
        """See :meth:`Backend.free`."""
        self._call("free", self.inner.free, ptr)

    def memcpy_htod(self, dst: int, src: memoryview, stream: Handle | None = None) -> None:
        """See :meth:`Backend.memcpy_htod`."""
        self._call("memcpy_htod", self.inner.memcpy_htod, dst, src, stream)

    def memcpy_dtoh(self, dst: memoryview, src: int, stream: Handle | None = None) -> None:
        """See :meth:`Backend.memcpy_dtoh`."""
        self._call("memcpy_dtoh", self.inner.memcpy_dtoh, dst, src, stream)

    def memcpy_dtod(self, dst: int, src: int, size: int, stream: Handle | None = None) -> None:
        """See :meth:`Backend.memcpy_dtod`."""
        self._call("memcpy_dtod", self.inner.memcpy_dtod, dst, src, size, stream)

    def memset(self, ptr: int, value: int, size: int, stream: Handle | None = None) -> None:
        """See :meth:`Backend.memset`."""
        self._call("memset", self.inner.memset, ptr, value, size, stream)

    # --- streams and events ------------------------------------------------------------------
    def stream_create(self) -> Handle:
        """See :meth:`Backend.stream_create`."""
        return self._call("stream_create", self.inner.stream_create)

    def stream_destroy(self, stream: Handle) -> None:
        """See :meth:`Backend.stream_destroy`."""
        self._call("stream_destroy", self.inner.stream_destroy, stream)

    def stream_synchronize(self, stream: Handle | None) -> None:
        """See :meth:`Backend.stream_synchronize`."""
        self._call("stream_synchronize", self.inner.stream_synchronize, stream)

    def stream_query(self, stream: Handle | None) -> bool:
        """See :meth:`Backend.stream_query`."""
        return self._call("stream_query", self.inner.stream_query, stream)

    def stream_wait_event(self, stream: Handle | None, event: Handle) -> None:
        """See :meth:`Backend.stream_wait_event`."""
        self._call("stream_wait_event", self.inner.stream_wait_event, stream, event)

    def event_create(self) -> Handle:
        """See :meth:`Backend.event_create`."""
        return self._call("event_create", self.inner.event_create)

    def event_destroy(self, event: Handle) -> None:
        """See :meth:`Backend.event_destroy`."""
        self._call("event_destroy", self.inner.event_destroy, event)

    def event_record(self, event: Handle, stream: Handle | None) -> None:
        """See :meth:`Backend.event_record`."""
        self._call("event_record", self.inner.event_record, event, stream)

    def event_synchronize(self, event: Handle) -> None:
        """See :meth:`Backend.event_synchronize`."""
        self._call("event_synchronize", self.inner.event_synchronize, event)

    def event_query(self, event: Handle) -> bool:
        """See :meth:`Backend.event_query`."""
        return self._call("event_query", self.inner.event_query, event)

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """See :meth:`Backend.event_elapsed_ms`."""
        return self._call("event_elapsed_ms", self.inner.event_elapsed_ms, start, end)

    # --- modules and kernels -----------------------------------------------------------------
    def compile(
        self,
        source: str,
        name: str,
        options: Sequence[str],
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """See :meth:`Backend.compile`."""
        if headers:
            return self._call("compile", self.inner.compile, source, name, options, headers)
        return self._call("compile", self.inner.compile, source, name, options)

    def program_link(self, inputs: Sequence[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """See :meth:`Backend.program_link`."""
        result: tuple[bytes, str] = self._call("program_link", self.inner.program_link, inputs)
        return result

    def module_load(self, image: bytes) -> Handle:
        """See :meth:`Backend.module_load`."""
        return self._call("module_load", self.inner.module_load, image)

    def module_unload(self, module: Handle) -> None:
        """See :meth:`Backend.module_unload`."""
        self._call("module_unload", self.inner.module_unload, module)

    def module_get_function(self, module: Handle, name: str) -> Handle:
        """See :meth:`Backend.module_get_function`."""
        return self._call("module_get_function", self.inner.module_get_function, module, name)

    def function_params(self, function: Handle) -> list[tuple[int, int, bool]]:
        """See :meth:`Backend.function_params`."""
        return self._call("function_params", self.inner.function_params, function)

    def builtin_module(self) -> Handle:
        """See :meth:`Backend.builtin_module`."""
        return self._call("builtin_module", self.inner.builtin_module)

    def launch(
        self,
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        stream: Handle | None,
        args: bytes,
    ) -> None:
        """See :meth:`Backend.launch`."""
        self._call("launch", self.inner.launch, function, grid, block, shared_mem, stream, args)

    # --- graphs ----------------------------------------------------------------------------
    def stream_begin_capture(self, stream: Handle) -> None:
        """See :meth:`Backend.stream_begin_capture`."""
        self._call("stream_begin_capture", self.inner.stream_begin_capture, stream)

    def stream_end_capture(self, stream: Handle) -> Handle:
        """See :meth:`Backend.stream_end_capture`."""
        return self._call("stream_end_capture", self.inner.stream_end_capture, stream)

    def graph_create(self) -> Handle:
        """See :meth:`Backend.graph_create`."""
        return self._call("graph_create", self.inner.graph_create)

    def graph_destroy(self, graph: Handle) -> None:
        """See :meth:`Backend.graph_destroy`."""
        self._call("graph_destroy", self.inner.graph_destroy, graph)

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> Handle:
        """See :meth:`Backend.graph_add_memset`."""
        return self._call(
            "graph_add_memset", self.inner.graph_add_memset, graph, dependencies, ptr, value, size
        )

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> Handle:
        """See :meth:`Backend.graph_add_memcpy`."""
        return self._call(
            "graph_add_memcpy", self.inner.graph_add_memcpy, graph, dependencies, dst, src, size
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
        """See :meth:`Backend.graph_add_kernel`."""
        return self._call(
            "graph_add_kernel",
            self.inner.graph_add_kernel,
            graph,
            dependencies,
            function,
            grid,
            block,
            shared_mem,
            args,
        )

    def graph_instantiate(self, graph: Handle) -> Handle:
        """See :meth:`Backend.graph_instantiate`."""
        return self._call("graph_instantiate", self.inner.graph_instantiate, graph)

    def graph_launch(self, graph_exec: Handle, stream: Handle | None) -> None:
        """See :meth:`Backend.graph_launch`."""
        self._call("graph_launch", self.inner.graph_launch, graph_exec, stream)

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """See :meth:`Backend.graph_exec_destroy`."""
        self._call("graph_exec_destroy", self.inner.graph_exec_destroy, graph_exec)

    # --- what the wrapped backend has beyond the interface ----------------------------------
    def __getattr__(self, name: str) -> Any:
        """The wrapped backend's optional teardown and payload hooks (:data:`FORWARDED`),
        where it has them: without ``release_thread`` a GPU backend's sessions would
        leave their threads' default streams behind. Nothing that runs GPU work is
        forwarded (``run_in_lane``, ``launcher``, ...): every such call goes through
        the injection point."""
        if name in FORWARDED and "inner" in self.__dict__:
            return getattr(self.inner, name)
        raise AttributeError(name)

    # --- accounting (never fails) ----------------------------------------------------------
    def stats(self) -> BackendStats:
        """The wrapped backend's live resources."""
        return self.inner.stats()

    def close(self) -> None:
        """Close the wrapped backend."""
        self.inner.close()


if TYPE_CHECKING:
    # mypy proves the wrapper satisfies the Protocol, signatures included.
    from hipr.backends.emulator import EmulatorBackend

    _protocol_check: Backend = FaultBackend(EmulatorBackend())
