"""Module and kernel messages (0x05xx): run-time compilation, loading, launches."""

from __future__ import annotations

from hipr.protocol.messages._schema import FieldGroup, Message, Out, field, fields_of, message
from hipr.protocol.opcodes import Opcode

#: Characters of HIP C++ source one compile takes.
MAX_SOURCE = 4 << 20
#: Bytes of one launch's packed argument buffer.
MAX_KERNEL_ARGS_BYTES = 4096
#: Dynamic shared memory one launch may ask.
MAX_SHARED_MEMORY = 1 << 20
#: Pointer arguments one launch may declare.
MAX_POINTER_ARGS = 256
#: Launches one LAUNCH_KERNELS request may carry (the Python client sends at most 64).
MAX_BATCH_LAUNCHES = 4096
#: Bytes of the largest code object MODULE_LOAD takes (CUDA libraries' fat binaries run to
#: hundreds of MiB).
MAX_MODULE_BYTES = 1 << 30
#: Bytes of a SHA-256 digest: MODULE_LOAD's `sha256` (protocol 1.2).
SHA256_BYTES = 32
#: Characters of a kernel's name (C++ templates' mangled names run to thousands).
MAX_KERNEL_NAME = 16384
#: CUfunction_attribute values are small; anything past this is a client's mistake.
MAX_FUNCTION_ATTRIBUTE = 64
#: FUNCTION_OCCUPANCY's queries, as cuOccupancy* names them.
OCCUPANCY_QUERIES = (
    "max_active_blocks",
    "available_dynamic_smem",
    "max_potential_block_size",
    "max_active_clusters",
)
#: Reply chunk of a code object (PROGRAM_COMPILE), as for device-to-host copies.
CODE_CHUNK = 4 << 20
#: Headers one PROGRAM_COMPILE may carry.
MAX_HEADERS = 256
#: Inputs one PROGRAM_LINK may link.
MAX_LINK_INPUTS = 256
#: hiprtcJITInputType (hipJitInputType) values PROGRAM_LINK takes: CUBIN 0, PTX 1,
#: FATBINARY 2, OBJECT 3, LIBRARY 4, NVVM 5; LLVM bitcode 100, bundled bitcode 101, archives
#: of bundled bitcode 102. CUjitInputType numbers the first six alike.
LINK_INPUT_KINDS = (0, 1, 2, 3, 4, 5, 100, 101, 102)


@fields_of
class Compile(FieldGroup):
    """What a run-time compilation takes."""

    source = field("text", "HIP C++ source", range=f"at most {MAX_SOURCE} characters")
    name = field(
        "text",
        "the source's file name, in the compiler's messages",
        required=False,
        default="`kernel.hip`",
        range="at most 256 characters",
    )
    options = field(
        "[text]",
        "compiler options (`-O3`, `-DN=4`)",
        required=False,
        default="none",
        range="at most 256 items of at most 4096 characters",
    )


@fields_of
class LaunchConfig(FieldGroup):
    """What every launch of one kernel configuration shares (the key of a batch)."""

    function = field("handle", "the kernel (MODULE_GET_FUNCTION's `function`)")
    grid = field("dim3", "blocks in the grid")
    block = field("dim3", "threads in a block")
    shared_mem = field(
        "uint",
        "dynamic shared memory",
        required=False,
        default="0",
        unit="bytes",
        range=f"[0, {MAX_SHARED_MEMORY}]",
    )
    ptrs = field(
        "[uint]",
        "the byte offsets in `args` of the arguments that are device pointers (8 bytes, "
        "little-endian, each null or inside an allocation of the session)",
        required=False,
        default="none",
        range=f"at most {MAX_POINTER_ARGS} offsets in [0, {MAX_KERNEL_ARGS_BYTES}]",
    )


_ARGS_DOC = (
    "the packed argument buffer: each argument at its C alignment, little-endian, as the "
    "kernel's parameter list lays them out"
)


_SYNCHRONIZE_DOC = (
    "protocol 1.3: true asks the worker to wait, after the launches, as DEVICE_SYNCHRONIZE "
    "does, and reply then: the request (sent without NO_REPLY) stands for the launches and "
    "a DEVICE_SYNCHRONIZE after them, one round trip for a kernel then its wait. The "
    "launches run even when an earlier fire-and-forget call failed; the reply's error is "
    "that earlier error (`...; reported at this synchronisation`), else the launches' own "
    "(refusal or failure), else the wait's. The wait counts as one more request against "
    "`max_request_rate`. Refused with NO_REPLY; an older worker ignores the key, so a "
    "client sends it only to a worker of minor 3 or later"
)


