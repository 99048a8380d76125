"""The GPU backend's streams and events."""

from __future__ import annotations

from functools import partial

from hipr.backends._gpu_core import GpuCore
from hipr.backends._gpu_handles import GpuEvent, GpuStream, live
from hipr.backends.interface import Handle
from hipr.errors import HipErrorCode

E = HipErrorCode


class GpuStreams(GpuCore):
    """The GPU backend's streams and events."""

    def stream_create(self) -> Handle:
        """A non-blocking stream on the current device (see module doc)."""
        device = self._current()
        raw = self._call(self._calls.stream_create, self._k.stream_flags)
        return self._track(self._ledger.streams, GpuStream(raw, device))

    def stream_destroy(self, stream: Handle) -> None:
        """Destroy a stream; its pending work still completes."""
        if isinstance(stream, GpuStream) and stream.carve is not None:
            # Its small copies' block retires behind a fence the stream can still take.
            raw = live(stream, GpuStream, "stream")
            self._current()
            self._staging.retire_carve(stream, partial(self.fence_after, raw))
        fn, streams = self._calls.stream_destroy, self._ledger.streams
        self._destroy(stream, GpuStream, "stream", fn, streams, self._orphan_capture_refs)

    def _orphan_capture_refs(self, stream: GpuStream) -> None:
        # A capture still running on it: its staged buffers have no graph to go to.
        if stream.capture_refs:
            self._orphan_refs.extend(stream.capture_refs)

    def stream_synchronize(self, stream: Handle | None) -> None:
        """Wait for the stream's work."""
        self._current()
        self._call(self._calls.stream_synchronize, self._stream(stream))
        self._staging.reclaim()

    def stream_query(self, stream: Handle | None) -> bool:
        """True when the stream has no pending work."""
        self._current()
        return self._reclaimed_if(self._query(self._calls.stream_query, self._stream(stream)))

    def stream_wait_event(self, stream: Handle | None, event: Handle) -> None:
        """Later work on ``stream`` waits for ``event``."""
        self._current()
        raw_event = live(event, GpuEvent, "event")
        self._call(self._calls.stream_wait_event, self._stream(stream), raw_event, 0)

    def event_create(self) -> Handle:
        """An event with timing enabled."""
        device = self._current()
        raw = self._call(self._calls.event_create, self._k.event_flags)
        return self._track(self._ledger.events, GpuEvent(raw, device))

    def event_destroy(self, event: Handle) -> None:
        """Destroy an event."""
        self._destroy(event, GpuEvent, "event", self._calls.event_destroy, self._ledger.events)

    def event_record(self, event: Handle, stream: Handle | None) -> None:
        """Record ``event`` on ``stream``."""
        self._current()
        self._call(self._calls.event_record, live(event, GpuEvent, "event"), self._stream(stream))

    def event_synchronize(self, event: Handle) -> None:
        """Wait for the event."""
        self._current()
        self._call(self._calls.event_synchronize, live(event, GpuEvent, "event"))
        self._staging.reclaim()

    def event_query(self, event: Handle) -> bool:
        """True once the event completed."""
        self._current()
        return self._reclaimed_if(
            self._query(self._calls.event_query, live(event, GpuEvent, "event"))
        )

    def _reclaimed_if(self, done: bool) -> bool:
        """``done``, after reclaiming the staging pool when it is True: a program that
        polls instead of synchronizing gets the payload buffers its stream copies held
        back too. (Not in ``_query``, which the worker's own polls call in a loop.)"""
        if done:
            self._staging.reclaim()
        return done

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """Milliseconds between two completed events (hipErrorNotReady if not yet)."""
        self._current()
        ms = self._call(
            self._calls.event_elapsed_time,
            live(start, GpuEvent, "event"),
            live(end, GpuEvent, "event"),
        )
        return float(ms)
