/* Shared by the HIP front's files. */
#ifndef HIPR_MODULES_H
#define HIPR_MODULES_H

#include <stddef.h>
#include <stdint.h>

#include "hip_types.h"

int hipr_front_device(void);
hipError_t hipr_front_ret(hipError_t e);

/* An image of this text names the worker's built-in kernel module (hipr.kernels.builtins):
 * hipModuleLoadData(&m, "hipr:builtin") then hipModuleGetFunction(&f, m, "fill_f32"). */
#define HIPR_BUILTIN_IMAGE "hipr:builtin"

/* Bytes of a code object given without its size (hipModuleLoadData): an ELF file (HSACO,
 * CUBIN), a clang offload bundle, a CUDA fat binary, PTX text or the built-in marker;
 * 0 when it is none of these. `limit` bounds what may be read (SIZE_MAX: trust the image). */
size_t hipr_image_size(const void *image, size_t limit);

#endif
