"""A resent request: one the client sent again after its link dropped, that already ran.

It is answered from the session's reply cache (``hipr.sessions.reply_cache``), never run
twice; a reply too large to have been kept is refused with an explanation, except a read
with nothing run after it, which may simply run again.
"""

from __future__ import annotations

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.protocol.codec import Frame
from hipr.protocol.opcodes import Opcode
from hipr.sessions.state import Session
from hipr.worker.link_writer import LinkWriter

__all__ = ["answer_resent"]


async def answer_resent(
    session: Session, frame: Frame, request: Request, writer: LinkWriter
) -> bool:
    """Answer a request that already ran; False when it must run again instead."""
    if request.more:
        await request.drain()
    if request.no_reply:
        return True
    cached = session.replies.get(frame.request_id)
    if cached is not None:
        await writer.send_bytes(cached)
        return True
    if frame.opcode == Opcode.MEMCPY_DTOH and frame.request_id == session.last_executed_id:
        return False  # a read with nothing run after it: reading again gives the same bytes
    await writer.send_error(
        frame.opcode,
        frame.request_id,
        HipError(
            HipErrorCode.hipErrorUnknown,
            f"the reply to request {frame.request_id} was lost with the link and is too "
            "large to keep; the request ran once: repeat the call to read its result",
        ),
    )
    return True
