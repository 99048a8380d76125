"""Session and system requests (0x00xx). HELLO and RESUME are answered by the connection
before a session exists; their handlers here refuse a second handshake."""

from __future__ import annotations

from typing import Any

from hipr.errors import ProtocolError
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.protocol.opcodes import Opcode, OpcodeRange
from hipr.session import Session

OPCODE_RANGE = OpcodeRange.SESSION


@handler(Opcode.HELLO)
async def hello_again(session: Session, request: Request) -> Any:
    """HELLO is the first frame of a connection; a second one is refused."""
    raise ProtocolError(message="HELLO was already exchanged on this connection")


@handler(Opcode.RESUME)
async def resume_again(session: Session, request: Request) -> Any:
    """RESUME is valid only as the first frame of a new connection."""
    raise ProtocolError(message="RESUME is valid only as the first frame of a connection")


@handler(Opcode.PING)
async def ping(session: Session, request: Request) -> Any:
    """A null request: replies at once with an empty map (round-trip probes, heartbeats)."""
    return {}


@handler(Opcode.GOODBYE)
async def goodbye(session: Session, request: Request) -> Any:
    """The client is closing: the connection frees the session after this reply."""
    return {}


@handler(Opcode.SYNC_ERRORS)
async def sync_errors(session: Session, request: Request) -> Any:
    """Reports a pending fire-and-forget error (the dispatcher does) or replies ``{}``."""
    return {}


@handler(Opcode.BARRIER)
async def barrier(session: Session, request: Request) -> Any:
    """Replies ``{}`` once every earlier request has run; reports no pending error."""
    return {}
