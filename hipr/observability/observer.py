"""What the worker reports about itself, for metrics and status pages.

The worker calls a :class:`WorkerObserver` at a few fixed points; the Prometheus
exporter is one implementation, :class:`NullObserver` the default. Keeping the calls
here, rather than metrics code in the request path, keeps the hot path one method call.
"""

from __future__ import annotations

from typing import Protocol


class WorkerObserver(Protocol):
    """Receives the worker's events. Calls are made on the event loop; keep them cheap."""

    def request_done(self, tenant: str, opcode: str, outcome: str, seconds: float) -> None:
        """A request finished: ``outcome`` is ``ok`` or the HIP error name."""
        ...

    def bytes_copied(self, tenant: str, direction: str, size: int) -> None:
        """``size`` bytes crossed the link, ``direction`` ``htod`` or ``dtoh``."""
        ...

    def session_opened(self, tenant: str) -> None:
        """A session started."""
        ...

    def session_closed(self, tenant: str) -> None:
        """A session ended and its resources were freed."""
        ...

    def session_resumed(self, tenant: str) -> None:
        """A detached session was resumed on a new connection."""
        ...

    def data_link_opened(self, tenant: str) -> None:
        """A data link was attached to a session of ``tenant``."""
        ...

    def quota_rejected(self, tenant: str, quota: str) -> None:
        """A request was refused by a quota."""
        ...

    def protocol_error(self, kind: str) -> None:
        """A peer broke the protocol (bad magic, oversized frame, bad handshake ...)."""
        ...

    def refused(self, what: str, who: str) -> None:
        """A connection or frame was refused or closed for its cost, before or beside
        any request: ``what`` is ``handshake_timeout``, ``auth`` (a wrong credential),
        ``pending_handshakes`` or ``pending_handshakes_per_peer`` (pre-auth caps),
        ``max_clients`` or ``max_sessions`` (session caps), ``frame_size``,
        ``cbor_items``, ``cbor_depth`` (frame limits) or ``frame_timeout`` (a slow
        link); ``who`` is the tenant where known, else the peer."""
        ...


class NullObserver:
    """Observes nothing."""

    def request_done(self, tenant: str, opcode: str, outcome: str, seconds: float) -> None:
        """Ignored."""

    def bytes_copied(self, tenant: str, direction: str, size: int) -> None:
        """Ignored."""

    def session_opened(self, tenant: str) -> None:
        """Ignored."""

    def session_closed(self, tenant: str) -> None:
        """Ignored."""

    def session_resumed(self, tenant: str) -> None:
        """Ignored."""

    def data_link_opened(self, tenant: str) -> None:
        """Ignored."""

    def quota_rejected(self, tenant: str, quota: str) -> None:
        """Ignored."""

    def protocol_error(self, kind: str) -> None:
        """Ignored."""

    def refused(self, what: str, who: str) -> None:
        """Ignored."""
