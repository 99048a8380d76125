"""Run-time compilation's other halves (module range, 0x05xx): a program's own headers
for PROGRAM_COMPILE, and PROGRAM_LINK, which links compiled device code into one image
(hiprtcLink* / cuLink*), as the proxy's libhiprtc.so and hipr.hiprtc ask."""

from __future__ import annotations

from typing import Any

from hipr.errors import invalid_value
from hipr.handlers.context import Reply, Request
from hipr.handlers.registry import handler
from hipr.protocol import messages as m
from hipr.protocol.opcodes import OpcodeRange
from hipr.sessions.state import Session

OPCODE_RANGE = OpcodeRange.MODULE

#: Characters of one header's or input's name.
_MAX_NAME = 1024


def program_headers(request: Request) -> list[tuple[str, str]]:
    """PROGRAM_COMPILE's ``headers`` and ``include_names`` as ``(name, contents)`` pairs,
    checked: as many names as headers, at most :data:`m.MAX_SOURCE` characters in all."""
    args = request.args
    headers = args.str_list(
        m.ProgramCompile.headers, max_items=m.MAX_HEADERS, max_length=m.MAX_SOURCE
    )
    names = args.str_list(
        m.ProgramCompile.include_names, max_items=m.MAX_HEADERS, max_length=_MAX_NAME
    )
    if len(headers) != len(names):
        raise invalid_value(
            f"{request.name}: {len(headers)} headers but {len(names)} include_names "
            "(one name per header)"
        )
    if sum(map(len, headers)) > m.MAX_SOURCE:
        raise invalid_value(f"{request.name}: headers hold more than {m.MAX_SOURCE} characters")
    if any(not name for name in names):
        raise invalid_value(f"{request.name}: an include name is empty")
    return list(zip(names, headers, strict=True))


async def _inputs(request: Request) -> list[tuple[int, bytes, str]]:
    """PROGRAM_LINK's inputs, checked, with their bytes cut from the request's bulk (and
    the DATA frames that continue it)."""
    args = request.args
    kinds = args.int_list(m.ProgramLink.kinds, max_items=m.MAX_LINK_INPUTS)
    sizes = args.int_list(m.ProgramLink.sizes, max_items=m.MAX_LINK_INPUTS)
    names = args.str_list(m.ProgramLink.names, max_items=m.MAX_LINK_INPUTS, max_length=_MAX_NAME)
    problem = ""
    if not kinds:
        problem = "'kinds' must name at least one input"
    elif len(sizes) != len(kinds) or (names and len(names) != len(kinds)):
        problem = "'kinds', 'sizes' and 'names' (when given) need one item per input"
    elif bad := [k for k in kinds if k not in m.LINK_INPUT_KINDS]:
        problem = f"input kind {bad[0]} is not a hiprtcJITInputType this worker links"
    elif 0 in sizes:
        problem = "an input is empty"
    elif sum(sizes) > m.MAX_MODULE_BYTES:
        problem = f"the inputs hold more than {m.MAX_MODULE_BYTES} bytes"
    if problem:
        await request.drain()
        raise invalid_value(f"{request.name}: {problem}")
    total = sum(sizes)
    parts = [bytes(request.bulk)]
    got = len(parts[0])
    while got <= total and (chunk := await request.receive_data()) is not None:
        got += chunk.nbytes
        parts.append(bytes(chunk))
    if got != total:
        await request.drain()
        raise invalid_value(
            f"{request.name}: 'sizes' add up to {total} bytes, the bulk holds {got}"
        )
    data = memoryview(b"".join(parts))
    out, at = [], 0
    for i, (kind, size) in enumerate(zip(kinds, sizes, strict=True)):
        out.append((kind, bytes(data[at : at + size]), names[i] if names else f"input{i}"))
        at += size
    return out


@handler(m.ProgramLink)
async def program_link(session: Session, request: Request) -> Any:
    """``{kinds, sizes, names?}`` and the inputs as bulk bytes -> ``{size, log}`` and the
    linked image as bulk bytes (REPLY|MORE chunks for a large one)."""
    inputs = await _inputs(request)
    image, log = await session.gpu(session.backend.program_link, inputs)
    view = memoryview(image)
    while view.nbytes > m.CODE_CHUNK:
        await request.send_chunk(view[: m.CODE_CHUNK])
        view = view[m.CODE_CHUNK :]
    return Reply({"size": len(image), "log": log}, view)
