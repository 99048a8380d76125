"""Frame generators and a raw mutator for fuzzing the worker. Sans-I/O: bytes out only.

Three layers of abuse, from polite to hostile:

- :func:`structured_frame`: a well-framed request for any opcode (or none), with
  plausible arguments aimed at the fuzz session's own allocation and handles, then
  often mutated: wrong CBOR shapes and types, sizes near 2**64, negative values,
  offsets just past the end of the allocation, unknown keys, nested junk.
- :func:`nasty_cbor_frame`: framing intact, the CBOR part hostile (deep nesting, huge
  declared lengths, cyclic shared references, bad UTF-8, odd tags).
- :class:`~hipr.testing.fuzz_bytes.RawMutator`: byte-level damage to encoded frames:
  bit flips, truncation, insertions, header fields (magic, version, opcode, flags,
  payload length up to 2**64-1) and the CBOR length prefix overwritten.

Every generator takes a :class:`random.Random`, so a run is replayed from its seed.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import cbor2

from hipr.kernels.builtins import BUILTINS
from hipr.protocol.codec import ARGS_LENGTH, encode_frame
from hipr.protocol.header import (
    HEADER,
    MAGIC,
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    Flags,
)
from hipr.protocol.opcodes import Opcode


class Stage(StrEnum):
    """Where in a connection's life the abuse arrives."""

    #: Before HELLO: the handshake itself is the target.
    PRE_HELLO = "pre_hello"
    #: After HELLO, between requests.
    POST_HELLO = "post_hello"
    #: Between a MEMCPY_HTOD (or MALLOC_HTOD) with MORE and its DATA frames.
    MID_COPY = "mid_copy"


#: Integers at the edges of every width a decoder or an address computation might use.
INTERESTING_INTS: tuple[int, ...] = (
    0,
    1,
    -1,
    2,
    7,
    8,
    255,
    256,
    4095,
    4096,
    65535,
    65536,
    2**31 - 1,
    2**31,
    -(2**31),
    2**32 - 1,
    2**32,
    2**53,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64 - 1,
    2**64,
    -(2**64),
    2**64 + 1,
    2**100,
    -(2**100),
    10**5000,
)

INTERESTING_FLOATS: tuple[float, ...] = (
    0.0,
    -0.0,
    0.5,
    1e308,
    -1e308,
    5e-324,
    math.inf,
    -math.inf,
    math.nan,
)

#: CBOR parts that are valid framing but hostile content.
NASTY_CBOR: tuple[bytes, ...] = (
    b"\x81" * 5000 + b"\x00",  # arrays nested 5000 deep
    b"\xa1\x00" * 5000 + b"\x00",  # maps nested 5000 deep
    b"\xc6" * 5000 + b"\x00",  # tags nested 5000 deep
    b"\x5b" + b"\xff" * 8,  # a byte string of 2**64-1 bytes (absent)
    b"\x9b\x00\x00\x00\x01\x00\x00\x00\x00",  # an array of 2**32 items (absent)
    b"\xbb" + b"\x7f" + b"\xff" * 7,  # a map of 2**63-1 pairs (absent)
    b"\x7f\x61a",  # indefinite text without break
    b"\x9f\x00\x00",  # indefinite array without break
    b"\xc2\x59\x10\x00" + b"\xff" * 4096,  # a 32768-bit bignum
    b"\xd8\x1c\x81\xd8\x1d\x00",  # an array that contains itself
    b"\xd8\x1c\xa1\x64size\xd8\x1d\x00",  # {"size": <itself>}
    b"\xd8\x23\x62(x",  # a bad regular expression
    b"\xd8\x23\x68(a+)+b$$",  # a catastrophic one
    b"\xc1\x1b" + b"\xff" * 8,  # a datetime out of range
    b"\x62\xff\xfe",  # invalid UTF-8
    b"\xd9\x01\x02\x81\x80",  # a set holding an unhashable
    b"\xd8\x1e\x82\x01\x00",  # a fraction over zero
    b"\xc4\x82\x1b\x7f\xff\xff\xff\xff\xff\xff\xff\x01",  # decimal with a huge exponent
    b"\xf7",  # undefined
    b"\xf8\xff",  # simple value 255
    b"\xa1\x80\x00",  # a map keyed by an array
    b"\xdb" + b"\xff" * 8 + b"\x00",  # tag 2**64-1
    b"\xd8\x24\x63abc",  # a MIME message
    b"\xd8\x19\x00",  # a string reference outside its namespace
    b"\xff",  # a lone break
    b"",  # nothing (with a non-zero length prefix this overruns)
)


