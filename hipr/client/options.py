"""How one client connection behaves: heartbeats, reconnection, batching, waiting
(:class:`LinkOptions`), and the bounds of its batches of launches and copies."""

from __future__ import annotations

from dataclasses import dataclass

from hipr.cpus import auto_spin_wait


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """Heartbeats, reconnection and batching of one client connection."""

    #: Send a heartbeat when nothing was received for this long (seconds).
    heartbeat_interval: float = 5.0
    #: A link silent for this long is dead.
    heartbeat_timeout: float = 15.0
    #: Reconnection gives up after this many attempts ...
    reconnect_attempts: int = 10
    #: ... or this many seconds, whichever comes first.
    reconnect_timeout: float = 60.0
    #: First backoff delay; doubled after each failed attempt, with jitter.
    reconnect_delay: float = 0.05
    reconnect_max_delay: float = 5.0
    #: Bytes of unacknowledged requests kept for resending before the client waits.
    resend_buffer_bytes: int = 64 << 20
    #: Fire-and-forget bytes batched into one write.
    coalesce_bytes: int = 64 << 10
    #: Longest a fire-and-forget frame waits for its batch (seconds).
    coalesce_delay: float = 0.002
    #: Time for one connection attempt and its handshake.
    connect_timeout: float = 30.0
    #: How long the synchronous client polls its socket without sleeping while it waits
    #: for a reply, before it blocks (seconds; ``None``: :func:`auto_spin_wait`). A
    #: reply that arrives within it is seen without the kernel waking a sleeping thread,
    #: which costs tens of µs on a virtual machine: CUDA's ``cudaDeviceScheduleSpin``
    #: for a remote call. ``0`` always blocks at once; a value as long as a kernel
    #: (``0.01``) spins through it, one core busy meanwhile. The async client never spins.
    spin_wait: float | None = None
    #: While spinning is on (``spin_wait``): a device's, stream's or event's synchronize
    #: that outlasts the spin sleeps through most of its expected wait (learned from the
    #: last ones) and polls again from shortly before its end until shortly after (at
    #: most 250 µs each side), so that the reply finds the caller running
    #: (:mod:`hipr.client.wait_forecast`). ``False``: block after the spin, as before.
    forecast_waits: bool = True
    #: Fire-and-forget launches of one kernel configuration (function, geometry, shared
    #: memory, stream, pointer offsets), and fire-and-forget host-to-device copies of
    #: at most :data:`BATCH_COPY_BYTES` on one stream, that follow each other go to the
    #: worker as one frame, LAUNCH_KERNELS or MEMCPY_HTOD_MANY (protocol 1.1; a worker
    #: before it gets one frame each). The frame leaves when anything else is sent,
    #: after ``coalesce_delay``, or at once when it holds :data:`BATCH_ITEMS` items or
    #: :data:`BATCH_BYTES`, so nothing waits longer than in a batched write, and a long
    #: run is pipelined: the worker issues one frame while the client fills the next.
    batch_posts: bool = True

    def spin_seconds(self) -> float:
        """The spin window in force: ``spin_wait``, or the automatic choice."""
        return auto_spin_wait() if self.spin_wait is None else max(0.0, self.spin_wait)


#: Launches or copies one batch frame carries at most (the worker takes up to 4,096). A
#: full batch is sent at once: small enough that the worker starts early and issues a
#: frame while the client posts the next, where frames of 1,024 sent whole at the
#: synchronize made the worker wait for the client (benchmarks/README.md has the A/B).
BATCH_ITEMS = 64
#: Bytes one batch frame carries at most: launch argument buffers, or copied bytes.
BATCH_BYTES = 64 << 10
#: Fire-and-forget host-to-device copies of at most this many bytes are batched.
BATCH_COPY_BYTES = 4096
#: The protocol minor from which a worker takes LAUNCH_KERNELS and MEMCPY_HTOD_MANY.
_BATCHES_SINCE_MINOR = 1
