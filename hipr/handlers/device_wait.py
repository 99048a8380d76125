"""DEVICE_SYNCHRONIZE's wait, shared by the requests that end with it: DEVICE_SYNCHRONIZE
itself and a launch that asks to be waited for (LAUNCH_KERNEL / LAUNCH_KERNELS with
``synchronize``, protocol 1.3)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from hipr.handlers.context import Request
from hipr.protocol import messages as m
from hipr.protocol.opcodes import Opcode
from hipr.sessions.state import Session

__all__ = ["LAUNCHES", "WAITING", "asks_to_wait", "finish_waiting", "wait_for_device"]


class _Waiting:
    """The type of :data:`WAITING`."""

    def __repr__(self) -> str:
        return "WAITING"


#: Returned by a ``now`` variant that did its request's work up to a device wait that
#: did not end at once (a launch with ``synchronize`` whose kernel still runs): the
#: executor then finishes that request with :func:`wait_for_device` alone, never
#: running its work again.
WAITING: Any = _Waiting()

#: The launches that may carry ``synchronize``.
LAUNCHES = frozenset({Opcode.LAUNCH_KERNEL, Opcode.LAUNCH_KERNELS})
_SYNCHRONIZE = m.LaunchKernel.synchronize


async def wait_for_device(session: Session, request: Request) -> None:
    """Wait for all of the session's work on the current device: answered at once when
    the backend can tell that the work is done (asked inline, then polled from the loop
    for the worker's ``spin_wait``), else waited for on the session's GPU thread, which
    sends the request's empty reply itself the moment the wait returns (unless an
    earlier fire-and-forget error must be reported instead)."""
    started = time.perf_counter()
    if not session.work_done() and not await session.spin_until_done():
        await session.gpu(session.backend.synchronize, then=request.answer_on_gpu_thread())
    # How long device waits take: the loop's busy poll spins through the next one's
    # forecast length instead of sleeping through its end (sessions/sync_forecast.py).
    session.sync_forecast.record(time.perf_counter() - started)


async def finish_waiting(session: Session, request: Request) -> Any:
    """The rest of a request whose ``now`` variant returned :data:`WAITING`: its wait,
    then its reply ``{}``."""
    await wait_for_device(session, request)
    return {}


def asks_to_wait(opcode: int, no_reply: bool, args: Any) -> bool:
    """True for a launch sent for a reply whose arguments carry ``synchronize: true``:
    it waits for the session's earlier work itself, as DEVICE_SYNCHRONIZE does, so the
    connection reports the earlier fire-and-forget error after it ran, not instead of
    running it. Read from the raw arguments (the handler checks their types)."""
    return (
        opcode in LAUNCHES
        and not no_reply
        and (type(args) is dict or isinstance(args, Mapping))
        and args.get(_SYNCHRONIZE) is True
    )
