/* Bulk copies through the driver API, timed one by one (benchmarks/proxy/copy_cpu.py).
 *
 *   copy_loop MIB REPS DIRECTION [SOURCE]
 *
 * DIRECTION: h cuMemcpyHtoD_v2, a cuMemcpyHtoDAsync_v2 on a stream of its own then
 * cuStreamSynchronize, d cuMemcpyDtoH_v2. SOURCE, the host buffer: malloc (default),
 * posix_memalign (4096-aligned, as the proxy's cuMemHostAlloc), hugepages (mmap with
 * MADV_HUGEPAGE). Prints "DIRECTION GB/s result" per copy. Linked by soname, so the
 * library path picks the proxy or NVIDIA's driver. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size);
CUresult cuMemFree_v2(CUdeviceptr ptr);
CUresult cuStreamCreate(CUstream *stream, unsigned flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t size);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t size, CUstream s);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *host_buffer(const char *source, size_t n) {
    void *p = NULL;
    if (strcmp(source, "posix_memalign") == 0) return posix_memalign(&p, 4096, n) ? NULL : p;
    if (strcmp(source, "hugepages") == 0) {
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        madvise(p, n, MADV_HUGEPAGE);
        return p;
    }
    return malloc(n);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: copy_loop MIB REPS h|a|d [malloc|posix_memalign|hugepages]\n");
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int reps = atoi(argv[2]);
    char direction = argv[3][0];
    const char *source = argc > 4 ? argv[4] : "malloc";
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr dptr;
    CUstream stream = NULL;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuMemAlloc_v2(&dptr, n)) {
        fprintf(stderr, "copy_loop: no device or no memory\n");
        return 1;
    }
    char *host = host_buffer(source, n);
    if (host == NULL || (direction == 'a' && cuStreamCreate(&stream, 0))) {
        fprintf(stderr, "copy_loop: no host buffer or stream\n");
        return 1;
    }
    memset(host, 7, n);
    int failed = 0;
    for (int i = 0; i < reps; i++) {
        double start = now();
        CUresult r;
        if (direction == 'h') r = cuMemcpyHtoD_v2(dptr, host, n);
        else if (direction == 'a') {
            r = cuMemcpyHtoDAsync_v2(dptr, host, n, stream);
            if (!r) r = cuStreamSynchronize(stream);
        } else r = cuMemcpyDtoH_v2(host, dptr, n);
        double seconds = now() - start;
        printf("%c %.3f %d\n", direction, (double)n / seconds / 1e9, r);
        failed |= r != 0;
    }
    if (stream) cuStreamDestroy_v2(stream);
    cuMemFree_v2(dptr);
    return failed;
}
