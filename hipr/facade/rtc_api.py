"""hip-python's ``hiprtc`` functions: run-time compilation on the worker.

A program is kept here until ``hiprtcCompileProgram`` sends its source, headers and
options to the worker, which compiles it with its backend's compiler (hiprtc on AMD,
NVRTC with a HIP prelude on NVIDIA) and sends the code object back; ``hiprtcGetCode``
hands it out for ``hipModuleLoadData``; ``hiprtcLink*`` link such code objects (from
``-fgpu-rdc`` compiles) on the worker with its runtime's linker. Options written for AMD
that name an AMD target (``--offload-arch=gfx942``) are dropped on an NVIDIA worker,
which compiles for its own device, so a program that passes its device's ``gcnArchName``
back compiles on either.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from hipr.errors import HipError, HipErrorCode, invalid_value
from hipr.facade import session
from hipr.facade.catalog import HIPRTC_FUNCTIONS
from hipr.facade.enums import HIPRTC_SUCCESS, hiprtcResult

#: Every served function, by name.
HIPRTC_API: dict[str, Callable[..., tuple[Any, ...]]] = {}

#: hiprtc's version as the facade reports it (the worker's compiler may differ).
VERSION = (6, 4)


def _rtc_error(exc: HipError) -> Any:
    code = exc.details.get("rtc_result") if exc.details else None
    if isinstance(code, int):
        try:
            return hiprtcResult(code)
        except ValueError:
            pass
    if exc.code == HipErrorCode.hipErrorInvalidValue:
        return hiprtcResult.HIPRTC_ERROR_INVALID_INPUT
    if exc.code == HipErrorCode.hipErrorInvalidHandle:
        return hiprtcResult.HIPRTC_ERROR_INVALID_PROGRAM
    return hiprtcResult.HIPRTC_ERROR_INTERNAL_ERROR


def _api(fn: Callable[..., tuple[Any, ...]]) -> Any:
    wrapped = session.hip_call(HIPRTC_FUNCTIONS.get(fn.__name__, 0), _rtc_error)(fn)
    HIPRTC_API[fn.__name__] = wrapped
    return wrapped


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode()
    return str(value)


class hiprtcProgram:  # hip-python's name (its class is _hiprtcProgram)
    """A program to compile: its source, name, headers and, once compiled, its code object
    (:attr:`code`) or its failure and log."""

    def __init__(self, source: str, name: str, headers: dict[str, str]) -> None:
        self.source = source
        self.name = name
        self.headers = headers
        self.code: bytes | None = None
        self.log = ""
        self.destroyed = False

    def createRef(self) -> hiprtcProgram:  # hip-python's name
        """A reference to this program, for ``hiprtcDestroyProgram`` (hip-python's way)."""
        return self

    def _live(self) -> hiprtcProgram:
        if self.destroyed:
            raise HipError(HipErrorCode.hipErrorInvalidHandle, "the program was destroyed")
        return self

    def __repr__(self) -> str:
        state = "compiled" if self.code is not None else "not compiled"
        return f"<hiprtcProgram {self.name!r} {state}>"


def _program(prog: Any) -> hiprtcProgram:
    if isinstance(prog, hiprtcProgram):
        return prog._live()
    raise HipError(
        HipErrorCode.hipErrorInvalidHandle, f"expected a hiprtcProgram, got {type(prog).__name__}"
    )


_AMD_TARGET = re.compile(r"^(--offload-arch|--amdgpu-target|-mcpu)=gfx", re.I)


def _options(options: Sequence[Any], backend: str) -> list[str]:
    out = []
    for opt in options:
        text = _text(opt)
        if backend == "cuda" and _AMD_TARGET.match(text):
            continue  # an AMD target means nothing to NVRTC: the worker's device decides
        out.append(text)
    return out


@_api
def hiprtcCreateProgram(
    src: Any,
    name: Any,
    numHeaders: int = 0,
    headers: Sequence[Any] | None = None,
    includeNames: Sequence[Any] | None = None,
) -> tuple[Any, ...]:
    """(result, program) from ``src`` (bytes or str) and its headers."""
    headers = list(headers or [])[: int(numHeaders)]
    names = list(includeNames or [])[: int(numHeaders)]
    if len(headers) != len(names):
        raise invalid_value("headers and includeNames must have numHeaders entries each")
    table = {_text(n): _text(h) for n, h in zip(names, headers, strict=True)}
    return HIPRTC_SUCCESS, hiprtcProgram(_text(src), _text(name or "kernel.hip"), table)


@_api
def hiprtcCompileProgram(prog: Any, numOptions: int = 0, options: Any = None) -> tuple[Any, ...]:
    """Compile on the worker. A refused source returns HIPRTC_ERROR_COMPILATION and its
    log is in ``hiprtcGetProgramLog``."""
    program = _program(prog)
    gpu = session.gpu()
    backend = str(gpu.worker_info().get("backend", ""))
    opts = _options(list(options or [])[: int(numOptions)], backend)
    program.code, program.log = None, ""
    try:
        # The headers travel beside the source; the worker's compiler includes them.
        program.code = gpu.compile_code(
            program.source, program.name, opts, headers=program.headers or None
        )
    except HipError as exc:
        # The compiler's log follows the first line of the message (see rtc_error).
        first, _, rest = exc.message.partition("\n")
        program.log = rest if rest else first
        raise
    return (HIPRTC_SUCCESS,)


@_api
def hiprtcGetProgramLogSize(prog: Any) -> tuple[Any, ...]:
    """(result, bytes of the log with its NUL terminator)."""
    return HIPRTC_SUCCESS, len(_program(prog).log.encode()) + 1


@_api
def hiprtcGetProgramLog(prog: Any, log: Any) -> tuple[Any, ...]:
    """Write the log, NUL-terminated, into ``log`` (a bytearray of the logged size)."""
    _fill(log, _program(prog).log.encode() + b"\0")
    return (HIPRTC_SUCCESS,)


@_api
def hiprtcGetCodeSize(prog: Any) -> tuple[Any, ...]:
    """(result, bytes of the code object)."""
    return HIPRTC_SUCCESS, len(_compiled(prog))


@_api
def hiprtcGetCode(prog: Any, code: Any) -> tuple[Any, ...]:
    """Write the code object into ``code`` (a bytearray of the code's size)."""
    _fill(code, _compiled(prog))
    return (HIPRTC_SUCCESS,)


@_api
def hiprtcDestroyProgram(prog: Any) -> tuple[Any, ...]:
    """Forget a program; ``prog.createRef()`` or the program itself."""
    _program(prog).destroyed = True
    return (HIPRTC_SUCCESS,)


@_api
def hiprtcGetErrorString(result: Any) -> tuple[Any, ...]:
    """(HIPRTC_SUCCESS, the result's name as bytes)."""
    try:
        text = hiprtcResult(int(result)).name
    except ValueError:
        text = "HIPRTC_ERROR_INVALID_INPUT"
    return HIPRTC_SUCCESS, text.encode()


@_api
def hiprtcVersion() -> tuple[Any, ...]:
    """(result, major, minor) of the hiprtc API the facade follows."""
    return HIPRTC_SUCCESS, VERSION[0], VERSION[1]


@_api
def hiprtcGetBitcodeSize(prog: Any) -> tuple[Any, ...]:
    """(result, bytes of the code a ``-fgpu-rdc`` compile gives for linking: LLVM bitcode
    on an AMD worker, a relocatable CUBIN (or PTX) on an NVIDIA one, as hiprtc there)."""
    return HIPRTC_SUCCESS, len(_compiled(prog))


@_api
def hiprtcGetBitcode(prog: Any, bitcode: Any) -> tuple[Any, ...]:
    """Write that code into ``bitcode`` (a bytearray of its size)."""
    _fill(bitcode, _compiled(prog))
    return (HIPRTC_SUCCESS,)


class hiprtcLinkState:  # hip-python's name (its class is ihiprtcLinkState)
    """A link in progress: the inputs added so far, linked on the worker by
    ``hiprtcLinkComplete``, which keeps the image here until ``hiprtcLinkDestroy``."""

    def __init__(self) -> None:
        self.inputs: list[tuple[int, bytes, str]] = []
        self.image: bytes | None = None
        self.log = ""
        self.destroyed = False

    def __repr__(self) -> str:
        return f"<hiprtcLinkState of {len(self.inputs)} inputs>"


def _link(state: Any) -> hiprtcLinkState:
    if isinstance(state, hiprtcLinkState) and not state.destroyed:
        return state
    raise invalid_value(f"expected a live hiprtcLinkState, got {state!r}")


def _input(state: Any, input_type: Any, data: bytes, name: Any) -> None:
    link = _link(state)
    kind = int(input_type)
    if kind not in _LINK_KINDS:
        raise invalid_value(f"input type {kind} is not a hiprtcJITInputType the worker links")
    if not data:
        raise invalid_value("a link input cannot be empty")
    link.inputs.append((kind, data, _text(name) if name else f"input{len(link.inputs)}"))


#: hiprtcJITInputType values the worker links (PROGRAM_LINK's kinds).
_LINK_KINDS = frozenset({0, 1, 2, 3, 4, 5, 100, 101, 102})


@_api
def hiprtcLinkCreate(
    num_options: int = 0, option_ptr: Any = None, option_vals_pptr: Any = None
) -> tuple[Any, ...]:
    """(result, link state). Options are the worker's linker's to choose (none are sent)."""
    return HIPRTC_SUCCESS, hiprtcLinkState()


@_api
def hiprtcLinkAddData(
    hip_link_state: Any,
    input_type: Any,
    image: Any,
    image_size: int,
    name: Any = None,
    num_options: int = 0,
    options_ptr: Any = None,
    option_values: Any = None,
) -> tuple[Any, ...]:
    """Add ``image_size`` bytes of ``image`` (bytes, a bytearray from hiprtcGetBitcode or
    hiprtcGetCode) as an input of type ``input_type`` (hiprtcJITInputType)."""
    try:
        view = memoryview(image).cast("B")
    except TypeError:
        raise invalid_value(f"{type(image).__name__} is not a buffer") from None
    if not 0 < int(image_size) <= view.nbytes:
        raise invalid_value(f"image_size {image_size} is not within the {view.nbytes}-byte image")
    _input(hip_link_state, input_type, bytes(view[: int(image_size)]), name)
    return (HIPRTC_SUCCESS,)


@_api
def hiprtcLinkAddFile(
    hip_link_state: Any,
    input_type: Any,
    file_path: Any,
    num_options: int = 0,
    options_ptr: Any = None,
    option_values: Any = None,
) -> tuple[Any, ...]:
    """Add a file of this machine (read here; its bytes go to the worker)."""
    path = _text(file_path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise invalid_value(f"cannot read {path}: {exc.strerror}") from None
    _input(hip_link_state, input_type, data, path.rsplit("/", 1)[-1])
    return (HIPRTC_SUCCESS,)


@_api
def hiprtcLinkComplete(hip_link_state: Any) -> tuple[Any, ...]:
    """(result, the linked image as bytes for hipModuleLoadData, its size). A failed link
    returns HIPRTC_ERROR_LINKING (the linker's log is in the error's message)."""
    link = _link(hip_link_state)
    if not link.inputs:
        raise invalid_value("the link has no inputs")
    link.image, link.log = session.gpu().link_code(list(link.inputs))
    return HIPRTC_SUCCESS, link.image, len(link.image)


@_api
def hiprtcLinkDestroy(hip_link_state: Any) -> tuple[Any, ...]:
    """Forget a link state and its image."""
    link = _link(hip_link_state)
    link.destroyed, link.inputs, link.image = True, [], None
    return (HIPRTC_SUCCESS,)


def _compiled(prog: Any) -> bytes:
    program = _program(prog)
    if program.code is None:
        raise HipError(HipErrorCode.hipErrorInvalidHandle, "the program is not compiled")
    return program.code


def _fill(target: Any, data: bytes) -> None:
    try:
        view = memoryview(target).cast("B")
    except TypeError:
        raise invalid_value(f"{type(target).__name__} is not a writable buffer") from None
    if view.readonly or view.nbytes < len(data):
        raise invalid_value(f"the buffer must be writable and hold {len(data)} bytes")
    view[: len(data)] = data