@message(Opcode.MODULE_COMPILE, reply=(Out("module", "handle", "the loaded module"),))
class ModuleCompile(Compile, Message):
    """Compile HIP C++ on the worker and load it (counted against `max_modules`). A
    compile error's message carries the compiler log."""


@message(
    Opcode.MODULE_LOAD,
    reply=(
        Out(
            "module",
            "handle",
            "the loaded module (absent when `held` is false)",
            required=False,
        ),
        Out(
            "held",
            "bool",
            "false when the request named a code object by `sha256` alone and the worker "
            "does not hold it for this tenant: nothing was loaded, send it again with its "
            "bytes (absent otherwise)",
            required=False,
        ),
    ),
    streams_request=True,
    request_bulk="the code object (HSACO, CUBIN, fatbin or PTX), not empty: in this frame "
    "after the CBOR map and, for one larger than a frame, in DATA frames that follow (at most "
    f"{MAX_MODULE_BYTES} bytes in all); none to name a code object by `sha256` alone",
)
class ModuleLoad(Message):
    """Load a code object (counted against `max_modules`). A worker refuses a code object
    for the other vendor's GPUs (AMD code objects on cuda, CUDA binaries on hip) with
    hipErrorNoBinaryForGpu.

    Since protocol 1.2 a code object may be named by its SHA-256 (`sha256`): with the bytes,
    the worker checks that they hash to it (hipErrorInvalidValue if not) and keeps them in
    its tenant's module store (bounded by the tenant's `module_store_bytes` and
    `module_store_count`, least recently used out first; kept across the tenant's sessions,
    never shared with another tenant); without the bytes, it loads the code object it holds,
    or answers `{held: false}` and the client sends the bytes. Each session still loads
    its own module: only the bytes are shared."""

    sha256 = field(
        "bytes",
        "the code object's SHA-256 digest (protocol 1.2)",
        required=False,
        default="none (the bytes are not kept)",
        range=f"exactly {SHA256_BYTES} bytes",
    )


@message(Opcode.MODULE_UNLOAD)
class ModuleUnload(Message):
    """Unload a module; its function handles become invalid (replies `{}`)."""

    module = field("handle", "the module")


@message(Opcode.MODULE_GET_FUNCTION, reply=(Out("function", "handle", "the kernel"),))
class ModuleGetFunction(Message):
    """A kernel of a loaded module, by name."""

    module = field("handle", "the module")
    name = field(
        "text",
        'the kernel\'s name (`extern "C"` names are the simplest)',
        range=f"at most {MAX_KERNEL_NAME} characters",
    )


@message(
    Opcode.MODULE_BUILTIN,
    reply=(
        Out("module", "handle", "the built-in module of the current device"),
        Out("function", "handle", "the kernel"),
    ),
)
class ModuleBuiltin(Message):
    """A built-in kernel (docs/kernels.md), loaded once per device."""

    name = field(
        "text", "the built-in kernel's name", range=f"at most {MAX_KERNEL_NAME} characters"
    )


@message(
    Opcode.COMPILE_AND_GET_FUNCTION,
    reply=(
        Out("module", "handle", "the loaded module"),
        Out("function", "handle", "the kernel"),
    ),
)
class CompileAndGetFunction(Compile, Message):
    """MODULE_COMPILE then MODULE_GET_FUNCTION in one round trip."""

    function = field("text", "the kernel's name", range="at most 1024 characters")


@message(
    Opcode.PROGRAM_COMPILE,
    reply=(Out("size", "size", "the code object's length in bytes", unit="bytes"),),
    reply_bulk="the code object; one larger than 4 MiB comes as REPLY|MORE frames (no CBOR "
    "part) before the final REPLY frame, which carries `{size}` and the last chunk",
)
class ProgramCompile(Compile, Message):
    """Compile HIP C++ on the worker without loading it, as hiprtc does; the code object
    loads with MODULE_LOAD. A compile error's message carries the compiler log."""

    headers = field(
        "[text]",
        "the contents of headers the source includes by name (hiprtcCreateProgram's "
        "`headers`), given to the compiler as in-memory files",
        required=False,
        default="none",
        range=f"at most {MAX_HEADERS} items, at most {MAX_SOURCE} characters in all",
    )
    include_names = field(
        "[text]",
        'the name each of `headers` is included as (`#include "name"`), one per header',
        required=False,
        default="none",
        range="as many items as `headers`, of at most 1024 characters each",
    )


