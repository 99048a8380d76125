"""Shutdown with a deadline: SIGTERM drains for ``shutdown_timeout``, and the process is
gone :data:`EXIT_MARGIN` seconds later whatever still runs.

A GPU thread blocked in a synchronize on a kernel that never ends would otherwise keep
the worker alive forever (its session's close waits for it, and that close is shielded
from cancellation so that nothing leaks on an ordinary stop). The worker's own path
exits as soon as the drain is over (``run_worker``); this timer is the backstop for an
event loop that cannot get there: a thread, so it fires even when the loop is stuck.
Either way the log names what was cut short, tenant processes are killed, and the exit
status is :data:`EXIT_CUT_SHORT`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

log = structlog.get_logger("hipr.shutdown")

#: Exit status of a worker that stopped with work cut short (as timeout(1) exits).
EXIT_CUT_SHORT = 124
#: Seconds past ``shutdown_timeout`` after which the process exits whatever runs; the
#: systemd units' ``TimeoutStopSec`` is above ``shutdown_timeout + EXIT_MARGIN``.
EXIT_MARGIN = 5.0


def exit_now(what: Mapping[str, Any], children: Mapping[str, int], *, because: str) -> None:
    """Log what is cut short, SIGKILL the tenant processes ``children`` (tenant -> pid),
    and end the process with :data:`EXIT_CUT_SHORT` (no cleanup runs: the GPU driver
    frees the contexts of a process that is gone)."""
    for pid in children.values():
        if _our_child(pid):  # not a pid reused since the child was reaped
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    log.error(
        "exiting with work cut short",
        because=because,
        exit_status=EXIT_CUT_SHORT,
        killed_tenant_processes=dict(children),
        **what,
    )
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        sys.stdout.flush()
    os._exit(EXIT_CUT_SHORT)


def _our_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return len(fields) > 1 and fields[1] == str(os.getpid())


class ShutdownDeadline:
    """A daemon thread that ends the process ``seconds`` after :meth:`arm` unless
    :meth:`disarm` ran first. ``describe`` says what is still under way (read from this
    thread: it must only read); ``children`` gives the tenant processes to kill."""

    def __init__(
        self,
        seconds: float,
        describe: Callable[[], Mapping[str, Any]],
        children: Callable[[], Mapping[str, int]],
    ) -> None:
        self.seconds = seconds
        self._describe = describe
        self._children = children
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        """Start counting (once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._wait, name="hipr-shutdown-deadline", daemon=True
            )
            self._thread.start()

    def disarm(self) -> None:
        """The worker stopped in time: nothing to do."""
        self._disarmed.set()

    def _wait(self) -> None:
        if self._disarmed.wait(self.seconds):
            return
        try:
            what = dict(self._describe())
        except Exception as exc:  # a racing read must not keep the process alive
            what = {"unknown": repr(exc)}
        try:
            children = dict(self._children())
        except Exception:
            children = {}
        exit_now(what, children, because=f"shutdown took over {self.seconds:g} s")
