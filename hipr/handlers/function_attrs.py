"""A kernel's attributes (0x0509) and occupancy (0x050A), in the module range: what the CUDA proxy's
cuFuncGetAttribute / cuFuncSetAttribute (and the CUDA runtime's cudaFuncGetAttributes /
cudaFuncSetAttribute, which cuBLAS uses for kernels that need more than 48 KiB of
dynamic shared memory) ask of the worker."""

from __future__ import annotations

from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.protocol.opcodes import Opcode, OpcodeRange
from hipr.worker.session import Session

OPCODE_RANGE = OpcodeRange.MODULE

#: CUfunction_attribute values are small; anything past this is a client's mistake.
MAX_ATTRIBUTE = 64


@handler(Opcode.FUNCTION_ATTRIBUTE)
async def function_attribute(session: Session, request: Request) -> Any:
    """``{function, attribute, value?}`` -> ``{value}``: the kernel's attribute
    (CUfunction_attribute numbering); with ``value``, set it first (only the attributes the
    runtime lets a program set, e.g. MAX_DYNAMIC_SHARED_SIZE_BYTES). hipErrorNotSupported
    on a backend that cannot tell."""
    function_id = request.args.handle("function")
    assert function_id is not None
    attribute = request.args.integer("attribute", high=MAX_ATTRIBUTE)
    value = (
        request.args.integer("value", low=-(2**31), high=2**31 - 1)
        if request.args.has("value")
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


#: FUNCTION_OCCUPANCY's queries, as cuOccupancy* names them.
OCCUPANCY_QUERIES = (
    "max_active_blocks",
    "available_dynamic_smem",
    "max_potential_block_size",
    "max_active_clusters",
)


@handler(Opcode.FUNCTION_OCCUPANCY)
async def function_occupancy(session: Session, request: Request) -> Any:
    """``{function, query, block_size?, dynamic_smem?, num_blocks?, block_limit?, flags?,
    grid?, block?, cluster?}`` -> ``{value}`` (``{min_grid, block_size}`` for
    max_potential_block_size): the driver's occupancy figures
    (cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    cuOccupancyAvailableDynamicSMemPerBlock, cuOccupancyMaxPotentialBlockSizeWithFlags with
    a fixed dynamic shared memory size, cuOccupancyMaxActiveClusters for a launch of
    ``grid``/``block``/``dynamic_smem`` with cluster dimensions ``cluster``).
    hipErrorNotSupported on a backend that cannot tell."""
    function_id = request.args.handle("function")
    assert function_id is not None
    query = request.args.text("query", max_length=64)
    if query not in OCCUPANCY_QUERIES:
        raise HipError(
            HipErrorCode.hipErrorInvalidValue,
            f"FUNCTION_OCCUPANCY: query must be one of {', '.join(OCCUPANCY_QUERIES)}",
        )
    numbers = {
        key: request.args.integer(key, high=2**31 - 1, default=0)
        for key in ("block_size", "dynamic_smem", "num_blocks", "block_limit", "flags")
    }
    dims: dict[str, Any] = {
        key: request.args.dim3(key) for key in ("grid", "block", "cluster") if request.args.has(key)
    }
    entry = session.functions.get(function_id)
    call = getattr(session.backend, "function_occupancy", None)
    if call is None:
        raise HipError(
            HipErrorCode.hipErrorNotSupported,
            "this worker's backend cannot report a kernel's occupancy",
        )
    return await session.gpu(call, entry.handle, query, {**numbers, **dims})
