"""Module and kernel requests (0x05xx): run-time compilation, loading, launches."""

from __future__ import annotations

import hmac
import struct
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio

from hipr.errors import HipError, invalid_value
from hipr.handlers.args import Args
from hipr.handlers.context import (
    Reply,
    Request,
    admit_each,
    or_restore,
    post_ordered,
    run_batch,
    run_ordered,
)
from hipr.handlers.device_wait import WAITING, wait_for_device
from hipr.handlers.program_link import program_headers
from hipr.handlers.registry import LATER, answers_now, handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.module_store import sha256
from hipr.sessions.resources import FunctionEntry, ModuleEntry
from hipr.sessions.state import Session, as_hip_error

OPCODE_RANGE = OpcodeRange.MODULE

MAX_SOURCE = m.MAX_SOURCE
MAX_KERNEL_ARGS_BYTES = m.MAX_KERNEL_ARGS_BYTES
MAX_SHARED_MEMORY = m.MAX_SHARED_MEMORY
MAX_POINTER_ARGS = m.MAX_POINTER_ARGS
CODE_CHUNK = m.CODE_CHUNK
# A launch's keys, read for every launch: module constants, not attribute look-ups.
_FUNCTION = m.LaunchConfig.function
_GRID = m.LaunchConfig.grid
_BLOCK = m.LaunchConfig.block
_SHARED_MEM = m.LaunchConfig.shared_mem
_PTRS = m.LaunchConfig.ptrs
_ARGS = m.LaunchKernel.args
_STREAM = m.LaunchKernel.stream
_BATCH_ARGS = m.LaunchKernels.args
_BATCH_STREAM = m.LaunchKernels.stream
_SYNCHRONIZE = m.LaunchKernel.synchronize


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


def _compile_args(request: Request) -> tuple[str, str, list[str]]:
    """A compile request's source, file name and options, checked."""
    args = request.args
    source = args.text(m.Compile.source, max_length=MAX_SOURCE)
    name = args.text(m.Compile.name, default="kernel.hip", max_length=256)
    return source, name, args.str_list(m.Compile.options)


@handler(m.ModuleCompile)
async def module_compile(session: Session, request: Request) -> Any:
    """``{source, name?, options?}`` -> ``{module}``: compile HIP C++ on the worker and load
    it. A compile error's message carries the compiler log."""
    source, name, options = _compile_args(request)
    session.gate.check_count("max_modules")
    backend = session.backend
    image = await session.gpu(backend.compile, source, name, options)
    handle = await session.gpu_create(backend.module_load, image)
    return {"module": _add_module(session, handle, shared=False)}


@handler(m.ProgramCompile)
async def program_compile(session: Session, request: Request) -> Any:
    """``{source, name?, options?, headers?, include_names?}`` -> ``{size}`` and the code
    object as bulk bytes (REPLY|MORE chunks for a large one): compile HIP C++ on the worker
    without loading it, as hiprtc does; the program's own headers go to the compiler as
    in-memory files. The image loads with MODULE_LOAD. A compile error's message carries
    the compiler log."""
    source, name, options = _compile_args(request)
    compile_: Callable[..., Any] = session.backend.compile
    if headers := program_headers(request):
        # Only when given: a backend written before headers keeps working.
        compile_ = partial(compile_, headers=headers)
    image = memoryview(await session.gpu(compile_, source, name, options))
    # Whole chunks first, so no frame is larger than a copy's.
    while image.nbytes > CODE_CHUNK:
        await request.send_chunk(image[:CODE_CHUNK])
        image = image[CODE_CHUNK:]
    return Reply({"size": image.nbytes}, image)


@handler(m.CompileAndGetFunction)
async def compile_and_get_function(session: Session, request: Request) -> Any:
    """``{source, name?, options?, function}`` -> ``{module, function}`` in one round trip."""
    reply: dict[str, Any] = await module_compile(session, request)
    function_name = request.args.text(m.CompileAndGetFunction.function, max_length=1024)
    reply["function"] = await _get_function(session, reply["module"], function_name)
    return reply


async def _whole_bulk(request: Request, limit: int) -> bytes:
    """The request's bulk bytes, with its continuation DATA frames (a code object larger
    than one frame); hipErrorInvalidValue past ``limit``."""
    if not request.more:
        return bytes(request.bulk)
    parts = [bytes(request.bulk)]
    total = len(parts[0])
    while (chunk := await request.receive_data()) is not None:
        total += chunk.nbytes
        if total > limit:
            await request.drain()
            raise invalid_value(f"{request.name}: the code object is larger than {limit} bytes")
        parts.append(bytes(chunk))
    return b"".join(parts)


