"""Graph requests (0x06xx): explicit graphs, instantiation and launch."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from hipr.errors import invalid_value
from hipr.handlers.context import Request, or_restore, run_ordered
from hipr.handlers.module import launch_arguments
from hipr.handlers.registry import handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.graph_memory import GraphKey
from hipr.sessions.resources import GraphEntry, GraphNodeEntry
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.GRAPH


def _graph(session: Session, request: Request) -> tuple[int, GraphEntry]:
    graph_id = request.args.handle(m.NodeOf.graph)
    assert graph_id is not None
    return graph_id, session.graphs.get(graph_id)


def _dependencies(session: Session, request: Request, graph_id: int) -> list[Any]:
    handles = []
    for node_id in request.args.int_list(m.NodeOf.dependencies, max_items=1024):
        node = session.graph_nodes.get(node_id)
        if node.graph_id != graph_id:
            raise invalid_value(f"graph node {node_id} belongs to another graph")
        handles.append(node.handle)
    return handles


def _add_node(session: Session, graph_id: int, entry: GraphEntry, handle: Any) -> dict[str, int]:
    node_id = session.graph_nodes.add(GraphNodeEntry(handle, graph_id))
    entry.node_ids.append(node_id)
    return {"node": node_id}


@handler(m.GraphCreate)
async def graph_create(session: Session, request: Request) -> Any:
    """-> ``{graph}``: an empty graph."""
    session.gate.check_count("max_graphs")
    graph = await session.gpu_create(session.backend.graph_create)
    return {"graph": session.graphs.add(GraphEntry(graph, []))}


def _destroying(
    session: Session, key: GraphKey, destroy: Callable[[Any], None], *restores: Callable[[], None]
) -> Callable[[Any], None]:
    """The GPU-thread call that destroys graph or executable graph ``key`` (``destroy``)
    and then frees the allocations the client freed while it might write them, which
    nothing else may write now. Refused by the runtime, it undoes everything:
    ``restores`` put the handles back, and what the graph writes stays held."""
    uses = session.graph_memory.forget(key)
    freed = session.collect_retired()
    undo = or_restore(
        destroy,
        *restores,
        partial(session.graph_memory.restore, key, uses),
        *(partial(session.allocations.retire, allocation) for allocation in freed),
    )

    def call(handle: Any) -> None:
        undo(handle)
        session.free_retired(freed)

    return call


@handler(m.GraphDestroy)
async def graph_destroy(session: Session, request: Request) -> Any:
    """``{graph}``: destroy a graph; its instantiations live on."""
    graph_id, _ = _graph(session, request)
    entry = session.graphs.pop(graph_id)
    nodes = [(node_id, session.graph_nodes.pop(node_id)) for node_id in entry.node_ids]
    destroy = _destroying(
        session,
        ("graph", graph_id),
        session.backend.graph_destroy,
        partial(session.graphs.restore, graph_id, entry),
        *(partial(session.graph_nodes.restore, i, node) for i, node in nodes),
    )
    await run_ordered(session, request, destroy, entry.handle)
    return {}


@handler(m.GraphAddMemset)
async def graph_add_memset(session: Session, request: Request) -> Any:
    """``{graph, dependencies, ptr, value, size}`` -> ``{node}``."""
    graph_id, entry = _graph(session, request)
    deps = _dependencies(session, request, graph_id)
    ptr = request.args.address(m.GraphAddMemset.ptr)
    value = request.args.integer(m.GraphAddMemset.value, high=255)
    size = request.args.size(m.GraphAddMemset.size)
    target = session.check_range(ptr, size, "memset range")
    session.graph_memory.add(("graph", graph_id), [target.base])
    node = await session.gpu(session.backend.graph_add_memset, entry.handle, deps, ptr, value, size)
    return _add_node(session, graph_id, entry, node)


@handler(m.GraphAddMemcpy)
async def graph_add_memcpy(session: Session, request: Request) -> Any:
    """``{graph, dependencies, dst, src, size}`` -> ``{node}`` (device to device)."""
    graph_id, entry = _graph(session, request)
    deps = _dependencies(session, request, graph_id)
    dst = request.args.address(m.GraphAddMemcpy.dst)
    src = request.args.address(m.GraphAddMemcpy.src)
    size = request.args.size(m.GraphAddMemcpy.size)
    target = session.check_range(dst, size, "destination")
    source = session.check_range(src, size, "source")
    session.graph_memory.add(("graph", graph_id), [target.base, source.base])
    node = await session.gpu(session.backend.graph_add_memcpy, entry.handle, deps, dst, src, size)
    return _add_node(session, graph_id, entry, node)


@handler(m.GraphAddKernel)
async def graph_add_kernel(session: Session, request: Request) -> Any:
    """``{graph, dependencies, function, grid, block, shared_mem?, args, ptrs}`` -> ``{node}``."""
    graph_id, entry = _graph(session, request)
    deps = _dependencies(session, request, graph_id)
    function, grid, block, shared_mem, data = launch_arguments(session, request.args)
    # Its arguments may carry pointers never declared as such: any allocation may be one.
    session.graph_memory.add(("graph", graph_id), session.graph_bases())
    node = await session.gpu(
        session.backend.graph_add_kernel,
        entry.handle,
        deps,
        function,
        grid,
        block,
        shared_mem,
        data,
    )
    return _add_node(session, graph_id, entry, node)


@handler(m.GraphInstantiate)
async def graph_instantiate(session: Session, request: Request) -> Any:
    """``{graph}`` -> ``{exec}``: an executable graph."""
    graph_id, entry = _graph(session, request)
    exe = await session.gpu_create(session.backend.graph_instantiate, entry.handle)
    exec_id = session.graph_execs.add(exe)
    session.graph_memory.instantiate(graph_id, exec_id)
    return {"exec": exec_id}


@handler(m.GraphLaunch)
async def graph_launch(session: Session, request: Request) -> Any:
    """``{exec, stream?}``: launch an executable graph."""
    exec_id = request.args.handle(m.GraphLaunch.exec)
    assert exec_id is not None
    exe = session.graph_execs.get(exec_id)
    stream = session.stream(request.args.handle(m.GraphLaunch.stream, optional=True))
    await run_ordered(session, request, session.backend.graph_launch, exe, stream)
    return {}


@handler(m.GraphExecDestroy)
async def graph_exec_destroy(session: Session, request: Request) -> Any:
    """``{exec}``: destroy an executable graph."""
    exec_id = request.args.handle(m.GraphExecDestroy.exec)
    assert exec_id is not None
    exe = session.graph_execs.pop(exec_id)
    destroy = _destroying(
        session,
        ("exec", exec_id),
        session.backend.graph_exec_destroy,
        partial(session.graph_execs.restore, exec_id, exe),
    )
    await run_ordered(session, request, destroy, exe)
    return {}
