"""Built-in kernels available on every backend, with one argument list everywhere.

GPU backends compile :data:`BUILTIN_SOURCE` at run time (hiprtc / NVRTC with the HIP
prelude); the emulator runs numpy versions with the same signatures. Every kernel uses
a grid-stride loop, so any launch geometry covers all ``n`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Argument kinds: ``ptr`` is an 8-byte device pointer; the rest are C scalar types.
ArgKind = str


@dataclass(frozen=True, slots=True)
class BuiltinKernel:
    """A built-in kernel's name, argument kinds in order, and what it computes."""

    name: str
    arg_kinds: tuple[ArgKind, ...]
    doc: str


BUILTINS: dict[str, BuiltinKernel] = {
    k.name: k
    for k in (
        BuiltinKernel("fill_f32", ("ptr", "f32", "u64"), "out[i] = value for i < n"),
        BuiltinKernel("scale_f32", ("ptr", "f32", "u64"), "x[i] *= a for i < n"),
        BuiltinKernel("axpy_f32", ("ptr", "ptr", "f32", "u64"), "y[i] += a * x[i] for i < n"),
        BuiltinKernel(
            "vector_add_f32", ("ptr", "ptr", "ptr", "u64"), "c[i] = a[i] + b[i] for i < n"
        ),
        BuiltinKernel(
            "reduce_sum_f32",
            ("ptr", "ptr", "u64"),
            "out[0] += sum(x[0:n]) (atomic; zero out[0] first)",
        ),
        BuiltinKernel(
            "mixed_args_probe",
            ("ptr", "i8", "i32", "f32", "f64", "i16", "probe_struct", "u64"),
            "out[i] = i8 + i32 + f32 + f64 + i16 + s.a + s.b + s.c + i for i < n "
            "(float64 out; proves every argument width and alignment arrives intact)",
        ),
        BuiltinKernel(
            "copy_from_address_u8",
            ("ptr", "u64", "u64"),
            "out[i] = ((const uint8_t*)address)[i] for i < n: a raw read of an address "
            "passed as a plain integer, which the worker cannot check (a kernel may compute "
            "any address); an address outside every allocation of the process faults and "
            "poisons the context, on a GPU and on the emulator alike",
        ),
    )
}

#: ``struct ProbeStruct { int8_t a; double b; int16_t c; }`` (24 bytes, align 8).
PROBE_STRUCT_C = "struct ProbeStruct { signed char a; double b; short c; };"

BUILTIN_SOURCE = r"""
#include <hip/hip_runtime.h>

struct ProbeStruct { signed char a; double b; short c; };

#define HIPR_GRID_STRIDE(i, n) \
  for (unsigned long long i = (unsigned long long)hipBlockIdx_x * hipBlockDim_x + hipThreadIdx_x; \
       i < (n); i += (unsigned long long)hipBlockDim_x * hipGridDim_x)

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