@message(
    Opcode.PROGRAM_LINK,
    reply=(
        Out("size", "size", "the linked image's length in bytes", unit="bytes"),
        Out("log", "text", "the linker's information log (may be empty)"),
    ),
    streams_request=True,
    request_bulk="the inputs, one after another in the order of `kinds` and `sizes`: in "
    "this frame after the CBOR map and, past one frame, in DATA frames that follow (at most "
    f"{MAX_MODULE_BYTES} bytes in all)",
    reply_bulk="the linked image (loads with MODULE_LOAD); one larger than 4 MiB comes as "
    "REPLY|MORE frames (no CBOR part) before the final REPLY frame",
)
class ProgramLink(Message):
    """Link compiled device code into one image, as hiprtcLinkCreate/AddData/Complete
    (AMD) and cuLinkCreate/AddData/Complete (NVIDIA) do: relocatable code from a
    compile with `-fgpu-rdc` (PROGRAM_COMPILE), PTX, CUBINs, fat binaries, libraries. On a
    cuda worker an LLVM bitcode kind is taken as the NVIDIA code it holds (hiprtc on
    NVIDIA returns a CUBIN or PTX for it), read from its first bytes. A link error is
    hipErrorInvalidSource with `rtc_result` 100 (HIPRTC_ERROR_LINKING) in its details and
    the linker's error log in its message; hipErrorNotSupported on a backend without a
    linker (the emulator)."""

    kinds = field(
        "[uint]",
        "each input's hiprtcJITInputType",
        range=f"1 to {MAX_LINK_INPUTS} items, each one of {', '.join(map(str, LINK_INPUT_KINDS))}",
    )
    sizes = field(
        "[uint]",
        "each input's length in the request's bulk bytes",
        unit="bytes",
        range="one per item of `kinds`, each at least 1",
    )
    names = field(
        "[text]",
        "each input's name, in the linker's messages",
        required=False,
        default="`input<i>`",
        range="none or one per item of `kinds`, of at most 1024 characters each",
    )


@message(
    Opcode.FUNCTION_PARAMS,
    reply=(
        Out("offsets", "[uint]", "each parameter's byte offset in the argument buffer"),
        Out("sizes", "[uint]", "each parameter's size in bytes"),
        Out("pointers", "[uint]", "the indices of the parameters that are device pointers"),
    ),
)
class FunctionParams(Message):
    """A kernel's parameter layout, so that a client given bare argument pointers (HIP's
    `kernelParams`) packs them. hipErrorNotSupported where the runtime cannot tell (HIP
    backends for now; CUDA before 12.4); a worker that predates it answers hipErrorNotSupported
    ("unknown opcode")."""

    function = field("handle", "the kernel")


@message(
    Opcode.FUNCTION_ATTRIBUTE,
    reply=(Out("value", "int", "the attribute's value (after setting it, if asked)"),),
)
class FunctionAttribute(Message):
    """A kernel's attribute in CUfunction_attribute numbering, as cuFuncGetAttribute reads
    it; with `value`, set first as cuFuncSetAttribute does (only the attributes the runtime
    lets a program set, e.g. MAX_DYNAMIC_SHARED_SIZE_BYTES). hipErrorNotSupported on a
    backend that cannot tell (hip and the emulator for now)."""

    function = field("handle", "the kernel")
    attribute = field(
        "uint", "the CUfunction_attribute number", range=f"[0, {MAX_FUNCTION_ATTRIBUTE}]"
    )
    value = field(
        "int",
        "the value to set first",
        required=False,
        default="read only",
        range="[-2^31, 2^31-1]",
    )


