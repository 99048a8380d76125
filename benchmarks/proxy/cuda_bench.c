/* Per-call costs of the CUDA driver API, through the proxy's libcuda.so.1 or NVIDIA's own
 * (the same program against either, to put the two side by side): calls answered locally,
 * an idle synchronize, a tiny launch + synchronize, launches in a stream, and large copies
 * in each form PyTorch and the CUDA runtime use (cuMemcpyHtoD/DtoH, their Async forms on a
 * stream, from malloc'd and from cuMemAllocHost memory). Build:
 *   cc -O2 -std=c11 benchmarks/proxy/cuda_bench.c -o /tmp/cuda_bench -L$(hipr proxy --path)/cuda \
 *      -l:libcuda.so.1
 * and run with LD_LIBRARY_PATH=$(hipr proxy --path)/cuda HIPR_URL=... for the proxy, without
 * for NVIDIA's driver. Usage: cuda_bench [COPY_MIB [MODULE]]: MODULE is a cubin/PTX/fat
 * binary file holding scale_f32 (tests/proxy/cuda/scale.cu), default "hipr:builtin" (the
 * worker's built-in kernels; the proxy only). Prints "name value" a line (medians of the
 * timed repeats), read by benchmarks/proxy/torch_compare.py. */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxSynchronize(void);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

enum { N_EACH = 2000, REPEATS = 3 };
static double each[N_EACH];

/* A copy's GB/s: median of REPEATS after one warm-up (which also faults the pages in). */
#define COPY_FIGURE(name, stmt)                                                        \
    do {                                                                               \
        double t_[REPEATS];                                                            \
        for (int r_ = -1; r_ < REPEATS; r_++) {                                        \
            MUST(cuCtxSynchronize());                                                  \
            double s_ = now();                                                         \
            stmt;                                                                      \
            if (r_ >= 0) t_[r_] = now() - s_;                                          \
        }                                                                              \
        printf("%s %.2f\n", name, (double)size / median(t_, REPEATS) / 1e9);           \
        fflush(stdout);                                                                \
    } while (0)

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
    const char *module = argc > 2 ? argv[2] : "hipr:builtin";
    CUdevice dev;
    CUcontext ctx, cur;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));

    int n = 1000000, value = 0;
    double t = now();
    for (int i = 0; i < n; i++) MUST(cuCtxGetCurrent(&cur));
    printf("cuCtxGetCurrent_us %.4f\n", (now() - t) / n * 1e6);
    t = now();
    for (int i = 0; i < n; i++) MUST(cuDeviceGetAttribute(&value, 16, dev));
    printf("cuDeviceGetAttribute_us %.4f\n", (now() - t) / n * 1e6);

    CUmodule mod;
    CUfunction fn;
    if (strcmp(module, "hipr:builtin") == 0) MUST(cuModuleLoadData(&mod, module));
    else MUST(cuModuleLoad(&mod, module));
    MUST(cuModuleGetFunction(&fn, mod, "scale_f32"));
    CUdeviceptr p;
    MUST(cuMemAlloc_v2(&p, 4096));
    unsigned mtype = 0;
    n = 100000;
    t = now();
    for (int i = 0; i < n; i++) MUST(cuPointerGetAttribute(&mtype, 2, p));
    printf("cuPointerGetAttribute_us %.4f\n", (now() - t) / n * 1e6);
    float a = 1.0f;
    unsigned long long count = 1;
    void *params[] = {&p, &a, &count};
