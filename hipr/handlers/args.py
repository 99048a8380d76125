"""Strict readers for a request's CBOR arguments.

Arguments arrive from an untrusted peer: every read checks the type and range and
names the argument in its error, so a wrong type never becomes a crash or a silent
truncation (``-1`` as a size, ``2**64`` as an address, a string where a list is due).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from hipr.errors import invalid_value

U64_MAX = 2**64 - 1
#: Sizes are bounded below 2**63 so that ``ptr + size`` arithmetic stays meaningful.
SIZE_MAX = 2**63 - 1
MAX_STRING = 1 << 20
#: The largest launch dimension a runtime takes.
_DIM_MAX = 2**31 - 1


def _shown(value: object) -> str:
    """A short rendering of an untrusted value that never raises: ``repr`` refuses ints
    of more than 4300 digits, and would render a megabyte list in full."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    try:
        return reprlib.repr(value)
    except Exception:
        return f"a {type(value).__name__}"


#: The arguments of a request that sent none: shared, as Args never writes its map.
_NO_ARGS: dict[Any, Any] = {}


class Args:
    """Typed access to one request's argument map."""

    __slots__ = ("_map", "_opcode")

    def __init__(self, raw: object, opcode_name: str) -> None:
        if raw is None:
            raw = _NO_ARGS
        # A dict (what CBOR maps decode to) is tested by type first: the ABC's
        # isinstance costs more than the rest of this for every request.
        if type(raw) is not dict and not isinstance(raw, Mapping):
            raise invalid_value(f"{opcode_name}: arguments must be a map, got {type(raw).__name__}")
        self._map: Mapping[Any, Any] = raw
        self._opcode = opcode_name

    def _fail(self, key: str, wanted: str, value: object) -> Exception:
        shown = _shown(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return invalid_value(f"{self._opcode}: argument '{key}' must be {wanted}, got {shown}")

    def bad(self, key: str, wanted: str) -> Exception:
        """hipErrorInvalidValue saying that ``key`` must be ``wanted`` (a check of the
        handler's own beyond the type readers below)."""
        return self._fail(key, wanted, self._map.get(key))

    def has(self, key: str) -> bool:
        """True when ``key`` is present and not null."""
        return self._map.get(key) is not None

    def _get(self, key: str, optional: bool) -> Any:
        value = self._map.get(key)
        if value is None and not optional:
            raise invalid_value(f"{self._opcode}: missing argument '{key}'")
        return value

    def integer(
        self, key: str, *, low: int = 0, high: int = U64_MAX, default: int | None = None
    ) -> int:
        """An integer in ``[low, high]``."""
        value = self._map.get(key)
        if type(value) is int and low <= value <= high:
            return value  # the usual case first: these reads run for every request
        value = self._get(key, default is not None)
        if value is None:
            assert default is not None
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, "an integer", value)
        if not low <= value <= high:
            raise self._fail(key, f"in [{low}, {high}]", value)
        return value

    def size(self, key: str, *, default: int | None = None) -> int:
        """A byte count in [0, 2**63)."""
        return self.integer(key, low=0, high=SIZE_MAX, default=default)

    def address(self, key: str) -> int:
        """A device address (u64)."""
        return self.integer(key, low=0, high=U64_MAX)

    def flag(self, key: str) -> bool:
        """A boolean; absent or null means false. Integers are not booleans."""
        value = self._map.get(key)
        if value is None or type(value) is bool:
            return bool(value)
        raise self._fail(key, "true or false", value)

    def handle(self, key: str, *, optional: bool = False) -> int | None:
        """A per-session handle id; 0 or absent means none when ``optional``."""
        value = self._map.get(key)
        if type(value) is int and 0 < value <= U64_MAX:
            return value
        value = self._get(key, optional)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
            raise self._fail(key, "a handle id", value)
        if value == 0:
            if optional:
                return None
            raise self._fail(key, "a handle id", value)
        return value

    def number(self, key: str) -> float:
        """A finite number."""
        value = self._get(key, False)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, "a number", value)
        try:
            number = float(value)
        except OverflowError:  # an int beyond the double range
            number = math.inf
        if not math.isfinite(number):
            raise self._fail(key, "a finite number", value)
        return number

    def text(self, key: str, *, default: str | None = None, max_length: int = MAX_STRING) -> str:
        """A text string."""
        value = self._get(key, default is not None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, str) or len(value) > max_length:
            raise self._fail(key, f"a string of at most {max_length} characters", value)
        return value

    def blob(self, key: str, *, max_length: int = SIZE_MAX) -> bytes:
        """A byte string."""
        value = self._get(key, False)
        if not isinstance(value, bytes) or len(value) > max_length:
            raise self._fail(key, f"a byte string of at most {max_length} bytes", value)
        return value

    def blob_list(self, key: str, *, max_items: int, max_length: int) -> list[bytes]:
        """A non-empty list of byte strings of at most ``max_length`` bytes each."""
        value = self._get(key, False)
        if type(value) is not list or not 1 <= len(value) <= max_items:
            raise self._fail(key, f"a list of 1 to {max_items} byte strings", value)
        for item in value:
            if type(item) is not bytes or len(item) > max_length:
                raise self._fail(
                    key, f"a list of byte strings of at most {max_length} bytes", value
                )
        return value

    def str_list(self, key: str, *, max_items: int = 256, max_length: int = 4096) -> list[str]:
        """A list of strings of at most ``max_length`` characters each (empty when absent)."""
        value = self._map.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise self._fail(key, f"a list of at most {max_items} strings", value)
        if not all(isinstance(v, str) and len(v) <= max_length for v in value):
            raise self._fail(key, f"a list of strings of at most {max_length} characters", value)
        return list(value)

    def int_list(self, key: str, *, max_items: int = 4096, high: int = U64_MAX) -> list[int]:
        """A list of non-negative integers (empty when absent)."""
        value = self._map.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise self._fail(key, f"a list of at most {max_items} integers", value)
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= high:
                raise self._fail(key, f"a list of integers in [0, {high}]", value)
        return list(value)

    def dim3(self, key: str) -> tuple[int, int, int]:
        """A launch dimension: 1 to 3 positive integers, padded with 1."""
        value = self._map.get(key)
        if type(value) is list:  # the usual shapes first, checked without a loop
            if len(value) == 1:
                x = value[0]
                if type(x) is int and 1 <= x <= _DIM_MAX:
                    return (x, 1, 1)
            elif len(value) == 3:
                x, y, z = value
                if (
                    type(x) is int
                    and type(y) is int
                    and type(z) is int
                    and 1 <= x <= _DIM_MAX
                    and 1 <= y <= _DIM_MAX
                    and 1 <= z <= _DIM_MAX
                ):
                    return (x, y, z)
        value = self._get(key, False)
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not 1 <= len(value) <= 3:
            raise self._fail(key, "1 to 3 positive integers", value)
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _DIM_MAX:
                raise self._fail(key, "1 to 3 integers in [1, 2**31-1]", value)
        padded = [*value, 1, 1][:3]
        return (padded[0], padded[1], padded[2])