@dataclass(slots=True)
class Targets:
    """What the fuzz session holds, so arguments can aim just inside and just past it."""

    ptr: int = 0x7F00_0000_0000
    size: int = 4096
    stream: int = 1
    event: int = 1
    module: int = 1
    function: int = 1
    graph: int = 1
    graph_exec: int = 1
    node: int = 1
    #: A second allocation, for device-to-device copies.
    ptr2: int = 0x7F00_0001_0000
    size2: int = 4096
    #: A device that SET_DEVICE never names (another client's, kept free of faults).
    reserved_device: int | None = None
    #: False: every kernel the frames could run stays inside the session's allocation
    #: (:func:`tame_launch`). On a real GPU a kernel's stray write lands in whatever
    #: memory is there, another client's included, and a fault poisons the context of
    #: every session on the device: neither is the worker's to check, so a campaign
    #: that shares a GPU with its well-behaved client keeps them out.
    kernel_faults: bool = True
    #: The built-in kernel that ``function`` names (its arguments' layout, for taming).
    kernel: str = "fill_f32"


@dataclass(slots=True)
class FuzzFrame:
    """One generated frame and what the worker owes it."""

    data: bytes
    request_id: int
    opcode: int
    flags: Flags
    #: A reply (success or error) for ``request_id`` is due, unless the session ends first.
    expects_reply: bool
    #: The worker ends the connection after this frame (GOODBYE, stray DATA, MORE).
    ends_session: bool
    note: str = ""


@dataclass
class IdSource:
    """Unique request ids for one connection, from a random start (wrapping, never 0)."""

    next_id: int = 1
    issued: set[int] = field(default_factory=set)

    @classmethod
    def seeded(cls, rng: random.Random) -> IdSource:
        """Start somewhere random: large ids are part of the test."""
        return cls(rng.choice((1, rng.randrange(1, MAX_REQUEST_ID - 100_000))))

    def take(self) -> int:
        """A fresh id."""
        value = self.next_id
        self.next_id = self.next_id + 1 if self.next_id < MAX_REQUEST_ID else 1
        self.issued.add(value)
        return value


# --- values ----------------------------------------------------------------------------


def interesting_int(rng: random.Random) -> int:
    """An integer at some edge."""
    value = rng.choice(INTERESTING_INTS)
    return value + rng.choice((0, 0, 0, -1, 1)) if abs(value) < 2**70 else value


