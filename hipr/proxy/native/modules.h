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

/* The device allocation of this session that holds `p` (its base and size): 1, else 0. */
int hipr_front_alloc_of(const void *p, uint64_t *base, uint64_t *size);
/* Host memory from hipHostMalloc/hipMallocHost that holds `p`: 1, else 0. */
int hipr_host_alloc_of(const void *p, uint64_t *base, uint64_t *size);

/* Each stream's device (stream_devices.c): noted at creation, forgotten at destruction;
 * hipr_stream_device gives the null stream the current device's and returns -1 for a
 * stream this session did not create. */
void hipr_stream_note(hipStream_t stream, int device);
void hipr_stream_forget(hipStream_t stream);
int hipr_stream_device(hipStream_t stream, int *device);

/* A stream is gone: it is capturing no more (hip_extras.c). */
void hipr_capture_forget(hipStream_t stream);

/* A launch of `f` (hipModuleLaunchKernel's body, without touching the last error). */
hipError_t hipr_module_launch(hipFunction_t f, const unsigned grid[3], const unsigned block[3],
                              unsigned shared, hipStream_t stream, void **params, void **extra);
/* The module's id on the wire, and whether it is the built-in module (whose id the
 * proxy learns from MODULE_BUILTIN: 0 until then). hipErrorInvalidHandle for NULL. */
hipError_t hipr_module_wire(hipModule_t module, uint64_t *id, int *builtin);
/* A device variable registered by hipcc (__hipRegisterVar) for its host shadow `symbol`:
 * its device address and size, its code object loaded and the variable looked up on the
 * first use (hipcc.c). hipErrorInvalidSymbol for an address that names none. */
hipError_t hipr_symbol_lookup(const void *symbol, void **ptr, size_t *size);
#define hipErrorInvalidSymbol 13

/* Frees a module's local bookkeeping without asking the worker (a session that is gone:
 * a forked child, process exit). */
void hipr_module_forget(hipModule_t module);

#endif
