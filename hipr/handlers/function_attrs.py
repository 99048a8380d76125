"""A kernel's attributes (0x0509, in the module range): what the CUDA proxy's
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
