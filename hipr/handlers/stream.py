"""Stream requests (0x03xx), stream capture included."""

from __future__ import annotations

from functools import partial
from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request, or_restore, post_ordered, run_ordered
from hipr.handlers.registry import LATER, answers_now, handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.resources import GraphEntry
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.STREAM

# Keys read on every synchronize, query or wait: module constants, not attribute look-ups.
_STREAM = m.StreamSynchronize.stream
_WAIT_STREAM = m.StreamWaitEvent.stream
_WAIT_EVENT = m.StreamWaitEvent.event


@handler(m.StreamCreate)
async def stream_create(session: Session, request: Request) -> Any:
    """-> ``{stream}``: a new stream on the current device."""
    session.gate.check_count("max_streams")
    stream = await session.gpu_create(session.backend.stream_create)
    return {"stream": session.streams.add(stream)}


@handler(m.StreamDestroy)
async def stream_destroy(session: Session, request: Request) -> Any:
    """``{stream}``: destroy a stream (its queued work still completes)."""
    stream_id = request.args.handle(m.StreamDestroy.stream)
    assert stream_id is not None
    if stream_id in session.capturing_streams:
        raise HipError(
            HipErrorCode.hipErrorIllegalState, "the stream is capturing; end capture first"
        )
    stream = session.streams.pop(stream_id)
    destroy = or_restore(
        session.backend.stream_destroy, partial(session.streams.restore, stream_id, stream)
    )
    await run_ordered(session, request, destroy, stream)
    return {}


@handler(m.StreamSynchronize)
async def stream_synchronize(session: Session, request: Request) -> Any:
    """``{stream?}``: wait for the stream's work (the default stream when absent)."""
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    query = session.backend.stream_query
    if stream is None or not (
        session.settled(query, stream) or await session.spin_until_settled(query, stream)
    ):
        await session.gpu(
            session.backend.stream_synchronize, stream, then=request.answer_on_gpu_thread()
        )
    return {}


@answers_now(m.StreamSynchronize)
def stream_synchronize_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback when the (created) stream is idle."""
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    if stream is not None and session.settled(session.backend.stream_query, stream):
        return {}
    return LATER


@handler(m.StreamQuery)
async def stream_query(session: Session, request: Request) -> Any:
    """``{stream?}`` -> ``{done}``."""
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    return {"done": await session.gpu(session.backend.stream_query, stream)}


@handler(m.StreamWaitEvent)
async def stream_wait_event(session: Session, request: Request) -> Any:
    """``{stream?, event}``: later work on the stream waits for the event."""
    call = _wait_call(session, request)
    await run_ordered(session, request, session.backend.stream_wait_event, *call)
    return {}


def _wait_call(session: Session, request: Request) -> tuple[Any, Any]:
    """The backend ``stream_wait_event`` arguments of a wait request, checked."""
    stream = session.stream(request.args.handle(_WAIT_STREAM, optional=True))
    event_id = request.args.handle(_WAIT_EVENT)
    assert event_id is not None
    return stream, session.events.get(event_id)


@answers_now(m.StreamQuery)
def stream_query_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback where the backend queries inline."""
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    ran, done = session.try_here(session.backend.stream_query, stream)
    return {"done": done} if ran else LATER


@answers_now(m.StreamWaitEvent)
def stream_wait_event_now(session: Session, request: Request) -> Any:
    """A fire-and-forget wait, issued from the worker's I/O callback."""
    if not request.no_reply:
        return LATER
    post_ordered(session, request, session.backend.stream_wait_event, *_wait_call(session, request))
    return {}


@handler(m.StreamBeginCapture)
async def stream_begin_capture(session: Session, request: Request) -> Any:
    """``{stream}``: work issued on the stream is captured into a graph from now on."""
    stream_id = request.args.handle(m.StreamBeginCapture.stream)
    assert stream_id is not None
    stream = session.streams.get(stream_id)
    if stream_id in session.capturing_streams:
        raise HipError(HipErrorCode.hipErrorIllegalState, "the stream is already capturing")
    # The graph comes into being at end_capture; count it now so that ending never fails.
    session.gate.check_count("max_graphs")
    await session.gpu(session.backend.stream_begin_capture, stream)
    session.capturing_streams.add(stream_id)
    return {}


@handler(m.StreamEndCapture)
async def stream_end_capture(session: Session, request: Request) -> Any:
    """``{stream}`` -> ``{graph}``: the captured work as a graph."""
    stream_id = request.args.handle(m.StreamEndCapture.stream)
    assert stream_id is not None
    stream = session.streams.get(stream_id)
    if stream_id not in session.capturing_streams:
        raise HipError(HipErrorCode.hipErrorIllegalState, "the stream is not capturing")
    session.capturing_streams.discard(stream_id)
    try:
        graph = await session.gpu_create(session.backend.stream_end_capture, stream)
    except HipError:
        # Nothing was captured: what was freed during the capture may go now.
        freed = session.collect_retired()
        if freed:
            await session.gpu(session.free_retired, freed)
        raise
    graph_id = session.graphs.add(GraphEntry(graph, []))
    # Any allocation the session had, or freed, during the capture may have been recorded.
    session.graph_memory.add(("graph", graph_id), session.graph_bases())
    return {"graph": graph_id}
