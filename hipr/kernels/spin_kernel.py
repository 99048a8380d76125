"""A kernel that never ends unless told to: what runaway work looks like, for tests.

``spin_until_flag(flag)`` spins while ``flag[0] == 0`` (a ``uint32``). Nobody else can
set the flag (it is the session's own memory, and the session's later requests queue
behind the kernel), so once launched it runs until its context is torn down: exactly
the kernel that a crashed or careless client leaves behind. The emulator offers it in
its built-in module (it stops there when the backend closes or the process ends); GPU
hosts compile :data:`SPIN_SOURCE` with ``gpu.compile()``. It is kept out of
:data:`hipr.kernels.builtins.BUILTINS`, which fuzzers and conformance suites launch at
random.
"""

from __future__ import annotations

from hipr.kernels.builtins import BuiltinKernel

#: The spinning kernel's name.
SPIN_KERNEL_NAME = "spin_until_flag"

SPIN_KERNEL = BuiltinKernel(
    SPIN_KERNEL_NAME,
    (("flag", "ptr"),),
    "spins while flag[0] == 0 (uint32): never ends unless its flag is set or its "
    "context is torn down (tests of runaway work)",
)

#: The same kernel for a GPU backend's compiler (hiprtc / NVRTC with the HIP prelude).
SPIN_SOURCE = r"""
#include <hip/hip_runtime.h>
extern "C" __global__ void spin_until_flag(volatile unsigned int* flag) {
  while (flag[0] == 0) {}
}
"""
