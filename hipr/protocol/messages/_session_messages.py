"""Session and system messages (0x00xx): the handshake, heartbeats, resumption, barriers."""

from __future__ import annotations

from hipr.protocol.messages._schema import Message, Out, field, message
from hipr.protocol.opcodes import Opcode

#: What HELLO's and RESUME's replies both carry.
_SESSION_REPLY = (
    Out("protocol", "uint", "the protocol version the worker speaks, major << 8 | minor"),
    Out("worker_version", "text", "the worker's software version"),
    Out("backend", "text", "the GPU backend: `cuda`, `hip` or `emulator`"),
    Out("session_id", "text", "the session's id (RESUME names it)"),
    Out(
        "chunk_bytes",
        "size",
        "the largest bulk chunk the client should put in one frame (request frame or DATA frame)",
        unit="bytes",
    ),
    Out(
        "data_links",
        "uint",
        "how many data links (DATA_LINK) the session may attach for striped copies; 0: "
        "none (protocol 1.4; absent from older workers, meaning none)",
    ),
)


@message(
    Opcode.HELLO,
    reply=(
        *_SESSION_REPLY,
        Out("tenant", "text", "the tenant the credentials named"),
        Out(
            "max_frame_bytes",
            "size",
            "the largest payload the worker accepts in one frame",
            unit="bytes",
        ),
        Out(
            "heartbeat_interval",
            "float",
            "seconds of silence after which the worker PINGs the client",
            unit="seconds",
        ),
        Out("resume_token", "text", "the secret a RESUME of this session must show"),
    ),
    connection="The first frame of a connection (request id 0). The connection answers it "
    "before any session exists; the registered handler refuses a second HELLO on the "
    "same connection with a `protocol` error.",
)
class Hello(Message):
    """Open a session: who the client is and its credentials."""

    client = field(
        "text",
        "the client's name and version, for logs (`hipr-py/1.2.3`)",
        required=False,
        default="`unknown`",
        range="at most 256 characters",
    )
    token = field(
        "text",
        "the tenant's token (`HIPR_TOKEN`); absent on a worker that admits anonymous "
        "clients, or that knows its peers by Unix uid or TLS certificate",
        required=False,
        range="at most 4096 characters",
    )
    eol = field(
        "text",
        'ignored; the Python client sends `"\\r\\n\\r\\n"` so that a line-based server '
        "reached by mistake (an HTTP metrics port) answers at once and the client can say "
        "it is not a worker",
        required=False,
    )


@message(
    Opcode.GOODBYE,
    connection="The worker also sends GOODBYE itself (request id 0, flags 0) with "
    "`{reason}` (text) when it stops: the session is over, its handles are gone.",
)
class Goodbye(Message):
    """The client is closing: the worker frees the session, then replies `{}` and closes
    the link."""


@message(
    Opcode.PING,
    connection="Answered at once by the connection's reader, ahead of queued requests, "
    "so a heartbeat never waits behind a long GPU call; its reply acknowledges nothing "
    "else. With request id 0 it is a heartbeat: flags 0 asks for a reply (PING, REPLY, "
    "id 0, `{}`), NO_REPLY asks for none. The worker sends PING (id 0, flags 0, empty "
    "payload) after `heartbeat_interval` of silence; the client answers PING with REPLY "
    "set and id 0.",
)
class Ping(Message):
    """A null request: replies `{}` at once (round-trip probes, heartbeats)."""


@message(
    Opcode.DATA,
    streams_request=True,
    request_bulk="the next chunk of the request's bulk data",
    connection="Never a request of its own: the continuation of the bulk data of the "
    "request with the same id, whose first frame had MORE set. Its payload is a "
    "zero-length CBOR part (the 4-byte prefix 0) and the chunk; MORE is set on every DATA "
    "frame but the last.",
)
class Data(Message):
    """Continuation of a request's bulk data."""


@message(
    Opcode.RESUME,
    reply=(
        *_SESSION_REPLY,
        Out(
            "last_executed_id",
            "uint",
            "the id of the last request of the session the worker ran (0: none)",
        ),
    ),
    connection="Valid only as the first frame of a new connection, in place of HELLO "
    "(request id 0): re-attaches a session kept after its link dropped (for "
    "`resume_grace` seconds). Anywhere else the handler refuses it with a `protocol` error.",
)
class Resume(Message):
    """Re-attach a session after a dropped link."""

    session_id = field("text", "HELLO's `session_id`", range="at most 64 characters")
    resume_token = field("text", "HELLO's `resume_token`", range="at most 256 characters")


@message(
    Opcode.DATA_LINK,
    reply=(Out("index", "uint", "the link's number among the session's data links, from 0"),),
    connection="Valid only as the first frame of a new connection (request id 0), to a "
    "worker that offered `data_links` (protocol 1.4): the connection becomes a data link of "
    "the session named, carrying only the chunks of its striped copies: from the client "
    "those of uploads (MEMCPY_HTOD's `striped`), from the worker those of downloads "
    "(MEMCPY_DTOH's `striped`). The worker sends nothing else on it after this reply (no "
    "PING); it ends with the session, or when the client closes it. Refused with `auth` "
    "(wrong token), `session_lost` (no such session), `quota` (the session holds "
    "`data_links` already) or `hipErrorNotSupported` (a TLS link, or a worker offering none). "
    "Each chunk of an upload is a DATA frame whose request id is the striped "
    "MEMCPY_HTOD's, flags 0, CBOR part `{offset}` (a multiple of `chunk_bytes`) and bulk "
    "the bytes at that offset: `chunk_bytes` of them, fewer only for the last chunk; a "
    "frame of any other shape from the client ends the data link. A download's chunks "
    "are the same with flags REPLY.",
)
class DataLink(Message):
    """Attach a further connection to a session, for striped copies."""

    session_id = field("text", "HELLO's `session_id`", range="at most 64 characters")
    resume_token = field("text", "HELLO's `resume_token`", range="at most 256 characters")


@message(Opcode.SYNC_ERRORS)
class SyncErrors(Message):
    """Report the session's pending fire-and-forget error as this request's error reply,
    or reply `{}` when there is none."""


@message(Opcode.BARRIER)
class Barrier(Message):
    """Replies `{}` once every earlier request has run; reports no pending error (which
    stays pending). Its reply acknowledges every earlier request."""


#: The map of an error reply (flags REPLY|ERROR, or ERROR alone at request id 0).
ERROR_REPLY = (
    Out("code", "uint", "HIP's `hipError_t` value"),
    Out("kind", "text", "the kind of failure, which picks the client's exception class"),
    Out("message", "text", "what went wrong, for a person"),
    Out(
        "details",
        "map",
        "facts about the failure: `quota` and `limit` of a quota refusal, `refused` of a "
        "frame over a limit, `cause` of a lost context",
        required=False,
    ),
)
