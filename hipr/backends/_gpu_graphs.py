"""The GPU backend's stream captures and graphs, and the pinned buffers they keep."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hipr.backends._gpu_handles import GpuGraph, GpuGraphExec, GpuStream, HostRefs, live
from hipr.backends._gpu_kernels import GpuKernels
from hipr.backends._launch_extra import check_dims
from hipr.backends._pinned import release_refs
from hipr.backends.interface import Dim3, Handle
from hipr.errors import HipError, HipErrorCode

E = HipErrorCode


class GpuGraphs(GpuKernels):
    """The GPU backend's stream captures and graphs, and the pinned buffers they keep."""

    def stream_begin_capture(self, stream: Handle) -> None:
        """Capture ``stream``'s work (relaxed mode, so other sessions carry on)."""
        self._current()
        raw = self._stream(stream)
        self._call(self._calls.stream_begin_capture, raw, self._k.capture_mode)
        if isinstance(stream, GpuStream):
            stream.capture_refs = []
        else:
            self._tls.ptds_capture = []

    def stream_end_capture(self, stream: Handle) -> Handle:
        """Stop capturing; the graph, which keeps the capture's staged host buffers."""
        device = self._current()
        raw = self._stream(stream)
        if isinstance(stream, GpuStream):
            blocks, stream.capture_refs = stream.capture_refs or [], None
        else:
            blocks, self._tls.ptds_capture = getattr(self._tls, "ptds_capture", None) or [], None
        try:
            graph_raw = self._call(self._calls.stream_end_capture, raw)
        except HipError:
            self._staging.give_back(blocks)  # captured copies never ran
            raise
        graph = GpuGraph(graph_raw, device, HostRefs(blocks=blocks, owners=1))
        return self._track(self._ledger.graphs, graph)

    def graph_create(self) -> Handle:
        """An empty graph."""
        device = self._current()
        raw = self._call(self._calls.graph_create, 0)
        return self._track(self._ledger.graphs, GpuGraph(raw, device, HostRefs(owners=1)))

    def graph_destroy(self, graph: Handle) -> None:
        """Destroy a graph; its instantiations live on (and keep its host buffers)."""
        fn, graphs = self._calls.graph_destroy, self._ledger.graphs
        self._destroy(graph, GpuGraph, "graph", fn, graphs, self._release_refs)

    def _add_node(self, fn: str, raw: Any, deps: list[Any], *params: Any) -> Handle:
        return self._call(fn, raw, deps or None, len(deps), *params)

    def _add_copy_node(
        self,
        graph: Handle,
        dependencies: Sequence[Handle],
        size: int,
        fn: str,
        params: Callable[[int], tuple[Any, ...]],
    ) -> Handle:
        """A memset or copy node made by ``fn`` with ``params(device)`` after (graph,
        dependencies, count); for ``size`` 0 an empty node, which keeps the dependency
        chain without handing the runtime a zero-byte operation."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        deps = list(dependencies)
        if size == 0:
            return self._add_node(self._calls.graph_add_empty_node, raw, deps)
        return self._add_node(fn, raw, deps, *params(graph.device))

    def graph_add_memset(
        self, graph: Handle, dependencies: Sequence[Handle], ptr: int, value: int, size: int
    ) -> Handle:
        """A 1-byte-element memset node (an empty node when ``size`` is 0)."""
        return self._add_copy_node(
            graph,
            dependencies,
            size,
            self._calls.graph_add_memset_node,
            lambda device: self._rt.memset_node_args(device, ptr, value & 0xFF, size),
        )

    def graph_add_memcpy(
        self, graph: Handle, dependencies: Sequence[Handle], dst: int, src: int, size: int
    ) -> Handle:
        """A device-to-device copy node (an empty node when ``size`` is 0)."""
        return self._add_copy_node(
            graph,
            dependencies,
            size,
            self._calls.graph_add_memcpy_node,
            lambda device: self._rt.memcpy_node_args(device, dst, src, size),
        )

    def graph_add_kernel(
        self,
        graph: Handle,
        dependencies: Sequence[Handle],
        function: Handle,
        grid: Dim3,
        block: Dim3,
        shared_mem: int,
        args: bytes,
    ) -> Handle:
        """A kernel node; ``args`` through ``extra`` as in :meth:`launch`."""
        raw = live(graph, GpuGraph, "graph")
        check_dims(grid, block)
        self._current()
        deps = list(dependencies)
        extra = self._extra(self._fit_args(function, args))
        p = self._rt.kernel_node_params(function, grid, block, shared_mem, extra.address)
        node = self._add_node(self._calls.graph_add_kernel_node, raw, deps, p)
        del extra  # the driver copied the argument bytes into the node
        return node

    def graph_instantiate(self, graph: Handle) -> Handle:
        """An executable graph; it shares the graph's host buffers."""
        raw = live(graph, GpuGraph, "graph")
        self._current()
        exec_raw = self._call(self._calls.graph_instantiate, raw, 0)
        with self._ledger.lock:
            graph.refs.owners += 1
            gexec = GpuGraphExec(exec_raw, graph.device, graph.refs)
            self._ledger.execs.add(gexec)
        return gexec

    def graph_launch(self, graph_exec: Handle, stream: Handle | None) -> None:
        """Launch an executable graph on ``stream``."""
        raw = live(graph_exec, GpuGraphExec, "graph exec")
        self._current()
        s = self._stream(stream)
        self._call(self._calls.graph_launch, raw, s)
        refs = graph_exec.refs
        if refs.blocks:
            # Its staged buffers may be freed only after this launch has read them.
            fence = self.fence_after(s)
            with self._ledger.lock:
                done = [f for f in refs.fences if self.fence_done(f)]
                refs.fences = [f for f in refs.fences if f not in done] + [fence]
            for f in done:
                self.fence_destroy(f)

    def graph_exec_destroy(self, graph_exec: Handle) -> None:
        """Destroy an executable graph."""
        fn, execs = self._calls.graph_exec_destroy, self._ledger.execs
        self._destroy(graph_exec, GpuGraphExec, "graph exec", fn, execs, self._release_refs)

    def _release_refs(self, owner: GpuGraph | GpuGraphExec) -> None:
        release_refs(self._staging, owner.refs)
