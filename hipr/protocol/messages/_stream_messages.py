"""Stream (0x03xx) and event (0x04xx) messages."""

from __future__ import annotations

from hipr.protocol.messages._schema import Message, Out, field, message
from hipr.protocol.opcodes import Opcode

_NULL_STREAM = "the stream; absent, null or 0: the null stream of the current device"


@message(Opcode.STREAM_CREATE, reply=(Out("stream", "handle", "the new stream"),))
class StreamCreate(Message):
    """A new stream on the current device (counted against `max_streams`)."""


@message(Opcode.STREAM_DESTROY, fire_and_forget=True)
class StreamDestroy(Message):
    """Destroy a stream; its queued work still completes. Refused while it captures."""

    stream = field("handle", "the stream")


@message(Opcode.STREAM_SYNCHRONIZE)
class StreamSynchronize(Message):
    """Wait for the stream's work (replies `{}`). A synchronising call."""

    stream = field("handle", _NULL_STREAM, required=False, default="the null stream")


@message(
    Opcode.STREAM_QUERY,
    reply=(Out("done", "bool", "true when all of the stream's work has completed"),),
)
class StreamQuery(Message):
    """Whether the stream's work has completed."""

    stream = field("handle", _NULL_STREAM, required=False, default="the null stream")


@message(Opcode.STREAM_WAIT_EVENT, fire_and_forget=True)
class StreamWaitEvent(Message):
    """Later work on the stream waits for the event."""

    stream = field("handle", _NULL_STREAM, required=False, default="the null stream")
    event = field("handle", "the event")


@message(Opcode.STREAM_BEGIN_CAPTURE)
class StreamBeginCapture(Message):
    """Work issued on the stream is captured into a graph from now on (replies `{}`;
    counted against `max_graphs`)."""

    stream = field("handle", "a stream the session created (not the null stream)")


@message(Opcode.STREAM_END_CAPTURE, reply=(Out("graph", "handle", "the captured work"),))
class StreamEndCapture(Message):
    """End a capture: the captured work as a graph."""

    stream = field("handle", "the capturing stream")


@message(Opcode.EVENT_CREATE, reply=(Out("event", "handle", "the new event"),))
class EventCreate(Message):
    """A new event, with timing (counted against `max_events`)."""


@message(Opcode.EVENT_DESTROY, fire_and_forget=True)
class EventDestroy(Message):
    """Destroy an event."""

    event = field("handle", "the event")


@message(Opcode.EVENT_RECORD, fire_and_forget=True)
class EventRecord(Message):
    """Record the event on the stream."""

    event = field("handle", "the event")
    stream = field("handle", _NULL_STREAM, required=False, default="the null stream")


@message(Opcode.EVENT_SYNCHRONIZE)
class EventSynchronize(Message):
    """Wait for the event (replies `{}`). A synchronising call."""

    event = field("handle", "the event")


@message(
    Opcode.EVENT_QUERY,
    reply=(Out("done", "bool", "true when the event has completed"),),
)
class EventQuery(Message):
    """Whether the event has completed."""

    event = field("handle", "the event")


@message(
    Opcode.EVENT_ELAPSED_TIME,
    reply=(Out("ms", "float", "time from `start` to `end`", unit="milliseconds"),),
)
class EventElapsedTime(Message):
    """Milliseconds between two completed events."""

    start = field("handle", "the earlier event")
    end = field("handle", "the later event")
