"""The built-in kernels of :mod:`hipr.kernels.builtins` as numpy code, for the emulator.

Each takes the same argument list as its HIP source (read back from the packed buffer
by :func:`hipr.kernels.kernel_args.unpack_args`) and gives the same result, bit for bit
where the source's arithmetic order allows. Device memory is reached through a
:data:`View` the backend supplies; a kernel that reads or writes outside it raises
:class:`KernelFault`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

#: A launch's grid or block: (x, y, z).
Dim3 = tuple[int, int, int]


class KernelFault(Exception):
    """A device-side failure: the caller turns it into hipErrorInvalidValue (checked at
    submission) or a pending hipErrorIllegalAddress (found while executing)."""


class StickyKernelFault(KernelFault):
    """A fault that poisons the emulated context, as an illegal address does on a GPU:
    every later call fails until the backend's ``reset_context``."""


#: Resolves (address, dtype, element count) to a view of emulated memory, or raises
#: KernelFault.
View = Callable[[int, "type[np.generic]", int], npt.NDArray[Any]]
KernelImpl = Callable[[View, tuple[Any, ...], Dim3, Dim3, int], None]


def _k_fill_f32(view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    out, value, n = args
    if n:
        view(out, np.float32, n)[...] = np.float32(value)


def _k_scale_f32(view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    x_ptr, a, n = args
    if n:
        x = view(x_ptr, np.float32, n)
        np.multiply(x, np.float32(a), out=x)


def _k_axpy_f32(view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    y_ptr, x_ptr, a, n = args
    if n:
        y = view(y_ptr, np.float32, n)
        x = view(x_ptr, np.float32, n)
        # Two float32 roundings, as the source reads (a compiler may fuse them into one FMA).
        np.add(y, np.multiply(x, np.float32(a)), out=y)


def _k_vector_add_f32(view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    c_ptr, a_ptr, b_ptr, n = args
    if n:
        c = view(c_ptr, np.float32, n)
        np.add(view(a_ptr, np.float32, n), view(b_ptr, np.float32, n), out=c)


def _k_reduce_sum_f32(view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    out_ptr, x_ptr, n = args
    # Thread 0 of every block adds into out[0] even when n is 0.
    out = view(out_ptr, np.float32, 1)
    bx = block[0]
    if shm < 4 * bx:
        # The HIP source keeps one float per thread in dynamic shared memory; with less,
        # a GPU reads and writes outside it (garbage on AMD, a fault on NVIDIA).
        raise KernelFault(
            f"reduce_sum_f32 needs shared_mem >= 4 * block.x = {4 * bx} bytes, got {shm}"
        )
    if n == 0:
        return
    x = view(x_ptr, np.float32, n)
    # Replay the kernel's arithmetic order so the float32 result matches a GPU's: each
    # thread sums its grid-stride slice in order, then each block folds its partials in a
    # shared-memory tree (which, like the source, drops values when block.x is not a
    # power of two), then blocks add atomically into out[0].
    threads = grid[0] * bx
    blocks_used = min(grid[0], -(-min(threads, n) // bx))
    width = blocks_used * bx
    if threads >= n:
        partial = np.zeros(width, dtype=np.float32)
        partial[:n] = x
    else:
        rows = -(-n // threads)
        padded = np.zeros(rows * threads, dtype=np.float32)
        padded[:n] = x
        # accumulate is strictly sequential (add.reduce may sum pairwise), matching each
        # thread's loop.
        partial = np.add.accumulate(padded.reshape(rows, threads), axis=0, dtype=np.float32)[-1]
    tree = partial[:width].reshape(blocks_used, bx).copy()
    s = bx // 2
    while s > 0:
        tree[:, :s] += tree[:, s : 2 * s]
        s >>= 1
    # accumulate is strictly sequential, like atomics landing one after another.
    sums = np.concatenate((out[:1], tree[:, 0])).astype(np.float32)
    out[0] = np.add.accumulate(sums, dtype=np.float32)[-1]


def _k_mixed_args_probe(
    view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int
) -> None:
    out_ptr, a8, a32, f, d, a16, (sa, sb, sc), n = args
    if n:
        out = view(out_ptr, np.float64, n)
        # Python floats are IEEE doubles, and this is the source's left-to-right order,
        # so the result is bit-identical to the HIP kernel's.
        base = float(a8) + float(a32) + float(f) + d + float(a16) + float(sa) + sb + float(sc)
        np.add(base, np.arange(n, dtype=np.float64), out=out)


def _k_copy_from_address_u8(
    view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int
) -> None:
    out_ptr, address, n = args
    if not n:
        return
    out = view(out_ptr, np.uint8, n)
    try:
        # Any live allocation of this process, whoever made it: a kernel's raw read is
        # not bound by the worker's pointer checks (that is what this kernel shows).
        source = view(address, np.uint8, n)
    except KernelFault as fault:
        raise StickyKernelFault(f"raw read of {n} bytes at {address:#x}: {fault}") from None
    out[...] = source


def spin_until_flag(view: View, args: tuple[Any, ...], stopped: Callable[[], bool]) -> None:
    """The emulator's ``spin_until_flag``: polls the flag (sleeping between looks, so a
    spinning session leaves the interpreter to the others, as a GPU kernel leaves the
    host CPU) until it is set or ``stopped()`` says the context is gone."""
    while not stopped():
        if int(view(args[0], np.uint32, 1)[0]) != 0:
            return
        time.sleep(0.002)
    raise KernelFault("the context was torn down while the kernel ran")


def _k_add_bias_f32(view: View, args: tuple[Any, ...], grid: Dim3, block: Dim3, shm: int) -> None:
    # The module's variables come after the kernel's own arguments (BuiltinKernel.reads).
    x_ptr, n, bias_ptr = args
    if n:
        x = view(x_ptr, np.float32, n)
        np.add(x, view(bias_ptr, np.float32, 1)[0], out=x)


NUMPY_KERNELS: Final[dict[str, KernelImpl]] = {
    "add_bias_f32": _k_add_bias_f32,
    "fill_f32": _k_fill_f32,
    "scale_f32": _k_scale_f32,
    "axpy_f32": _k_axpy_f32,
    "vector_add_f32": _k_vector_add_f32,
    "reduce_sum_f32": _k_reduce_sum_f32,
    "mixed_args_probe": _k_mixed_args_probe,
    "copy_from_address_u8": _k_copy_from_address_u8,
}
