"""The client: async (:func:`aconnect`) and sync (:func:`connect`) APIs with one set of names.

One URL gives a single-worker client (:class:`AsyncGpu`, :class:`Gpu`); several (a list,
or one string with commas, also in ``$HIPR_URL``) give one client over all their devices
(:class:`AsyncMultiGpu`, :class:`MultiGpu`, see :mod:`hipr.client.multi`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from hipr.client.api import DEFAULT_URL, AsyncGpu
from hipr.client.api import aconnect as _aconnect_one
from hipr.client.multi import (
    AsyncMultiGpu,
    MultiGpu,
    WorkerPtr,
    aconnect_multi,
    connect_multi,
    env_urls,
    split_urls,
)
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
from hipr.client.placement import DeviceLoad, apick_device, pick_device
from hipr.client.sync import Gpu
from hipr.client.sync import connect as _connect_one

__all__ = [
    "AsyncGpu",
    "AsyncMultiGpu",
    "DeviceLoad",
    "DevicePtr",
    "Event",
    "Function",
    "Gpu",
    "Graph",
    "GraphExec",
    "GraphNode",
    "Module",
    "MultiGpu",
    "Stream",
    "WorkerPtr",
    "aconnect",
    "apick_device",
    "connect",
    "pick_device",
]


def _urls(url: str | Sequence[str] | None) -> list[str]:
    """The worker URLs, each checked for shape and scheme before any is connected to, so
    that a typo in the third of three is named at once (``InvalidUrlError``)."""
    from hipr.transports import get_transport, parse_url

    if url is None:
        url = env_urls() or DEFAULT_URL
    urls = split_urls(url)
    for one in urls:
        get_transport(parse_url(one).scheme)
    return urls


def aconnect(
    url: str | Sequence[str] | None = None, **options: Any
) -> AbstractAsyncContextManager[AsyncGpu | AsyncMultiGpu]:
    """Connect to a worker, or to several: ``async with hipr.aconnect(url) as gpu: ...``.

    ``url`` defaults to ``$HIPR_URL``, then ``tcp://127.0.0.1:18515``. A list of URLs, or
    one string with commas, opens a session on each worker and gives an
    :class:`AsyncMultiGpu` whose devices are all of theirs, in order. Options are those
    of the single-worker client (``token=``, ``timeout=``, ``on_event=``, ``link=``,
    transport options), given to every worker.
    """
    urls = _urls(url)
    if len(urls) == 1:
        return _aconnect_one(urls[0], **options)
    return aconnect_multi(urls, **options)


def connect(url: str | Sequence[str] | None = None, **options: Any) -> Gpu | MultiGpu:
    """Connect from synchronous code: ``with hipr.connect(url) as gpu: ...``.

    Takes what :func:`aconnect` takes; several URLs give a :class:`MultiGpu`.
    """
    urls = _urls(url)
    if len(urls) == 1:
        return _connect_one(urls[0], **options)
    return connect_multi(urls, **options)
