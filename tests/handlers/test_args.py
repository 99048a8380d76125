"""Argument readers: their fast paths for the usual shapes against the rules they keep.

``Args.integer``, ``handle`` and ``dim3`` take plain ints (and 1- or 3-element lists)
first, without their general checks; every other value goes the general way. Both ways
must accept exactly what the rules accept and give the same values.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipr.errors import HipError, HipErrorCode
from hipr.handlers.args import U64_MAX, Args


class Small(enum.IntEnum):
    ONE = 1


SCALARS = st.one_of(
    st.integers(min_value=-(2**65), max_value=2**65),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, U64_MAX, U64_MAX + 1, -1]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.none(),
    st.just(Small.ONE),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except HipError as exc:
        assert exc.code == HipErrorCode.hipErrorInvalidValue
        return "invalid", None


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_dim3_accepts_one_to_three_positive_ints(value: Any) -> None:
    items = value if isinstance(value, list) else [value]
    valid = 1 <= len(items) <= 3 and all(_is_int(v) and 1 <= v <= 2**31 - 1 for v in items)
    expected = ("ok", tuple(int(v) for v in [*items, 1, 1][:3])) if valid else ("invalid", None)
    assert _read(lambda: Args({"grid": value}, "T").dim3("grid")) == expected


@settings(max_examples=400, deadline=None)
@given(SCALARS, st.sampled_from([(0, U64_MAX), (1, 10), (-5, 5)]), st.sampled_from([None, 3]))
def test_integer_in_range_or_default(value: Any, bounds: tuple[int, int], default: Any) -> None:
    low, high = bounds
    if value is None and default is not None:
        expected: tuple[str, Any] = ("ok", default)
    elif _is_int(value) and low <= value <= high:
        expected = ("ok", value)
    else:
        expected = ("invalid", None)
    read = _read(lambda: Args({"n": value}, "T").integer("n", low=low, high=high, default=default))
    assert read == expected


@settings(max_examples=400, deadline=None)
@given(SCALARS, st.booleans())
def test_handle_is_a_positive_u64_or_none_when_optional(value: Any, optional: bool) -> None:
    if optional and (value is None or (_is_int(value) and value == 0)):
        expected: tuple[str, Any] = ("ok", None)
    elif _is_int(value) and 0 < value <= U64_MAX:
        expected = ("ok", value)
    else:
        expected = ("invalid", None)
    assert _read(lambda: Args({"h": value}, "T").handle("h", optional=optional)) == expected


@pytest.mark.parametrize("value", [[1], [4, 5, 6], 7, [2, 3]])
def test_dim3_pads_with_ones(value: Any) -> None:
    items = value if isinstance(value, list) else [value]
    assert Args({"block": value}, "T").dim3("block") == tuple([*items, 1, 1][:3])
