"""Graph (0x06xx) and admin (0x07xx) messages."""

from __future__ import annotations

from hipr.protocol.messages._module_messages import MAX_KERNEL_ARGS_BYTES, LaunchConfig
from hipr.protocol.messages._schema import FieldGroup, Message, Out, field, fields_of, message
from hipr.protocol.opcodes import Opcode

_NODE = (Out("node", "handle", "the new node, usable as a dependency of later nodes"),)


@fields_of
class NodeOf(FieldGroup):
    """Where a new graph node goes."""

    graph = field("handle", "the graph")
    dependencies = field(
        "[uint]",
        "nodes of the same graph that must run first",
        required=False,
        default="none",
        range="at most 1024 node handles",
    )


@message(Opcode.GRAPH_CREATE, reply=(Out("graph", "handle", "the new, empty graph"),))
class GraphCreate(Message):
    """An empty graph (counted against `max_graphs`)."""


@message(Opcode.GRAPH_DESTROY, fire_and_forget=True)
class GraphDestroy(Message):
    """Destroy a graph; its instantiations live on."""

    graph = field("handle", "the graph")


@message(Opcode.GRAPH_ADD_MEMSET, reply=_NODE)
class GraphAddMemset(NodeOf, Message):
    """A memset node."""

    ptr = field("address", "start; [ptr, ptr+size) in one allocation of the session")
    value = field("uint", "the byte", range="[0, 255]")
    size = field("size", "bytes to set", unit="bytes")


@message(Opcode.GRAPH_ADD_MEMCPY, reply=_NODE)
class GraphAddMemcpy(NodeOf, Message):
    """A device-to-device copy node."""

    dst = field("address", "destination; [dst, dst+size) in one allocation")
    src = field("address", "source; [src, src+size) in one allocation")
    size = field("size", "bytes to copy", unit="bytes")


@message(Opcode.GRAPH_ADD_KERNEL, reply=_NODE)
class GraphAddKernel(NodeOf, LaunchConfig, Message):
    """A kernel node: LAUNCH_KERNEL's fields, less the stream."""

    args = field(
        "bytes",
        "the packed argument buffer (as LAUNCH_KERNEL's)",
        required=False,
        default="empty",
        range=f"at most {MAX_KERNEL_ARGS_BYTES} bytes",
    )


@message(Opcode.GRAPH_INSTANTIATE, reply=(Out("exec", "handle", "the executable graph"),))
class GraphInstantiate(Message):
    """An executable snapshot of the graph."""

    graph = field("handle", "the graph")


@message(Opcode.GRAPH_LAUNCH, fire_and_forget=True)
class GraphLaunch(Message):
    """Launch an executable graph."""

    exec = field("handle", "the executable graph")
    stream = field(
        "handle",
        "the stream; absent, null or 0: the null stream",
        required=False,
        default="the null stream",
    )


@message(Opcode.GRAPH_EXEC_DESTROY, fire_and_forget=True)
class GraphExecDestroy(Message):
    """Destroy an executable graph."""

    exec = field("handle", "the executable graph")


@message(
    Opcode.ADMIN_STATUS,
    reply_open=True,
    reply=(
        Out("worker_version", "text", "the worker's software version"),
        Out("protocol", "uint", "the protocol version it speaks"),
        Out("backend", "text", "its GPU backend"),
        Out("started_at", "float", "when it started (Unix time)", unit="seconds"),
        Out("uptime_s", "float", "how long it has run", unit="seconds"),
        Out("listen", "[text]", "the URLs it listens on"),
        Out("max_clients", "uint", "its `max_clients`, null when unlimited", required=False),
        Out(
            "sessions",
            "[map]",
            "one map per live session: `{id, tenant, peer, device, memory, allocations, "
            "handles: {streams, events, modules, functions, graphs, graph_execs}, current, "
            "data_links}` (`current` marks the caller's own; `data_links` counts the further "
            'connections carrying its striped copies); with `isolation = "process"` the sessions '
            "of the tenant child workers too, each with its `worker_pid`",
        ),
        Out(
            "tenants",
            "[map]",
            "`{name, sessions, memory, max_sessions, max_device_memory}` per tenant, quotas "
            "null when unlimited",
        ),
        Out(
            "children",
            "[map]",
            "`{tenant, pid, rss, sessions, memory, error}` per tenant child worker (`error` "
            "when it did not answer: its last figures are shown)",
        ),
        Out(
            "pinned_payload_buffers",
            "map",
            "`{held, in_use, bytes}` of the page-locked buffers uploads and downloads go "
            "through (`pinned_payload_bytes`), null on a backend without them",
            required=False,
        ),
        Out("spin_wait", "float", "the event loop's spin window in force", unit="seconds"),
        Out("isolation", "text", "the isolation mode: `none` or `process`"),
        Out("shared_tenants", "uint", "tenants whose sessions share one process"),
        Out(
            "isolation_warning",
            "text",
            "why sharing a process is a risk, when several tenants do; else null",
            required=False,
        ),
        Out("context_resets", "map", "tenant -> contexts rebuilt after a kernel fault"),
        Out("runaway", "map", "`{active, stopped, stopped_total}`: work past its session"),
        Out(
            "devices",
            "[map]",
            "`{index, name, pci_bus_id, memory_used, memory_total, utilization, "
            "temperature_c, power_w, source}` per device, null where the runtime does not "
            "tell (`source`: nvml, amdsmi, emulator or runtime)",
        ),
    ),
)
class AdminStatus(Message):
    """The worker's status (`hipr status`). Needs the admin token: an `auth` error
    without it, or when the worker has no `admin_token_sha256`."""

    admin_token = field(
        "text",
        "the admin token (`HIPR_ADMIN_TOKEN`)",
        required=False,
        default="empty",
        range="at most 4096 characters",
    )
