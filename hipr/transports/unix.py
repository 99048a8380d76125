"""``unix:///abs/path``: a Unix domain socket, for clients on the GPU node and for ssh.

File permissions guard the socket (``unix_socket_mode``, 0o660 by default, so the
socket's group decides who may connect) and the kernel tells the worker who connected
(``SO_PEERCRED``, see :func:`hipr.transports.peer_uid`). An ssh tunnel lands here as the
ssh-authenticated user, so the worker sees that user's uid too.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
from anyio.abc import ByteStream, Listener, SocketStream, TaskGroup

from hipr.transports._common import (
    connect_error,
    connect_timeout_error,
    connect_timeout_option,
    merge_options,
)
from hipr.transports.base import TransportConfig, TransportUrl

__all__ = ["UnixSocketListener", "UnixTransport", "socket_path"]

_CONNECT_OPTIONS = frozenset({"connect_timeout"})


def socket_path(url: TransportUrl) -> Path:
    """The absolute socket path of a ``unix://`` URL (``unix:///run/hipr/worker.sock``)."""
    if url.host not in ("", "localhost"):
        # unix://run/x parses "run" as a host: the usual slip of two slashes for three.
        raise ValueError(
            f"{url.raw!r}: a unix:// URL needs an absolute path after the scheme, "
            f"e.g. unix:///{url.host}{url.path}"
        )
    if not url.path.startswith("/"):
        raise ValueError(f"{url.raw!r}: a unix:// URL needs an absolute path")
    return Path(url.path)


def _is_live_socket(path: Path) -> bool:
    """Whether a process accepts connections on the socket at ``path`` right now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        return False
    else:
        return True
    finally:
        probe.close()


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file left by a worker that died; never anything else.

    A live socket means another worker is serving there: taking its path would cut off
    its clients silently, so that is an error. Anything not a socket is the user's file.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(
            errno.EEXIST,
            f"cannot listen on unix://{path}: the path exists and is not a socket; "
            "refusing to remove it",
            str(path),
        )
    if _is_live_socket(path):
        raise OSError(
            errno.EADDRINUSE,
            f"cannot listen on unix://{path}: another process is already listening there "
            "(is another worker running?)",
        )
    path.unlink(missing_ok=True)


class UnixSocketListener(Listener[SocketStream]):
    """A Unix socket listener that removes its socket file when closed.

    It removes the file only while it is still the one this listener bound (same inode),
    so a worker that replaced a stale socket is not cut off by the old one's shutdown.
    """

    def __init__(self, inner: Listener[SocketStream], path: Path) -> None:
        self._inner = inner
        self.path = path
        st = path.lstat()
        self._identity = (st.st_dev, st.st_ino)

    async def serve(
        self, handler: Callable[[SocketStream], Any], task_group: TaskGroup | None = None
    ) -> None:
        """Accept connections forever, each handed to ``handler`` in its own task."""
        await self._inner.serve(handler, task_group)

    async def aclose(self) -> None:
        """Stop listening and remove the socket file."""
        try:
            await self._inner.aclose()
        finally:
            self._unlink()

    def _unlink(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self._identity:
            self.path.unlink(missing_ok=True)

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        """The inner listener's attributes (``SocketAttribute.local_address`` is the path)."""
        return self._inner.extra_attributes


class UnixTransport:
    """``unix:///abs/path``: listen and connect on a Unix domain socket.

    Listening creates the parent directory when missing, replaces a stale socket file
    (never a regular file, nor a socket a live process serves), sets the socket's mode to
    ``config.unix_socket_mode`` and removes the socket file on close. Connect option:
    ``connect_timeout``.
    """

    scheme: ClassVar[str] = "unix"

    async def listen(self, url: TransportUrl, config: TransportConfig) -> Listener[ByteStream]:
        """Bind and listen on the URL's path."""
        path = socket_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        await anyio.to_thread.run_sync(_clear_stale_socket, path)
        try:
            # anyio chmods between bind and listen, so no client can connect while the
            # socket still has the umask's permissions.
            inner = await anyio.create_unix_listener(path, mode=config.unix_socket_mode)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen on unix://{path}: {exc.strerror or exc}"
            ) from exc
        return UnixSocketListener(inner, path)

    async def connect(self, url: TransportUrl, **options: Any) -> ByteStream:
        """Connect to the socket at the URL's path."""
        path = socket_path(url)
        opts = merge_options(url, options, _CONNECT_OPTIONS)
        timeout = connect_timeout_option(opts)
        target = f"unix://{path}"
        try:
            with anyio.fail_after(timeout):
                return await anyio.connect_unix(os.fspath(path))
        except TimeoutError:
            raise connect_timeout_error(target, timeout or 0) from None
        except OSError as exc:
            raise connect_error(target, exc) from exc
