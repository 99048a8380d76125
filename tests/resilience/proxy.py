"""A loopback TCP proxy that cuts, stalls or resets links at chosen byte offsets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from hipr.transports import connect


class FaultyProxy:
    """Forwards client links to ``target``; faults are switched on by the test.

    ``cut_every`` cuts each link once that many bytes (both directions together) have
    crossed it, in the middle of whatever frame is passing; set back to None, it stops
    cutting live links too. ``stalled`` stops forwarding without closing, as a dead
    route does.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.url = ""
        self.cut_every: int | None = None
        self.stalled = False
        #: Bytes per second each direction may carry (a slow route); None: as fast as it can.
        self.throttle: int | None = None
        self.cuts = 0
        self.links = 0
        self._live: set[anyio.abc.ByteStream] = set()

    async def cut_all(self) -> None:
        """Drop every live link now."""
        for stream in list(self._live):
            await anyio.aclose_forcefully(stream)

    async def _handle(self, client: anyio.abc.ByteStream) -> None:
        self.links += 1
        try:
            upstream = await connect(self.target)
        except Exception:
            await anyio.aclose_forcefully(client)
            return
        budget = [self.cut_every]
        self._live.update((client, upstream))

        async def pump(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
            try:
                while True:
                    data = await src.receive()
                    while self.stalled:
                        await anyio.sleep(0.01)
                    if self.throttle:
                        await anyio.sleep(len(data) / self.throttle)
                    if self.cut_every is None and budget[0] != 0:
                        budget[0] = None
                    if budget[0] is not None:
                        if budget[0] == 0:  # the other direction is cutting this link
                            raise anyio.BrokenResourceError
                        if len(data) >= budget[0]:
                            head, budget[0] = data[: budget[0]], 0
                            self.cuts += 1  # once per link, before the send can yield
                            await dst.send(head)
                            raise anyio.BrokenResourceError
                        budget[0] -= len(data)
                    await dst.send(data)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                await anyio.aclose_forcefully(client)
                await anyio.aclose_forcefully(upstream)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, client, upstream)
                tg.start_soon(pump, upstream, client)
        finally:
            self._live.difference_update((client, upstream))


@asynccontextmanager
async def faulty_proxy(target: str) -> AsyncIterator[FaultyProxy]:
    """A proxy to ``target`` on an ephemeral loopback port for the block's duration."""
    proxy = FaultyProxy(target)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy.url = f"tcp://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, proxy._handle)
            try:
                yield proxy
            finally:
                tg.cancel_scope.cancel()
    finally:
        await listener.aclose()
