"""A loaded module's global variables (0x050B, in the module range): what the CUDA proxy's
cuModuleGetGlobal / cuLibraryGetGlobal ask of the worker. cuBLAS reads one at handle
creation; the session may then copy to and from it as to an allocation of its own."""

from __future__ import annotations

from typing import Any

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.context import Request
from hipr.handlers.registry import handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.resources import Allocation
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.MODULE


@handler(m.ModuleGetGlobal)
async def module_get_global(session: Session, request: Request) -> Any:
    """``{module, name}`` -> ``{ptr, size}``: the variable's address and size, reachable
    by this session's copies until the module is unloaded. hipErrorNotSupported on a
    backend that cannot tell."""
    module_id = request.args.handle(m.ModuleGetGlobal.module)
    assert module_id is not None
    name = request.args.text(m.ModuleGetGlobal.name, max_length=1024)
    entry = session.modules.get(module_id)
    if entry.shared and session.other_tenants_share_context:
        # The built-in module is loaded once per device for every session of the
        # process: its variables would carry one tenant's writes to another's kernels.
        raise HipError(
            HipErrorCode.hipErrorNotSupported,
            f"{name!r} is a variable of the worker's built-in module, which tenants "
            "sharing this worker's GPU context would share; the worker must keep tenants "
            'apart (isolation = "process") to serve it',
        )
    call = getattr(session.backend, "module_global", None)
    if call is None:
        raise HipError(
            HipErrorCode.hipErrorNotSupported,
            "this worker's backend cannot give a module's global variables",
        )
    ptr, size = await session.gpu(call, entry.handle, name)
    ptr, size = int(ptr), int(size)
    known = session.module_globals.containing(ptr)
    if ptr and size and known is None:
        session.module_globals.add(Allocation(ptr, size, session.device))
        entry.global_bases.append(ptr)
    return {"ptr": ptr, "size": size}
