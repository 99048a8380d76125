"""Bounded CBOR decoding: no frame's arguments may cost more than a bounded amount of
memory or event-loop time to decode.

``cbor2.loads`` builds every item a payload declares: 32 MiB of one-byte empty maps is
32 million dicts (gigabytes, seconds of a frozen loop). Every data item takes at least
one byte, so a CBOR part of at most ``max_items`` bytes holds at most ``max_items``
items and goes straight to cbor2 (the fast path of every ordinary frame). A longer one
is walked first by :func:`scan`, which reads only the item heads (strings are skipped by
their declared length, containers counted by their declared size before any child is
read) and refuses the payload at the first item over ``max_items`` or container over
``max_depth``: its cost is bounded by the limit, not by the payload.

Map keys must be text or byte strings (cbor2's ``strict_hashable_types``): the worker's
arguments only ever use those, and integer keys chosen to share a hash make a dict's
inserts quadratic (24 KB of them froze the loop for 0.2 s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

from hipr.errors import ProtocolError

#: Items one frame's arguments may hold: 16x the largest request the worker knows
#: (4,096 pieces of a MEMCPY_HTOD_MANY, two lists of them), a few ms to decode.
DEFAULT_MAX_ITEMS = 1 << 16
#: Nesting of arrays, maps and tags that the scan allows: the worker's arguments nest
#: three deep at most. (A part short enough to skip the scan has cbor2's own limit, 400
#: levels, which its decoder holds without exhausting the C stack.)
DEFAULT_MAX_DEPTH = 32

_INDEFINITE = -1


@dataclass(frozen=True, slots=True)
class CborLimits:
    """What a frame's CBOR arguments may hold."""

    max_items: int = DEFAULT_MAX_ITEMS
    max_depth: int = DEFAULT_MAX_DEPTH

    def __post_init__(self) -> None:
        if self.max_items < 1 or self.max_depth < 1:
            raise ValueError("CBOR limits must be positive")


def limit_error(reason: str, message: str, limit: int) -> ProtocolError:
    """The refusal of a frame over a decoding limit (``details["refused"]`` names which,
    for the worker's counters)."""
    return ProtocolError(message=message, refused=reason, limit=limit)


def scan(
    data: bytes | bytearray | memoryview,
    limits: CborLimits,
    start: int = 0,
    end: int | None = None,
) -> int:
    """Walk the heads of the one CBOR item in ``data[start:end]``; its item count, or
    ProtocolError once it holds more than ``limits.max_items`` items or nests deeper
    than ``limits.max_depth``. Malformed input ends the walk quietly: cbor2 reports it.
    Offsets rather than a slice: no copy, and no view left exporting a bytearray."""
    max_items = limits.max_items
    max_depth = limits.max_depth
    n = len(data) if end is None else end
    pos = start
    items = 1
    #: Children still expected by each open container; _INDEFINITE until its break.
    stack: list[int] = []
    while pos < n:
        ib = data[pos]
        pos += 1
        major = ib >> 5
        info = ib & 31
        if stack and stack[-1] == _INDEFINITE and ib != 0xFF:
            items += 1
            if items > max_items:
                raise _too_many(max_items)
        if info < 24:
            arg = info
        elif info == 24:
            if pos >= n:
                return items
            arg = data[pos]
            pos += 1
        elif 25 <= info <= 27:
            width = 1 << (info - 24)
            if pos + width > n:
                return items
            arg = int.from_bytes(data[pos : pos + width], "big")
            pos += width
        elif info == 31:
            arg = _INDEFINITE
        else:
            return items  # reserved: malformed
        if major == 4 or major == 5:
            if arg == _INDEFINITE:
                stack.append(_INDEFINITE)
                if len(stack) > max_depth:
                    raise _too_deep(max_depth)
                continue
            count = arg if major == 4 else 2 * arg
            items += count
            if items > max_items:
                raise _too_many(max_items)
            if count > n - pos:
                return items  # declares more children than bytes left: malformed
            if count:
                stack.append(count)
                if len(stack) > max_depth:
                    raise _too_deep(max_depth)
                continue
        elif major == 6:
            # A tag wraps the one item that follows: a container of one.
            items += 1
            if items > max_items:
                raise _too_many(max_items)
            stack.append(1)
            if len(stack) > max_depth:
                raise _too_deep(max_depth)
            continue
        elif major == 2 or major == 3:
            if arg == _INDEFINITE:
                stack.append(_INDEFINITE)  # chunks until a break
                if len(stack) > max_depth:
                    raise _too_deep(max_depth)
                continue
            pos += arg
            if pos > n:
                return items
        elif major == 7 and info == 31:
            if not stack or stack[-1] != _INDEFINITE:
                return items  # a stray break: malformed
            stack.pop()
        elif major == 7 and arg == _INDEFINITE:
            return items
        # One item is complete: close every container it completes.
        while stack:
            left = stack[-1]
            if left == _INDEFINITE:
                break
            left -= 1
            if left:
                stack[-1] = left
                break
            stack.pop()
        else:
            return items
    return items


def _too_many(limit: int) -> ProtocolError:
    return limit_error(
        "cbor_items",
        f"the frame's CBOR arguments hold more than {limit} items (max_cbor_items)",
        limit,
    )


def _too_deep(limit: int) -> ProtocolError:
    return limit_error(
        "cbor_depth", f"the frame's CBOR arguments nest deeper than {limit} levels", limit
    )


def bounded_loads(limits: CborLimits) -> Callable[[bytes | bytearray | memoryview], Any]:
    """A ``cbor2.loads`` that refuses arguments over ``limits`` (ProtocolError with
    ``details["refused"]``) before building anything, and raises cbor2's own errors for
    malformed input."""
    max_items = limits.max_items
    loads = cbor2.loads

    def decode(data: bytes | bytearray | memoryview) -> Any:
        if len(data) > max_items:
            scan(data, limits)
        return loads(data, strict_hashable_types=True)

    return decode
