"""HELLO and RESUME without I/O: the frame to write, and the worker's answer read from
the bytes that come back (both client I/O layers write and read; this decides)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hipr.errors import HipConnectionError, HipError, ProtocolError
from hipr.protocol.codec import Frame, FrameDecoder, encode_frame_parts
from hipr.protocol.header import MAGIC, Flags
from hipr.protocol.opcodes import Opcode, opcode_name


@dataclass(slots=True)
class Handshake:
    """What HELLO or RESUME answered, and the bytes that arrived behind the answer."""

    reply: dict[str, Any]
    leftover: list[Frame] = field(default_factory=list)


def check_first_bytes(url: str, data: bytes | bytearray | memoryview) -> None:
    """Refuse a peer whose first bytes are not a frame's magic: it is no hipr worker.

    ``data`` is what arrived first on the connection (any length); the error quotes it,
    so that an HTTP server (the worker's metrics port) or an SSH banner is recognisable."""
    head = bytes(data[: len(MAGIC)])
    if head and not MAGIC.startswith(head):
        said = bytes(data[:40]).split(b"\n", 1)[0].strip().decode("ascii", "replace")
        web = said.startswith(("HTTP/", "<"))
        hint = " (a web server: the worker's metrics port?)" if web else ""
        raise HipConnectionError(
            message=f"{url} is not a hipr worker: it answered {said!r}{hint}; "
            "check the host and port (a worker listens on 18515 by default)"
        )


class HandshakeReader:
    """HELLO or RESUME on a fresh stream, without I/O: ``parts`` to write, then the bytes
    that come back fed to :meth:`feed` until it returns the worker's answer; frames that
    arrived behind it stay in ``decoder`` for the link."""

    def __init__(self, url: str, opcode: Opcode, args: dict[str, Any], max_payload: int) -> None:
        self.url = url
        self.opcode = opcode
        self.parts = encode_frame_parts(opcode, 0, Flags.NONE, args)
        self.decoder = FrameDecoder(max_payload)
        self._first = True

    def feed(self, data: bytes | bytearray | memoryview) -> dict[str, Any] | None:
        """Take bytes read from the stream (empty: it closed); the answer once complete."""
        if not len(data):
            raise HipConnectionError(
                message=f"{self.url} closed the connection during the handshake"
            )
        if self._first:
            check_first_bytes(self.url, data)
            self._first = False
        self.decoder.feed(data)
        while (frame := self.decoder.next_frame()) is not None:
            reply = handshake_reply(frame, self.opcode, self.url)
            if reply is not None:
                return reply
        return None

    def no_answer(self, timeout: float) -> HipConnectionError:
        """The error for a peer that accepted the connection and never answered."""
        return HipConnectionError(
            message=f"{self.url} accepted the connection but did not answer "
            f"{opcode_name(self.opcode)} within {timeout} s: is it a hipr worker?"
        )


def handshake_reply(frame: Frame, opcode: int, url: str) -> dict[str, Any] | None:
    """The worker's answer to HELLO/RESUME in ``frame``; None for a frame to skip (a
    heartbeat that crossed the handshake); raises the worker's refusal."""
    if frame.request_id != 0 or frame.opcode not in (opcode, 0):
        return None
    if Flags.ERROR in frame.flags:
        raise HipError.from_wire(frame.args)
    if frame.error is not None:
        raise frame.error
    if not isinstance(frame.args, dict):
        raise ProtocolError(message=f"unexpected handshake reply from {url}")
    return frame.args
