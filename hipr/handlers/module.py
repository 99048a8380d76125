"""Module and kernel requests (0x05xx): run-time compilation, loading, launches."""

from __future__ import annotations

from functools import partial
from typing import Any

from hipr.errors import invalid_value
from hipr.handlers.args import Args
from hipr.handlers.context import Reply, Request, or_restore, post_ordered, run_ordered
from hipr.handlers.registry import LATER, answers_now, handler
from hipr.protocol.opcodes import Opcode, OpcodeRange
from hipr.worker.resources import FunctionEntry, ModuleEntry
from hipr.worker.session import Session

OPCODE_RANGE = OpcodeRange.MODULE

MAX_SOURCE = 4 << 20
MAX_KERNEL_ARGS_BYTES = 4096
MAX_SHARED_MEMORY = 1 << 20
#: Reply chunk of a code object (PROGRAM_COMPILE), as for device-to-host copies.
CODE_CHUNK = 4 << 20


def _add_module(session: Session, handle: Any, *, shared: bool) -> int:
    return session.modules.add(ModuleEntry(handle, shared, []))


async def _get_function(session: Session, module_id: int, name: str) -> int:
    entry = session.modules.get(module_id)
    for function_id in entry.function_ids:
        if session.functions.get(function_id).name == name:
            return function_id
    handle = await session.gpu(session.backend.module_get_function, entry.handle, name)
    function_id = session.functions.add(FunctionEntry(handle, module_id, name))
    entry.function_ids.append(function_id)
    return function_id


@handler(Opcode.MODULE_COMPILE)
async def module_compile(session: Session, request: Request) -> Any:
    """``{source, name?, options?}`` -> ``{module}``: compile HIP C++ on the worker and load
    it. A compile error's message carries the compiler log."""
    source = request.args.text("source", max_length=MAX_SOURCE)
    name = request.args.text("name", default="kernel.hip", max_length=256)
    options = request.args.str_list("options")
    session.gate.check_count("max_modules")
    backend = session.backend
    image = await session.gpu(backend.compile, source, name, options)
    handle = await session.gpu_create(backend.module_load, image)
    return {"module": _add_module(session, handle, shared=False)}


@handler(Opcode.PROGRAM_COMPILE)
async def program_compile(session: Session, request: Request) -> Any:
    """``{source, name?, options?}`` -> ``{size}`` and the code object as bulk bytes (REPLY|MORE
    chunks for a large one): compile HIP C++ on the worker without loading it, as hiprtc does.
    The image loads with MODULE_LOAD. A compile error's message carries the compiler log."""
    source = request.args.text("source", max_length=MAX_SOURCE)
    name = request.args.text("name", default="kernel.hip", max_length=256)
    options = request.args.str_list("options")
    image = memoryview(await session.gpu(session.backend.compile, source, name, options))
    # Whole chunks first, so no frame is larger than a copy's.
    while image.nbytes > CODE_CHUNK:
        await request.send_chunk(image[:CODE_CHUNK])
        image = image[CODE_CHUNK:]
    return Reply({"size": image.nbytes}, image)


@handler(Opcode.COMPILE_AND_GET_FUNCTION)
async def compile_and_get_function(session: Session, request: Request) -> Any:
    """``{source, name?, options?, function}`` -> ``{module, function}`` in one round trip."""
    reply: dict[str, Any] = await module_compile(session, request)
    function_name = request.args.text("function", max_length=1024)
    reply["function"] = await _get_function(session, reply["module"], function_name)
    return reply


@handler(Opcode.MODULE_LOAD)
async def module_load(session: Session, request: Request) -> Any:
    """Bulk: a code object (HSACO, CUBIN or PTX) -> ``{module}``."""
    if not request.bulk.nbytes:
        raise invalid_value("MODULE_LOAD: the code object is empty")
    session.gate.check_count("max_modules")
    handle = await session.gpu_create(session.backend.module_load, bytes(request.bulk))
    return {"module": _add_module(session, handle, shared=False)}