@handler(m.ModuleLoad)
async def module_load(session: Session, request: Request) -> Any:
    """Bulk: a code object (HSACO, CUBIN, PTX or fat binary; a large one continues in
    DATA frames), and since protocol 1.2 optionally its ``sha256`` -> ``{module}``. With
    ``sha256`` and no bytes: the code object the tenant's module store holds, or
    ``{held: false}``. A code object for the other vendor's GPUs is refused
    (hipErrorNoBinaryForGpu)."""
    claimed = _claimed_digest(request)
    image = await _whole_bulk(request, m.MAX_MODULE_BYTES)
    store = session.gate.module_store
    to_keep: bytes | None = None
    if not image:
        if claimed is None:
            raise invalid_value("MODULE_LOAD: the code object is empty")
        held = store.lookup(claimed)
        if held is None:
            return {"held": False}
        image = held
    else:
        store.received(len(image))
        if claimed is not None:
            to_keep = await _verified_digest(claimed, image)
    session.gate.check_count("max_modules")
    handle = await session.gpu_create(session.backend.module_load, image)
    if to_keep is not None:
        # Kept only once it loaded: an image the worker refuses (or a load over quota)
        # never takes the tenant's store space, nor answers a later offer of its hash.
        quotas = session.gate.quotas
        store.add(
            to_keep, image, max_bytes=quotas.module_store_bytes,
            max_images=quotas.module_store_count,
        )  # fmt: skip
    return {"module": _add_module(session, handle, shared=False)}


async def _verified_digest(claimed: bytes, image: bytes) -> bytes:
    """The SHA-256 of ``image`` computed here, when it is the hash the client claimed (a
    mismatch is refused: nothing loaded, nothing kept)."""
    digest = await _digest(image)
    if not hmac.compare_digest(digest, claimed):
        raise invalid_value(
            f"MODULE_LOAD: the {len(image)}-byte code object's SHA-256 is {digest.hex()}, "
            f"not the 'sha256' sent ({claimed.hex()}): not loaded"
        )
    return digest


def _claimed_digest(request: Request) -> bytes | None:
    """MODULE_LOAD's ``sha256``: None when absent; exactly 32 bytes, else refused."""
    args = request.args
    if not args.has(m.ModuleLoad.sha256):
        return None
    wanted = f"a byte string of exactly {m.SHA256_BYTES} bytes (a SHA-256 digest)"
    try:
        digest = args.blob(m.ModuleLoad.sha256, max_length=m.SHA256_BYTES)
    except HipError:
        raise args.bad(m.ModuleLoad.sha256, wanted) from None
    if len(digest) != m.SHA256_BYTES:
        raise args.bad(m.ModuleLoad.sha256, wanted)
    return digest


#: Code objects at least this large are hashed on a worker thread, not the event loop
#: (hashlib lets go of the GIL; a 100 MiB fat binary takes ~0.1 s to hash).
_HASH_IN_THREAD = 1 << 20


async def _digest(image: bytes) -> bytes:
    if len(image) < _HASH_IN_THREAD:
        return sha256(image)
    return await anyio.to_thread.run_sync(sha256, image)


@handler(m.ModuleUnload)
async def module_unload(session: Session, request: Request) -> Any:
    """``{module}``: unload; its function handles become invalid."""
    module_id = request.args.handle(m.ModuleUnload.module)
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
    for base in entry.global_bases:  # the session can no longer name them
        session.module_globals.remove(base)
    return {}


@handler(m.ModuleGetFunction)
async def module_get_function(session: Session, request: Request) -> Any:
    """``{module, name}`` -> ``{function}``."""
    module_id = request.args.handle(m.ModuleGetFunction.module)
    assert module_id is not None
    name = request.args.text(m.ModuleGetFunction.name, max_length=m.MAX_KERNEL_NAME)
    return {"function": await _get_function(session, module_id, name)}


@handler(m.ModuleBuiltin)
async def module_builtin(session: Session, request: Request) -> Any:
    """``{name}`` -> ``{module, function}``: a built-in kernel (hipr.kernels.builtins)."""
    name = request.args.text(m.ModuleBuiltin.name, max_length=m.MAX_KERNEL_NAME)
    # One built-in module per device: a kernel loaded on device 0 cannot run on device 1.
    module_id = session.builtin_module_ids.get(session.device)
    if module_id is None:
        handle = await session.gpu(session.backend.builtin_module)
        module_id = _add_module(session, handle, shared=True)
        session.builtin_module_ids[session.device] = module_id
    return {"module": module_id, "function": await _get_function(session, module_id, name)}


