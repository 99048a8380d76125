"""Built-in kernels are checked at ``launch()`` against their declarations, and the
declarations match the kernels' source (so docs/kernels.md, generated from them, is true)."""

from __future__ import annotations

import ctypes
import re
from collections.abc import AsyncIterator

import numpy as np
import pytest

import hipr
from hipr.backends.emulator import EmulatorBackend
from hipr.errors import HipErrorCode as E
from hipr.kernels.builtins import BUILTIN_SOURCE, BUILTINS, C_TYPES, source_params
from hipr.worker.config import WorkerConfig
from hipr.worker.server import running_worker


def test_declarations_match_the_source() -> None:
    in_source = re.findall(r'extern "C" __global__ void (\w+)\(', BUILTIN_SOURCE)
    assert sorted(in_source) == sorted(BUILTINS)
    for name, kernel in BUILTINS.items():
        declared = source_params(name)
        assert [p for _, p in declared] == [p for p, _ in kernel.params], name
        for (ctype, pname), (_, kind) in zip(declared, kernel.params, strict=True):
            if kind == "ptr":
                assert ctype.endswith("*"), (name, pname, ctype)
            else:
                assert ctype == C_TYPES[kind], (name, pname, ctype)


def test_reduce_needs_shared_memory_per_thread() -> None:
    assert "shared" in BUILTIN_SOURCE.split("reduce_sum_f32", 1)[1].split("}", 1)[0].lower()
    assert BUILTINS["reduce_sum_f32"].shared_bytes_per_thread == 4
    assert all(k.shared_bytes_per_thread == 0 for n, k in BUILTINS.items() if n != "reduce_sum_f32")


def test_kernels_page_lists_every_builtin_with_its_arguments() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "kernels.md").read_text()
    for name, kernel in BUILTINS.items():
        [row] = [line for line in page.splitlines() if line.startswith(f"| `{name}` |")]
        cells = row.split(" | ")
        positions = [cells[1].index(f"`{p}`") for p, _ in kernel.params]
        assert positions == sorted(positions), row  # in order
        assert ("4 * block.x" in cells[2]) == (name == "reduce_sum_f32")


pytestmark = pytest.mark.anyio


@pytest.fixture
async def gpu(anyio_backend: str) -> AsyncIterator[hipr.AsyncGpu]:
    backend = EmulatorBackend(device_count=1, total_memory=16 << 20)
    async with (
        running_worker(WorkerConfig(), backend, ["tcp://127.0.0.1:0"]) as worker,
        hipr.aconnect(worker.bound_urls[0]) as client,
    ):
        yield client


async def _refused_at_launch(gpu: hipr.AsyncGpu, launch: object) -> str:
    with pytest.raises(hipr.HipError) as err:
        await launch  # type: ignore[misc]
    assert err.value.code == E.hipErrorInvalidValue
    await gpu.synchronize()  # nothing was sent: nothing is left to report
    return err.value.message


async def test_wrong_count_fails_at_launch(gpu: hipr.AsyncGpu) -> None:
    x = await gpu.malloc(64)
    fill = await gpu.builtin("fill_f32")
    message = await _refused_at_launch(gpu, fill.launch(1, 16, [x, np.float32(1)]))
    assert "fill_f32 takes 3 arguments, got 2" in message
    assert "fill_f32(out: DevicePtr, value: np.float32, n: np.uint64)" in message


async def test_wrong_type_fails_at_launch(gpu: hipr.AsyncGpu) -> None:
    y, x = await gpu.malloc(64), await gpu.malloc(64)
    axpy = await gpu.builtin("axpy_f32")
    # BLAS order (a, x, y, n) is the natural slip: a float where y belongs.
    message = await _refused_at_launch(
        gpu, axpy.launch(1, 16, [np.float32(2), x, y, np.uint64(16)])
    )
    assert "argument 0 (y) of axpy_f32 must be DevicePtr, got float32" in message
    message = await _refused_at_launch(
        gpu, axpy.launch(1, 16, [y, x, np.float64(2), np.uint64(16)])
    )
    assert "argument 2 (a) of axpy_f32 must be np.float32, got float64" in message
    # ctypes scalars of the right type are fine.
    await axpy.launch(1, 16, [y, x, ctypes.c_float(2), ctypes.c_uint64(16)])
    await gpu.synchronize()


async def test_reduce_without_shared_memory_fails_at_launch(gpu: hipr.AsyncGpu) -> None:
    n = 1000
    out, x = await gpu.malloc(4), await gpu.malloc(4 * n)
    await gpu.memcpy_htod(x, np.ones(n, np.float32))
    await gpu.memset(out, 0, 4)
    reduce = await gpu.builtin("reduce_sum_f32")
    args = [out, x, np.uint64(n)]
    message = await _refused_at_launch(gpu, reduce.launch(2, 128, args))
    assert "needs shared_mem >= 4 * block.x = 512 bytes, got 0" in message
    assert "shared_mem=512" in message
    message = await _refused_at_launch(gpu, reduce.launch(2, (128, 1, 1), args, shared_mem=256))
    assert "got 256" in message
    await reduce.launch(2, (128, 1, 1), args, shared_mem=512)
    got = np.empty(1, np.float32)
    await gpu.memcpy_dtoh(out, 4, out=got)
    assert got[0] == n


async def test_compiled_kernels_are_not_held_to_builtin_rules(gpu: hipr.AsyncGpu) -> None:
    fill = await gpu.builtin("fill_f32")
    assert fill._builtin is BUILTINS["fill_f32"]
    other = hipr.Function(gpu, fill.id, "my_kernel")
    assert other._builtin is None
