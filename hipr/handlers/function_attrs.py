"""A kernel's attributes (0x0509) and occupancy (0x050A), in the module range: what the CUDA
proxy's cuFuncGetAttribute / cuFuncSetAttribute (and the CUDA runtime's
cudaFuncGetAttributes / cudaFuncSetAttribute, which cuBLAS uses for kernels that need more
than 48 KiB of dynamic shared memory) and cuOccupancy* ask of the worker."""

from __future__ import annotations

from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.MODULE

_I32_MAX = 2**31 - 1
#: The occupancy query's plain numbers, absent ones 0.
_NUMBERS = (
    m.FunctionOccupancy.block_size,
    m.FunctionOccupancy.dynamic_smem,
    m.FunctionOccupancy.num_blocks,
    m.FunctionOccupancy.block_limit,
    m.FunctionOccupancy.flags,
)
#: Its launch dimensions, passed only when given.
_DIMS = (m.FunctionOccupancy.grid, m.FunctionOccupancy.block, m.FunctionOccupancy.cluster)


@handler(m.FunctionAttribute)
async def function_attribute(session: Session, request: Request) -> Any:
    """``{function, attribute, value?}`` -> ``{value}``: the kernel's attribute; with
    ``value``, set it first. hipErrorNotSupported on a backend that cannot tell."""
    function_id = request.args.handle(m.FunctionAttribute.function)
    assert function_id is not None
    attribute = request.args.integer(m.FunctionAttribute.attribute, high=m.MAX_FUNCTION_ATTRIBUTE)
    value = (
        request.args.integer(m.FunctionAttribute.value, low=-(2**31), high=_I32_MAX)
        if request.args.has(m.FunctionAttribute.value)
        else None
    )
    entry = session.functions.get(function_id)
    call = getattr(session.backend, "function_attribute", None)
    if call is None:
        raise HipError(
            HipErrorCode.hipErrorNotSupported,
            "this worker's backend cannot read or set a kernel's attributes",
        )
    return {"value": await session.gpu(call, entry.handle, attribute, value)}


@handler(m.FunctionOccupancy)
async def function_occupancy(session: Session, request: Request) -> Any:
    """``{function, query, ...}`` -> ``{value}`` (``{min_grid, block_size}`` for
    max_potential_block_size): the driver's occupancy figures (see the declaration).
    hipErrorNotSupported on a backend that cannot tell."""
    function_id = request.args.handle(m.FunctionOccupancy.function)
    assert function_id is not None
    query = request.args.text(m.FunctionOccupancy.query, max_length=64)
    if query not in m.OCCUPANCY_QUERIES:
        raise HipError(
            HipErrorCode.hipErrorInvalidValue,
            f"FUNCTION_OCCUPANCY: query must be one of {', '.join(m.OCCUPANCY_QUERIES)}",
        )
    numbers: dict[str, Any] = {
        key: request.args.integer(key, high=_I32_MAX, default=0) for key in _NUMBERS
    }
    for key in _DIMS:
        if request.args.has(key):
            numbers[key] = request.args.dim3(key)
    entry = session.functions.get(function_id)
    call = getattr(session.backend, "function_occupancy", None)
    if call is None:
        raise HipError(
            HipErrorCode.hipErrorNotSupported,
            "this worker's backend cannot report a kernel's occupancy",
        )
    return await session.gpu(call, entry.handle, query, numbers)