@handler(m.FunctionParams)
async def function_params(session: Session, request: Request) -> Any:
    """``{function}`` -> ``{offsets, sizes, pointers}``: where each parameter of the kernel
    sits in its argument buffer and how many bytes it takes, and the indices of those that
    are device pointers (as far as the runtime tells), so that a client given bare argument
    pointers (HIP's ``kernelParams``) packs them. hipErrorNotSupported where the runtime
    cannot tell (HIP backends for now; CUDA before 12.4)."""
    function_id = request.args.handle(m.FunctionParams.function)
    assert function_id is not None
    entry = session.functions.get(function_id)
    params = await session.gpu(session.backend.function_params, entry.handle)
    return {
        "offsets": [offset for offset, _, _ in params],
        "sizes": [size for _, size, _ in params],
        "pointers": [i for i, (_, _, pointer) in enumerate(params) if pointer],
    }


def launch_arguments(session: Session, args: Args) -> tuple[Any, Any, Any, int, bytes]:
    """Read and check a launch's function, geometry and packed arguments. Each pointer
    argument must be null or inside one of the session's allocations."""
    function, grid, block, shared_mem, ptrs = launch_config(session, args)
    data = args.blob(_ARGS, max_length=MAX_KERNEL_ARGS_BYTES) if args.has(_ARGS) else b""
    check_pointers(session, data, ptrs, "launch")
    return function, grid, block, shared_mem, data


def launch_config(session: Session, args: Args) -> tuple[Any, Any, Any, int, list[int]]:
    """A launch's function (its backend handle), grid, block, shared memory and the
    offsets of its pointer arguments, checked."""
    function_id = args.handle(_FUNCTION)
    assert function_id is not None
    function = session.functions.get(function_id)
    grid = args.dim3(_GRID)
    block = args.dim3(_BLOCK)
    shared_mem = args.integer(_SHARED_MEM, high=MAX_SHARED_MEMORY, default=0)
    ptrs = args.int_list(_PTRS, max_items=MAX_POINTER_ARGS, high=MAX_KERNEL_ARGS_BYTES)
    return function.handle, grid, block, shared_mem, ptrs


def check_pointers(
    session: Session, data: bytes, ptrs: list[int], what: str | Callable[[], str]
) -> None:
    """Each pointer argument of ``data`` (at the offsets ``ptrs``) must be null or inside
    one of the session's allocations; ``what`` names the launch in the error (a function
    that names it, for a batch: built only when one is refused)."""
    size = len(data)
    for offset in ptrs:
        if offset + 8 > size:
            raise invalid_value(
                f"{_named(what)}: pointer argument at offset {offset} is past the arguments"
            )
        address = _ADDRESS.unpack_from(data, offset)[0]
        if address and not session.reaches(address):
            raise invalid_value(
                f"{_named(what)}: pointer argument at offset {offset} (0x{address:x}) is not "
                "inside an allocation of this session"
            )


#: A pointer argument: 8 bytes, little-endian, as the clients pack it.
_ADDRESS = struct.Struct("<Q")


