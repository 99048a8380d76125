/* Stream-ordered allocation on each device's default memory pool, and managed memory's
 * refusal. The worker allocates at once and frees in the session's order, as the HIP
 * front serves hipMallocAsync/hipFreeAsync: cuMemAllocAsync's memory is usable when the
 * call returns, on any stream, and cuMemFreeAsync's FREE runs after every request the
 * program made before it, on the worker's GPU thread, which waits for the device to be
 * done with the memory (stronger than the stream's order, never weaker). The pool holds
 * no freed memory: what it has reserved is what is allocated from it. Only each device's
 * default pool exists (cuMemPoolCreate stays a stub). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_front.h"

CUresult cuDeviceGetCount(int *count);
CUresult cuMemFree_v2(CUdeviceptr ptr);

#define MAX_POOLS 1024

struct hipr_cu_pool {
    int reuse[4];                  /* CU_MEMPOOL_ATTR_REUSE_* (1..3): kept, on by default */
    uint64_t threshold;            /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: kept */
    uint64_t reserved_high, used_high; /* high-water marks since the last reset */
};

/* One default pool per device, under hipr_cu_lock. */
static struct hipr_cu_pool pools[MAX_POOLS];

/* The pool of device `dev` (checked). */
static CUresult default_pool(CUdevice dev, CUmemoryPool *out) {
    int n = 0;
    CUresult rc = cuDeviceGetCount(&n);
    if (rc) return rc;
    if (dev < 0 || dev >= n) return CUDA_ERROR_INVALID_DEVICE;
    if (dev >= MAX_POOLS) return CUDA_ERROR_NOT_SUPPORTED;
    *out = &pools[dev];
    return CUDA_SUCCESS;
}

/* The device whose default pool `pool` is; -1 when it is none. */
static int pool_device(CUmemoryPool pool) {
    uintptr_t p = (uintptr_t)pool, first = (uintptr_t)pools;
    if (p < first || p >= first + sizeof pools || (p - first) % sizeof *pools) return -1;
    int dev = (int)((p - first) / sizeof *pools), n = 0;
    return cuDeviceGetCount(&n) == CUDA_SUCCESS && dev < n ? dev : -1;
}

static __attribute__((constructor(101))) void pools_init(void) {
    for (size_t i = 0; i < MAX_POOLS; i++)
        for (int a = 1; a <= 3; a++) pools[i].reuse[a] = 1;
}

API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return default_pool(dev, pool);
}

/* The current pool is the default one: no other can exist. */
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    return cuDeviceGetDefaultMemPool(pool, dev);
}

API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUmemoryPool own;
    CUresult rc = default_pool(dev, &own);
    if (rc) return rc;
    return pool == own ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* An allocation from device `dev`'s default pool on `s`. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, int want_dev, CUstream s) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    uint64_t sid;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &sid);
    if (rc) return rc;
    if (want_dev >= 0 && want_dev != dev) return CUDA_ERROR_INVALID_VALUE;
    if (dev >= MAX_POOLS) return CUDA_ERROR_NOT_SUPPORTED;
    rc = hipr_cu_mem_alloc(dptr, size, 1);
    if (rc) return rc;
    uint64_t used = hipr_cu_pooled_bytes(dev);
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_pool *p = &pools[dev];
    if (used > p->used_high) p->used_high = used;
    if (used > p->reserved_high) p->reserved_high = used;
    pthread_mutex_unlock(&hipr_cu_lock);
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    return alloc_async(dptr, size, -1, s);
}

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                     CUstream s) {
    int dev = pool_device(pool);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, size, dev, s);
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    int dev;
    uint64_t sid;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &sid);
    return rc ? rc : cuMemFree_v2(ptr);
}

/* Reads (set 0) or sets attribute `attr` of `pool` through `value`. Freed memory goes
 * back to the worker at once, so what the pool reserves is what is in use; the high-water
 * marks can only be reset (to the current figure), the current figures only read. */
static CUresult pool_attribute(CUmemoryPool pool, int attr, void *value, int set) {
    int dev = pool_device(pool);
    if (dev < 0 || !value) return CUDA_ERROR_INVALID_VALUE;
    struct hipr_cu_pool *p = &pools[dev];
    CUresult rc = CUDA_SUCCESS;
    uint64_t used = hipr_cu_pooled_bytes(dev);
    cuuint64_t *u64 = value;
    pthread_mutex_lock(&hipr_cu_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        if (set) p->reuse[attr] = *(int *)value != 0;
        else *(int *)value = p->reuse[attr];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        if (set) p->threshold = *u64;
        else *u64 = p->threshold;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        if (set) rc = CUDA_ERROR_INVALID_VALUE;
        else *u64 = used;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: {
        uint64_t *high = attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH ? &p->used_high : &p->reserved_high;
        if (!set) *u64 = *high > used ? *high : used;
        else if (*u64 != 0) rc = CUDA_ERROR_INVALID_VALUE;
        else *high = used;
        break;
    }
    default:
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    return pool_attribute(pool, attr, value, 1);
}

API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    return pool_attribute(pool, attr, value, 0);
}

/* The pool keeps no freed memory: there is nothing to trim. */
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    (void)keep;
    return pool_device(pool) < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* --- managed memory ------------------------------------------------------------------- */

/* The worker has no managed memory (memory both the host and the device address): the
 * device attributes MANAGED_MEMORY and CONCURRENT_MANAGED_ACCESS read 0, so libraries
 * that ask first (CuPy, PyTorch) do not try. */
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    (void)size;
    (void)flags;
    if (dptr) *dptr = 0;
    static int warned;
    hipr_warn_once("cuMemAllocManaged is not served: the worker serves no managed memory "
                   "(CUDA_ERROR_NOT_SUPPORTED)",
                   &warned);
    return CUDA_ERROR_NOT_SUPPORTED;
}

ALIAS(CUresult, cuMemAllocAsync_ptsz, cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))
ALIAS(CUresult, cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync,
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
ALIAS(CUresult, cuMemFreeAsync_ptsz, cuMemFreeAsync, (CUdeviceptr, CUstream))
