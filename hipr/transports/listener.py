"""Accepting connections on a listening socket, for any stream socket family.

Built on a non-blocking socket and anyio's ``wait_readable`` rather than taken from
anyio: on asyncio, anyio 4.16's own listeners resolve an accept future with a bare
``set_result`` callback, so a task cancelled in ``accept()`` just as a client arrives
makes the event loop report ``InvalidStateError`` (a routine race when a worker shuts
down). A listener out of file descriptors also backs off and retries here instead of
ending ``serve()``. Each accepted socket becomes the cheapest stream for the running
loop (:func:`hipr.transports.unix.socket_stream`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import ByteStream, Listener, TaskGroup

from hipr.transports._common import socket_attributes

__all__ = ["SocketListener"]

_log = logging.getLogger(__name__)

#: accept() errors that mean "out of resources for now", not "the listener is broken"
_TRANSIENT_ACCEPT_ERRORS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO}
)


class SocketListener(Listener[ByteStream]):
    """A listening stream socket; ``wrap`` turns each accepted socket into a stream."""

    def __init__(
        self,
        sock: socket.socket,
        wrap: Callable[[socket.socket], Awaitable[ByteStream]],
        name: str,
    ) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._wrap = wrap
        self._name = name
        self._closed = False

    async def accept(self) -> ByteStream:
        """The next connection; transient shortages (out of fds) are waited out."""
        await anyio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                client, _ = self._sock.accept()
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
            except OSError as exc:
                if self._closed:
                    raise anyio.ClosedResourceError from None
                if exc.errno not in _TRANSIENT_ACCEPT_ERRORS:
                    raise anyio.BrokenResourceError from exc
                _log.warning("accept() on %s failed, retrying: %s", self._name, exc)
                await anyio.sleep(0.1)
            else:
                try:
                    return await self._wrap(client)
                except BaseException:
                    client.close()
                    raise

    async def serve(
        self, handler: Callable[[ByteStream], Any], task_group: TaskGroup | None = None
    ) -> None:
        """Accept connections forever, each handed to ``handler`` in its own task."""
        async with contextlib.AsyncExitStack() as stack:
            if task_group is None:
                task_group = await stack.enter_async_context(anyio.create_task_group())
            while True:
                stream = await self.accept()
                task_group.start_soon(handler, stream)

    async def aclose(self) -> None:
        """Stop listening."""
        if not self._closed:
            self._closed = True
            anyio.notify_closing(self._sock)
            self._sock.close()
            self._on_closed()
        await anyio.lowlevel.checkpoint()

    def _on_closed(self) -> None:
        """Subclasses' clean-up once the socket is closed (a Unix socket's file)."""

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """anyio's ``SocketAttribute`` family (addresses, ports for TCP, raw socket)."""
        return socket_attributes(self._sock, connected=False)
