"""One client over several workers: their devices form one list.

``hipr.connect(["tcp://a:18515", "tcp://b:18515"])`` (or ``"tcp://a:18515,tcp://b:18515"``,
or the same in ``HIPR_URL``) opens one session on each worker, in the order given, and
numbers their devices one after the other: with two devices on ``a`` and three on ``b``,
devices 0-1 are ``a``'s and 2-4 are ``b``'s. ``set_device(i)`` picks the worker and its
device; calls that name no object go to the current device's worker.

This is a layer over the public single-worker API, so one worker costs nothing extra:
every pointer and handle the multi-worker client returns is the single-worker object
tagged with the worker that owns it (:class:`WorkerPtr`, :class:`AsyncWorkerHandle`,
:class:`WorkerHandle`). It is written once, async: :class:`MultiGpu` runs
:class:`AsyncMultiGpu`'s coroutines in the caller's thread over each worker's blocking
connection, as :class:`hipr.Gpu` runs :class:`hipr.AsyncGpu`'s (:mod:`hipr.client.sync`).
A call is routed to the worker that owns its objects; a call
that mixes objects of two workers fails with ``hipErrorInvalidValue`` naming both,
except :meth:`AsyncMultiGpu.memcpy_dtod`, which copies across workers through the client.

Each worker's session lives on its own: it resumes on its own after a dropped link, and
when one is lost for good, its devices (and its objects) raise :class:`SessionLostError`
while the other workers go on.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from hipr.backends.interface import DeviceProperties
from hipr.client.api import AsyncGpu
from hipr.client.api import aconnect as aconnect_one
from hipr.client.objects import DevicePtr, _Handle
from hipr.client.sync import (
    Gpu,
    SyncProxy,
    add_sync_methods,
    inline_view,
    register_sync_class,
    run_inline,
    wrap,
)
from hipr.client.sync import connect as connect_one
from hipr.client.timeouts import time_limit
from hipr.errors import HipError, HipErrorCode, SessionLostError, invalid_value

__all__ = [
    "COPY_CHUNK_BYTES",
    "AsyncMultiGpu",
    "AsyncWorkerHandle",
    "MultiGpu",
    "WorkerHandle",
    "WorkerPtr",
    "WorkerSlot",
    "aconnect_multi",
    "connect_multi",
    "split_urls",
]

#: Bytes per step of a copy between two workers (one host buffer of this size is used).
COPY_CHUNK_BYTES = 16 << 20

Urls = str | Sequence[str]


def split_urls(url: Urls) -> list[str]:
    """Worker URLs from one string (comma-separated) or a sequence of strings
    (each of which may hold commas too); blanks are dropped, order is kept."""
    parts = [url] if isinstance(url, str) else list(url)
    urls = [u.strip() for part in parts for u in str(part).split(",")]
    urls = [u for u in urls if u]
    if not urls:
        raise invalid_value(f"no worker URL in {url!r}")
    return urls


@dataclass(eq=False)
class WorkerSlot:
    """One worker of a multi-worker client: its URL, its session (an :class:`AsyncGpu`
    or a sync :class:`Gpu`) and where its devices sit in the client's device list."""

    index: int
    url: str
    gpu: Any
    first_device: int
    device_count: int
    tenant: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: The async API object the client awaits: ``gpu`` itself for the async client, its
    #: coroutines run inline for the sync one (``hipr.client.sync.inline_view``).
    session: Any = None

    def __post_init__(self) -> None:
        if self.session is None:
            self.session = inline_view(self.gpu)

    @property
    def devices(self) -> range:
        """The client-wide ordinals of this worker's devices."""
        return range(self.first_device, self.first_device + self.device_count)

    @property
    def lost(self) -> bool:
        """True once this worker's session is gone for good."""
        return bool(getattr(self.gpu, "lost", False))

    def describe(self) -> str:
        """``worker tcp://a:18515 (devices 2-4)``, for error messages."""
        devices = self.devices
        if len(devices) == 1:
            span = f"device {devices.start}"
        elif devices:
            span = f"devices {devices.start}-{devices.stop - 1}"
        else:
            span = "no devices"
        return f"worker {self.url} ({span})"

    def check_alive(self) -> None:
        """Raise :class:`SessionLostError` naming this worker if its session is lost."""
        if self.lost:
            raise SessionLostError(
                message=f"{self.describe()} is lost: its session and every object on it "
                "are gone (the other workers go on)"
            )