def interesting_value(rng: random.Random, depth: int = 0) -> Any:
    """Any CBOR-encodable value, biased towards ones that break naive readers."""
    kind = rng.randrange(13 if depth < 3 else 9)
    if kind == 0:
        return interesting_int(rng)
    if kind == 1:
        return rng.choice(INTERESTING_FLOATS)
    if kind == 2:
        return rng.choice((True, False, None, cbor2.undefined))
    if kind == 3:
        return rng.choice(("", "x", "\x00", "é" * 7, "A" * rng.randrange(1, 5000), "\ud7ff"))
    if kind == 4:
        return rng.randbytes(rng.choice((0, 1, 8, 64, 4096)))
    if kind == 5:
        return rng.randrange(-(2**64), 2**64)
    if kind == 6:
        return rng.choice(list(Opcode)).name
    if kind == 7:
        return cbor2.CBORTag(rng.choice((0, 1, 2, 3, 4, 30, 258, 55799, 2**32)), None)
    if kind == 8:
        return cbor2.CBORSimpleValue(rng.choice((0, 19, 32, 255)))
    if kind == 9:
        return [interesting_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if kind == 10:
        return {
            rng.choice(("size", "ptr", "dst", "src", "stream", "x", "")): interesting_value(
                rng, depth + 1
            )
            for _ in range(rng.randrange(0, 4))
        }
    if kind == 11:
        return [rng.getrandbits(64) for _ in range(rng.choice((0, 3, 300, 5000)))]
    return {interesting_int(rng): interesting_value(rng, depth + 1)}


def _edge_range(rng: random.Random, t: Targets) -> tuple[int, int]:
    """An (address, size) just inside, on, or past the edges of the session's allocation."""
    end = t.ptr + t.size
    return rng.choice(
        (
            (t.ptr, t.size),
            (t.ptr, rng.randrange(1, t.size + 1)),
            (t.ptr + rng.randrange(t.size), 1),
            (t.ptr, t.size + 1),
            (end, 1),
            (end - 1, 2),
            (t.ptr - 1, 2),
            (t.ptr, 0),
            (end, 0),
            (t.ptr, 2**63 - 1),
            (t.ptr, 2**64 - 1),
            (t.ptr + 1, 2**64 - 2),
            (2**64 - 1, 1),
            (2**64 - t.size, t.size),
            (0, 0),
            (0, 16),
            (t.ptr2, t.size2),
            (t.ptr2 + t.size2 - 8, 16),
        )
    )


def _dims(rng: random.Random) -> Any:
    return rng.choice(
        (
            [1],
            [rng.randrange(1, 64)],
            [64, 1, 1],
            [2**31 - 1],
            [2**31],
            [0],
            [-1],
            [1, 1, 1, 1],
            [],
            [65536, 65536, 65536],
            1024,
            [1025],
            [2**64 - 1],
        )
    )


def _launch(rng: random.Random, t: Targets) -> dict[str, Any]:
    """A launch of a built-in kernel on the session's buffer, sometimes badly packed."""
    ptr, size = _edge_range(rng, t)
    name = rng.choice(list(BUILTINS))
    n = rng.choice((0, 1, max(1, size // 4), size, 2**64 - 1, 2**63))
    ptr_field = (ptr % 2**64).to_bytes(8, "little")
    kinds = BUILTINS[name].arg_kinds
    data = bytearray()
    ptrs = []
    for kind in kinds:
        width = 24 if kind == "probe_struct" else 8 if kind in ("ptr", "u64", "f64") else 4
        while len(data) % min(width, 8):
            data.append(0)
        if kind == "ptr":
            ptrs.append(len(data))
            data += ptr_field
        elif kind == "u64":
            data += (n % 2**64).to_bytes(8, "little")
        else:
            data += rng.randbytes(width)
    if rng.random() < 0.3:
        data = bytearray(rng.randbytes(rng.choice((0, 1, 7, len(data), 4096, 5000))))
    if rng.random() < 0.2:
        ptrs = [rng.choice((0, 4, 4088, 4096, 2**32, 2**64 - 1)) for _ in range(rng.randrange(4))]
    return {
        "function": rng.choice((t.function, t.function, 0, 2**64 - 1, 99)),
        "grid": _dims(rng) if rng.random() < 0.2 else [rng.randrange(1, 8)],
        "block": _dims(rng) if rng.random() < 0.2 else [rng.choice((1, 32, 64, 256))],
        "shared_mem": rng.choice((0, 0, 1024, 2**20, 2**20 + 1, 2**64 - 1)),
        "stream": rng.choice((None, t.stream, 0, 77)),
        "args": bytes(data),
        "ptrs": ptrs,
    }


def _launches(rng: random.Random, t: Targets) -> dict[str, Any]:
    """LAUNCH_KERNELS arguments: one launch's, its buffer repeated or varied, or a list
    that is empty, too long, or not of byte strings."""
    wire = _launch(rng, t)
    count = rng.choice((1, 2, 64, 4096, 4097, 0))
    if count * len(wire["args"]) > 1 << 17:  # the frame stays well under the worker's limit
        wire["args"] = wire["args"][:16]
    buffers: Any = [wire["args"]] * count
    if count and rng.random() < 0.3:
        buffers = [_launch(rng, t)["args"] for _ in range(min(count, 64))]
    if rng.random() < 0.1:
        buffers = rng.choice((wire["args"], [1, 2], ["x"], None))
    return {**wire, "args": buffers}


def _pieces(rng: random.Random, t: Targets, stream: Any) -> dict[str, Any]:
    """MEMCPY_HTOD_MANY arguments: pieces at and around the targets' edges, sizes that
    may not match the destinations or the bulk bytes."""
    count = rng.choice((1, 2, 16, 300, 4097, 0))
    ranges = [_edge_range(rng, t) for _ in range(min(count, 300))]
    dsts = [ptr for ptr, _ in ranges]
    sizes = [min(size, 4096) if rng.random() < 0.8 else size for _, size in ranges]
    if rng.random() < 0.1:
        sizes = sizes[:-1] or [1, 2]
    return {"dst": dsts, "size": sizes, "stream": stream}


def plausible_args(rng: random.Random, opcode: int, t: Targets) -> Any:
    """Arguments of the shape ``opcode`` takes, values aimed at and around the targets."""
    ptr, size = _edge_range(rng, t)
    stream = rng.choice((None, None, t.stream, 0, 2**64 - 1, 12345))
    builders: dict[int, Callable[[], Any]] = {
        Opcode.HELLO: lambda: {"client": "fuzz"},
        Opcode.SET_DEVICE: lambda: {"device": rng.choice((0, 1, 2, -1, 2**31))},
        Opcode.DEVICE_PROPERTIES: lambda: {"device": rng.choice((0, 1, 2, -1, 2**64))},
        Opcode.MALLOC: lambda: {"size": rng.choice((1, 16, 4096, 1 << 20, 0, 2**63 - 1, size))},
        Opcode.FREE: lambda: {"ptr": rng.choice((t.ptr, t.ptr2, ptr, 0, 2**64 - 1))},
        Opcode.MEMCPY_HTOD: lambda: {"dst": ptr, "size": size, "stream": stream},
        Opcode.MEMCPY_DTOH: lambda: {"src": ptr, "size": min(size, 1 << 22), "stream": stream},
        Opcode.MEMCPY_DTOD: lambda: {
            "dst": ptr,
            "src": rng.choice((t.ptr2, ptr, t.ptr)),
            "size": size,
            "stream": stream,
        },
        Opcode.MEMSET: lambda: {
            "ptr": ptr,
            "value": rng.choice((0, 255, 256, -1)),
            "size": size,
            "stream": stream,
        },
        Opcode.MALLOC_HTOD: lambda: {"size": rng.choice((1, 16, 4096, 0, 2**63 - 1))},
        Opcode.STREAM_DESTROY: lambda: {"stream": rng.choice((t.stream, 0, 77))},
        Opcode.STREAM_SYNCHRONIZE: lambda: {"stream": stream},
        Opcode.STREAM_QUERY: lambda: {"stream": stream},
        Opcode.STREAM_WAIT_EVENT: lambda: {"stream": stream, "event": t.event},
        Opcode.STREAM_BEGIN_CAPTURE: lambda: {"stream": rng.choice((t.stream, 0, 9))},
        Opcode.STREAM_END_CAPTURE: lambda: {"stream": rng.choice((t.stream, 0, 9))},
        Opcode.EVENT_DESTROY: lambda: {"event": rng.choice((t.event, 0, 9))},
        Opcode.EVENT_RECORD: lambda: {"event": t.event, "stream": stream},
        Opcode.EVENT_SYNCHRONIZE: lambda: {"event": t.event},
        Opcode.EVENT_QUERY: lambda: {"event": t.event},
        Opcode.EVENT_ELAPSED_TIME: lambda: {"start": t.event, "end": rng.choice((t.event, 9))},
        Opcode.MODULE_COMPILE: lambda: {
            "source": rng.choice(("", 'extern "C" __global__ void k() {}', "\x00" * 100)),
            "name": rng.choice(("k.hip", "../../etc/passwd", "")),
            "options": rng.choice(([], ["-O3"], ["--bogus"] * 300)),
        },
        Opcode.COMPILE_AND_GET_FUNCTION: lambda: {
            "source": 'extern "C" __global__ void k() {}',
            "function": "k",
        },
        Opcode.MODULE_UNLOAD: lambda: {"module": rng.choice((t.module, 0, 9))},
        Opcode.MODULE_GET_FUNCTION: lambda: {
            "module": rng.choice((t.module, 9)),
            "name": rng.choice((*BUILTINS, "nope", "")),
        },
        Opcode.MODULE_BUILTIN: lambda: {"name": rng.choice((*BUILTINS, "nope", ""))},
        Opcode.LAUNCH_KERNEL: lambda: _launch(rng, t),
        Opcode.LAUNCH_KERNELS: lambda: _launches(rng, t),
        Opcode.MEMCPY_HTOD_MANY: lambda: _pieces(rng, t, stream),
        Opcode.GRAPH_DESTROY: lambda: {"graph": rng.choice((t.graph, 0, 9))},
        Opcode.GRAPH_ADD_MEMSET: lambda: {
            "graph": t.graph,
            "dependencies": rng.choice(([], [t.node], [9], [0])),
            "ptr": ptr,
            "value": 7,
            "size": size,
        },
        Opcode.GRAPH_ADD_MEMCPY: lambda: {
            "graph": t.graph,
            "dependencies": [],
            "dst": ptr,
            "src": t.ptr2,
            "size": size,
        },
        Opcode.GRAPH_ADD_KERNEL: lambda: {
            **_launch(rng, t),
            "graph": t.graph,
            "dependencies": rng.choice(([], [t.node], [1, 2, 3])),
        },
        Opcode.GRAPH_INSTANTIATE: lambda: {"graph": rng.choice((t.graph, 9))},
        Opcode.GRAPH_LAUNCH: lambda: {"exec": rng.choice((t.graph_exec, 9)), "stream": stream},
        Opcode.GRAPH_EXEC_DESTROY: lambda: {"exec": rng.choice((t.graph_exec, 9))},
    }
    build = builders.get(opcode)
    return build() if build is not None else rng.choice((None, {}, {"x": 1}))


def mutate_args(rng: random.Random, args: Any) -> Any:
    """Break ``args``: wrong container, a key dropped, retyped or set to an edge value."""
    choice = rng.randrange(8)
    if choice == 0 or not isinstance(args, dict) or not args:
        return interesting_value(rng)
    mutated = dict(args)
    key = rng.choice(list(mutated))
    if choice == 1:
        del mutated[key]
    elif choice == 2:
        mutated[key] = interesting_int(rng)
    elif choice == 3:
        mutated[key] = interesting_value(rng)
    elif choice == 4:
        mutated[key] = -abs(interesting_int(rng)) or -1
    elif choice == 5:
        mutated[rng.choice(("extra", key.upper() if isinstance(key, str) else "k", 7))] = (
            interesting_value(rng)
        )
    elif choice == 6:
        for k in list(mutated):
            if rng.random() < 0.5:
                mutated[k] = interesting_value(rng)
    else:
        mutated = {str(k).encode() if isinstance(k, str) else k: v for k, v in mutated.items()}
    return mutated


# --- frames ----------------------------------------------------------------------------

#: Opcodes by how often fuzzing picks them: the ones with arithmetic on sizes most.
_WEIGHTED_OPCODES: tuple[int, ...] = (
    *([Opcode.MEMCPY_HTOD, Opcode.MEMCPY_DTOH, Opcode.MEMCPY_DTOD, Opcode.MEMSET] * 4),
    *([Opcode.MALLOC, Opcode.FREE, Opcode.MALLOC_HTOD, Opcode.LAUNCH_KERNEL] * 3),
    *([Opcode.LAUNCH_KERNELS, Opcode.MEMCPY_HTOD_MANY] * 2),
    *([Opcode.GRAPH_ADD_KERNEL, Opcode.GRAPH_ADD_MEMSET, Opcode.GRAPH_ADD_MEMCPY] * 2),
    *(op for op in Opcode if op not in (Opcode.GOODBYE, Opcode.DATA)),
)


def pick_opcode(rng: random.Random) -> int:
    """An opcode to fuzz: mostly known ones, sometimes none at all."""
    roll = rng.random()
    if roll < 0.04:
        return rng.randrange(0, 0x10000)
    if roll < 0.05:
        return rng.choice((Opcode.GOODBYE, Opcode.DATA))
    return rng.choice(_WEIGHTED_OPCODES)


def _bulk_for(rng: random.Random, opcode: int, args: Any) -> bytes:
    if opcode == Opcode.MEMCPY_HTOD_MANY and isinstance(args, dict):
        sizes = args.get("size")
        if isinstance(sizes, list) and all(isinstance(s, int) for s in sizes):
            total = sum(sizes)
            if 0 <= total <= 1 << 17 and rng.random() < 0.8:
                return rng.randbytes(total + rng.choice((0, 0, 0, 1, -1 if total else 0)))
        return rng.randbytes(rng.choice((0, 1, 16, 4096)))
    if (
        opcode in (Opcode.MEMCPY_HTOD, Opcode.MALLOC_HTOD, Opcode.MODULE_LOAD)
        or rng.random() < 0.05
    ):
        size = args.get("size") if isinstance(args, dict) else None
        if isinstance(size, int) and 0 <= size <= 65536 and rng.random() < 0.7:
            return rng.randbytes(size + rng.choice((0, 0, 0, 1, -1 if size else 0)))
        return rng.randbytes(rng.choice((0, 1, 16, 4096)))
    return b""


def frame_of(
    opcode: int,
    request_id: int,
    flags: Flags = Flags.NONE,
    args: Any = None,
    bulk: bytes = b"",
    *,
    version: int = PROTOCOL_VERSION,
    note: str = "",
) -> FuzzFrame:
    """Encode a frame and note what the worker owes it."""
    try:
        data = encode_frame(opcode, request_id, flags, args, bulk, version)
    except (ValueError, TypeError, cbor2.CBOREncodeError, OverflowError, RecursionError):
        data = encode_frame(opcode, request_id, flags, None, bulk, version)
    return FuzzFrame(
        data,
        request_id,
        opcode,
        flags,
        expects_reply=_expects_reply(opcode, flags),
        ends_session=Flags.MORE in flags or opcode in (Opcode.GOODBYE, Opcode.DATA),
        note=note,
    )


def _expects_reply(opcode: int, flags: Flags) -> bool:
    """Whether the worker owes a frame a reply: not fire-and-forget, not the start of a
    stream, not a stray DATA, not a PING marked REPLY (an answer to the worker's own
    heartbeat, which needs none)."""
    if Flags.NO_REPLY in flags or Flags.MORE in flags or opcode == Opcode.DATA:
        return False
    return not (opcode == Opcode.PING and Flags.REPLY in flags)


def structured_frame(rng: random.Random, t: Targets, ids: IdSource) -> FuzzFrame:
    """A well-framed request with plausible, often mutated, arguments."""
    opcode = pick_opcode(rng)
    args = plausible_args(rng, opcode, t)
    if rng.random() < 0.6:
        args = mutate_args(rng, args)
    flags = Flags.NONE
    roll = rng.random()
    if roll < 0.12:
        flags = Flags.NO_REPLY
    elif roll < 0.15:
        flags = Flags(rng.randrange(0, 2**32) & ~int(Flags.MORE))
    elif roll < 0.17:
        flags = Flags.REPLY | rng.choice((Flags.NONE, Flags.ERROR))
    if (
        opcode == Opcode.SET_DEVICE
        and isinstance(args, dict)
        and args.get("device") == t.reserved_device
    ):
        args["device"] = 0
    if not t.kernel_faults and opcode in KERNEL_OPCODES:
        args = tame_launch(rng, args, t)
    version = PROTOCOL_VERSION
    if rng.random() < 0.03:
        version = rng.randrange(0, 0x10000)
    return frame_of(
        opcode,
        ids.take(),
        flags,
        args,
        _bulk_for(rng, opcode, args),
        version=version,
        note="structured",
    )


#: Requests that run a kernel (or put one in a graph that a later request runs).
KERNEL_OPCODES = frozenset({Opcode.LAUNCH_KERNEL, Opcode.LAUNCH_KERNELS, Opcode.GRAPH_ADD_KERNEL})
#: Grid blocks a tamed launch keeps: a grid-stride kernel over a few KiB needs no more,
#: and billions of blocks would hold the device for seconds.
TAME_MAX_BLOCKS = 1 << 12


def _tame_buffer(rng: random.Random, t: Targets) -> tuple[bytes, list[int]]:
    """Arguments of ``t.kernel`` whose every access lies in ``[t.ptr, t.ptr + t.size)``:
    its pointers all ``t.ptr``, its count at most the allocation's floats. With the
    offsets of its pointers."""
    n = rng.choice((0, 1, t.size // 4))
    data, ptrs = bytearray(), []
    for kind in BUILTINS[t.kernel].arg_kinds:
        width = 24 if kind == "probe_struct" else 8 if kind in ("ptr", "u64", "f64") else 4
        while len(data) % min(width, 8):
            data.append(0)
        if kind == "ptr":
            ptrs.append(len(data))
            data += t.ptr.to_bytes(8, "little")
        elif kind == "u64":
            data += n.to_bytes(8, "little")
        else:
            data += rng.randbytes(width)
    return bytes(data), ptrs


def tame_launch(rng: random.Random, args: Any, t: Targets) -> Any:
    """``args`` of a kernel request with whatever would run made safe (see
    :attr:`Targets.kernel_faults`), the rest left as fuzzed: a function other than the
    session's known one becomes a handle that never exists; argument buffers become
    in-bounds ones; every pointer offset is checked by the worker; a huge grid shrinks;
    a kernel that indexes dynamic shared memory by thread gets enough of it.
    Malformed fields stay malformed (the worker refuses them before any kernel runs)."""
    if not isinstance(args, dict):
        return args
    # Seen as the worker's decoder will see them: it drops the self-describing tag, so a
    # tagged null is a null (an absent field) there, and must be tamed as one.
    args = {key: _self_described(value) for key, value in args.items()}
    if args.get("function") != t.function:
        args["function"] = 2**64 - 1
    # A null or absent field is read as its default (no arguments, no pointer checked,
    # no shared memory), so it is tamed as that default would be.
    data, ptrs = _tame_buffer(rng, t)
    buffers = args.get("args")
    if buffers is None or isinstance(buffers, bytes):
        args["args"] = data
    elif isinstance(buffers, list) and all(isinstance(b, bytes) for b in buffers):
        args["args"] = [_tame_buffer(rng, t)[0] for _ in buffers]
    listed = args.get("ptrs")
    if listed is None:
        args["ptrs"] = ptrs
    elif isinstance(listed, list) and all(isinstance(p, int) for p in listed):
        args["ptrs"] = sorted(set(ptrs) | set(listed))
    blocks = _product(args.get("grid"))
    if blocks is not None and blocks > TAME_MAX_BLOCKS:
        args["grid"] = [rng.randrange(1, 8)]
    threads = _product(args.get("block"))
    need = SHARED_BYTES_PER_THREAD.get(t.kernel, 0) * (threads or 0)
    shared = args.get("shared_mem")
    if need and (shared is None or (type(shared) is int and 0 <= shared < need)):
        # Too little of the dynamic shared memory it indexes by thread: a fault.
        args["shared_mem"] = need
    return args


def _self_described(value: Any) -> Any:
    """``value`` without its self-describing CBOR tags (55799), which decoders drop."""
    while isinstance(value, cbor2.CBORTag) and value.tag == SELF_DESCRIBE_TAG:
        value = value.value
    return value


#: RFC 8949's "self-described CBOR" tag: a decoder returns the value it wraps.
SELF_DESCRIBE_TAG = 55799

#: Dynamic shared memory a built-in kernel indexes by thread (bytes per thread of a
#: block): launched with less, it writes past its shared memory and faults.
SHARED_BYTES_PER_THREAD = {"reduce_sum_f32": 4}


def _product(dims: Any) -> int | None:
    """The product of a geometry given as an int or a list of ints (None otherwise)."""
    values = dims if isinstance(dims, list) else [dims]
    if not values or not all(isinstance(d, int) and not isinstance(d, bool) for d in values):
        return None
    product = 1
    for d in values:
        product *= max(d, 1)
    return product


def without_kernels(frame: Callable[[], FuzzFrame]) -> FuzzFrame:
    """``frame()`` again until it makes no kernel request: for frames whose bytes are
    damaged after the fact, where a flipped bit could turn a tamed count into a wild one."""
    while True:
        made = frame()
        if made.opcode not in KERNEL_OPCODES:
            return made


def nasty_cbor_frame(rng: random.Random, ids: IdSource) -> FuzzFrame:
    """A request whose framing is intact and whose CBOR part is hostile."""
    cbor_part = rng.choice(NASTY_CBOR)
    declared = len(cbor_part)
    roll = rng.random()
    if roll < 0.1:
        declared = rng.choice((2**32 - 1, declared + 1, declared + 1000))
    elif roll < 0.15 and declared:
        declared -= 1
    payload = ARGS_LENGTH.pack(declared) + cbor_part + rng.randbytes(rng.choice((0, 0, 8)))
    opcode = rng.choice(_WEIGHTED_OPCODES)
    request_id = ids.take()
    header = HEADER.pack(MAGIC, PROTOCOL_VERSION, opcode, request_id, 0, len(payload))
    return FuzzFrame(
        header + payload,
        request_id,
        opcode,
        Flags.NONE,
        expects_reply=True,
        ends_session=False,
        note="nasty-cbor",
    )


def hello_frame(request_id: int, token: str | None, **extra: Any) -> bytes:
    """A valid HELLO."""
    args: dict[str, Any] = {"client": "hipr-fuzz", **extra}
    if token:
        args["token"] = token
    return encode_frame(Opcode.HELLO, request_id, Flags.NONE, args)


def with_flags(frame: FuzzFrame, flags: Flags) -> FuzzFrame:
    """``frame`` re-headed with other flags (the payload is kept as is)."""
    data = bytearray(frame.data)
    struct.pack_into("<I", data, 12, int(flags))
    return replace(
        frame,
        data=bytes(data),
        flags=flags,
        expects_reply=_expects_reply(frame.opcode, flags),
        ends_session=Flags.MORE in flags or frame.ends_session,
    )
