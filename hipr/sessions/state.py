"""A client's session on the worker: everything it made, and the thread its GPU calls run on.

The session is the unit of ownership: ending it frees every allocation, stream, event,
module and graph it holds, whatever path ended it (goodbye, reset, protocol error,
handler exception, worker shutdown).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
import structlog

from hipr.backends.interface import Backend
from hipr.errors import HipError, HipErrorCode
from hipr.observability.observer import NullObserver, WorkerObserver
from hipr.sessions.busy_poll import BusyPoll
from hipr.sessions.gpu_thread import GpuThread, PendingCall
from hipr.sessions.graph_memory import GraphMemory
from hipr.sessions.limits import ANONYMOUS, Quotas
from hipr.sessions.quotas import QuotaGate, TenantState
from hipr.sessions.reply_cache import ReplyCache
from hipr.sessions.resources import (
    Allocation,
    AllocationTable,
    FunctionEntry,
    GraphEntry,
    GraphNodeEntry,
    HandleTable,
    ModuleEntry,
)
from hipr.sessions.stripes import StripeInbox
from hipr.sessions.sync_forecast import SyncForecast

T = TypeVar("T")
#: Which backend and device the event-loop thread has current, for inline calls.
_LOOP_BINDING = threading.local()
#: How long an inline probe polls for work that is about to finish (a tiny kernel)
#: before the call goes to the GPU thread to wait there: short, since the loop serves
#: every session meanwhile.
_INLINE_POLL_SECONDS = 30e-6
log = structlog.get_logger("hipr.session")


@dataclass(frozen=True, slots=True)
class DeferredError:
    """An error raised by a fire-and-forget request, kept for the next synchronising call."""

    error: HipError
    opcode: str
    request_id: int


@dataclass(frozen=True, slots=True)
class PreparedExpress:
    """A launch-and-wait the backend packed once (``backend.prepare_waited``) and the
    session's stream-table changes then: made again only while those have not moved
    (:meth:`Session.launch_waited_again`)."""

    backend_call: Any
    stream_changes: int


def as_hip_error(exc: BaseException, what: str) -> HipError:
    """``exc`` as a HipError; anything else is an internal fault, reported as such."""
    if isinstance(exc, HipError):
        return exc
    return HipError(HipErrorCode.hipErrorUnknown, f"internal error in {what}: {exc!r}")


def _nothing() -> None:
    """A no-op to queue behind other GPU calls: its return means they have all run."""


class Session:
    """One client's state on the worker."""

    def __init__(
        self,
        backend: Backend,
        *,
        tenant: str = ANONYMOUS,
        peer: str = "",
        gate: QuotaGate | None = None,
        observer: WorkerObserver | None = None,
        busy_poll: BusyPoll | None = None,
        other_tenants_share_context: bool = False,
    ) -> None:
        self.id = secrets.token_hex(8)
        #: Whether sessions of other tenants run in this process's GPU context
        #: (``isolation = "none"`` with several tenants): what the worker's shared
        #: modules hold is then visible to all of them.
        self.other_tenants_share_context = other_tenants_share_context
        self.tenant = tenant
        self.gate = gate or QuotaGate(tenant, Quotas, lambda: [self], TenantState())
        self.observer: WorkerObserver = observer or NullObserver()
        self.peer = peer
        self.backend = backend
        self.device = 0
        self.allocations = AllocationTable()
        #: Global variables of loaded modules (MODULE_GET_GLOBAL): copies and pointer
        #: arguments may name them as allocations; the module owns the memory (never
        #: freed by the client, gone when it is unloaded).
        self.module_globals = AllocationTable()
        self.streams: HandleTable[Any] = HandleTable("stream")
        self.events: HandleTable[Any] = HandleTable("event")
        self.modules: HandleTable[ModuleEntry] = HandleTable("module")
        self.functions: HandleTable[FunctionEntry] = HandleTable("function")
        self.graphs: HandleTable[GraphEntry] = HandleTable("graph")
        self.graph_nodes: HandleTable[GraphNodeEntry] = HandleTable("graph node")
        self.graph_execs: HandleTable[Any] = HandleTable("graph exec")
        self.capturing_streams: set[int] = set()
        #: What the session's graphs may write: frees it would undercut are deferred.
        self.graph_memory = GraphMemory()
        #: The shared built-in module's id, per device it was loaded on.
        self.builtin_module_ids: dict[int, int] = {}
        #: Proves ownership on RESUME; given to the client at HELLO, never logged.
        self.resume_token = secrets.token_urlsafe(32)
        #: The highest request id run: a resent request at or below it is not rerun.
        self.last_executed_id = 0
        #: A request whose work the I/O callback did up to a device wait it left to the
        #: executor (a launch with ``synchronize`` whose kernel still ran); 0 when none.
        #: Kept with the session, not the connection: resent after a dropped link, that
        #: request is only waited for, never launched again.
        self.launched_pending = 0
        #: The request whose small copy back the loop already polled for and saw still
        #: queued (``hipr.handlers.memory``): the executor then copies without polling again.
        self.copy_back_polled = 0
        self.replies = ReplyCache()
        #: The chunks of striped uploads and the data links that bring them (1.4).
        self.stripes = StripeInbox()
        #: The connection serving the session, or None while it waits to be resumed.
        self.connection: object | None = None
        #: Counts detaches, so that a grace timer knows whether its detach is the latest.
        self.detach_epoch = 0
        self.log = log.bind(session=self.id, tenant=tenant, peer=peer)
        #: The worker's busy polling: a synchronize may wait by polling (spin_wait).
        self._busy_poll = busy_poll or BusyPoll(0.0, lambda: False)
        self._gpu = GpuThread(name=f"hipr-gpu-{self.id}", on_work=self._busy_poll.note_gpu_work)
        #: The expected wait of this session's device synchronizes (polled through).
        self.sync_forecast = SyncForecast(self._busy_poll.seconds)
        #: Backend calls that never wait for the GPU (run inline when the thread is idle).
        self._inline_calls: frozenset[str] = getattr(backend, "inline_calls", frozenset())
        #: The backend's launches may run on the loop (read once: the express path asks
        #: for every launch it takes).
        self._launch_inline = "launch" in self._inline_calls
        #: Backend calls that run inline only for some arguments (a small kernel).
        self._inline_when: Mapping[str, Callable[..., bool]] = getattr(backend, "inline_when", {})
        self._uses_lanes = hasattr(backend, "run_in_lane")
        #: Set by the connection while more requests wait behind the current one: a
        #: burst of fire-and-forget calls is then batched on the GPU thread (overlapped
        #: with decoding), while a lone one runs inline (no thread round trip).
        self.burst = False
        #: The GPU thread's state, for running calls inline as if on it (backends with
        #: lanes: ``current_lane``/``run_in_lane``); known once the thread has bound.
        self._lane: Any = None
        self._gpu.post(self._bind_first, on_error=self._record_bind_error)
        self._deferred: DeferredError | None = None
        #: When a poll for finished work (:meth:`_poll`) last ran out.
        self._poll_gave_up = 0.0
        #: Fire-and-forget calls may still be queued (the bind above is one).
        self._unsettled = True
        self._closed = False
        #: ``time.monotonic()`` when :meth:`close` began: work still running a while
        #: after it has outlived its session (see hipr/worker/runaway.py).
        self.closing_since: float | None = None
        #: Set by the runaway watch while this session's GPU work runs past its rules
        #: (``reason``, ``started`` in Unix time); shown by status.
        self.runaway: dict[str, Any] | None = None

    # --- running work on the session's GPU thread --------------------------------------
    def _bind_first(self) -> None:
        """On the GPU thread: bind device 0 and note the thread's lane."""
        self.backend.bind_thread(0)
        current_lane = getattr(self.backend, "current_lane", None)
        if current_lane is not None:
            self._lane = current_lane()

    def _run_here(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the event-loop thread as if on the session's GPU thread."""
        if self._lane is not None:
            return self.backend.run_in_lane(self._lane, fn, *args)  # type: ignore[attr-defined, no-any-return]
        self._bind_here()
        return fn(*args)

    def _can_inline(self, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> bool:
        """True when ``fn(*args)`` may run right here on the event loop: the backend says
        it never waits for the GPU (always, or for these arguments), and nothing of this
        session is queued on its thread (so order is kept). Saves the thread round trip,
        the largest part of a small request's cost on the worker."""
        if not self._loop_may_run():
            return False
        name = getattr(fn, "__name__", "")
        if name in self._inline_calls:
            return True
        quick = self._inline_when.get(name)
        return quick is not None and quick(*args)

    def _loop_may_run(self) -> bool:
        """True when the event loop may run this session's backend calls itself: nothing
        of the session is queued on its GPU thread, the session is open, and (for a
        backend of lanes) its thread's lane is known."""
        return (
            self._gpu.idle and not self._closed and (self._lane is not None or not self._uses_lanes)
        )

    def _bind_here(self) -> None:
        """Make the session's device current on the calling (event-loop) thread, which
        serves many sessions: rebind only when the last inline call was another device's."""
        key = (id(self.backend), self.device)
        if getattr(_LOOP_BINDING, "key", None) != key:
            self.backend.bind_thread(self.device)
            _LOOP_BINDING.key = key

    def try_here(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """``(True, fn(*args))`` run right here when :meth:`gpu` would run it inline;
        ``(False, None)``, with nothing run, when it would go to the GPU thread."""
        if self._can_inline(fn, args):
            return True, self._run_here(fn, *args)
        return False, None

    async def gpu(
        self, fn: Callable[..., T], *args: Any, then: Callable[[], object] | None = None
    ) -> T:
        """Run a backend call on this session's thread, after all earlier ones (or
        inline, when it cannot block and nothing is ahead of it). When ``fn`` runs on
        the GPU thread, ``then()`` runs there right after it returns (see
        ``GpuThread.submit``); inline, the caller goes on at once and it is not run."""
        if self._can_inline(fn, args):
            return self._run_here(fn, *args)
        return await self._gpu.call(fn, *args, then=then)

    @property
    def error_pending(self) -> bool:
        """True while a fire-and-forget request's error waits to be reported (read from
        any thread: the GPU thread asks before it answers a synchronize itself)."""
        return self._deferred is not None

    def work_done(self) -> bool:
        """True when the session's work on the device has finished, asked without
        blocking; False when a synchronising call must wait on the GPU thread. Raises a
        failed kernel's error, as a synchronisation would. Backends that cannot tell
        from another thread (no ``work_done``) always answer False."""
        probe = getattr(self.backend, "work_done", None)
        if probe is None or not self._loop_may_run():
            return False
        streams = self.streams.objects()
        return self._poll(lambda: bool(self._run_here(probe, streams)))

    def launch_waited(
        self,
        function: Any,
        grid: Any,
        block: Any,
        shared_mem: int,
        args: bytes,
        reply: tuple[int, bytes] | None = None,
    ) -> tuple[bool, HipError | None, int] | None:
        """A launch on the default stream and the session's wait for all its work, right
        here on the event loop as one native call (``backend.launch_waited``), polling
        as long as :meth:`work_done` would, and sending ``reply`` once done:
        ``(done, None, reply bytes sent)``, or ``(False, error, 0)`` when the runtime
        refused the launch; None, with nothing done, where it cannot run here (the
        launch then goes the usual way). A faulted kernel raises."""
        native = getattr(self.backend, "launch_waited", None)
        if native is None or not self._waited_here():
            return None
        return self._noted(
            self._run_here(
                native, function, grid, block, shared_mem, args, self.streams.objects(),
                _INLINE_POLL_SECONDS, reply,
            )
        )  # fmt: skip

    def _waited_here(self) -> bool:
        """True when a launch and its wait may run here on the loop now:
        ``_can_inline(backend.launch)``, without the bound method."""
        return not self.burst and self._launch_inline and self._loop_may_run()

    def _noted(
        self, outcome: tuple[bool, HipError | None, int] | None
    ) -> tuple[bool, HipError | None, int] | None:
        """A launch-and-wait's outcome, noted: one that polled for its whole length makes
        the executor's wait look once, then block, as after :meth:`_poll` gave up."""
        if outcome is not None and not outcome[0] and outcome[1] is None:
            self._poll_gave_up = time.perf_counter()
        return outcome

    def prepare_waited(
        self,
        function: Any,
        grid: Any,
        block: Any,
        shared_mem: int,
        args: bytes,
        reply: bytes,
        request_id_at: int,
    ) -> PreparedExpress | None:
        """:meth:`launch_waited`'s native call packed once, for
        :meth:`launch_waited_again` (the express path's loop over one kernel); None where
        the backend has no such call or :meth:`launch_waited` could not run here now."""
        prepare = getattr(self.backend, "prepare_waited", None)
        # launch_waited_again needs a lane.
        if prepare is None or self._lane is None or not self._waited_here():
            return None
        changes = self.streams.changes
        prepared = self._run_here(
            prepare, function, grid, block, shared_mem, args, self.streams.objects(),
            _INLINE_POLL_SECONDS, reply, request_id_at,
        )  # fmt: skip
        return None if prepared is None else PreparedExpress(prepared, changes)

    def launch_waited_again(
        self, prepared: PreparedExpress, fd: int, request_id: int
    ) -> tuple[bool, HipError | None, int] | None:
        """The launch :meth:`prepare_waited` packed, made again with its reply (request
        ``request_id``'s) sent to ``fd`` (-1: not sent), exactly as :meth:`launch_waited`
        would make it: the same outcome. None, with nothing done, where it cannot run
        here now or the session's streams or lane have changed since it was packed."""
        lane = self._lane
        if (
            lane is None
            or not self._waited_here()
            or self.streams.changes != prepared.stream_changes
        ):
            return None
        # The backend's own call binds the lane's device: the hot path of PyTorch's
        # add_ + synchronize skips _run_here's borrowing of the lane.
        return self._noted(
            self.backend.waited_again(  # type: ignore[attr-defined]
                lane, prepared.backend_call, fd, request_id
            )
        )

    def device_busy(self) -> bool:
        """True while the session has GPU work queued or running: on its thread, or (on a
        backend whose work runs on after the call returns) on the device. Asked without
        waiting and without taking a pending error (a failed kernel has finished)."""
        if not self._gpu.idle:
            return True
        if self._closed or getattr(self.backend, "runs_work_at_submission", False):
            return False
        probe = getattr(self.backend, "work_done", None)
        if probe is None or (self._uses_lanes and self._lane is None):
            return False
        try:
            return not self._run_here(probe, self.streams.objects())
        except HipError:
            return False

    @property
    def gpu_busy(self) -> bool:
        """True while the session's GPU thread has queued or running work."""
        return not self._gpu.idle

    async def spin_until_done(self) -> bool:
        """Wait for :meth:`work_done` by polling from the event loop, for up to the
        worker's ``spin_wait``: True once the work is done; False when the caller must
        block on the GPU thread instead (no spinning configured, a backend that cannot
        tell, time ran out, or a GPU thread needs the loop's interpreter lock)."""
        if getattr(self.backend, "work_done", None) is None:
            return False
        return await self._busy_poll.wait_until(self.work_done, self.sync_forecast.window())

    async def spin_until_settled(self, query: Callable[..., bool], *args: Any) -> bool:
        """:meth:`spin_until_done` for a stream or event query (:meth:`settled`)."""
        if not self._can_inline(query, args):
            return False
        return await self._busy_poll.wait_until(lambda: self.settled(query, *args))

    def settled(self, query: Callable[..., bool], *args: Any) -> bool:
        """True when ``query(*args)`` (a stream or event query) says done, asked inline
        when the backend allows; False when the caller must wait on the GPU thread."""
        if not self._can_inline(query, args):
            return False
        return self._poll(lambda: bool(self._run_here(query, *args)))

    def _poll(self, done: Callable[[], bool]) -> bool:
        """Ask ``done`` until it says True or the poll's time runs out. A poll that ran
        out less than a poll's length ago (the I/O callback's look at the same
        synchronize, before it went to the executor) is not run in full again: one
        look, then the GPU thread."""
        started = time.perf_counter()
        recent = started - self._poll_gave_up < _INLINE_POLL_SECONDS
        deadline = started + (0.0 if recent else _INLINE_POLL_SECONDS)
        while not done():
            if time.perf_counter() >= deadline:
                self._poll_gave_up = time.perf_counter()
                return False
        return True

    async def gpu_create(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`gpu` for a call that makes a backend object: not cancellable once queued,
        so that the object always reaches the handler, which records it before its next
        checkpoint and the teardown frees it. Cancelled mid-call (a worker shutdown), a
        plain call would drop the object and leak it."""
        with anyio.CancelScope(shield=True):
            result = await self._gpu.call(fn, *args)
        return result

    def flush_posts(self) -> None:
        """Start the fire-and-forget calls posted so far (before the executor waits)."""
        self._gpu.flush()

    def gpu_submit(self, fn: Callable[..., T], *args: Any) -> PendingCall[T]:
        """Queue a backend call and return at once (await ``.result()`` later)."""
        return self._gpu.submit(fn, *args)

    def gpu_post(self, opcode: str, request_id: int, fn: Callable[..., Any], *args: Any) -> None:
        """Queue a fire-and-forget backend call; its error is kept for the next sync."""

        def keep(exc: BaseException) -> None:
            if self._deferred is None:
                self._deferred = DeferredError(as_hip_error(exc, opcode), opcode, request_id)

        if not self.burst and self._can_inline(fn, args):
            try:
                self._run_here(fn, *args)
            except Exception as exc:
                keep(exc)
            return
        self._unsettled = True
        self._gpu.post(fn, *args, on_error=keep)

    def _record_bind_error(self, exc: BaseException) -> None:
        if self._deferred is None:
            self._deferred = DeferredError(as_hip_error(exc, "bind_thread"), "SET_DEVICE", 0)

    def defer_error(self, error: HipError, opcode: str, request_id: int) -> None:
        """Keep ``error`` of a fire-and-forget request for the next synchronising call."""
        if self._deferred is None:
            self._deferred = DeferredError(error, opcode, request_id)

    async def settled_deferred_error(self) -> DeferredError | None:
        """:meth:`take_deferred_error` once every fire-and-forget call queued so far has
        run: otherwise the error of one still queued would reach a later call, and this
        one would report success over work that failed (a read after a failed launch)."""
        if self._unsettled:
            if not self._gpu.idle:
                await self._gpu.call(_nothing)
            self._unsettled = False
        return self.take_deferred_error()

    def settled_now(self) -> bool:
        """True when every fire-and-forget call queued so far has run, asked without
        waiting: :meth:`take_deferred_error` then holds their error, if any (the part of
        :meth:`settled_deferred_error` that needs no wait)."""
        if self._unsettled:
            if not self._gpu.idle:
                return False
            self._unsettled = False
        return True

    def take_deferred_error(self) -> DeferredError | None:
        """The pending fire-and-forget error, cleared (reported exactly once)."""
        deferred, self._deferred = self._deferred, None
        return deferred

    # --- checks ----------------------------------------------------------------------
    def check_range(self, address: int, size: int, what: str = "range") -> Allocation:
        """``[address, address+size)`` lies in one of this session's allocations (or a
        module global it was given)."""
        module_globals = self.module_globals
        # Most sessions load no module with globals: the usual path is one length test.
        if len(module_globals) and module_globals.containing(address) is not None:
            return module_globals.check(address, size, what)
        return self.allocations.check(address, size, what)

    def reaches(self, address: int) -> bool:
        """``address`` lies in an allocation of this session or a module global of it."""
        if self.allocations.containing(address) is not None:
            return True
        module_globals = self.module_globals
        return bool(len(module_globals)) and module_globals.containing(address) is not None

    def stream(self, stream_id: int | None) -> Any:
        """The backend stream of ``stream_id``; None is the default stream."""
        return None if stream_id is None else self.streams.get(stream_id)

    # --- memory that a graph may still write (hipr.sessions.graph_memory) ---------------------
    def keeps_for_graphs(self, base: int) -> bool:
        """True when freeing the allocation at ``base`` now could leave a graph of this
        session writing memory that is no longer the session's: a capture is running,
        or a graph or executable graph may write it. Its free is then deferred."""
        return bool(self.capturing_streams) or bool(self.graph_memory.in_use((base,)))

    def graph_bases(self) -> list[int]:
        """Every allocation a kernel node or a capture made now may write: the live and
        the retired ones."""
        return [a.base for a in self.allocations] + [a.base for a in self.allocations.retired()]

    def collect_retired(self) -> list[Allocation]:
        """The retired allocations that no graph may write any more, taken off the
        retired list, for :meth:`free_retired` to free; none while a capture runs."""
        if self.capturing_streams:
            return []
        retired = self.allocations.retired()
        used = self.graph_memory.in_use(a.base for a in retired)
        collected = [a for a in retired if a.base not in used]
        for allocation in collected:
            self.allocations.unretire(allocation.base)
        return collected

    def free_retired(self, allocations: list[Allocation]) -> None:
        """On the GPU thread: free what :meth:`collect_retired` gave, leaving the thread
        on the device it was on. One the runtime refuses is retired again, for the
        teardown to free; the request that got here has done its own job already."""
        device = self.device
        for allocation in allocations:
            try:
                if allocation.device != device:
                    self.backend.bind_thread(allocation.device)
                try:
                    self.backend.free(allocation.base)
                finally:
                    if allocation.device != device:
                        self.backend.bind_thread(device)
            except Exception as exc:
                self.allocations.retire(allocation)
                self.log.warning("deferred free failed", ptr=allocation.base, error=str(exc))

    # --- teardown ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    async def close(self) -> None:
        """Free everything the session holds, on its GPU thread, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self.closing_since = time.monotonic()
        self.stripes.close()  # its data links end; an upload waiting on them fails
        try:
            await self._gpu.call(self._release_all)
        finally:
            await self._gpu.close()

    def _release_all(self) -> None:
        backend = self.backend
        # Waits for the session's work first: on a backend whose kernels run on after
        # their launch, a kernel that never ends keeps the close from finishing, which
        # is how the runaway watch tells work that outlives its session.
        steps: list[tuple[str, Callable[[], object]]] = []
        if not getattr(backend, "runs_work_at_submission", False):
            waits = [h for i, h in self.streams.items() if i not in self.capturing_streams]
            steps.append(("synchronize", partial(self._wait_quietly, [*waits, None])))
        steps += [
            ("graph exec", partial(backend.graph_exec_destroy, h))
            for _, h in self.graph_execs.items()
        ]
        steps += [
            ("graph", partial(backend.graph_destroy, g.handle)) for _, g in self.graphs.items()
        ]
        steps += [
            ("capture", partial(self._abandon_capture, self.streams.get(stream_id)))
            for stream_id in sorted(self.capturing_streams)
            if stream_id in self.streams
        ]
        steps += [("stream", partial(backend.stream_destroy, h)) for _, h in self.streams.items()]
        steps += [("event", partial(backend.event_destroy, h)) for _, h in self.events.items()]
        steps += [
            ("module", partial(backend.module_unload, m.handle))
            for _, m in self.modules.items()
            if not m.shared
        ]
        steps += [("allocation", partial(self._free_on, a)) for a in self.allocations]
        steps += [
            ("retired allocation", partial(self._free_on, a)) for a in self.allocations.retired()
        ]
        release_thread = getattr(backend, "release_thread", None)
        if release_thread is not None:  # the thread's own default streams
            steps.append(("default stream", release_thread))
        failures = 0
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # keep freeing the rest; report once at the end
                failures += 1
                self.log.warning("release failed", resource=what, error=str(exc))
        if failures:
            self.log.warning("session release finished with failures", failures=failures)
        for table in (
            self.graph_execs,
            self.graphs,
            self.graph_nodes,
            self.streams,
            self.events,
            self.modules,
            self.functions,
        ):
            for handle_id, _ in table.items():
                table.pop(handle_id)
        for allocation in self.allocations:
            self.allocations.remove(allocation.base)
        for allocation in self.module_globals:
            self.module_globals.remove(allocation.base)
        for allocation in self.allocations.retired():
            self.allocations.unretire(allocation.base)
        self.graph_memory = GraphMemory()
        self.capturing_streams.clear()

    def _wait_quietly(self, streams: list[Any]) -> None:
        """Wait for ``streams`` (None: the thread's default stream); a failed kernel's
        error is nobody's to report any more."""
        for stream in streams:
            try:
                self.backend.stream_synchronize(stream)
            except HipError:
                pass

    def _free_on(self, allocation: Allocation) -> None:
        if allocation.device != self.device:
            self.backend.bind_thread(allocation.device)
            self.device = allocation.device
        self.backend.free(allocation.base)

    def _abandon_capture(self, stream: Any) -> None:
        graph = self.backend.stream_end_capture(stream)
        self.backend.graph_destroy(graph)