@dataclass(frozen=True, slots=True, repr=False)
class WorkerPtr(DevicePtr):
    """A :class:`DevicePtr` that remembers the worker it lives on."""

    worker: WorkerSlot

    def __add__(self, offset: int) -> WorkerPtr:
        moved = DevicePtr.__add__(self, offset)
        if moved is NotImplemented:
            return NotImplemented  # type: ignore[no-any-return]
        return WorkerPtr(moved.address, moved.size, self.worker)

    def plain(self) -> DevicePtr:
        """The single-worker pointer (what the worker's own session understands)."""
        return DevicePtr(self.address, self.size)

    def __repr__(self) -> str:
        return f"DevicePtr(0x{self.address:x}, size={self.size}, worker={self.worker.url!r})"


def _is_handle(value: object) -> bool:
    """Whether a single-worker result is a handle (stream, event, module, ...), whatever
    wrapper the sync client puts around it."""
    if isinstance(value, _Handle):
        return True
    return isinstance(getattr(value, "kind", None), str) and isinstance(
        getattr(value, "id", None), int
    )


class _Tagged:
    """What both handle wrappers share: the single-worker handle and its owner."""

    __slots__ = ("_target", "_worker")

    def __init__(self, target: Any, worker: WorkerSlot) -> None:
        self._target = target
        self._worker = worker

    @property
    def worker(self) -> WorkerSlot:
        """The worker that owns this object."""
        return self._worker

    @property
    def target(self) -> Any:
        """The single-worker handle behind this one."""
        return self._target

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Tagged):
            return bool(self._worker is other._worker and self._target == other._target)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self._worker), self._target))

    def __repr__(self) -> str:
        return f"{self._target!r} on {self._worker.url}"


def _describe_object(value: object) -> str:
    if isinstance(value, WorkerPtr):
        return "a device pointer"
    kind = getattr(value, "kind", None)
    return f"a {kind}" if isinstance(kind, str) else f"a {type(value).__name__}"


