"""Memory requests (0x02xx): allocation, copies in bounded chunks, memset.

Host-to-device data arrives as the request's bulk part and continuation DATA frames;
device-to-host data leaves as REPLY|MORE frames before the final reply. Either way no
copy needs more than a few chunks of worker memory, and each chunk's GPU copy overlaps
the transfer of the next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from contextlib import nullcontext
from itertools import accumulate
from typing import Any

import anyio
import numpy as np

from hipr.errors import HipError, HipErrorCode, invalid_value
from hipr.handlers.args import Args
from hipr.handlers.context import Reply, Request, admit_each, post_ordered, run_batch, run_ordered
from hipr.handlers.registry import LATER, answers_now, handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.gpu_thread import PendingCall
from hipr.sessions.loop_wakeup import LoopWaker, OneShot
from hipr.sessions.resources import Allocation
from hipr.sessions.state import Session
from hipr.sessions.stripes import DataLinkEnd, DataLinkEnded

OPCODE_RANGE = OpcodeRange.MEMORY

# A copy's keys, read for every copy: module constants, not attribute look-ups. (MEMCPY_HTOD
# and MALLOC_HTOD share the chunked upload, so its stream key serves both.)
_DST = m.MemcpyHtod.dst
_SIZE = m.MemcpyHtod.size
_STREAM = m.MemcpyHtod.stream
_STRIPED = m.MemcpyHtod.striped
_STRIPED_OUT = m.MemcpyDtoh.striped
_STRIPED_WAITS = "MEMCPY_HTOD: a striped upload must wait for its reply"
_MANY_DST = m.MemcpyHtodMany.dst
_MANY_SIZE = m.MemcpyHtodMany.size
_MANY_STREAM = m.MemcpyHtodMany.stream

#: GPU copies kept in flight per request: enough to overlap link and bus, bounded memory.
PIPELINE_DEPTH = 4
#: Device-to-host reply chunk; the client learns the worker's limits at HELLO.
DTOH_CHUNK = 4 << 20


#: How long the worker's loop polls for a small copy back to end before the usual,
#: waiting copy takes the request (``Backend.memcpy_dtoh_if_quick``).
QUICK_DTOH_SPIN = 30e-6


def _copied_back_quickly(
    session: Session, request_id: int, out: memoryview, src: int, stream: Any
) -> bool:
    """True when ``out`` was filled right here on the loop: a small copy whose stream's
    work ended within :data:`QUICK_DTOH_SPIN` (PyTorch's ``item()`` after a tiny
    kernel), without the GPU thread's two hand-offs; False, with nothing to undo, where
    the usual copy must run (the backend has no such call, the session's GPU thread has
    work queued, or the copy had not ended). A request polled for once (in the I/O
    callback) is not polled for again by the executor: its stream was busy."""
    quick = getattr(session.backend, "memcpy_dtoh_if_quick", None)
    if (
        quick is None
        or out.nbytes > getattr(session.backend, "quick_dtoh_bytes", 0)
        or session.copy_back_polled == request_id
    ):
        return False
    ran, done = session.try_here(quick, out, src, stream, QUICK_DTOH_SPIN)
    if ran and not done:
        session.copy_back_polled = request_id
    return ran and bool(done)


def _host_buffer(size: int) -> memoryview:
    """A fresh host buffer for device bytes, left uninitialised: the copy fills all of it,
    so zeroing it first (as ``bytearray(size)`` does) would be a wasted pass over memory."""
    return np.empty(size, np.uint8).data


@handler(m.Malloc)
async def malloc(session: Session, request: Request) -> Any:
    """``{size}`` -> ``{ptr}``: allocate on the current device. Size 0 gives the null
    pointer (``ptr`` 0) and allocates nothing, as ``hipMalloc`` does."""
    size = request.args.size(m.Malloc.size)
    if size == 0:
        return {"ptr": 0}
    with session.gate.reserve_memory(size):
        ptr = await session.gpu_create(session.backend.malloc, size)
        session.allocations.add(Allocation(ptr, size, session.device))
    return {"ptr": ptr}


@handler(m.Free)
async def free(session: Session, request: Request) -> Any:
    """``{ptr}``: free an allocation of this session (its start address). The null
    pointer is freed as a no-op, as ``hipFree(nullptr)`` is. While a graph of the
    session may still write it (or a capture runs), the memory stays held and counted
    until that graph and its instantiations are destroyed or the session ends."""
    ptr = request.args.address(m.Free.ptr)
    if ptr == 0:
        return {}
    allocation = session.allocations.remove(ptr)
    if session.keeps_for_graphs(ptr):
        # A graph may still write it: held, out of reach, until that graph is gone.
        session.allocations.retire(allocation)
        return {}
    try:
        await session.gpu(session._free_on, allocation)
    except Exception:
        # The runtime refused (or failed): keep the books honest, the memory is still held.
        session.allocations.add(allocation)
        raise
    return {}


def _whole_copy_in(session: Session, request: Request, dst: int, size: int) -> tuple[Any, bool]:
    """A copy that came whole in one frame: its stream, and whether it has bytes."""
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    if request.bulk.nbytes != size:
        if request.args.flag(_STRIPED):  # read here, off the fire-and-forget copies' path
            raise invalid_value(_STRIPED_WAITS)
        raise invalid_value(f"MEMCPY_HTOD: announced {size} bytes, received {request.bulk.nbytes}")
    return stream, size > 0


async def _upload_window(session: Session, dst: int, size: int, stream: Any) -> memoryview | None:
    """The destination of a synchronous upload as host memory, for its chunks to be
    received straight into (a backend whose device memory is host memory: the
    emulator's ``host_window``), or None. Asked on the session's thread after all its
    earlier calls: the emulator runs work at submission, so once they are done nothing
    of the session touches these bytes while the upload runs (the executor takes no
    other request meanwhile). Not for a copy on a stream, which a capture may record
    instead of running."""
    window_of = getattr(session.backend, "host_window", None)
    if window_of is None or stream is not None:
        return None
    window: memoryview = await session.gpu(window_of, dst, size)
    return window


def _address(view: memoryview) -> int:
    """Where a buffer's bytes are in this process's memory."""
    return int(np.frombuffer(view, np.uint8).ctypes.data)


async def _copy_chunks_in(session: Session, request: Request, dst: int, size: int) -> None:
    if not request.more:
        # All of it came in one frame: one ordered call, queued without a wait when the
        # request is fire-and-forget (small async copies run at the launch rate).
        stream, any_bytes = _whole_copy_in(session, request, dst, size)
        if any_bytes:
            await run_ordered(
                session, request, session.backend.memcpy_htod, dst, request.bulk, stream
            )
        return
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    window = await _upload_window(session, dst, size, stream)
    at = _address(window) if window is not None else 0
    in_flight: deque[PendingCall[None]] = deque()
    offset = 0
    chunk: memoryview | None = request.bulk
    with request.placing(window) if window is not None else nullcontext(False):
        try:
            while chunk is not None:
                if chunk.nbytes > size - offset:
                    await request.drain()
                    raise invalid_value(
                        f"MEMCPY_HTOD: received more than the announced {size} bytes"
                    )
                # A chunk the loop received straight into its destination is there.
                if chunk.nbytes and (window is None or _address(chunk) != at + offset):
                    in_flight.append(
                        session.gpu_submit(session.backend.memcpy_htod, dst + offset, chunk, stream)
                    )
                offset += chunk.nbytes
                if len(in_flight) >= PIPELINE_DEPTH:
                    await in_flight.popleft().result()
                chunk = await request.receive_data()
        finally:
            await _settle(in_flight)
    if offset != size:
        raise invalid_value(f"MEMCPY_HTOD: announced {size} bytes, received {offset}")


async def _settle(in_flight: deque[PendingCall[None]]) -> None:
    """Await every queued copy, so that a failure never leaves one running unobserved;
    the first failure is raised."""
    errors: list[BaseException] = []
    while in_flight:
        try:
            await in_flight.popleft().result()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


async def _copy_striped_in(session: Session, request: Request, dst: int, size: int) -> None:
    """A striped upload (protocol 1.4): its chunks come from the session's data links
    (``hipr.sessions.stripes``) in any order, each copied as it comes; a chunk that comes
    twice (resent after a data link broke) is copied once."""
    if request.more or request.bulk.nbytes:
        await request.drain()
        raise invalid_value("MEMCPY_HTOD: a striped upload carries no bytes of its own")
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    inbox = session.stripes
    chunk_bytes = inbox.chunk_bytes
    count = -(-size // chunk_bytes)
    arrived = bytearray(count)
    missing = count
    waker = LoopWaker()
    in_flight: deque[PendingCall[None]] = deque()
    with inbox.receiving(request.request_id):
        try:
            while missing:
                chunk = inbox.take(request.request_id, waker)
                if isinstance(chunk, OneShot):
                    with anyio.move_on_after(inbox.stall_seconds) as waited:
                        await chunk.wait()
                    if waited.cancelled_caught or inbox.closed:
                        raise HipError(
                            HipErrorCode.hipErrorInvalidValue,
                            f"MEMCPY_HTOD: striped upload stalled: {count - missing} of its "
                            f"{count} chunks arrived on the session's {inbox.links} data "
                            f"link(s), none for {inbox.stall_seconds:g} s",
                            stalled=True,
                        )
                    continue
                offset, data = chunk
                index = offset // chunk_bytes
                if index >= count or data.nbytes != min(chunk_bytes, size - offset):
                    raise invalid_value(
                        f"MEMCPY_HTOD: a striped chunk of {data.nbytes} bytes at offset "
                        f"{offset} does not fit an upload of {size} bytes in chunks of "
                        f"{chunk_bytes}"
                    )
                if arrived[index]:
                    continue
                arrived[index] = 1
                missing -= 1
                in_flight.append(
                    session.gpu_submit(session.backend.memcpy_htod, dst + offset, data, stream)
                )
                if len(in_flight) >= PIPELINE_DEPTH:
                    await in_flight.popleft().result()
        finally:
            await _settle(in_flight)


@handler(m.MemcpyHtod)
async def memcpy_htod(session: Session, request: Request) -> Any:
    """``{dst, size, stream?}`` + ``size`` bulk bytes (in this frame and DATA frames)."""
    try:
        dst = request.args.address(_DST)
        size = request.args.size(_SIZE)
        session.check_range(dst, size, "destination")
    except HipError:
        await request.drain()
        raise
    if request.args.flag(_STRIPED):
        if request.no_reply:  # as the answer-now path refuses it (_whole_copy_in)
            raise invalid_value(_STRIPED_WAITS)
        await _copy_striped_in(session, request, dst, size)
    else:
        await _copy_chunks_in(session, request, dst, size)
    session.observer.bytes_copied(session.tenant, "htod", size)
    return {}


@answers_now(m.MemcpyHtod)
def memcpy_htod_now(session: Session, request: Request) -> Any:
    """A fire-and-forget copy that came whole in one frame, queued on the session's GPU
    thread from the worker's I/O callback."""
    if not request.no_reply or request.more:
        return LATER
    dst = request.args.address(_DST)
    size = request.args.size(_SIZE)
    session.check_range(dst, size, "destination")
    stream, any_bytes = _whole_copy_in(session, request, dst, size)
    if any_bytes:
        post_ordered(session, request, session.backend.memcpy_htod, dst, request.bulk, stream)
    session.observer.bytes_copied(session.tenant, "htod", size)
    return {}


@handler(m.MemcpyDtoh)
async def memcpy_dtoh(session: Session, request: Request) -> Any:
    """``{src, size, stream?}`` -> the bytes, in REPLY|MORE chunks then the final reply."""
    args = request.args
    src = args.address(m.MemcpyDtoh.src)
    size = args.size(m.MemcpyDtoh.size)
    session.check_range(src, size, "source")
    stream = session.stream(args.handle(m.MemcpyDtoh.stream, optional=True))
    session.observer.bytes_copied(session.tenant, "dtoh", size)
    if args.flag(_STRIPED_OUT):
        return await _copy_striped_out(session, request, src, size, stream)
    if size <= DTOH_CHUNK:
        out = _host_buffer(size)
        if not _copied_back_quickly(session, request.request_id, out, src, stream):
            await session.gpu(session.backend.memcpy_dtoh, out, src, stream)
        return Reply({"size": size}, out)
    # Double-buffered: the GPU fills chunk k+1 while chunk k is on the wire.
    pending: PendingCall[None] | None = None
    pending_buffer = memoryview(b"")
    offset = 0
    while offset < size:
        n = min(DTOH_CHUNK, size - offset)
        # Each chunk goes out as a streamed reply, never cached for a resend, so its
        # buffer can be reused once the transport has let go of it.
        buffer = request.chunk_buffer(n)
        call = session.gpu_submit(session.backend.memcpy_dtoh, buffer, src + offset, stream)
        if pending is not None:
            await pending.result()
            await request.send_chunk(pending_buffer)
        pending, pending_buffer = call, buffer
        offset += n
    assert pending is not None
    await pending.result()
    return Reply({"size": size}, pending_buffer)


async def _copy_striped_out(
    session: Session, request: Request, src: int, size: int, stream: Any
) -> Any:
    """A striped download (protocol 1.4): chunk ``j`` copied into a payload buffer on the
    session's GPU thread, then written to data link ``j`` modulo the links by a worker
    thread, while the GPU copies the next; at most two chunks a link on their way."""
    inbox = session.stripes
    links = inbox.live_links()
    if not links:
        raise invalid_value("MEMCPY_DTOH: striped, but the session has no data link")
    chunk_bytes = inbox.chunk_bytes
    slots = anyio.Semaphore(2 * len(links))
    failures: list[DataLinkEnded] = []

    async def send(link: DataLinkEnd, offset: int, buffer: memoryview) -> None:
        try:
            await anyio.to_thread.run_sync(link.send_chunk, request.request_id, offset, buffer)
        except DataLinkEnded as exc:
            failures.append(exc)
        finally:
            slots.release()

    async with anyio.create_task_group() as sending:
        for index, offset in enumerate(range(0, size, chunk_bytes)):
            await slots.acquire()
            if failures:
                slots.release()
                break
            buffer = request.chunk_buffer(min(chunk_bytes, size - offset))
            try:
                await session.gpu(session.backend.memcpy_dtoh, buffer, src + offset, stream)
            except BaseException:
                slots.release()
                raise
            sending.start_soon(send, links[index % len(links)], offset, buffer)
    if failures:
        raise invalid_value(
            f"MEMCPY_DTOH: striped download lost a data link ({failures[0]}); ask again "
            "without striped"
        )
    return {"size": size}


def quick_copy_back(session: Session, args: Args, request_id: int) -> memoryview | None:
    """The bytes of MEMCPY_DTOH ``args`` (request ``request_id``) when the copy is small
    and its stream's work ended within a short poll, copied right here on the loop
    (:func:`_copied_back_quickly`); None where the usual copy must take the request.
    Refuses as the handler does (HipError): a source outside the session's allocations,
    a stream not its own. Used by the answers-now variant below and by the express path
    (``hipr.worker.express``)."""
    src = args.address(m.MemcpyDtoh.src)
    size = args.size(m.MemcpyDtoh.size)
    if size > getattr(session.backend, "quick_dtoh_bytes", 0) or args.flag(_STRIPED_OUT):
        return None
    session.check_range(src, size, "source")
    stream = session.stream(args.handle(m.MemcpyDtoh.stream, optional=True))
    out = _host_buffer(size)
    if not _copied_back_quickly(session, request_id, out, src, stream):
        return None
    session.observer.bytes_copied(session.tenant, "dtoh", size)
    return out


@answers_now(m.MemcpyDtoh)
def memcpy_dtoh_now(session: Session, request: Request) -> Any:
    """A small copy back answered from the I/O callback when its stream's work ends
    within a short poll (PyTorch's ``item()``: four bytes after a tiny kernel); anything
    else goes to the executor, which makes the usual copy."""
    if request.no_reply:
        return LATER
    out = quick_copy_back(session, request.args, request.request_id)
    if out is None:
        return LATER
    return Reply({"size": out.nbytes}, out)


@handler(m.MemcpyDtod)
async def memcpy_dtod(session: Session, request: Request) -> Any:
    """``{dst, src, size, stream?}``: copy between this session's allocations."""
    args = request.args
    dst = args.address(m.MemcpyDtod.dst)
    src = args.address(m.MemcpyDtod.src)
    size = args.size(m.MemcpyDtod.size)
    session.check_range(dst, size, "destination")
    session.check_range(src, size, "source")
    stream = session.stream(args.handle(m.MemcpyDtod.stream, optional=True))
    await run_ordered(session, request, session.backend.memcpy_dtod, dst, src, size, stream)
    return {}


@handler(m.Memset)
async def memset(session: Session, request: Request) -> Any:
    """``{ptr, value, size, stream?}``: set ``size`` bytes to the byte ``value``."""
    args = request.args
    ptr = args.address(m.Memset.ptr)
    value = args.integer(m.Memset.value, low=0, high=255)
    size = args.size(m.Memset.size)
    session.check_range(ptr, size, "memset range")
    stream = session.stream(args.handle(m.Memset.stream, optional=True))
    await run_ordered(session, request, session.backend.memset, ptr, value, size, stream)
    return {}


@handler(m.MallocHtod)
async def malloc_htod(session: Session, request: Request) -> Any:
    """``{size}`` + ``size`` bulk bytes -> ``{ptr}``: allocate and fill in one round trip.
    Nothing stays allocated when the copy fails."""
    try:
        size = request.args.size(m.MallocHtod.size)
        if size == 0:
            raise invalid_value("MALLOC_HTOD: size must be at least 1 byte")
        with session.gate.reserve_memory(size):
            ptr = await session.gpu_create(session.backend.malloc, size)
            allocation = Allocation(ptr, size, session.device)
            session.allocations.add(allocation)
    except HipError:
        await request.drain()
        raise
    try:
        await _copy_chunks_in(session, request, ptr, size)
        session.observer.bytes_copied(session.tenant, "htod", size)
    except BaseException:
        session.allocations.remove(ptr)
        with anyio.CancelScope(shield=True):
            try:
                await session.gpu(session._free_on, allocation)
            except Exception:
                # Still held: back in the books, the session's teardown frees it.
                session.allocations.add(allocation)
        raise
    return {"ptr": ptr}


MAX_PIECES = m.MAX_PIECES
MAX_PIECES_BYTES = m.MAX_PIECES_BYTES


def _in_one_allocation(session: Session, ranges: Sequence[tuple[int, int]]) -> bool:
    """True when the span from the lowest destination to the highest end lies in one of
    the session's allocations: then every piece does, and one look-up stands for one
    per piece (a batch usually writes into one buffer). False says nothing: each piece
    is then checked, and a refusal names its piece."""
    low = min(dst for dst, _ in ranges)
    high = max(dst + size for dst, size in ranges)
    try:
        session.check_range(low, high - low)
    except HipError:
        return False
    return True


def _admitted(index: int, piece: tuple[int, int]) -> None:
    """A piece already known to lie in the session's memory (:func:`_in_one_allocation`)."""


def _pieces(
    session: Session, request: Request
) -> tuple[Any, list[tuple[int, memoryview]], HipError | None]:
    """A MEMCPY_HTOD_MANY read and checked: its stream, the pieces that may run
    (address, bytes), and the first refusal, naming its piece."""
    args = request.args
    stream = session.stream(args.handle(_MANY_STREAM, optional=True))
    dsts = args.int_list(_MANY_DST, max_items=MAX_PIECES)
    sizes = args.int_list(_MANY_SIZE, max_items=MAX_PIECES, high=MAX_PIECES_BYTES)
    if not dsts or len(dsts) != len(sizes):
        raise invalid_value(
            f"{request.name}: 'dst' and 'size' must be lists of 1 to {MAX_PIECES} integers "
            f"of one length, got {len(dsts)} and {len(sizes)}"
        )
    bulk = request.bulk
    if sum(sizes) != bulk.nbytes:
        raise invalid_value(
            f"{request.name}: the pieces' sizes add up to {sum(sizes)} bytes, "
            f"received {bulk.nbytes}"
        )
    count = len(dsts)
    starts = list(accumulate(sizes, initial=0))
    ranges = list(zip(dsts, sizes, strict=True))

    def check(index: int, piece: tuple[int, int]) -> None:
        session.check_range(*piece, f"destination of piece {index + 1} of {count}")

    if count > 1 and _in_one_allocation(session, ranges):
        check = _admitted  # every piece lies inside that allocation
    admitted, refused = admit_each(session, request, ranges, check, "pieces")
    pieces = [
        (dst, bulk[starts[index] : starts[index] + size]) for index, (dst, size) in admitted if size
    ]
    return stream, pieces, refused


def _post_pieces(session: Session, request: Request) -> None:
    stream, pieces, refused = _pieces(session, request)
    if pieces:
        post_ordered(session, request, *_copy_call(session, pieces, stream))
    _count_copied(session, pieces)
    if refused is not None:
        raise refused


def _count_copied(session: Session, pieces: list[tuple[int, memoryview]]) -> None:
    if pieces:
        session.observer.bytes_copied(
            session.tenant, "htod", sum(piece.nbytes for _, piece in pieces)
        )


def _copy_call(
    session: Session, pieces: list[tuple[int, memoryview]], stream: Any
) -> tuple[Any, ...]:
    """The backend call that copies ``pieces``: its own ``memcpy_htod_many`` where it has
    one (one synchronise for all on the default stream), else one copy after another."""
    many = getattr(session.backend, "memcpy_htod_many", None)
    if many is not None:
        return many, pieces, stream
    return _each_piece, session.backend.memcpy_htod, pieces, stream


def _each_piece(copy: Any, pieces: list[tuple[int, memoryview]], stream: Any) -> None:
    for dst, piece in pieces:
        copy(dst, piece, stream)


@handler(m.MemcpyHtodMany)
async def memcpy_htod_many(session: Session, request: Request) -> Any:
    """``{dst: [address, ...], size: [bytes, ...], stream?}`` + the pieces' bytes, one
    after another (protocol 1.1): host-to-device copies in order, as if each came as its
    own MEMCPY_HTOD on ``stream``. Each destination range is checked; a refused piece
    (outside the session's allocations, or past the tenant's max_request_rate: each
    piece counts as one request) stops none of the others; the first refusal, else a
    failure of the copies, is the request's error, a refusal naming its piece."""
    stream, pieces, refused = _pieces(session, request)
    call = _copy_call(session, pieces, stream) if pieces else None
    try:
        await run_batch(session, request, call, refused)
    finally:
        _count_copied(session, pieces)
    return {}


@answers_now(m.MemcpyHtodMany)
def memcpy_htod_many_now(session: Session, request: Request) -> Any:
    """A fire-and-forget MEMCPY_HTOD_MANY queued from the worker's I/O callback."""
    if not request.no_reply or request.more:
        return LATER
    _post_pieces(session, request)
    return {}
