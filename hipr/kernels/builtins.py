"""Built-in kernels available on every backend, with one argument list everywhere.

GPU backends compile :data:`BUILTIN_SOURCE` at run time (hiprtc / NVRTC with the HIP
prelude); the emulator runs numpy versions with the same signatures. Every kernel uses
a grid-stride loop, so any launch geometry covers all ``n`` elements.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hipr.errors import invalid_value

#: Argument kinds: ``ptr`` is an 8-byte device pointer; the rest are C scalar types.
ArgKind = str

#: The C type of each argument kind, as the kernels' source declares it.
C_TYPES: dict[ArgKind, str] = {
    "ptr": "pointer",
    "i8": "signed char",
    "i16": "short",
    "i32": "int",
    "u64": "unsigned long long",
    "f32": "float",
    "f64": "double",
    "probe_struct": "ProbeStruct",
}

#: What a caller passes for each scalar kind: the numpy type (or a ctypes one).
_NUMPY: dict[ArgKind, type] = {
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "u64": np.uint64,
    "f32": np.float32,
    "f64": np.float64,
}
_CTYPES: dict[ArgKind, tuple[type, ...]] = {
    "i8": (ctypes.c_int8,),
    "i16": (ctypes.c_int16,),
    "i32": (ctypes.c_int32,),
    "u64": (ctypes.c_uint64,),
    "f32": (ctypes.c_float,),
    "f64": (ctypes.c_double,),
}


@dataclass(frozen=True, slots=True)
class BuiltinKernel:
    """A built-in kernel: its name, its parameters in order (``(name, kind)``, with the
    C type of each in the source), the dynamic shared memory it needs per thread of a
    block's x dimension, and what it computes."""

    name: str
    params: tuple[tuple[str, ArgKind], ...]
    doc: str
    #: ``shared_mem`` must be at least this many bytes times ``block.x``.
    shared_bytes_per_thread: int = 0
    #: The module's variables (:data:`BUILTIN_GLOBALS`) the kernel reads.
    reads: tuple[str, ...] = ()

    @property
    def arg_kinds(self) -> tuple[ArgKind, ...]:
        """The argument kinds in order."""
        return tuple(kind for _, kind in self.params)

    def signature(self) -> str:
        """``fill_f32(out: float*, value: np.float32, n: np.uint64)``, for messages and docs."""
        return f"{self.name}({', '.join(f'{n}: {_shown(k)}' for n, k in self.params)})"

    def check_launch(self, args: Sequence[object], block: object, shared_mem: int) -> None:
        """Refuse, at ``launch()``, what would fail on the device: a wrong count or type of
        arguments, or too little dynamic shared memory. Raises hipErrorInvalidValue."""
        # Types first: a plain int among too few arguments is the likelier mistake.
        for index, ((pname, kind), arg) in enumerate(zip(self.params, args, strict=False)):
            if not _is_kind(arg, kind):
                raise invalid_value(
                    f"kernel argument {index} ({pname}) of {self.name} must be "
                    f"{_shown(kind)}, got {type(arg).__name__}: call it as {self.signature()}"
                )
        if len(args) != len(self.params):
            raise invalid_value(
                f"{self.name} takes {len(self.params)} arguments, got {len(args)}: "
                f"call it as {self.signature()}"
            )
        if self.shared_bytes_per_thread:
            bx = _block_x(block)
            need = self.shared_bytes_per_thread * (bx or 0)
            if bx is not None and shared_mem < need:
                raise invalid_value(
                    f"{self.name} needs shared_mem >= {self.shared_bytes_per_thread} * "
                    f"block.x = {need} bytes, got {shared_mem}: launch it with "
                    f"shared_mem={need}"
                )


def _shown(kind: ArgKind) -> str:
    if kind == "ptr":
        return "DevicePtr"
    if kind == "probe_struct":
        return "ctypes ProbeStruct (24 bytes)"
    return f"np.{_NUMPY[kind].__name__}"


def _is_kind(arg: object, kind: ArgKind) -> bool:
    if kind == "ptr":
        return bool(getattr(arg, "is_device_pointer", False))
    if kind == "probe_struct":
        return isinstance(arg, ctypes.Structure) and ctypes.sizeof(arg) == 24
    return type(arg) is _NUMPY[kind] or isinstance(arg, _CTYPES[kind])


def _block_x(block: object) -> int | None:
    if isinstance(block, int):
        return block
    if isinstance(block, tuple | list) and block and isinstance(block[0], int):
        return block[0]
    return None  # malformed: the launch's own checks say so


