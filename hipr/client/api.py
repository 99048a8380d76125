"""The async client API: ``async with hipr.aconnect(url) as gpu: ...``."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.abc

from hipr._version import __version__
from hipr.backends.interface import DeviceProperties
from hipr.client.connection import (
    Buffer,
    ClientConnection,
    EventCallback,
    LinkOptions,
    Progress,
)
from hipr.client.connection import _view as _bytes_view
from hipr.client.direct import Send, sends
from hipr.client.link import RequestLink
from hipr.client.module_offer import hash_offer
from hipr.client.objects import (
    DevicePtr,
    Event,
    Function,
    Graph,
    LaunchPlan,
    Module,
    Stream,
    handle_id,
)
from hipr.client.timeouts import with_timeouts
from hipr.errors import HipError, ProtocolError, SessionLostError, invalid_value
from hipr.kernels.builtins import BUILTINS
from hipr.protocol.codec import DEFAULT_MAX_PAYLOAD
from hipr.protocol.header import PROTOCOL_VERSION
from hipr.protocol.messages import Hello
from hipr.protocol.opcodes import Opcode

DEFAULT_URL = "tcp://127.0.0.1:18515"


@with_timeouts
class AsyncGpu:
    """A remote device. Every method is a coroutine; handles it returns are bound to
    this session. The same names exist, synchronous, on :func:`hipr.connect`'s object."""

    def __init__(self, connection: RequestLink, hello: dict[str, Any]) -> None:
        self._conn = connection
        self._hello = hello
        self.session_id: str = str(hello.get("session_id", ""))
        self._properties: dict[int, DeviceProperties] = {}
        self._device_count: int | None = None

    @property
    def lost(self) -> bool:
        """True once the session is gone for good (its handles are then invalid)."""
        return isinstance(self._conn.broken, SessionLostError)

    # --- plumbing ------------------------------------------------------------------
    async def _call(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> Any:
        result, _ = await self._conn.request(opcode, args, data)
        return result

    async def _post(self, opcode: Opcode, args: Any = None, data: Buffer = b"") -> None:
        await self._conn.notify(opcode, args, data)

    async def _launch(self, plan: LaunchPlan, data: bytes) -> None:
        await self._conn.launch(plan, data)

    def worker_info(self) -> dict[str, Any]:
        """What the worker said at HELLO: protocol, worker_version, backend, session_id."""
        return dict(self._hello)

    async def ping(self) -> float:
        """Seconds for one null round trip."""
        start = time.perf_counter()
        await self._call(Opcode.PING)
        return time.perf_counter() - start

    async def admin_status(self, admin_token: str | None = None) -> dict[str, Any]:
        """The worker's status: sessions, tenants with memory against quota, uptime,
        backend, devices (see docs/protocol.md, ADMIN_STATUS). Needs the worker's admin
        token; ``admin_token`` defaults to ``$HIPR_ADMIN_TOKEN``."""
        if admin_token is None:
            admin_token = os.environ.get("HIPR_ADMIN_TOKEN", "")
        return dict(await self._call(Opcode.ADMIN_STATUS, {"admin_token": admin_token}))

    # --- devices -------------------------------------------------------------------
    async def device_count(self) -> int:
        """Visible devices (cached: it cannot change during a session)."""
        if self._device_count is None:
            self._device_count = int((await self._call(Opcode.DEVICE_COUNT))["count"])
        return self._device_count

    async def set_device(self, device: int) -> None:
        """Make ``device`` current for this session's later calls."""
        await self._call(Opcode.SET_DEVICE, {"device": device})

    async def get_device(self) -> int:
        """This session's current device."""
        return int((await self._call(Opcode.GET_DEVICE))["device"])

    async def device_properties(self, device: int = 0) -> DeviceProperties:
        """Name, arch, memory, multiprocessors... of ``device`` (cached per session)."""
        if device not in self._properties:
            result = await self._call(Opcode.DEVICE_PROPERTIES, {"device": device})
            known = set(DeviceProperties.__dataclass_fields__)
            self._properties[device] = DeviceProperties(
                **{k: v for k, v in result.items() if k in known}
            )
        return self._properties[device]

    async def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        result = await self._call(Opcode.MEM_GET_INFO)
        return int(result["free"]), int(result["total"])

    def _synchronize_request(self) -> tuple[Opcode, None, bytes]:
        """:meth:`synchronize`'s request: opcode, wire arguments, bytes."""
        return Opcode.DEVICE_SYNCHRONIZE, None, b""

    @sends(Send.WAIT, _synchronize_request)
    async def synchronize(self) -> None:
        """Wait for all work of the current device; reports asynchronous errors."""
        await self._call(*self._synchronize_request())

    # --- memory --------------------------------------------------------------------
    async def malloc(self, size: int) -> DevicePtr:
        """Allocate ``size`` bytes on the current device. ``malloc(0)`` returns the null
        pointer (``DevicePtr(0, 0)``), as ``hipMalloc`` does; freeing it does nothing."""
        _check_size(size)
        if size == 0:
            return DevicePtr(0, 0)
        result = await self._call(Opcode.MALLOC, {"size": size})
        return DevicePtr(int(result["ptr"]), size)

    async def malloc_htod(self, src: Buffer) -> DevicePtr:
        """Allocate device memory holding a copy of ``src``, in one round trip."""
        data, size = _host_source(0, src, None)
        if size == 0:
            raise invalid_value("malloc_htod needs a non-empty buffer")
        result = await self._call(Opcode.MALLOC_HTOD, {"size": size}, data)
        return DevicePtr(int(result["ptr"]), size)

    async def free(self, ptr: DevicePtr | int) -> None:
        """Free an allocation (its start address)."""
        await self._call(Opcode.FREE, {"ptr": int(ptr)})

    async def memcpy_htod(
        self,
        dst: DevicePtr | int,
        src: Buffer,
        size: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Copy a host buffer (bytes, bytearray, memoryview, numpy array) to the device.
        ``progress(done, total)`` is called as chunks leave, for progress bars."""
        data, size = _host_source(dst, src, size)
        await self._conn.request(
            Opcode.MEMCPY_HTOD, {"dst": int(dst), "size": size}, data, progress=progress
        )

    def _memcpy_htod_async_request(
        self,
        dst: DevicePtr | int,
        src: Buffer,
        stream: Stream | None = None,
        size: int | None = None,
    ) -> tuple[Opcode, dict[str, Any], memoryview]:
        """:meth:`memcpy_htod_async`'s request: opcode, wire arguments, bytes."""
        data, size = _host_source(dst, src, size)
        wire = {"dst": int(dst), "size": size, "stream": handle_id(stream)}
        return Opcode.MEMCPY_HTOD, wire, data

    @sends(Send.POST, _memcpy_htod_async_request)
    async def memcpy_htod_async(
        self,
        dst: DevicePtr | int,
        src: Buffer,
        stream: Stream | None = None,
        size: int | None = None,
    ) -> None:
        """Queue a host-to-device copy on ``stream``. The bytes are sent before this
        returns, so ``src`` may be reused at once."""
        await self._post(*self._memcpy_htod_async_request(dst, src, stream, size))

    def _link(self) -> RequestLink:
        """The connection this object's requests go over."""
        return self._conn

    async def memcpy_dtoh(
        self,
        src: DevicePtr | int,
        size: int | None = None,
        out: Buffer | None = None,
        stream: Stream | None = None,
        progress: Progress | None = None,
    ) -> Any:
        """Copy device bytes to the host: new ``bytes``, or into ``out`` (returned).
        ``progress(done, total)`` is called as chunks arrive, for progress bars."""
        if size is None:
            if out is not None:
                size = _bytes_view(out).nbytes
            elif isinstance(src, DevicePtr):
                size = src.size
            else:
                raise invalid_value("memcpy_dtoh needs a size for a raw address")
        _check_size(size)
        _check_fits(src, size, "source")
        target = memoryview(bytearray(size)) if out is None else _bytes_view(out)
        if target.readonly or target.nbytes < size:
            raise invalid_value(f"out must be a writable buffer of at least {size} bytes")
        sink = _IntoBuffer(target, size, progress)
        await self._conn.request(
            Opcode.MEMCPY_DTOH,
            {"src": int(src), "size": size, "stream": handle_id(stream)},
            sink=sink,
        )
        if sink.offset != size:
            raise ProtocolError(message=f"the worker sent {sink.offset} of {size} bytes")
        return bytes(target) if out is None else out

    async def memcpy_dtod(
        self, dst: DevicePtr | int, src: DevicePtr | int, size: int, stream: Stream | None = None
    ) -> None:
        """Copy ``size`` bytes from device range ``src`` to ``dst`` (both this session's)."""
        _check_size(size)
        _check_fits(dst, size, "destination")
        _check_fits(src, size, "source")
        await self._call(
            Opcode.MEMCPY_DTOD,
            {"dst": int(dst), "src": int(src), "size": size, "stream": handle_id(stream)},
        )

    async def memset(
        self, ptr: DevicePtr | int, value: int, size: int, stream: Stream | None = None
    ) -> None:
        """Set ``size`` bytes to the byte ``value``."""
        _check_size(size)
        if not isinstance(value, int) or not 0 <= value <= 255:
            raise invalid_value(f"memset value must be a byte (0..255), got {value!r}")
        await self._call(
            Opcode.MEMSET,
            {"ptr": int(ptr), "value": value, "size": size, "stream": handle_id(stream)},
        )

    # --- streams and events --------------------------------------------------------
    async def stream_create(self) -> Stream:
        """A new stream."""
        return Stream(self, (await self._call(Opcode.STREAM_CREATE))["stream"])

    async def event_create(self) -> Event:
        """A new event with timing."""
        return Event(self, (await self._call(Opcode.EVENT_CREATE))["event"])

    async def event_elapsed_ms(self, start: Event, end: Event) -> float:
        """Milliseconds between two completed events."""
        result = await self._call(
            Opcode.EVENT_ELAPSED_TIME, {"start": start._check(), "end": end._check()}
        )
        return float(result["ms"])

    # --- kernels and graphs --------------------------------------------------------
    async def compile(
        self, source: str, name: str = "kernel.hip", options: list[str] | tuple[str, ...] = ()
    ) -> Module:
        """Compile HIP C++ source on the worker and load it; a compile error raises
        HipError whose message carries the compiler's log."""
        result = await self._call(
            Opcode.MODULE_COMPILE, {"source": source, "name": name, "options": list(options)}
        )
        return Module(self, result["module"])

    async def compile_code(
        self,
        source: str,
        name: str = "kernel.hip",
        options: list[str] | tuple[str, ...] = (),
        headers: dict[str, str] | None = None,
    ) -> bytes:
        """Compile HIP C++ source on the worker and return its code object, unloaded (for
        :meth:`module_load`, as hiprtc gives it); a compile error raises HipError whose
        message carries the compiler's log. ``headers`` maps include names to contents
        the source may ``#include`` (hiprtcCreateProgram's headers)."""
        args: dict[str, Any] = {"source": source, "name": name, "options": list(options)}
        if headers:
            args["include_names"] = list(headers)
            args["headers"] = list(headers.values())
        sink = _Collect()
        await self._conn.request(Opcode.PROGRAM_COMPILE, args, sink=sink)
        return sink.data()

    async def link_code(self, inputs: list[tuple[int, bytes, str]]) -> tuple[bytes, str]:
        """Link compiled device code on the worker (its runtime's linker: cuLink* on
        NVIDIA, hiprtcLink* on AMD): ``(hiprtcJITInputType, code, name)`` inputs, such as
        the code objects of ``-fgpu-rdc`` compiles. (the linked image for
        :meth:`module_load`, the linker's log); a link error raises HipError with
        ``rtc_result`` HIPRTC_ERROR_LINKING and the linker's error log."""
        args = {
            "kinds": [int(kind) for kind, _, _ in inputs],
            "sizes": [len(code) for _, code, _ in inputs],
            "names": [name for _, _, name in inputs],
        }
        sink = _Collect()
        reply, _ = await self._conn.request(
            Opcode.PROGRAM_LINK, args, b"".join(bytes(code) for _, code, _ in inputs), sink=sink
        )
        return sink.data(), str(reply.get("log", ""))

    async def module_load(self, image: Buffer) -> Module:
        """Load a code object (HSACO on AMD, CUBIN or PTX on NVIDIA). One of at least
        4 KiB is first named by its SHA-256 (protocol 1.2): a worker that holds it for this
        tenant (an earlier session loaded it) loads it without the bytes crossing again."""
        offer = hash_offer(image, self._hello.get("protocol", 0))
        if offer is not None:
            reply = await self._call(Opcode.MODULE_LOAD, offer)
            if reply.get("held") is not False:
                return Module(self, reply["module"])
        return Module(self, (await self._call(Opcode.MODULE_LOAD, offer, image))["module"])

    async def builtin(self, name: str) -> Function:
        """A built-in kernel (fill_f32, scale_f32, axpy_f32, vector_add_f32, reduce_sum_f32,
        mixed_args_probe) that runs on every backend; docs/kernels.md lists each one's
        arguments. Its launches are checked against them at ``launch()``."""
        result = await self._call(Opcode.MODULE_BUILTIN, {"name": name})
        return Function(self, result["function"], name, BUILTINS.get(name))

    async def graph_create(self) -> Graph:
        """An empty graph."""
        return Graph(self, (await self._call(Opcode.GRAPH_CREATE))["graph"])

    async def close(self) -> None:
        """Say goodbye and close the connection; the worker frees the session."""
        if self._conn.broken is None:
            self._conn.begin_close()
            with anyio.move_on_after(5):
                with suppress(HipError):
                    await self._conn.request(Opcode.GOODBYE)
        await self._conn.aclose()


class _IntoBuffer:
    """Writes a reply's chunks into the caller's buffer; restartable for a replayed reply."""

    def __init__(self, target: memoryview, size: int, progress: Progress | None = None) -> None:
        self.target = target
        self.size = size
        self.offset = 0
        self.progress = progress

    def write(self, chunk: memoryview) -> None:
        if self.offset + chunk.nbytes > self.size:
            raise ProtocolError(message="the worker sent more bytes than asked for")
        self.target[self.offset : self.offset + chunk.nbytes] = chunk
        self.offset += chunk.nbytes
        if self.progress is not None:
            self.progress(self.offset, self.size)

    def window(self, nbytes: int) -> memoryview | None:
        """Where the next ``nbytes`` go, for a connection that receives them straight
        from the socket (no copy); None when they would not fit."""
        if self.offset + nbytes > self.size:
            return None
        return self.target[self.offset : self.offset + nbytes]

    def advance(self, nbytes: int) -> None:
        """``nbytes`` were written into the last :meth:`window`."""
        self.offset += nbytes
        if self.progress is not None:
            self.progress(self.offset, self.size)

    def reset(self) -> None:
        self.offset = 0


class _Collect:
    """Gathers a reply's chunks of unknown total size; restartable for a replayed reply."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, chunk: memoryview) -> None:
        self.chunks.append(bytes(chunk))

    def reset(self) -> None:
        self.chunks.clear()

    def data(self) -> bytes:
        return b"".join(self.chunks)


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63:
        raise invalid_value(f"size must be an int in [0, 2**63), got {size!r}")


def _check_fits(ptr: DevicePtr | int, size: int, what: str = "destination") -> None:
    if isinstance(ptr, DevicePtr) and size > ptr.size:
        raise invalid_value(
            f"the copy of {size} bytes overruns the {what} allocation: {ptr!r} holds "
            f"{ptr.size} bytes; copy at most {ptr.size}, or allocate more"
        )


def _host_source(dst: DevicePtr | int, src: Buffer, size: int | None) -> tuple[memoryview, int]:
    data = _bytes_view(src)
    if size is None:
        size = data.nbytes
    _check_size(size)
    if size > data.nbytes:
        raise invalid_value(f"size {size} is larger than the {data.nbytes}-byte host buffer")
    _check_fits(dst, size)
    return data[:size], size


def hello_args(token: str | None, version: str) -> dict[str, Any]:
    """The HELLO arguments: who we are and the token (default ``$HIPR_TOKEN``)."""
    token = token if token is not None else os.environ.get("HIPR_TOKEN")
    # "eol" ends the request of any line-based server reached by mistake (an HTTP
    # metrics port waits for a blank line), so it answers at once and the handshake
    # can say "not a hipr worker" instead of waiting out the connect timeout.
    args: dict[str, Any] = {Hello.client: f"hipr-py/{version}", Hello.eol: "\r\n\r\n"}
    if token:
        args[Hello.token] = token
    return args


def check_hello(hello: dict[str, Any], url: str) -> None:
    """Refuse a HELLO reply of another protocol major; drop the resume secret from what
    the API shows (``worker_info``)."""
    if hello.get("protocol", 0) >> 8 != PROTOCOL_VERSION >> 8:
        raise ProtocolError(message=f"unexpected HELLO reply from {url}: {hello!r:.200}")
    hello.pop("resume_token", None)


@asynccontextmanager
async def aconnect(
    url: str = DEFAULT_URL,
    *,
    token: str | None = None,
    timeout: float = 30.0,
    on_event: EventCallback | None = None,
    link: LinkOptions | None = None,
    **transport_options: Any,
) -> AsyncIterator[AsyncGpu]:
    """Connect to a worker; the session lives for the ``async with`` block.

    ``token`` defaults to ``$HIPR_TOKEN``. ``on_event(kind, details)`` hears about
    ``disconnected``, ``reconnecting``, ``resumed`` and ``session_lost``; ``link`` sets
    heartbeats, reconnection and batching (:class:`LinkOptions`); ``timeout`` bounds
    connecting. ``transport_options`` go to the transport (``ca=``, ``cert=``, ``key=``
    for TLS; ``identity=`` for SSH).
    """
    from hipr.transports import connect as transport_connect

    options = link or LinkOptions(connect_timeout=timeout)

    async def connector() -> anyio.abc.ByteStream:
        return await transport_connect(url, **transport_options)

    connection = ClientConnection(url, connector, DEFAULT_MAX_PAYLOAD, options, on_event)
    hello = await connection.open(hello_args(token, __version__))
    try:
        check_hello(hello, url)
    except BaseException:
        await connection.aclose()
        raise
    # The caller's own exception is re-raised after the task group, not from inside it,
    # where it would reach the caller wrapped in an ExceptionGroup.
    raised: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(connection.run)
        gpu = AsyncGpu(connection, hello)
        try:
            yield gpu
        except Exception as exc:
            raised = exc
        finally:
            with anyio.CancelScope(shield=True):
                await gpu.close()
            tg.cancel_scope.cancel()
    if raised is not None:
        raise raised
