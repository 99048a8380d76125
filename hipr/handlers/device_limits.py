"""A device limit (0x0107, in the device range), read only: what the CUDA proxy's
cuCtxGetLimit asks of the worker (cuBLAS reads limits while it sets up a matmul)."""

from __future__ import annotations

from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.DEVICE


@handler(m.DeviceLimit)
async def device_limit(session: Session, request: Request) -> Any:
    """``{limit}`` -> ``{value}``: the current device's limit (CUlimit numbering).
    hipErrorNotSupported on a backend that cannot tell."""
    limit = request.args.integer(m.DeviceLimit.limit, high=m.MAX_DEVICE_LIMIT)
    call = getattr(session.backend, "device_limit", None)
    if call is None:
        raise HipError(
            HipErrorCode.hipErrorNotSupported, "this worker's backend cannot read device limits"
        )
    return {"value": int(await session.gpu(call, limit))}
