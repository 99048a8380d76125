"""A kernel's launch plans (``Function._launch_plan``): what launches of one
configuration share is checked and built once, and each launch packs only its
arguments. The checks stay what they were: every launch checks its handles, values
equal to a kept plan's but of other types are refused as before, and any iterable of
arguments, any geometry spelling and any number of configurations still work."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hipr
from hipr.client.objects import _MAX_PLANS
from hipr.worker.server import Worker


def plans(kernel: Any) -> dict[Any, Any]:
    """The plans a kernel (a sync proxy's Function) keeps."""
    return getattr(kernel, "_target", kernel)._plans  # type: ignore[no-any-return]


def floats(gpu: Any, ptr: Any, count: int) -> list[float]:
    return np.frombuffer(gpu.memcpy_dtoh(ptr, 4 * count), np.float32).tolist()


def test_launches_of_one_configuration_share_one_plan(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        out = gpu.malloc(4 * 100)
        fill = gpu.builtin("fill_f32")
        grid = (1, 1, 1)
        for i in range(100):
            fill.launch(grid, (1, 1, 1), [out + 4 * i, np.float32(i), np.uint64(1)])
        gpu.synchronize()
        assert len(plans(fill)) == 1
        assert floats(gpu, out, 100) == list(map(float, range(100)))
        # Another spelling of the same geometry, an iterator of arguments, a list for
        # the grid (not kept: unhashable): all launch, in order.
        fill.launch((1,), 1, iter([out, np.float32(7.0), np.uint64(2)]))
        fill.launch([1], [1, 1], (out + 8, np.float32(8.0), np.uint64(1)))
        gpu.synchronize()
        assert floats(gpu, out, 3) == [7.0, 7.0, 8.0]


@pytest.mark.parametrize(
    ("grid", "block", "shared_mem"),
    [
        (True, 1, 0),
        (1, np.int64(1), 0),
        ((1, True, 1), 1, 0),
        (1, (1.0, 1, 1), 0),
        (1, 1, 0.0),
    ],
)
def test_a_value_equal_to_a_kept_plans_but_of_another_type_is_refused(
    threaded_worker: Worker, grid: Any, block: Any, shared_mem: Any
) -> None:
    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        out = gpu.malloc(16)
        fill = gpu.builtin("fill_f32")
        args = [out, np.float32(1.0), np.uint64(1)]
        fill.launch(1, 1, args)
        fill.launch((1, 1, 1), (1, 1, 1), args)
        with pytest.raises(hipr.HipError) as err:
            fill.launch(grid, block, args, shared_mem=shared_mem)
        assert err.value.code == hipr.HipErrorCode.hipErrorInvalidValue
        gpu.synchronize()


def test_a_bad_argument_value_is_refused_with_a_kept_plan(threaded_worker: Worker) -> None:
    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        out = gpu.malloc(16)
        fill = gpu.builtin("fill_f32")
        fill.launch(1, 1, [out, np.float32(1.0), np.uint64(1)])
        with pytest.raises(hipr.HipError, match="kernel argument"):
            fill.launch(1, 1, [out, np.float32(1.0), 1])  # a plain int: no C width
        gpu.synchronize()


def test_plans_are_bounded_and_every_configuration_still_launches(
    threaded_worker: Worker,
) -> None:
    with hipr.connect(threaded_worker.bound_urls[0]) as gpu:
        count = _MAX_PLANS + 8
        out = gpu.malloc(4 * count)
        fill = gpu.builtin("fill_f32")
        for i in range(count):  # a new block size each time: a new plan each
            fill.launch(1, i + 1, [out, np.float32(i), np.uint64(i + 1)])
            assert len(plans(fill)) <= _MAX_PLANS
        gpu.synchronize()
        assert floats(gpu, out, count) == [float(count - 1)] * count


def test_a_launch_after_the_connection_closed_fails_here(threaded_worker: Worker) -> None:
    gpu = hipr.connect(threaded_worker.bound_urls[0])
    out = gpu.malloc(16)
    fill = gpu.builtin("fill_f32")
    stream = gpu.stream_create()
    fill.launch(1, 1, [out, np.float32(1.0), np.uint64(1)], stream=stream)
    gpu.synchronize()
    gpu.close()
    with pytest.raises(hipr.HipError, match="closed"):
        fill.launch(1, 1, [out, np.float32(1.0), np.uint64(1)], stream=stream)