#define LAUNCH() MUST(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL))
    LAUNCH();
    MUST(cuCtxSynchronize());
    for (int i = 0; i < N_EACH; i++) { /* nothing to wait for */
        t = now();
        MUST(cuCtxSynchronize());
        each[i] = now() - t;
    }
    printf("ctx_sync_idle_us %.2f\n", median(each, N_EACH) * 1e6);
    for (int i = 0; i < N_EACH; i++) {
        t = now();
        MUST(cuStreamSynchronize(NULL));
        each[i] = now() - t;
    }
    printf("stream_sync_idle_us %.2f\n", median(each, N_EACH) * 1e6);
    for (int i = 0; i < 200; i++) { /* warm-up */
        LAUNCH();
        MUST(cuCtxSynchronize());
    }
    for (int i = 0; i < N_EACH; i++) {
        t = now();
        LAUNCH();
        MUST(cuCtxSynchronize());
        each[i] = now() - t;
    }
    printf("launch_ctx_sync_us %.2f\n", median(each, N_EACH) * 1e6);
    for (int i = 0; i < N_EACH; i++) {
        t = now();
        LAUNCH();
        MUST(cuStreamSynchronize(NULL));
        each[i] = now() - t;
    }
    printf("launch_stream_sync_us %.2f\n", median(each, N_EACH) * 1e6);
    float word = 0;
    for (int i = 0; i < N_EACH; i++) { /* PyTorch's item(): a few bytes back, after an op */
        t = now();
        LAUNCH();
        MUST(cuMemcpyDtoH_v2(&word, p, sizeof word));
        each[i] = now() - t;
    }
    printf("launch_dtoh_4B_us %.2f\n", median(each, N_EACH) * 1e6);
    for (int i = 0; i < N_EACH; i++) {
        t = now();
        MUST(cuMemcpyDtoH_v2(&word, p, sizeof word));
        each[i] = now() - t;
    }
    printf("dtoh_4B_us %.2f\n", median(each, N_EACH) * 1e6);
    double per[5];
    for (int r = 0; r < 5; r++) {
        t = now();
        for (int i = 0; i < 1000; i++) LAUNCH();
        MUST(cuCtxSynchronize());
        per[r] = (now() - t) / 1000;
    }
    printf("launch_in_stream_us %.2f\n", median(per, 5) * 1e6);
    fflush(stdout);

    size_t size = mib << 20;
    char *host = malloc(size), *back = malloc(size);
    void *pinned;
    CUdeviceptr big;
    CUstream s;
    if (!host || !back) return 1;
    memset(host, 7, size);
    memset(back, 0, size);
    MUST(cuMemAllocHost_v2(&pinned, size));
    memset(pinned, 9, size);
    MUST(cuMemAlloc_v2(&big, size));
    MUST(cuStreamCreate(&s, 0));
    COPY_FIGURE("htod_pageable_GBps", MUST(cuMemcpyHtoD_v2(big, host, size)));
    COPY_FIGURE("dtoh_pageable_GBps", MUST(cuMemcpyDtoH_v2(back, big, size)));
    if (back[0] != 7 || back[size - 1] != 7) {
        fprintf(stderr, "the copy came back wrong\n");
        return 1;
    }
    COPY_FIGURE("htod_async_pageable_GBps",
                MUST(cuMemcpyHtoDAsync_v2(big, host, size, s)); MUST(cuStreamSynchronize(s)));
    COPY_FIGURE("dtoh_async_pageable_GBps",
                MUST(cuMemcpyDtoHAsync_v2(back, big, size, s)); MUST(cuStreamSynchronize(s)));
    COPY_FIGURE("htod_async_pinned_GBps",
                MUST(cuMemcpyHtoDAsync_v2(big, pinned, size, s)); MUST(cuStreamSynchronize(s)));
    COPY_FIGURE("dtoh_async_pinned_GBps",
                MUST(cuMemcpyDtoHAsync_v2(pinned, big, size, s)); MUST(cuStreamSynchronize(s)));
    if (((char *)pinned)[0] != 9 || ((char *)pinned)[size - 1] != 9) {
        fprintf(stderr, "the pinned copy came back wrong\n");
        return 1;
    }
    MUST(cuStreamDestroy_v2(s));
    MUST(cuMemFree_v2(big));
    MUST(cuMemFreeHost(pinned));
    MUST(cuMemFree_v2(p));
    MUST(cuModuleUnload(mod));
    MUST(cuCtxSynchronize());
    MUST(cuDevicePrimaryCtxRelease_v2(dev));
    free(host);
    free(back);
    return 0;
}
