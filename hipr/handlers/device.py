"""Device requests (0x01xx)."""

from __future__ import annotations

from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.device_wait import wait_for_device
from hipr.handlers.registry import LATER, answers_now, handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.DEVICE


def _check_device(session: Session, device: int) -> None:
    count = session.backend.device_count()
    if not 0 <= device < count:
        raise HipError(
            HipErrorCode.hipErrorInvalidDevice, f"device {device} does not exist ({count} visible)"
        )


@handler(m.DeviceCount)
async def device_count(session: Session, request: Request) -> Any:
    """-> ``{count}``: visible devices."""
    return {"count": await session.gpu(session.backend.device_count)}


@handler(m.SetDevice)
async def set_device(session: Session, request: Request) -> Any:
    """``{device}``: make ``device`` current for the session's later calls."""
    device = request.args.integer(m.SetDevice.device, high=2**31 - 1)
    _check_device(session, device)
    await session.gpu(session.backend.bind_thread, device)
    session.device = device
    return {}


@handler(m.GetDevice)
async def get_device(session: Session, request: Request) -> Any:
    """-> ``{device}``: the session's current device."""
    return {"device": session.device}


@answers_now(m.GetDevice)
def get_device_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback."""
    return {"device": session.device}


@handler(m.DeviceProperties)
async def device_properties(session: Session, request: Request) -> Any:
    """``{device}`` -> the device's properties map (name, arch, total_memory, ...)."""
    device = request.args.integer(m.DeviceProperties.device, high=2**31 - 1)
    _check_device(session, device)
    props = await session.gpu(session.backend.device_properties, device)
    return props.to_wire()


@answers_now(m.DeviceProperties)
def device_properties_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback where the backend reads properties inline."""
    device = request.args.integer(m.DeviceProperties.device, high=2**31 - 1)
    _check_device(session, device)
    ran, props = session.try_here(session.backend.device_properties, device)
    return props.to_wire() if ran and props is not None else LATER


@handler(m.DeviceSynchronize)
async def device_synchronize(session: Session, request: Request) -> Any:
    """Wait for all work on the current device (answered at once, without a GPU-thread
    round trip, when the backend can tell that the session's work is done)."""
    await wait_for_device(session, request)
    return {}


@answers_now(m.DeviceSynchronize)
def device_synchronize_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback when the session's work is done already."""
    return {} if session.work_done() else LATER


@handler(m.MemGetInfo)
async def mem_get_info(session: Session, request: Request) -> Any:
    """-> ``{free, total}`` bytes of the current device."""
    free, total = await session.gpu(session.backend.mem_get_info)
    return {"free": free, "total": total}


@answers_now(m.MemGetInfo)
def mem_get_info_now(session: Session, request: Request) -> Any:
    """Answered in the worker's I/O callback where the backend asks inline."""
    ran, info = session.try_here(session.backend.mem_get_info)
    if not ran or info is None:
        return LATER
    free, total = info
    return {"free": free, "total": total}