@handler(Opcode.MODULE_UNLOAD)
async def module_unload(session: Session, request: Request) -> Any:
    """``{module}``: unload; its function handles become invalid."""
    module_id = request.args.handle("module")
    assert module_id is not None
    entry = session.modules.pop(module_id)
    functions = [(i, session.functions.pop(i)) for i in entry.function_ids]
    for device, builtin_id in list(session.builtin_module_ids.items()):
        if builtin_id == module_id:
            del session.builtin_module_ids[device]
    if not entry.shared:
        unload = or_restore(
            session.backend.module_unload,
            partial(session.modules.restore, module_id, entry),
            *(partial(session.functions.restore, i, f) for i, f in functions),
        )
        await session.gpu(unload, entry.handle)
    return {}


@handler(Opcode.MODULE_GET_FUNCTION)
async def module_get_function(session: Session, request: Request) -> Any:
    """``{module, name}`` -> ``{function}``."""
    module_id = request.args.handle("module")
    assert module_id is not None
    name = request.args.text("name", max_length=1024)
    return {"function": await _get_function(session, module_id, name)}


@handler(Opcode.MODULE_BUILTIN)
async def module_builtin(session: Session, request: Request) -> Any:
    """``{name}`` -> ``{module, function}``: a built-in kernel (hipr.kernels.builtins)."""
    name = request.args.text("name", max_length=256)
    # One built-in module per device: a kernel loaded on device 0 cannot run on device 1.
    module_id = session.builtin_module_ids.get(session.device)
    if module_id is None:
        handle = await session.gpu(session.backend.builtin_module)
        module_id = _add_module(session, handle, shared=True)
        session.builtin_module_ids[session.device] = module_id
    return {"module": module_id, "function": await _get_function(session, module_id, name)}


def launch_arguments(session: Session, args: Args) -> tuple[Any, Any, Any, int, bytes]:
    """Read and check a launch's function, geometry and packed arguments. Each pointer
    argument must be null or inside one of the session's allocations."""
    function_id = args.handle("function")
    assert function_id is not None
    function = session.functions.get(function_id)
    grid = args.dim3("grid")
    block = args.dim3("block")
    shared_mem = args.integer("shared_mem", high=MAX_SHARED_MEMORY, default=0)
    data = args.blob("args", max_length=MAX_KERNEL_ARGS_BYTES) if args.has("args") else b""
    for offset in args.int_list("ptrs", max_items=256, high=MAX_KERNEL_ARGS_BYTES):
        if offset + 8 > len(data):
            raise invalid_value(
                f"launch: pointer argument at offset {offset} is past the arguments"
            )
        address = int.from_bytes(data[offset : offset + 8], "little")
        if address and session.allocations.containing(address) is None:
            raise invalid_value(
                f"launch: pointer argument at offset {offset} (0x{address:x}) is not inside an "
                "allocation of this session"
            )
    return function.handle, grid, block, shared_mem, data


@handler(Opcode.LAUNCH_KERNEL, fire_and_forget=True)
async def launch_kernel(session: Session, request: Request) -> Any:
    """``{function, grid, block, shared_mem?, stream?, args, ptrs}``: launch a kernel.
    ``args`` is the C-aligned argument buffer; ``ptrs`` the offsets of its pointers."""
    await run_ordered(session, request, session.backend.launch, *_launch_call(session, request))
    return {}


def _launch_call(session: Session, request: Request) -> tuple[Any, ...]:
    """The backend ``launch`` arguments of a launch request, checked."""
    function, grid, block, shared_mem, data = launch_arguments(session, request.args)
    stream = session.stream(request.args.handle("stream", optional=True))
    return function, grid, block, shared_mem, stream, data


@answers_now(Opcode.LAUNCH_KERNEL)
def launch_kernel_now(session: Session, request: Request) -> Any:
    """A lone fire-and-forget launch, issued from the worker's I/O callback (inline when
    the backend allows, else queued on the session's GPU thread)."""
    if not request.no_reply:
        return LATER
    post_ordered(session, request, session.backend.launch, *_launch_call(session, request))
    return {}
