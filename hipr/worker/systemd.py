"""systemd integration without libsystemd: readiness notification, watchdog, socket
activation. Each is a few lines of a documented protocol (sd_notify(3),
sd_listen_fds(3)), and all are no-ops when the worker is not started by systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

#: File descriptors passed by socket activation start here (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``, ``"STATUS=..."``, ``"WATCHDOG=1"``) to the
    service manager; False when there is none or it cannot be reached."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode("utf-8"), address)
    except OSError:
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when not asked."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.01, int(usec) / 2_000_000)
    except ValueError:
        return None


def listen_fds(environ: Mapping[str, str] | None = None) -> list[tuple[int, str]]:
    """Sockets passed by socket activation, as (fd, name); empty when not activated."""
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return []
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    names = env.get("LISTEN_FDNAMES", "").split(":")
    fds = []
    for index in range(count):
        fd = LISTEN_FDS_START + index
        os.set_inheritable(fd, False)
        name = names[index] if index < len(names) and names[index] else f"fd{fd}"
        fds.append((fd, name))
    return fds
