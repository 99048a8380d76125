"""Process isolation's parent side: a connection handed, byte for byte, to the process
of its tenant (``hipr.worker.isolation``), which serves it from then on."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from hipr.errors import SessionLostError
from hipr.handlers.args import Args
from hipr.protocol import messages as m
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame
from hipr.protocol.header import Flags
from hipr.transports import connect as transport_connect
from hipr.worker.isolation import TenantProcesses
from hipr.worker.link_writer import LINK_ERRORS
from hipr.worker.tenants import TenantRegistry

__all__ = ["RECEIVE_SIZE", "relay", "resume_target"]

#: Bytes read at a time from either side of a relay.
RECEIVE_SIZE = 1 << 18


async def resume_target(
    isolation: TenantProcesses, tenants: TenantRegistry, frame: Frame, args: Args
) -> tuple[str, bytes, str]:
    """Where a RESUME (or a DATA_LINK, which names a session the same way) goes: the
    address of the tenant process that holds the session, the frame to send it, and the
    tenant's name; SessionLostError if none does."""
    session_id = args.text(m.Resume.session_id, max_length=64)
    tenant_name = isolation.session_tenants.get(session_id)
    tenant = tenants.get(tenant_name) if tenant_name else None
    if tenant is None:
        raise SessionLostError(
            message=f"session {session_id} no longer exists on this worker: the worker "
            "or its tenant process restarted"
        )
    child = await isolation.child_holding(session_id, tenant)
    first = encode_frame(
        frame.opcode, frame.request_id, Flags.NONE, frame.args, version=frame.header.version
    )
    return child.url, first, tenant.name


async def relay(
    isolation: TenantProcesses,
    stream: anyio.abc.ByteStream,
    decoder: FrameDecoder,
    url: str,
    first: bytes,
    tenant: str,
    max_frame_bytes: int,
    log: Any,
) -> None:
    """Pass the connection on ``stream`` to the tenant's process at ``url``, byte for
    byte, until either ends: ``first`` (the handshake, rewritten for the child), then
    what ``decoder`` holds unread, then the stream. The first reply is read on the way,
    to learn which process holds the session."""
    upstream = await transport_connect(url)
    try:
        await upstream.send(first + decoder.take_buffered())
        replies = FrameDecoder(max_frame_bytes)
        reply: Frame | None = None
        while reply is None:
            data = await upstream.receive(RECEIVE_SIZE)
            await stream.send(data)
            replies.feed(data)
            reply = replies.next_frame()
        if Flags.ERROR not in reply.flags and isinstance(reply.args, dict):
            session_id = str(reply.args.get("session_id", ""))
            isolation.note_session(session_id, tenant, url)
            log.info("relaying to the tenant's process", session=session_id)
        async with anyio.create_task_group() as tg:
            tg.start_soon(_copy, stream, upstream, tg.cancel_scope)
            tg.start_soon(_copy, upstream, stream, tg.cancel_scope)
    except LINK_ERRORS:
        pass
    except anyio.EndOfStream:
        pass
    finally:
        await anyio.aclose_forcefully(upstream)


async def _copy(
    source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream, scope: anyio.CancelScope
) -> None:
    """Copy ``source`` to ``sink`` until either side ends; then end the relay."""
    try:
        while True:
            await sink.send(await source.receive(RECEIVE_SIZE))
    except (anyio.EndOfStream, *LINK_ERRORS):
        pass
    finally:
        scope.cancel()
