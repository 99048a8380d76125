"""hip-python's ``hiprtc`` functions: run-time compilation on the worker.

A program is kept here until ``hiprtcCompileProgram`` sends its source (headers inlined)
and options to the worker, which compiles it with its backend's compiler (hiprtc on AMD,
NVRTC with a HIP prelude on NVIDIA) and sends the code object back; ``hiprtcGetCode``
hands it out for ``hipModuleLoadData``. Options written for AMD that name an AMD target
(``--offload-arch=gfx942``) are dropped on an NVIDIA worker, which compiles for its own
device, so a program that passes its device's ``gcnArchName`` back compiles on either.
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


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"][^\n]*$', re.M)


def _inline_headers(source: str, headers: dict[str, str]) -> str:
    """The source with ``#include``s of the program's own headers replaced by their text
    (the wire carries one source), each header once."""
    if not headers:
        return source
    seen: set[str] = set()

    def expand(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in headers:
                return match.group(0)
            if name in seen:
                return ""
            seen.add(name)
            return f"// begin {name}\n{expand(headers[name])}\n// end {name}"

        return _INCLUDE.sub(one, text)

    return expand(source)


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
        program.code = gpu.compile_code(
            _inline_headers(program.source, program.headers), program.name, opts
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
