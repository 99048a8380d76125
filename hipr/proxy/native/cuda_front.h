/* Shared by the CUDA front's files (libcuda.so.1). */
#ifndef HIPR_CUDA_FRONT_H
#define HIPR_CUDA_FRONT_H

#include <pthread.h>
#include <stdint.h>

#include "client.h"
#include "cuda_types.h"
#include "launch_extra.h"

#define API HIPR_EXPORT
/* Another exported name for `target` (the _ptds / _ptsz forms). */
#define ALIAS(type, name, target, params) API type name params __attribute__((alias(#target)));
/* The longest kernel name taken (as the worker's MODULE_GET_FUNCTION). */
#define HIPR_CU_MAX_NAME 16384

struct hipr_cu_ctx {
    int device;
    unsigned flags;
    int primary;
    int refs; /* a primary context's retains */
    int alive;
    uint64_t uid; /* cuCtxGetId's: unique in the process, never reused */
    struct hipr_cu_ctx *next;
};

struct hipr_cu_stream {
    uint64_t id; /* the worker's handle */
    unsigned flags;
    int priority;
    int device;
    CUcontext ctx;
    uint64_t uid; /* cuStreamGetId's: unique in the process, never reused */
    struct hipr_cu_stream *next;
};

struct hipr_cu_event {
    uint64_t id;
    unsigned flags;
    int device;
    struct hipr_cu_event *next;
};

/* The lock of the front's tables (contexts, allocations, streams, events). */
extern pthread_mutex_t hipr_cu_lock;

/* The CUresult of a hipError_t from the core or the worker. */
CUresult hipr_cu_error(int hip);
int hipr_cu_initialized(void);
int hipr_cu_driver_version(void);
/* The calling thread's current context, or NULL. */
CUcontext hipr_cu_current(void);
/* The current context's device; CUDA_ERROR_NOT_INITIALIZED / INVALID_CONTEXT without. */
CUresult hipr_cu_ctx_device(int *device);
/* cuCtxGetId: `ctx`'s id (NULL: the current context's); INVALID_CONTEXT when not live. */
CUresult hipr_cu_ctx_id(CUcontext ctx, uint64_t *id);
/* The worker's handle of stream `s` (0: the null stream); INVALID_HANDLE when unknown. */
CUresult hipr_cu_stream(CUstream s, uint64_t *id);
/* cuMemAlloc's allocation; `pooled`: made from the default pool (cuMemAllocAsync). */
CUresult hipr_cu_mem_alloc(CUdeviceptr *dptr, size_t size, int pooled);
/* The bytes of `device`'s pooled allocations not freed yet. */
uint64_t hipr_cu_pooled_bytes(int device);
/* 1 when `p` is inside an allocation made through this proxy (or a module global). */
int hipr_cu_is_device(uint64_t p);
/* cuda_modules.c: 1 when `p` is inside a module global cuModuleGetGlobal gave. */
int hipr_cu_is_global(uint64_t p);
/* cuda_modules.c: the size of an image given without one (following a fat binary
 * wrapper to its data, which *image then points at); 0 when not an image. */
size_t hipr_cu_image_size(const void **image);
/* cuda_modules.c: the whole file at `path`, NUL-terminated, in a buffer of the caller's
 * to free (*len without the NUL); FILE_NOT_FOUND, OUT_OF_MEMORY or INVALID_IMAGE. */
CUresult hipr_cu_read_file(const char *path, uint8_t **out, size_t *len);
/* Load `size` bytes of image on the current context's device. */
CUresult hipr_cu_load(CUmodule *out, const void *image, size_t size);
/* cuda_modules.c: a launch of `f` checked and its arguments packed, as cuLaunchKernel
 * sends it (config.stream left 0), for cuLaunchKernel and graph kernel nodes. */
struct hipr_cu_launch {
    int device;
    hipr_launch_config config;
    const uint8_t *args; /* buf, or the caller's `extra` buffer */
    size_t args_len;
    uint8_t buf[HIPR_MAX_ARGS_BYTES];
};
CUresult hipr_cu_launch_prepare(struct hipr_cu_launch *l, CUfunction f, const unsigned grid[3],
                                const unsigned block[3], unsigned shared, void **params,
                                void **extra);
/* cuda_library.c: 1 when `p` is a CUkernel, its function in the current context in *f
 * (loading its library there first) and any failure in *rc; 0 when it is not one. */
int hipr_cu_kernel_function(void *p, CUfunction *f, CUresult *rc);
void hipr_cu_forget_libraries(void);
/* cuda_graphs.c: drop every graph record (a forked child's session is new). */
void hipr_cu_forget_graphs(void);
/* cuda_modules.c: drop every module and function (a forked child's session is new). */
void hipr_cu_forget_modules(void);

#endif
