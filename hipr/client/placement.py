"""Placement: which device should new work go to?

:func:`pick_device` (sync) and :func:`apick_device` (async) look at every device of a
client, one worker or many, and choose by what the workers already tell:

- free memory of each device (``mem_get_info``, which every session may call);
- the tenant's quota left on each worker (``max_device_memory`` less what the tenant's
  sessions hold) and the sessions on each device, from ``ADMIN_STATUS`` when an admin
  token is given (``admin_token=`` or ``$HIPR_ADMIN_TOKEN``); without one, these are
  unknown and only free memory counts.

A device qualifies when its usable memory, ``min(free, quota left)``, is at least
``min_free``; among those the one with the fewest other sessions wins, then the one
with the most usable memory, then the lowest ordinal. Lost workers are skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hipr.client.multi import AsyncMultiGpu
from hipr.client.sync import run_sync
from hipr.errors import AuthError, HipError, HipErrorCode, SessionLostError

__all__ = ["DeviceLoad", "apick_device", "arank_devices", "pick_device", "rank_devices"]


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """What placement knows of one device."""

    #: The device's ordinal in the client's list.
    device: int
    #: The URL of the worker it is on (empty for a single-worker client).
    worker: str
    free: int
    total: int
    #: Other sessions whose current device this is (None without an admin token).
    sessions: int | None
    #: Bytes the tenant may still allocate on this worker (None: unlimited or unknown).
    quota_left: int | None

    @property
    def usable(self) -> int:
        """Bytes new work can count on: free memory, capped by the quota left."""
        return self.free if self.quota_left is None else min(self.free, self.quota_left)


@dataclass(frozen=True, slots=True)
class _Worker:
    url: str
    gpu: Any
    first: int
    count: int


def _workers(gpu: Any, count: int | None) -> list[_Worker]:
    if isinstance(gpu, AsyncMultiGpu):
        return [
            _Worker(s.url, s.session, s.first_device, s.device_count)
            for s in gpu.workers
            if not s.lost
        ]
    assert count is not None
    return [_Worker("", gpu, 0, count)]


def _admin_facts(
    status: dict[str, Any] | None, tenant: str
) -> tuple[dict[int, int] | None, int | None]:
    """Other sessions per local device, and the tenant's quota left, from a status reply."""
    if status is None:
        return None, None
    per_device: dict[int, int] = {}
    for session in status.get("sessions") or []:
        if session.get("current"):
            continue  # the placement call's own session is not load
        device = session.get("device")
        if isinstance(device, int):
            per_device[device] = per_device.get(device, 0) + 1
    quota_left = None
    for entry in status.get("tenants") or []:
        limit = entry.get("max_device_memory")
        if entry.get("name") == tenant and isinstance(limit, int):
            quota_left = max(0, limit - int(entry.get("memory") or 0))
    return per_device, quota_left


def _token(admin_token: str | None) -> str:
    return admin_token if admin_token is not None else os.environ.get("HIPR_ADMIN_TOKEN", "")


def _loads_of(
    worker: _Worker,
    memory: list[tuple[int, int]],
    status: dict[str, Any] | None,
    tenant: str,
) -> list[DeviceLoad]:
    per_device, quota_left = _admin_facts(status, tenant)
    return [
        DeviceLoad(
            device=worker.first + local,
            worker=worker.url,
            free=free,
            total=total,
            sessions=None if per_device is None else per_device.get(local, 0),
            quota_left=quota_left,
        )
        for local, (free, total) in enumerate(memory)
    ]


def _rank(loads: list[DeviceLoad]) -> list[DeviceLoad]:
    return sorted(loads, key=lambda d: (d.sessions or 0, -d.usable, d.device))


def _choose(loads: list[DeviceLoad], min_free: int) -> DeviceLoad:
    fitting = [d for d in _rank(loads) if d.usable >= min_free]
    if not fitting:
        seen = ", ".join(f"device {d.device}: {d.usable} B" for d in loads) or "no live device"
        raise HipError(
            HipErrorCode.hipErrorOutOfMemory,
            f"no device has {min_free} bytes free for new work ({seen})",
        )
    return fitting[0]


async def arank_devices(gpu: Any, *, admin_token: str | None = None) -> list[DeviceLoad]:
    """Every live device of ``gpu`` (an :class:`~hipr.AsyncGpu` or a multi-worker one)
    with what placement knows of it, best first. The current device is left as it was."""
    token = _token(admin_token)
    single_count = None if isinstance(gpu, AsyncMultiGpu) else await gpu.device_count()
    loads: list[DeviceLoad] = []
    for worker in _workers(gpu, single_count):
        g = worker.gpu
        try:
            previous = await g.get_device()
            memory = []
            for local in range(worker.count):
                await g.set_device(local)
                memory.append(await g.mem_get_info())
            await g.set_device(previous)
            status = None
            if token:
                try:
                    status = await g.admin_status(token)
                except AuthError:
                    status = None  # placement works without it, on free memory alone
            tenant = str(g.worker_info().get("tenant", ""))
        except SessionLostError:
            continue
        loads += _loads_of(worker, memory, status, tenant)
    return _rank(loads)


async def apick_device(
    gpu: Any, *, min_free: int = 0, admin_token: str | None = None, select: bool = True
) -> int:
    """The ordinal of the best device of ``gpu`` for new work needing ``min_free``
    bytes (see the module's rules); made current when ``select``. Raises HipError
    (hipErrorOutOfMemory) when no device qualifies."""
    best = _choose(await arank_devices(gpu, admin_token=admin_token), min_free)
    if select:
        await gpu.set_device(best.device)
    return best.device


def rank_devices(gpu: Any, *, admin_token: str | None = None) -> list[DeviceLoad]:
    """Every live device of ``gpu`` (a :class:`~hipr.Gpu` or a multi-worker one) with
    what placement knows of it, best first. The current device is left as it was.
    (:func:`arank_devices`, run in the caller's thread.)"""
    result: list[DeviceLoad] = run_sync(arank_devices, gpu, admin_token=admin_token)
    return result


def pick_device(
    gpu: Any, *, min_free: int = 0, admin_token: str | None = None, select: bool = True
) -> int:
    """The ordinal of the best device of ``gpu`` for new work needing ``min_free``
    bytes: ``hipr.pick_device(gpu, min_free=2 << 30)``. Made current when ``select``;
    HipError (hipErrorOutOfMemory) when no device qualifies. Async code uses
    :func:`apick_device` (this is it, run in the caller's thread)."""
    return int(
        run_sync(apick_device, gpu, min_free=min_free, admin_token=admin_token, select=select)
    )