def _named(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


@handler(m.LaunchKernel)
async def launch_kernel(session: Session, request: Request) -> Any:
    """``{function, grid, block, shared_mem?, stream?, args, ptrs}``: launch a kernel.
    ``args`` is the C-aligned argument buffer; ``ptrs`` the offsets of its pointers.
    With ``synchronize`` (protocol 1.3), the launch then its DEVICE_SYNCHRONIZE."""
    if _synchronizes(request):
        if _launch_waited_now(session, request) is WAITING:
            await wait_for_device(session, request)
        return {}
    await run_ordered(session, request, session.backend.launch, *_launch_call(session, request))
    return {}


def _synchronizes(request: Request) -> bool:
    """The launch's ``synchronize`` (protocol 1.3), checked: a request that asks for no
    reply cannot be waited for, and is refused."""
    if not request.args.flag(_SYNCHRONIZE):
        return False
    if request.no_reply:
        raise invalid_value(
            f"{request.name}: 'synchronize' asks for a reply; it cannot be sent with NO_REPLY"
        )
    return True


async def _launched_then_waited(
    session: Session, request: Request, launch: Callable[[], None]
) -> None:
    """A launch request with ``synchronize``, as its two requests would have run
    (:func:`_launched`), then the wait of DEVICE_SYNCHRONIZE. The connection reports the
    kept error after the wait (``asks_to_wait``)."""
    _launched(session, request, launch)
    await wait_for_device(session, request)


def _launched_then_done_now(session: Session, request: Request, launch: Callable[[], None]) -> Any:
    """:func:`_launched_then_waited` from the I/O callback: ``{}`` when the work is done
    at once (the synchronize's own look), else WAITING: the executor does the wait."""
    _launched(session, request, launch)
    session.flush_posts()  # a launch queued on the GPU thread starts now
    return {} if session.work_done() else WAITING


def _launched(session: Session, request: Request, launch: Callable[[], None]) -> None:
    """The launches go out as fire-and-forget ones do (``launch``: a refusal or failure
    is kept as this request's deferred error, behind any earlier one); the synchronize
    spends one more request of max_request_rate."""
    try:
        launch()
    except HipError as exc:
        session.defer_error(exc, request.name, request.request_id)
    if not session.gate.try_admit():
        raise session.gate.over_rate(f" (the synchronize of {request.name} was refused)")


def _launch_call(session: Session, request: Request) -> tuple[Any, ...]:
    """The backend ``launch`` arguments of a launch request, checked."""
    function, grid, block, shared_mem, data = launch_arguments(session, request.args)
    stream = session.stream(request.args.handle(_STREAM, optional=True))
    return function, grid, block, shared_mem, stream, data


@answers_now(m.LaunchKernel)
def launch_kernel_now(session: Session, request: Request) -> Any:
    """A lone fire-and-forget launch, issued from the worker's I/O callback (inline when
    the backend allows, else queued on the session's GPU thread); with ``synchronize``,
    the launch then its synchronize's wait, when the work is done at once."""
    if not request.no_reply:
        if request.args.flag(_SYNCHRONIZE):
            return _launch_waited_now(session, request)
        return LATER
    if request.args.has(_SYNCHRONIZE):
        return LATER  # the executor refuses ``synchronize`` with NO_REPLY
    _post_launch(session, request)
    return {}


def _launch_waited_now(session: Session, request: Request) -> Any:
    """:func:`_launched_then_done_now` of a launch on the default stream, its launch and
    wait made as one native call where the backend has it (``Session.launch_waited``),
    which also sends the reply the moment the work is seen done where the link allows
    (``Request.reply_target``): the same checks and the same answers. The synchronize's
    request of max_request_rate is spent before the launch here (the reply may leave
    with it); a refusal goes the usual way, as does a launch whose checks fail, which
    keeps its refusal for the reply after the wait."""
    try:
        call = _launch_call(session, request)
    except HipError:
        call = None
    outcome = None
    if call is not None and call[4] is None and session.gate.try_admit():
        function, grid, block, shared_mem, _, data = call
        target = request.reply_target()
        sent = 0
        try:
            outcome = session.launch_waited(function, grid, block, shared_mem, data, target)
            sent = 0 if outcome is None else outcome[2]
        finally:
            if target is not None:
                request.reply_written(target, sent)
        if outcome is None:
            session.gate.refund()  # spent again by the usual way's own admission
    if outcome is None:
        launch = (
            partial(_post_launch, session, request)
            if call is None
            else partial(post_ordered, session, request, session.backend.launch, *call)
        )
        return _launched_then_done_now(session, request, launch)
    done, refused, _ = outcome
    if refused is not None:
        session.defer_error(refused, request.name, request.request_id)
        done = session.work_done()  # the earlier work, which the refused launch did not poll
    return {} if done else WAITING


def _post_launch(session: Session, request: Request) -> None:
    """The launch, checked and posted as fire-and-forget."""
    post_ordered(session, request, session.backend.launch, *_launch_call(session, request))


MAX_BATCH_LAUNCHES = m.MAX_BATCH_LAUNCHES


class _Batch:
    """A LAUNCH_KERNELS request read and checked: the call shared by its launches, the
    launches that may run (index, argument buffer), and the first refusal."""

    __slots__ = ("call", "count", "launches", "refused")

    def __init__(self, session: Session, request: Request) -> None:
        args = request.args
        function, grid, block, shared_mem, ptrs = launch_config(session, args)
        stream = session.stream(args.handle(_BATCH_STREAM, optional=True))
        blobs = args.blob_list(
            _BATCH_ARGS, max_items=MAX_BATCH_LAUNCHES, max_length=MAX_KERNEL_ARGS_BYTES
        )
        self.call = (function, grid, block, shared_mem, stream)
        self.count = count = len(blobs)

        def check(index: int, blob: bytes) -> None:
            check_pointers(
                session, blob, ptrs, lambda: f"{request.name}: launch {index + 1} of {count}"
            )

        #: The launches that may run, and the first refusal by position.
        self.launches, self.refused = admit_each(session, request, blobs, check, "launches")

    def run(self, session: Session, request: Request) -> tuple[Any, ...] | None:
        """The one backend call that runs every launch that may run (``_launch_each``);
        None when none may."""
        if not self.launches:
            return None
        return (
            _launch_each,
            session.backend,
            self.call,
            self.launches,
            partial(self.name, request),
        )

    def name(self, request: Request, index: int) -> str:
        """The launch's name in an error: which launch of the batch failed."""
        return f"{request.name} (launch {index + 1} of {self.count})"


@handler(m.LaunchKernels)
async def launch_kernels(session: Session, request: Request) -> Any:
    """``{function, grid, block, shared_mem?, stream?, ptrs, args: [buffer, ...]}``
    (protocol 1.1): one launch of the kernel per argument buffer, in order, as if each
    came as its own LAUNCH_KERNEL. The function, geometry, stream and pointer offsets
    are shared and checked once; each buffer's pointers are checked on their own. A
    launch that is refused (a pointer outside the session's allocations, or past the
    tenant's max_request_rate: each launch counts as one request) or fails does not stop
    the others; the first refusal, else the first failure, is the request's error,
    naming the launch. All of them go to the session's GPU thread in one hand-off,
    where a burst of LAUNCH_KERNEL frames pays one a launch. With ``synchronize``
    (protocol 1.3), the launches then their DEVICE_SYNCHRONIZE."""
    if _synchronizes(request):
        await _launched_then_waited(session, request, partial(_post_batch, session, request))
        return {}
    batch = _Batch(session, request)
    await run_batch(session, request, batch.run(session, request), batch.refused)
    return {}


@answers_now(m.LaunchKernels)
def launch_kernels_now(session: Session, request: Request) -> Any:
    """A fire-and-forget batch of launches issued from the worker's I/O callback; with
    ``synchronize``, the launches then their synchronize's wait, when done at once."""
    if not request.no_reply:
        if request.args.flag(_SYNCHRONIZE):
            return _launched_then_done_now(session, request, partial(_post_batch, session, request))
        return LATER
    if request.args.has(_SYNCHRONIZE):
        return LATER  # the executor refuses ``synchronize`` with NO_REPLY
    _post_batch(session, request)
    return {}


def _post_batch(session: Session, request: Request) -> None:
    """A batch's admitted launches posted as fire-and-forget; its first refusal raised."""
    batch = _Batch(session, request)
    call = batch.run(session, request)
    if call is not None:
        post_ordered(session, request, *call)
    if batch.refused is not None:
        raise batch.refused


def _launch_each(
    backend: Any,
    call: tuple[Any, ...],
    launches: list[tuple[int, bytes]],
    name_of: Any,
) -> None:
    """On the GPU thread: every launch, in order; one that fails stops none of the
    others, and the first failure, naming its launch, is the batch's error. A backend
    with a ``batch_launcher`` makes them all in one native call (``LaunchMany``); one
    with a ``launcher`` makes the shared part of the launches ready once (see
    ``GpuBackend.launcher``). One that cannot (a destroyed stream, bad geometry) fails
    them all, as each would have failed alone."""
    make_batch = getattr(backend, "batch_launcher", None)
    make_launcher = getattr(backend, "launcher", None)
    try:
        launch_all = make_batch(*call) if make_batch is not None else None
        launch = (
            make_launcher(*call) if make_launcher is not None else partial(backend.launch, *call)
        ) if launch_all is None else None  # fmt: skip
    except Exception as exc:
        raise _naming(as_hip_error(exc, "launch"), name_of(launches[0][0])) from None
    if launch_all is not None:
        try:
            errors = launch_all([blob for _, blob in launches])
        except Exception as exc:  # nothing launched (a refused call structure)
            raise _naming(as_hip_error(exc, "launch"), name_of(launches[0][0])) from None
        for (index, _), error in zip(launches, errors, strict=True):
            if error is not None:
                raise _naming(error, name_of(index))
        return
    assert launch is not None
    first: HipError | None = None
    for index, blob in launches:
        try:
            launch(blob)
        except Exception as exc:  # each launch is on its own, as its own frame would be
            if first is None:
                first = _naming(as_hip_error(exc, "launch"), name_of(index))
    if first is not None:
        raise first


def _naming(error: HipError, launch: str) -> HipError:
    """``error`` with the launch of a batch that raised it in its message."""
    return type(error)(error.code, f"{launch}: {error.message}")
