/* What the C test programs that reach the CUDA driver API only through cuGetProcAddress
 * share (cuda_sync_trips.c, cuda_trace_check.c): the few driver types their calls name,
 * get() (an entry point by name, a failure counted when it is not served) and PROC, which
 * declares a pointer of the given parameter list and fetches it. Going through
 * cuGetProcAddress is the point: the trace wraps only the pointers it hands out. */
#ifndef HIPR_TEST_CUDA_PROC_H
#define HIPR_TEST_CUDA_PROC_H

#include "cuda_api.h"
#include "check.h"

/* The entry point `name` as CUDA 12.0 asks for it. */
static void *get(const char *name) {
    void *fn = NULL;
    int status = -1;
    CUresult rc = cuGetProcAddress_v2(name, &fn, 12000, 0, &status);
    EXPECT(rc == 0 && fn != NULL && status == 0);
    return fn;
}

/* PROC(alloc, (CUdeviceptr *, size_t), "cuMemAlloc"): a local `alloc` of that type. */
#define PROC(var, params, name) CUresult(*var) params = (CUresult(*) params)get(name)

#endif
