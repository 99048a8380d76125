"""Event requests (0x04xx)."""

from __future__ import annotations

from functools import partial
from typing import Any

from hipr.handlers.context import Request, or_restore, post_ordered, run_ordered
from hipr.handlers.registry import LATER, answers_now, handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.EVENT

#: EVENT_RECORD's stream, read for every record: a module constant.
_RECORD_STREAM = m.EventRecord.stream


def _event(session: Session, request: Request, key: str = m.EventQuery.event) -> Any:
    event_id = request.args.handle(key)
    assert event_id is not None
    return session.events.get(event_id)


@handler(m.EventCreate)
async def event_create(session: Session, request: Request) -> Any:
    """-> ``{event}``: a new event with timing."""
    session.gate.check_count("max_events")
    event = await session.gpu_create(session.backend.event_create)
    return {"event": session.events.add(event)}


@handler(m.EventDestroy)
async def event_destroy(session: Session, request: Request) -> Any:
    """``{event}``: destroy an event."""
    event_id = request.args.handle(m.EventDestroy.event)
    assert event_id is not None
    event = session.events.pop(event_id)
    destroy = or_restore(
        session.backend.event_destroy, partial(session.events.restore, event_id, event)
    )
    await run_ordered(session, request, destroy, event)
    return {}


@handler(m.EventRecord)
async def event_record(session: Session, request: Request) -> Any:
    """``{event, stream?}``: record the event on the stream."""
    await run_ordered(
        session, request, session.backend.event_record, *_record_call(session, request)
    )
    return {}


def _record_call(session: Session, request: Request) -> tuple[Any, Any]:
    """The backend ``event_record`` arguments of a record request, checked."""
    return _event(session, request), session.stream(
        request.args.handle(_RECORD_STREAM, optional=True)
    )


@answers_now(m.EventRecord)
def event_record_now(session: Session, request: Request) -> Any:
    """A fire-and-forget record, issued from the worker's I/O callback."""
    if not request.no_reply:
        return LATER
    post_ordered(session, request, session.backend.event_record, *_record_call(session, request))
    return {}


@handler(m.EventSynchronize)
async def event_synchronize(session: Session, request: Request) -> Any:
    """``{event}``: wait for the event."""
    event = _event(session, request)
    query = session.backend.event_query
    if not session.settled(query, event) and not await session.spin_until_settled(query, event):
        await session.gpu(
            session.backend.event_synchronize, event, then=request.answer_on_gpu_thread()
        )
    return {}


@answers_now(m.EventSynchronize)
def event_synchronize_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback when the event has completed."""
    return {} if session.settled(session.backend.event_query, _event(session, request)) else LATER


@handler(m.EventQuery)
async def event_query(session: Session, request: Request) -> Any:
    """``{event}`` -> ``{done}``."""
    return {"done": await session.gpu(session.backend.event_query, _event(session, request))}


@answers_now(m.EventQuery)
def event_query_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback where the backend queries inline."""
    ran, done = session.try_here(session.backend.event_query, _event(session, request))
    return {"done": done} if ran else LATER


@handler(m.EventElapsedTime)
async def event_elapsed_time(session: Session, request: Request) -> Any:
    """``{start, end}`` -> ``{ms}``: milliseconds between two completed events."""
    start = _event(session, request, m.EventElapsedTime.start)
    end = _event(session, request, m.EventElapsedTime.end)
    return {"ms": await session.gpu(session.backend.event_elapsed_ms, start, end)}