class _Router:
    """Finds the worker a call's objects belong to and hands the call its single-worker
    objects; refuses a call that mixes two workers' objects."""

    def __init__(self, what: str, owner: WorkerSlot | None = None) -> None:
        self.what = what
        self.owner = owner
        self.first: tuple[WorkerSlot, str] | None = (
            (owner, f"this {what.split('.')[0]}") if owner is not None else None
        )

    def _see(self, worker: WorkerSlot, value: object) -> None:
        if self.first is None:
            self.first = (worker, _describe_object(value))
            self.owner = worker
            return
        first_worker, first_what = self.first
        if worker is not first_worker:
            raise invalid_value(
                f"{self.what}: {first_what} of {first_worker.describe()} and "
                f"{_describe_object(value)} of {worker.describe()} cannot be mixed in one "
                "call; objects belong to the worker that made them (memcpy_dtod is the one "
                "call that crosses workers, through the client)"
            )

    def unwrap(self, value: Any) -> Any:
        if isinstance(value, SyncProxy):
            value = value._target
        if isinstance(value, WorkerPtr):
            self._see(value.worker, value)
            return value.plain()
        if isinstance(value, _Tagged):
            self._see(value._worker, value._target)
            return value._target
        if isinstance(value, list):
            return [self.unwrap(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.unwrap(v) for v in value)
        return value

    def args(self, args: Iterable[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        return [self.unwrap(a) for a in args], {k: self.unwrap(v) for k, v in kwargs.items()}


def _tag(value: Any, worker: WorkerSlot, wrapper: type[_Tagged]) -> Any:
    """Tag a single-worker result with its worker."""
    if isinstance(value, DevicePtr):
        return WorkerPtr(value.address, value.size, worker)
    if _is_handle(value):
        return wrapper(value, worker)
    return value


class AsyncWorkerHandle(_Tagged):
    """A stream, event, module, function, graph, graph node or graph exec of one worker
    of an :class:`AsyncMultiGpu`: the same methods as the single-worker handle, with the
    objects passed to them checked to be of the same worker."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        worker = self._worker
        what = f"{getattr(self._target, 'kind', 'handle')}.{name}"

        async def call(*args: Any, **kwargs: Any) -> Any:
            router = _Router(what, worker)
            a, kw = router.args(args, kwargs)
            worker.check_alive()
            return _tag(await attr(*a, **kw), worker, AsyncWorkerHandle)

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call


class WorkerHandle(SyncProxy):
    """The synchronous counterpart of :class:`AsyncWorkerHandle`, for :class:`MultiGpu`:
    its methods block, running the async handle's coroutines in the caller's thread."""

    @property
    def worker(self) -> WorkerSlot:
        """The worker that owns this object."""
        worker: WorkerSlot = self._target.worker
        return worker

    @property
    def target(self) -> Any:
        """The single-worker handle behind this one (the sync client's)."""
        target = self._target.target
        # A worker on a portal thread hands out sync handles already (``inline_view``).
        return getattr(target, "_sync", None) or wrap(target, run_inline)


register_sync_class(AsyncWorkerHandle, WorkerHandle)


def _check_copy(dst: DevicePtr | int, src: DevicePtr | int, size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63:
        raise invalid_value(f"size must be an int in [0, 2**63), got {size!r}")
    for name, ptr in (("dst", dst), ("src", src)):
        if isinstance(ptr, DevicePtr) and size > ptr.size:
            raise invalid_value(f"{size} bytes do not fit in {name} {ptr!r}")


def _ptr_owner(ptr: object) -> WorkerSlot | None:
    return ptr.worker if isinstance(ptr, WorkerPtr) else None


class AsyncMultiGpu:
    """The devices of several workers as one list, with :class:`hipr.AsyncGpu`'s names
    (every method a coroutine, ``timeout=`` on each). Made by :func:`hipr.aconnect` when
    it is given more than one URL."""

    def __init__(self, slots: list[WorkerSlot], *, inline: bool = False) -> None:
        if not slots:
            raise invalid_value("a multi-worker client needs at least one worker")
        self._slots = slots
        self._current = slots[0]
        #: The coroutines run without an event loop (inside :class:`MultiGpu`).
        self._inline = inline

    # --- the device list -------------------------------------------------------------
    @property
    def workers(self) -> tuple[WorkerSlot, ...]:
        """The workers, in the order given, each with its URL and device ordinals."""
        return tuple(self._slots)

    @property
    def current_worker(self) -> WorkerSlot:
        """The worker of the current device."""
        return self._current

    @property
    def lost(self) -> bool:
        """True once every worker's session is lost (one lost worker only makes its own
        devices raise :class:`SessionLostError`)."""
        return all(slot.lost for slot in self._slots)

    @property
    def session_id(self) -> str:
        """The workers' session ids, comma-separated in worker order."""
        return ",".join(str(getattr(slot.session, "session_id", "")) for slot in self._slots)

    def worker_of(self, obj: object) -> WorkerSlot:
        """The worker that owns ``obj`` (a pointer or handle of this client) or, for a
        device ordinal, the worker whose device it is."""
        if isinstance(obj, SyncProxy):
            obj = obj._target
        if isinstance(obj, WorkerPtr):
            return obj.worker
        if isinstance(obj, _Tagged):
            return obj._worker
        if isinstance(obj, int) and not isinstance(obj, bool):
            return self._slot_of_device(obj)
        raise invalid_value(f"{obj!r} is not an object of this multi-worker client")

    def _slot_of_device(self, device: object) -> WorkerSlot:
        if isinstance(device, int) and not isinstance(device, bool):
            for slot in self._slots:
                if device in slot.devices:
                    return slot
        total = sum(slot.device_count for slot in self._slots)
        raise HipError(
            HipErrorCode.hipErrorInvalidDevice,
            f"device {device!r} does not exist: this client has {total} devices "
            f"(0-{total - 1}) on {len(self._slots)} workers",
        )

    def _peer_pointers(
        self,
        dst: DevicePtr | int,
        dst_device: int,
        src: DevicePtr | int,
        src_device: int,
        size: int,
    ) -> tuple[WorkerPtr, WorkerPtr]:
        """memcpy_peer's pointers, each checked against its device's worker and tagged
        with it (a plain address is taken to be on the device given for it)."""
        tagged: list[WorkerPtr] = []
        for ptr, device, name in ((dst, dst_device, "dst"), (src, src_device, "src")):
            slot = self._slot_of_device(device)
            owner = _ptr_owner(ptr)
            if owner is not None and owner is not slot:
                raise invalid_value(
                    f"memcpy_peer: {name} is on {owner.describe()}, not on device {device}"
                )
            tagged.append(
                ptr
                if isinstance(ptr, WorkerPtr)
                else WorkerPtr(int(ptr), _size_of(ptr, size), slot)
            )
        return tagged[0], tagged[1]

    def _across_workers(
        self, dst: DevicePtr | int, src: DevicePtr | int, size: int, stream: Any
    ) -> tuple[WorkerSlot, WorkerSlot, WorkerSlot | None] | None:
        """For memcpy_dtod: None when one worker can do the copy; else the destination's,
        the source's and the stream's workers, all checked (sizes, the stream on one of
        the two sides, both workers alive)."""
        dst_slot, src_slot = _ptr_owner(dst), _ptr_owner(src)
        if dst_slot is None or src_slot is None or dst_slot is src_slot:
            return None
        _check_copy(dst, src, size)
        stream_slot = self.worker_of(stream) if stream is not None else None
        if stream_slot is not None and stream_slot not in (dst_slot, src_slot):
            raise invalid_value(
                f"memcpy_dtod: the stream of {stream_slot.describe()} belongs to neither "
                f"the source ({src_slot.describe()}) nor the destination "
                f"({dst_slot.describe()})"
            )
        dst_slot.check_alive()
        src_slot.check_alive()
        return dst_slot, src_slot, stream_slot

    def _route(
        self, what: str, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[WorkerSlot, list[Any], dict[str, Any]]:
        router = _Router(what)
        a, kw = router.args(args, kwargs)
        slot = router.owner or self._current
        slot.check_alive()
        return slot, a, kw

    def worker_info(self) -> dict[str, Any]:
        """What the current device's worker said at HELLO, plus ``workers``: one entry
        per worker with its URL, device ordinals and HELLO reply."""
        info = dict(self._current.session.worker_info())
        info["workers"] = [
            {
                "url": slot.url,
                "devices": list(slot.devices),
                "lost": slot.lost,
                **(dict(slot.session.worker_info()) if not slot.lost else {}),
            }
            for slot in self._slots
        ]
        return info

    def __repr__(self) -> str:
        inner = ", ".join(slot.describe() for slot in self._slots)
        return f"<{type(self).__name__} {inner}>"

    async def _do(self, name: str, *args: Any, **kwargs: Any) -> Any:
        slot, a, kw = self._route(name, args, kwargs)
        return _tag(await getattr(slot.session, name)(*a, **kw), slot, AsyncWorkerHandle)

    def __getattr__(self, name: str) -> Any:
        # A public call of the single-worker API that this class does not spell out
        # (added there later) is routed like the others: by its objects, else to the
        # current device's worker.
        attr = getattr(self._current.session, name) if not name.startswith("_") else None
        if attr is None or not inspect.iscoroutinefunction(attr):
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._do(name, *args, **kwargs)

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call

    # --- devices -------------------------------------------------------------------
    async def ping(self, **kw: Any) -> float:
        """Seconds for one null round trip to the current device's worker."""
        return float(await self._do("ping", **kw))

    async def admin_status(self, admin_token: str | None = None, **kw: Any) -> dict[str, Any]:
        """The current device's worker's status (see :meth:`hipr.AsyncGpu.admin_status`)."""
        return dict(await self._do("admin_status", admin_token, **kw))

    async def device_count(self, **kw: Any) -> int:
        """Devices of all workers together (lost workers' included: ordinals never move)."""
        return sum(slot.device_count for slot in self._slots)

    async def set_device(self, device: int, **kw: Any) -> None:
        """Make ``device`` (a client-wide ordinal) current: its worker gets later calls."""
        slot = self._slot_of_device(device)
        slot.check_alive()
        await slot.session.set_device(device - slot.first_device, **kw)
        self._current = slot

    async def get_device(self, **kw: Any) -> int:
        """The current device's client-wide ordinal."""
        slot = self._current
        slot.check_alive()
        return slot.first_device + int(await slot.session.get_device(**kw))

    async def device_properties(self, device: int = 0, **kw: Any) -> DeviceProperties:
        """Properties of ``device`` (a client-wide ordinal)."""
        slot = self._slot_of_device(device)
        slot.check_alive()
        props: DeviceProperties = await slot.session.device_properties(
            device - slot.first_device, **kw
        )
        return props

    async def mem_get_info(self, **kw: Any) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        free, total = await self._do("mem_get_info", **kw)
        return int(free), int(total)

    async def synchronize(self, **kw: Any) -> None:
        """Wait for all work of the current device."""
        await self._do("synchronize", **kw)

    # --- memory --------------------------------------------------------------------
    async def malloc(self, size: int, **kw: Any) -> WorkerPtr:
        """Allocate ``size`` bytes on the current device."""
        result: WorkerPtr = await self._do("malloc", size, **kw)
        return result

    async def malloc_htod(self, src: Any, **kw: Any) -> WorkerPtr:
        """Allocate on the current device a copy of the host buffer ``src``."""
        result: WorkerPtr = await self._do("malloc_htod", src, **kw)
        return result

    async def free(self, ptr: DevicePtr | int, **kw: Any) -> None:
        """Free an allocation (on the worker that owns it)."""
        await self._do("free", ptr, **kw)

    async def memcpy_htod(self, dst: DevicePtr | int, src: Any, *a: Any, **kw: Any) -> None:
        """Copy a host buffer to ``dst``'s worker."""
        await self._do("memcpy_htod", dst, src, *a, **kw)

    async def memcpy_htod_async(self, dst: DevicePtr | int, src: Any, *a: Any, **kw: Any) -> None:
        """Queue a host-to-device copy on ``dst``'s worker."""
        await self._do("memcpy_htod_async", dst, src, *a, **kw)

    async def memcpy_dtoh(self, src: DevicePtr | int, *a: Any, **kw: Any) -> Any:
        """Copy device bytes from ``src``'s worker to the host."""
        return await self._do("memcpy_dtoh", src, *a, **kw)

    async def memcpy_dtod(
        self,
        dst: DevicePtr | int,
        src: DevicePtr | int,
        size: int,
        stream: Any = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Copy between device ranges. Within one worker the worker copies (as
        ``hipMemcpyDtoD`` / peer copies do); between two workers the bytes travel
        through this client, :data:`COPY_CHUNK_BYTES` at a time: source worker to
        client, then client to destination worker, so the copy costs twice the bytes
        on the network at the slower link's speed, and is synchronous (it returns when
        the bytes are on the destination). ``stream`` may belong to either side."""
        across = self._across_workers(dst, src, size, stream)
        if across is None:
            kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
            await self._do("memcpy_dtod", dst, src, size, stream, **kw)
            return
        dst_slot, src_slot, _ = across
        with time_limit("memcpy_dtod across workers", timeout, self._inline):
            await self._copy_across(dst_slot, int(dst), src_slot, int(src), size, stream)

    async def _copy_across(
        self,
        dst_slot: WorkerSlot,
        dst: int,
        src_slot: WorkerSlot,
        src: int,
        size: int,
        stream: Any,
    ) -> None:
        target = stream.target if isinstance(stream, _Tagged) else None
        on_src = target if stream is not None and stream.worker is src_slot else None
        on_dst = target if stream is not None and stream.worker is dst_slot else None
        chunk = memoryview(bytearray(min(size, COPY_CHUNK_BYTES)))
        done = 0
        while done < size:
            n = min(chunk.nbytes, size - done)
            await src_slot.session.memcpy_dtoh(src + done, n, out=chunk[:n], stream=on_src)
            if on_dst is None:
                await dst_slot.session.memcpy_htod(dst + done, chunk[:n])
            else:
                # The bytes leave before this returns, so the buffer is free for the next.
                await dst_slot.session.memcpy_htod_async(dst + done, chunk[:n], on_dst)
            done += n

    async def memcpy_peer(
        self,
        dst: DevicePtr | int,
        dst_device: int,
        src: DevicePtr | int,
        src_device: int,
        size: int,
        **kw: Any,
    ) -> None:
        """Copy ``size`` bytes from ``src`` on ``src_device`` to ``dst`` on
        ``dst_device`` (client-wide ordinals): the worker copies when both devices are
        its own, the client when they are on two workers (see :meth:`memcpy_dtod`)."""
        dst, src = self._peer_pointers(dst, dst_device, src, src_device, size)
        await self.memcpy_dtod(dst, src, size, **kw)

    async def memset(self, ptr: DevicePtr | int, value: int, size: int, *a: Any, **kw: Any) -> None:
        """Set ``size`` bytes at ``ptr`` (on its worker) to the byte ``value``."""
        await self._do("memset", ptr, value, size, *a, **kw)

    # --- streams, events, kernels, graphs -------------------------------------------
    async def stream_create(self, **kw: Any) -> AsyncWorkerHandle:
        """A new stream on the current device."""
        result: AsyncWorkerHandle = await self._do("stream_create", **kw)
        return result

    async def event_create(self, **kw: Any) -> AsyncWorkerHandle:
        """A new event on the current device's worker."""
        result: AsyncWorkerHandle = await self._do("event_create", **kw)
        return result

    async def event_elapsed_ms(self, start: Any, end: Any, **kw: Any) -> float:
        """Milliseconds between two completed events of one worker."""
        return float(await self._do("event_elapsed_ms", start, end, **kw))

    async def compile(self, source: str, *a: Any, **kw: Any) -> AsyncWorkerHandle:
        """Compile HIP C++ on the current device's worker and load it."""
        result: AsyncWorkerHandle = await self._do("compile", source, *a, **kw)
        return result

    async def compile_code(self, source: str, *a: Any, **kw: Any) -> bytes:
        """Compile HIP C++ on the current device's worker; its code object, unloaded
        (load it on any worker with :meth:`module_load`)."""
        return bytes(await self._do("compile_code", source, *a, **kw))

    async def link_code(self, inputs: Any, **kw: Any) -> tuple[bytes, str]:
        """Link compiled device code on the current device's worker: (the image, the
        linker's log); load the image on that worker's kind of GPU with
        :meth:`module_load`."""
        image, log = await self._do("link_code", inputs, **kw)
        return bytes(image), str(log)

    async def module_load(self, image: Any, **kw: Any) -> AsyncWorkerHandle:
        """Load a code object on the current device's worker."""
        result: AsyncWorkerHandle = await self._do("module_load", image, **kw)
        return result

    async def builtin(self, name: str, **kw: Any) -> AsyncWorkerHandle:
        """A built-in kernel on the current device's worker."""
        result: AsyncWorkerHandle = await self._do("builtin", name, **kw)
        return result

    async def graph_create(self, **kw: Any) -> AsyncWorkerHandle:
        """An empty graph on the current device's worker."""
        result: AsyncWorkerHandle = await self._do("graph_create", **kw)
        return result

    async def close(self) -> None:
        """End every worker's session (each is also ended by its ``async with``)."""
        for slot in self._slots:
            with anyio.CancelScope(shield=True):
                await slot.session.close()


class MultiGpu(SyncProxy):
    """The devices of several workers as one list for synchronous code, with
    :class:`hipr.Gpu`'s names. Holds one sync :class:`hipr.Gpu` per worker (no event
    loop of its own) and runs :class:`AsyncMultiGpu`'s coroutines over them in the
    caller's thread. Made by :func:`hipr.connect` when it is given more than one URL."""

    def __init__(self, slots: list[WorkerSlot]) -> None:
        super().__init__(AsyncMultiGpu(slots, inline=True), run_inline)

    def close(self) -> None:
        """End every worker's session; the first error is raised after all are closed."""
        error: BaseException | None = None
        for slot in self._target.workers:
            try:
                slot.gpu.close()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def __enter__(self) -> MultiGpu:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


add_sync_methods(MultiGpu, AsyncMultiGpu)


def _size_of(ptr: DevicePtr | int, size: int) -> int:
    return ptr.size if isinstance(ptr, DevicePtr) else size


def _with_events(
    options: dict[str, Any], on_event: Callable[[str, dict[str, Any]], None] | None, url: str
) -> dict[str, Any]:
    """One worker's options: ``on_event`` gets ``worker=URL`` in each event's details,
    so a program hears which worker dropped, resumed or was lost."""
    if on_event is None:
        return options

    def tagged(kind: str, details: dict[str, Any]) -> None:
        on_event(kind, {**details, "worker": url})

    return {**options, "on_event": tagged}


@asynccontextmanager
async def aconnect_multi(urls: Urls, **options: Any) -> AsyncIterator[AsyncMultiGpu]:
    """Open a session on each worker of ``urls`` (in order) for the ``async with`` block:
    ``options`` are :func:`hipr.aconnect`'s, given to every worker. Fails, closing what
    it opened, when any worker cannot be reached at the start."""
    on_event = options.pop("on_event", None)
    async with AsyncExitStack() as stack:
        slots: list[WorkerSlot] = []
        first = 0
        for index, url in enumerate(split_urls(urls)):
            gpu: AsyncGpu = await stack.enter_async_context(
                aconnect_one(url, **_with_events(options, on_event, url))
            )
            count = int(await gpu.device_count())
            tenant = str(gpu.worker_info().get("tenant", ""))
            slots.append(WorkerSlot(index, url, gpu, first, count, tenant))
            first += count
        yield AsyncMultiGpu(slots)


def connect_multi(urls: Urls, **options: Any) -> MultiGpu:
    """Open a session on each worker of ``urls`` (in order) from synchronous code, one
    sync :class:`hipr.Gpu` per worker: ``with hipr.connect([a, b]) as gpu: ...``."""
    on_event = options.pop("on_event", None)
    slots: list[WorkerSlot] = []
    first = 0
    try:
        for index, url in enumerate(split_urls(urls)):
            gpu: Gpu = connect_one(url, **_with_events(options, on_event, url))
            try:
                count = int(gpu.device_count())
                tenant = str(gpu.worker_info().get("tenant", ""))
            except BaseException:
                gpu.close()
                raise
            slots.append(WorkerSlot(index, url, gpu, first, count, tenant))
            first += count
    except BaseException:
        for slot in reversed(slots):
            try:
                slot.gpu.close()
            except Exception:
                pass  # the connect error is the one worth raising
        raise
    return MultiGpu(slots)


def env_urls() -> str | None:
    """``$HIPR_URL`` (one URL, or several comma-separated), or None when unset."""
    value = os.environ.get("HIPR_URL", "").strip()
    return value or None