@message(
    Opcode.FUNCTION_OCCUPANCY,
    reply=(
        Out("value", "uint", "the figure asked (all queries but max_potential_block_size)",
            required=False),
        Out("min_grid", "uint", "max_potential_block_size: the smallest grid for full occupancy",
            required=False),
        Out("block_size", "uint", "max_potential_block_size: the block size", required=False),
    ),
)  # fmt: skip
class FunctionOccupancy(Message):
    """The driver's occupancy figures for a kernel: `max_active_blocks`
    (cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags), `available_dynamic_smem`
    (cuOccupancyAvailableDynamicSMemPerBlock), `max_potential_block_size`
    (cuOccupancyMaxPotentialBlockSizeWithFlags with a fixed dynamic shared memory size) and
    `max_active_clusters` (cuOccupancyMaxActiveClusters for a launch of `grid`/`block`/
    `dynamic_smem` with cluster dimensions `cluster`). hipErrorNotSupported on a backend
    that cannot tell."""

    function = field("handle", "the kernel")
    query = field("text", "which figure", range=" | ".join(OCCUPANCY_QUERIES))
    block_size = field(
        "uint", "threads per block", required=False, default="0", range="[0, 2^31-1]"
    )
    dynamic_smem = field(
        "uint",
        "dynamic shared memory per block",
        required=False,
        default="0",
        unit="bytes",
        range="[0, 2^31-1]",
    )
    num_blocks = field(
        "uint", "blocks per multiprocessor", required=False, default="0", range="[0, 2^31-1]"
    )
    block_limit = field(
        "uint",
        "the largest block size to consider",
        required=False,
        default="0 (no limit)",
        range="[0, 2^31-1]",
    )
    flags = field("uint", "CU_OCCUPANCY_* flags", required=False, default="0", range="[0, 2^31-1]")
    grid = field("dim3", "max_active_clusters: the launch's grid", required=False, default="1")
    block = field("dim3", "max_active_clusters: the launch's block", required=False, default="1")
    cluster = field("dim3", "max_active_clusters: the cluster dimensions", required=False,
                    default="none")  # fmt: skip


@message(
    Opcode.MODULE_GET_GLOBAL,
    reply=(
        Out("ptr", "uint", "the variable's device address"),
        Out("size", "uint", "its size", unit="bytes"),
    ),
)
class ModuleGetGlobal(Message):
    """A global variable (`__device__` / `__constant__`) of a loaded module, as
    cuModuleGetGlobal gives it. Copies and kernel pointer arguments of the session may
    then name its bytes, as an allocation's, until the module is unloaded; it is never
    freed (FREE refuses it). hipErrorNotFound when the module has no such variable. The
    emulator's built-in module has one (`hipr_builtin_bias`, docs/kernels.md); the
    built-in module is shared by the worker process's sessions, and so are its variables."""

    module = field("handle", "the module")
    name = field("text", "the variable's (mangled) name", range="at most 1024 characters")


@message(Opcode.LAUNCH_KERNEL, fire_and_forget=True)
class LaunchKernel(LaunchConfig, Message):
    """Launch a kernel."""

    stream = field(
        "handle",
        "the stream; absent, null or 0: the null stream",
        required=False,
        default="the null stream",
    )
    args = field(
        "bytes",
        _ARGS_DOC,
        required=False,
        default="empty",
        range=f"at most {MAX_KERNEL_ARGS_BYTES} bytes",
    )
    synchronize = field("bool", _SYNCHRONIZE_DOC, required=False, default="false")


@message(
    Opcode.LAUNCH_KERNELS,
    fire_and_forget=True,
    batch_of="LAUNCH_KERNEL",
    since_minor=1,
)
class LaunchKernels(LaunchConfig, Message):
    """One launch of the kernel per argument buffer, in order, as if each came as its own
    LAUNCH_KERNEL. The function, geometry, stream and pointer offsets are shared and
    checked once; each buffer's pointers are checked on their own. A launch that is
    refused (a pointer outside the session's allocations, or past the tenant's
    `max_request_rate`: each launch counts as one request) or fails does not stop the
    others; the first refusal, else the first failure, is the request's error, naming
    the launch."""

    stream = field(
        "handle",
        "the stream; absent, null or 0: the null stream",
        required=False,
        default="the null stream",
    )
    args = field(
        "[bytes]",
        "one packed argument buffer per launch (as LAUNCH_KERNEL's `args`)",
        range=f"1 to {MAX_BATCH_LAUNCHES} buffers of at most {MAX_KERNEL_ARGS_BYTES} bytes",
    )
    synchronize = field("bool", _SYNCHRONIZE_DOC, required=False, default="false")
