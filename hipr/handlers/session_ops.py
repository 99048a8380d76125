"""Session and system requests (0x00xx). HELLO and RESUME are answered by the connection
before a session exists; their handlers here refuse a second handshake."""

from __future__ import annotations

from typing import Any

from hipr.errors import ProtocolError
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.SESSION


@handler(m.Hello)
async def hello_again(session: Session, request: Request) -> Any:
    """The first frame of a connection: ``{client, token?, eol?}`` (request id 0) ->
    ``{protocol, worker_version, backend, session_id, tenant, max_frame_bytes,
    chunk_bytes, heartbeat_interval, resume_token}``. A client of another major protocol
    version gets a ``version`` error; a bad token an ``auth`` error. ``eol`` (the Python
    client sends ``"\\r\\n\\r\\n"``) is ignored: it makes a line-based server reached
    by mistake (an HTTP metrics port) answer at once, so the client can say it is not a
    worker. Answered by the connection; this handler refuses a second HELLO on the same
    connection."""
    raise ProtocolError(message="HELLO was already exchanged on this connection")


@handler(m.Resume)
async def resume_again(session: Session, request: Request) -> Any:
    """The first frame of a new connection after a dropped link: ``{session_id,
    resume_token}`` -> ``{protocol, session_id, last_executed_id, chunk_bytes, ...}``.
    The client then re-sends what it sent after ``last_executed_id``; the worker skips
    fire-and-forget requests it already ran and replays cached replies. A session that is
    gone gives a ``session_lost`` error. Refused anywhere but as the first frame."""
    raise ProtocolError(message="RESUME is valid only as the first frame of a connection")


@handler(m.DataLink)
async def data_link_again(session: Session, request: Request) -> Any:
    """The first frame of a data link: ``{session_id, resume_token}`` -> ``{index}``
    (protocol 1.4). Answered by the connection, which then hands the link to a thread
    of its own; refused anywhere but as the first frame."""
    raise ProtocolError(message="DATA_LINK is valid only as the first frame of a connection")


@handler(m.Ping)
async def ping(session: Session, request: Request) -> Any:
    """A null request: replies at once with an empty map (round-trip probes, heartbeats)."""
    return {}


@handler(m.Goodbye)
async def goodbye(session: Session, request: Request) -> Any:
    """The client is closing: the connection frees the session after this reply."""
    return {}


@handler(m.SyncErrors)
async def sync_errors(session: Session, request: Request) -> Any:
    """Reports a pending fire-and-forget error (the dispatcher does) or replies ``{}``."""
    return {}


@handler(m.Barrier)
async def barrier(session: Session, request: Request) -> Any:
    """Replies ``{}`` once every earlier request has run; reports no pending error."""
    return {}
