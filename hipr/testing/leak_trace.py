"""Who made what a GPU backend still holds: a debug trace for the reliability campaigns.

A campaign's leak oracle compares the backend's own books (``stats()``) before and after.
When they differ it says how much, not why. :class:`LeakTrace`, installed on a
:class:`~hipr.backends.gpu.GpuBackend` (cuda or hip, real or simulated), says why:

- for every object the backend creates, the backend call and the requests that make it
  (:data:`CREATORS`), the session thread that ran it, and when, relative to that
  session's teardown (before it; after it, so nothing would ever free it);
- every release the runtime refused, with its error;
- every runtime error by call and code, and when each code was first seen (a fault that
  poisons the context shows here as the moment every later call started to fail);
- the runtime's own books: objects created minus objects destroyed, counted at the
  runtime calls themselves (what ``stats()`` does not count shows here: the default
  streams of session threads, staging fences, pinned host buffers).

It wraps instance attributes only, so the backend's class and every other instance are
untouched, and costs a dictionary entry per object: cheap enough for a campaign of
millions of frames.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hipr.errors import HipError

#: Backend calls that make an object the session owns: (kind, the requests that call it).
CREATORS: dict[str, tuple[str, str]] = {
    "malloc": ("allocation", "MALLOC or MALLOC_HTOD"),
    "stream_create": ("stream", "STREAM_CREATE"),
    "event_create": ("event", "EVENT_CREATE"),
    "module_load": ("module", "MODULE_LOAD, MODULE_COMPILE or COMPILE_AND_GET_FUNCTION"),
    "graph_create": ("graph", "GRAPH_CREATE"),
    "stream_end_capture": ("graph", "STREAM_END_CAPTURE (or a session's teardown)"),
    "graph_instantiate": ("graph exec", "GRAPH_INSTANTIATE"),
}
#: Runtime results that poison a context (illegal address, launch failure: the same
#: numbers in CUresult and hipError_t): the trace keeps the calls that led up to one.
STICKY_CODES = frozenset({700, 719})
#: Every backend call the journal records (the Backend interface and the batch copy).
JOURNALED: tuple[str, ...] = (
    "synchronize",
    "malloc",
    "free",
    "memcpy_htod",
    "memcpy_htod_many",
    "memcpy_dtoh",
    "memcpy_dtod",
    "memset",
    "stream_create",
    "stream_destroy",
    "stream_synchronize",
    "stream_wait_event",
    "event_create",
    "event_destroy",
    "event_record",
    "event_synchronize",
    "module_load",
    "module_unload",
    "module_get_function",
    "launch",
    "launcher",
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

#: Backend calls that give an object back.
RELEASERS: tuple[str, ...] = (
    "free",
    "stream_destroy",
    "event_destroy",
    "module_unload",
    "graph_destroy",
    "graph_exec_destroy",
)
#: Runtime calls (fields of the runtime's call table) that make or free a runtime object,
#: by the kind of object: the runtime's books.
RUNTIME_MAKES: dict[str, str] = {
    "malloc": "allocation",
    "host_alloc": "pinned host buffer",
    "stream_create": "stream",
    "event_create": "event",
    "module_load_data": "module",
    "graph_create": "graph",
    "stream_end_capture": "graph",
    "graph_instantiate": "graph exec",
}
RUNTIME_FREES: dict[str, str] = {
    "free": "allocation",
    "host_free": "pinned host buffer",
    "stream_destroy": "stream",
    "event_destroy": "event",
    "module_unload": "module",
    "graph_destroy": "graph",
    "graph_exec_destroy": "graph exec",
}


@dataclass(frozen=True, slots=True)
class Origin:
    """Where one object came from."""

    kind: str
    method: str
    thread: str
    at: float


@dataclass
class LeakTrace:
    """The trace of one backend (see the module doc); :meth:`install` starts it."""

    started: float = field(default_factory=time.monotonic)
    origins: dict[int, Origin] = field(default_factory=dict)
    #: Threads whose session released everything (``release_thread`` ran), and when.
    released: dict[str, float] = field(default_factory=dict)
    refused_releases: Counter[str] = field(default_factory=Counter)
    runtime_errors: Counter[str] = field(default_factory=Counter)
    first_error_at: dict[str, float] = field(default_factory=dict)
    runtime_live: Counter[str] = field(default_factory=Counter)
    #: What the ledger and the runtime held at :meth:`mark_baseline`.
    baseline_keys: set[int] = field(default_factory=set)
    baseline_books: dict[str, int] = field(default_factory=dict)
    #: The last backend calls, and a copy of them taken when a sticky fault first showed.
    journal: deque[str] = field(default_factory=lambda: deque(maxlen=2000))
    before_fault: list[str] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _backend: Any = None

    # --- installing ------------------------------------------------------------------------
    @classmethod
    def install(cls, backend: Any) -> LeakTrace:
        """Trace ``backend`` (a GpuBackend) from now on."""
        trace = cls()
        trace._backend = backend
        for method in JOURNALED:
            if getattr(backend, method, None) is not None:
                trace._wrap_journal(backend, method)
        for method in CREATORS:
            trace._wrap_creator(backend, method)
        for method in RELEASERS:
            trace._wrap_releaser(backend, method)
        release_thread = getattr(backend, "release_thread", None)
        if release_thread is not None:
            backend.release_thread = trace._wrap_release_thread(release_thread)
        runtime = getattr(backend, "_rt", None)
        calls = getattr(backend, "_calls", None)
        if runtime is not None and calls is not None:
            trace._wrap_runtime(backend, runtime, calls)
        return trace

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _wrap_journal(self, backend: Any, method: str) -> None:
        inner = getattr(backend, method)
        names = self._names

        def journaled(*args: Any) -> Any:
            try:
                result = inner(*args)
            except Exception as exc:
                self._log(method, args, f"-> {_error_name(exc)[:60]}")
                raise
            if method == "module_get_function" and len(args) > 1:
                names[_key(result)] = str(args[1])
            self._log(method, args, "")
            return result

        journaled.__name__ = inner.__name__
        setattr(backend, method, journaled)

    def _log(self, method: str, args: tuple[Any, ...], outcome: str) -> None:
        shown = ", ".join(_brief(a, self._names) for a in args)
        thread = threading.current_thread().name.removeprefix("hipr-gpu-")[:8]
        self.journal.append(f"{self._now():9.4f} {thread:8} {method}({shown}) {outcome}")

    def _wrap_creator(self, backend: Any, method: str) -> None:
        inner = getattr(backend, method)
        kind = CREATORS[method][0]

        def create(*args: Any) -> Any:
            made = inner(*args)
            key = made if kind == "allocation" else id(made)
            with self._lock:
                self.origins[key] = Origin(
                    kind, method, threading.current_thread().name, self._now()
                )
            return made

        create.__name__ = inner.__name__
        setattr(backend, method, create)

    def _wrap_releaser(self, backend: Any, method: str) -> None:
        inner = getattr(backend, method)

        def release(*args: Any) -> Any:
            try:
                return inner(*args)
            except Exception as exc:
                with self._lock:
                    self.refused_releases[f"{method}: {_error_name(exc)}"] += 1
                raise

        release.__name__ = inner.__name__
        setattr(backend, method, release)

    def _wrap_release_thread(self, inner: Callable[[], None]) -> Callable[[], None]:
        def release_thread() -> None:
            try:
                inner()
            finally:
                with self._lock:
                    self.released[threading.current_thread().name] = self._now()

        release_thread.__name__ = inner.__name__
        return release_thread

    def _wrap_runtime(self, backend: Any, runtime: Any, calls: Any) -> None:
        """Count the runtime's objects at its own calls, and its errors."""
        kinds: dict[str, tuple[str, int]] = {}
        for name, kind in RUNTIME_MAKES.items():
            kinds[getattr(calls, name)] = (kind, +1)
        for name, kind in RUNTIME_FREES.items():
            kinds[getattr(calls, name)] = (kind, -1)
        call, raw = runtime.call, runtime.raw

        def note(fn: str, code: int) -> None:
            with self._lock:
                if code == 0:
                    counted = kinds.get(fn)
                    if counted is not None:
                        self.runtime_live[counted[0]] += counted[1]
                    return
                key = f"{fn}: {code}"
                self.runtime_errors[key] += 1
                self.first_error_at.setdefault(str(code), self._now())
                if code in STICKY_CODES and not self.before_fault:
                    self.before_fault = [*self.journal, f"{self._now():9.4f} first {key}"]

        def traced_call(fn: str, *args: Any) -> Any:
            try:
                out = call(fn, *args)
            except HipError as exc:
                note(fn, int(exc.details.get("cuda_result", exc.code)) or int(exc.code))
                raise
            note(fn, 0)
            return out

        def traced_raw(fn: str, *args: Any) -> Any:
            result = raw(fn, *args)
            try:
                note(fn, int(result[0]))
            except (TypeError, ValueError, IndexError):
                pass
            return result

        runtime.call = traced_call
        runtime.raw = traced_raw
        backend._call = traced_call

    # --- reading -----------------------------------------------------------------------------
    def mark_baseline(self) -> None:
        """Take what the backend and the runtime hold now (after a warm-up: shared
        modules, pinned buffers) as the baseline that :meth:`report` compares against."""
        self.baseline_keys = self.ledger_keys()
        self.baseline_books = self.runtime_books()

    def runtime_books(self) -> dict[str, int]:
        """Objects the runtime holds now that the trace saw made, by kind."""
        with self._lock:
            return {k: v for k, v in sorted(self.runtime_live.items()) if v}

    def leaked(self) -> list[str]:
        """One line per object the backend's ledger still holds beyond the baseline: its
        kind, the call and requests that made it, its session thread, and whether that
        session's teardown had run before it was made, ran after it, or never ran."""
        lines = []
        for key in sorted(self.ledger_keys() - self.baseline_keys):
            origin = self.origins.get(key)
            if origin is None:
                lines.append(f"object {key:#x}: made before the trace, or not by a traced call")
                continue
            released = self.released.get(origin.thread)
            if released is None:
                when = "its session's teardown never ran on that thread"
            elif released < origin.at:
                when = f"made {origin.at - released:.3f} s AFTER its session's teardown"
            else:
                when = "its session's teardown ran later and did not free it"
            lines.append(
                f"{origin.kind} by {origin.method} ({CREATORS[origin.method][1]}) on "
                f"{origin.thread} at {origin.at:.3f} s: {when}"
            )
        return lines

    def ledger_keys(self) -> set[int]:
        """The keys (pointer, or wrapper id) of what the backend's ledger holds now."""
        ledger = getattr(self._backend, "_ledger", None)
        if ledger is None:
            return set()
        with ledger.lock:
            keys = set(ledger.allocations)
            for bucket in (ledger.streams, ledger.events, ledger.graphs, ledger.execs):
                keys |= {id(obj) for obj in bucket}
            keys |= {id(m) for m in ledger.modules if not m.builtin}
        return keys

    def runtime_growth(self) -> dict[str, int]:
        """The runtime's objects now minus at the baseline, by kind (non-zero only)."""
        now = self.runtime_books()
        kinds = set(now) | set(self.baseline_books)
        growth = {k: now.get(k, 0) - self.baseline_books.get(k, 0) for k in sorted(kinds)}
        return {k: v for k, v in growth.items() if v}

    def report(self, limit: int = 40) -> list[str]:
        """Everything the trace knows, as lines for a campaign's output."""
        lines = [
            f"runtime's books at the baseline {self.baseline_books}, growth since "
            f"{self.runtime_growth()} (objects made minus freed, at the runtime's calls)"
        ]
        with self._lock:
            if self.refused_releases:
                lines.append(f"releases the runtime refused: {dict(self.refused_releases)}")
            if self.runtime_errors:
                top = dict(self.runtime_errors.most_common(12))
                lines.append(f"runtime errors by call: {top}")
                firsts = {k: round(v, 3) for k, v in sorted(self.first_error_at.items())}
                lines.append(f"first seen (s from start), by code: {firsts}")
        if self.before_fault:
            lines.append("the backend calls before the first sticky fault (newest last):")
            lines += [f"  | {entry}" for entry in self.before_fault[-400:]]
        leaked = self.leaked()
        lines.append(f"objects the backend still holds: {len(leaked)}")
        lines += [f"  {line}" for line in leaked[:limit]]
        if len(leaked) > limit:
            lines.append(f"  ... and {len(leaked) - limit} more")
        return lines


def _key(handle: Any) -> int:
    """A runtime handle as a number (function handles of both bindings)."""
    try:
        return int(handle)
    except (TypeError, ValueError):
        return id(handle)


def _brief(value: Any, names: dict[int, str]) -> str:
    """One argument of a journaled call, short: byte strings by size (launch arguments,
    at most 64 bytes, in hex), functions by name, handles by type and id."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value) if len(value) <= 64 else b""
        return data.hex() if data else f"<{len(value)} bytes>"
    if isinstance(value, int | float | str | type(None)):
        return hex(value) if isinstance(value, int) and value > 4096 else repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_brief(v, names) for v in list(value)[:4]) + "]"
    name = names.get(_key(value)) if not hasattr(value, "device") else None
    if name is not None:
        return name
    return f"{type(value).__name__}@{id(value) & 0xFFFFFF:06x}"


def _error_name(exc: BaseException) -> str:
    if isinstance(exc, HipError):
        return f"{exc.name} ({exc.message[:80]})"
    return repr(exc)[:80]