BUILTINS: dict[str, BuiltinKernel] = {
    k.name: k
    for k in (
        BuiltinKernel(
            "fill_f32",
            (("out", "ptr"), ("value", "f32"), ("n", "u64")),
            "out[i] = value for i < n",
        ),
        BuiltinKernel(
            "scale_f32", (("x", "ptr"), ("a", "f32"), ("n", "u64")), "x[i] *= a for i < n"
        ),
        BuiltinKernel(
            "axpy_f32",
            (("y", "ptr"), ("x", "ptr"), ("a", "f32"), ("n", "u64")),
            "y[i] += a * x[i] for i < n (y first: not BLAS's order)",
        ),
        BuiltinKernel(
            "vector_add_f32",
            (("c", "ptr"), ("a", "ptr"), ("b", "ptr"), ("n", "u64")),
            "c[i] = a[i] + b[i] for i < n",
        ),
        BuiltinKernel(
            "reduce_sum_f32",
            (("out", "ptr"), ("x", "ptr"), ("n", "u64")),
            "out[0] += sum(x[0:n]) (atomic; zero out[0] first; block.x a power of two)",
            shared_bytes_per_thread=4,
        ),
        BuiltinKernel(
            "mixed_args_probe",
            (
                ("out", "ptr"),
                ("a8", "i8"),
                ("a32", "i32"),
                ("f", "f32"),
                ("d", "f64"),
                ("a16", "i16"),
                ("s", "probe_struct"),
                ("n", "u64"),
            ),
            "out[i] = a8 + a32 + f + d + a16 + s.a + s.b + s.c + i for i < n "
            "(float64 out; proves every argument width and alignment arrives intact)",
        ),
        BuiltinKernel(
            "add_bias_f32",
            (("x", "ptr"), ("n", "u64")),
            "x[i] += hipr_builtin_bias for i < n: the module's `__device__ float` variable "
            "(0 when loaded), set with hipMemcpyToSymbol / MODULE_GET_GLOBAL. The built-in "
            "module is shared by the worker process's sessions, and so is this variable",
            reads=("hipr_builtin_bias",),
        ),
        BuiltinKernel(
            "copy_from_address_u8",
            (("out", "ptr"), ("address", "u64"), ("n", "u64")),
            "out[i] = ((const uint8_t*)address)[i] for i < n: a raw read of an address "
            "passed as a plain integer, which the worker cannot check (a kernel may compute "
            "any address); an address outside every allocation of the process faults and "
            "poisons the context, on a GPU and on the emulator alike",
        ),
    )
}


#: The built-in module's variables: name -> (size in bytes, what it is). The emulator
#: keeps them in its device memory as a GPU keeps a module's globals.
BUILTIN_GLOBALS: dict[str, tuple[int, str]] = {
    "hipr_builtin_bias": (4, "`__device__ float`, 0 when the module loads: what add_bias_f32 adds"),
}


def source_params(name: str) -> list[tuple[str, str]]:
    """``(C type, parameter name)`` of kernel ``name`` as :data:`BUILTIN_SOURCE` declares
    it: what the declarations in :data:`BUILTINS` are checked against."""
    found = re.search(
        rf'extern "C" __global__ void {re.escape(name)}\((.*?)\)\s*{{', BUILTIN_SOURCE, re.S
    )
    if found is None:
        raise KeyError(f"{name} is not in BUILTIN_SOURCE")
    out = []
    for part in found.group(1).split(","):
        ctype, _, pname = " ".join(part.split()).rpartition(" ")
        if pname.startswith("*"):
            ctype, pname = ctype + "*", pname[1:]
        out.append((ctype.replace(" *", "*"), pname))
    return out


def kernels_markdown_table() -> str:
    """The table of built-in kernels for ``docs/kernels.md``."""
    rows = [
        "| kernel | arguments, in order (C type in the source) | dynamic shared memory "
        "| computes |",
        "|---|---|---|---|",
    ]
    for k in BUILTINS.values():
        ctypes_of = dict((p, c) for c, p in source_params(k.name))
        params = ", ".join(
            f"`{n}`: {_shown(kind)} (`{ctypes_of.get(n, '?')}`)" for n, kind in k.params
        )
        shared = (
            f"`{k.shared_bytes_per_thread} * block.x` bytes"
            if k.shared_bytes_per_thread
            else "none"
        )
        doc = k.doc.replace("|", "\\|")
        rows.append(f"| `{k.name}` | {params} | {shared} | {doc} |")
    return "\n".join(rows)


#: ``struct ProbeStruct { int8_t a; double b; int16_t c; }`` (24 bytes, align 8).
PROBE_STRUCT_C = "struct ProbeStruct { signed char a; double b; short c; };"

BUILTIN_SOURCE = r"""
#include <hip/hip_runtime.h>

struct ProbeStruct { signed char a; double b; short c; };

#define HIPR_GRID_STRIDE(i, n) \
  for (unsigned long long i = (unsigned long long)hipBlockIdx_x * hipBlockDim_x + hipThreadIdx_x; \
       i < (n); i += (unsigned long long)hipBlockDim_x * hipGridDim_x)

__device__ float hipr_builtin_bias = 0.0f;

extern "C" __global__ void fill_f32(float* out, float value, unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) out[i] = value;
}

extern "C" __global__ void scale_f32(float* x, float a, unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) x[i] *= a;
}

extern "C" __global__ void axpy_f32(float* y, const float* x, float a, unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) y[i] += a * x[i];
}

extern "C" __global__ void vector_add_f32(float* c, const float* a, const float* b,
                                          unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) c[i] = a[i] + b[i];
}

extern "C" __global__ void reduce_sum_f32(float* out, const float* x, unsigned long long n) {
  HIP_DYNAMIC_SHARED(float, partial)
  float acc = 0.0f;
  HIPR_GRID_STRIDE(i, n) acc += x[i];
  partial[hipThreadIdx_x] = acc;
  __syncthreads();
  for (unsigned int s = hipBlockDim_x / 2; s > 0; s >>= 1) {
    if (hipThreadIdx_x < s) partial[hipThreadIdx_x] += partial[hipThreadIdx_x + s];
    __syncthreads();
  }
  if (hipThreadIdx_x == 0) atomicAdd(out, partial[0]);
}

extern "C" __global__ void add_bias_f32(float* x, unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) x[i] += hipr_builtin_bias;
}

extern "C" __global__ void copy_from_address_u8(unsigned char* out, unsigned long long address,
                                                unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) out[i] = ((const unsigned char*)address)[i];
}

extern "C" __global__ void mixed_args_probe(double* out, signed char a8, int a32, float f,
                                            double d, short a16, ProbeStruct s,
                                            unsigned long long n) {
  HIPR_GRID_STRIDE(i, n) out[i] = (double)a8 + (double)a32 + (double)f + d + (double)a16
                                  + (double)s.a + s.b + (double)s.c + (double)i;
}
"""
