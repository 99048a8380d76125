"""The client: async (:func:`aconnect`) and sync (:func:`connect`) APIs with one set of names."""

from hipr.client.api import AsyncGpu, aconnect
from hipr.client.objects import (
    DevicePtr,
    Event,
    Function,
    Graph,
    GraphExec,
    GraphNode,
    Module,
    Stream,
)
from hipr.client.sync import Gpu, connect

__all__ = [
    "AsyncGpu",
    "DevicePtr",
    "Event",
    "Function",
    "Gpu",
    "Graph",
    "GraphExec",
    "GraphNode",
    "Module",
    "Stream",
    "aconnect",
    "connect",
]
