/* HIPR_PROXY_TRACE=1: entry points from cuGetProcAddress are wrapped, and each call
 * through them prints its name and result while the arguments (registers and the stack
 * arguments of cuLaunchKernel's eleven) and the result pass through unchanged. Run
 * against a worker (HIPR_URL) by tests/proxy/test_cuda_trace.py under ASan/UBSan. */
#include <stdio.h>
#include <string.h>

#include "cuda_proc.h"

int main(int argc, char **argv) {
    PROC(init, (unsigned), "cuInit");
    if (argc > 1 && strcmp(argv[1], "crash") == 0) {
        /* a runtime calling an empty export-table slot: the trace says where and after what */
        EXPECT(init(0) == 0);
        void (*volatile empty)(void) = NULL;
        empty();
        return 3; /* not reached */
    }
    PROC(count, (int *), "cuDeviceGetCount");
    PROC(retain, (void **, int), "cuDevicePrimaryCtxRetain");
    PROC(set, (void *), "cuCtxSetCurrent");
    PROC(release, (int), "cuDevicePrimaryCtxRelease");
    PROC(alloc, (CUdeviceptr *, size_t), "cuMemAlloc");
    PROC(htod, (CUdeviceptr, const void *, size_t), "cuMemcpyHtoD");
    PROC(dtoh, (void *, CUdeviceptr, size_t), "cuMemcpyDtoH");
    PROC(mfree, (CUdeviceptr), "cuMemFree");
    PROC(load, (CUmodule *, const void *), "cuModuleLoadData");
    PROC(function, (CUfunction *, CUmodule, const char *), "cuModuleGetFunction");
    PROC(launch, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                  unsigned, CUstream, void **, void **), "cuLaunchKernel");
    PROC(unload, (CUmodule), "cuModuleUnload");
    PROC(managed, (CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged");
    if (failures) return 1;

    EXPECT(init(1) == 1); /* CUDA_ERROR_INVALID_VALUE passes back through */
    EXPECT(init(0) == 0);
    int n = -1;
    EXPECT(count(&n) == 0 && n >= 1);
    void *ctx = NULL;
    EXPECT(retain(&ctx, 0) == 0 && ctx != NULL);
    EXPECT(set(ctx) == 0);
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    CUdeviceptr a = 0;
    EXPECT(alloc(&a, sizeof host) == 0 && a != 0);
    EXPECT(htod(a, host, sizeof host) == 0);
    CUmodule mod = NULL;
    CUfunction scale = NULL;
    EXPECT(load(&mod, "hipr:builtin") == 0);
    EXPECT(function(&scale, mod, "scale_f32") == 0);
    float factor = 2.0f;
    unsigned long long count_n = N;
    void *params[] = {&a, &factor, &count_n};
    /* the grid's z, the block and the rest travel on the stack */
    EXPECT(launch(scale, 4, 1, 1, 256, 1, 1, 0, NULL, params, NULL) == 0);
    EXPECT(launch(scale, 4, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL) != 0);
    EXPECT(dtoh(back, a, sizeof back) == 0);
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= back[i] == host[i] * 2.0f;
    EXPECT(ok);
    CUdeviceptr m = 0;
    EXPECT(managed(&m, 64, 1) == 801); /* a stub, wrapped as well */
    EXPECT(unload(mod) == 0);
    EXPECT(mfree(a) == 0);
    EXPECT(set(NULL) == 0);
    EXPECT(release(0) == 0);
    return verdict();
}
