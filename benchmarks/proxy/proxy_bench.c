/* Per-call costs through the native proxy (HIPR_URL): calls answered locally, a tiny
 * launch + synchronize, launches in a stream, and large copies. Build against the proxy:
 *   cc -O2 -std=c11 benchmarks/proxy/proxy_bench.c -o /tmp/proxy_bench \
 *      -L$(hipr proxy --path) -l:libamdhip64.so -Wl,-rpath,$(hipr proxy --path)
 * Usage: proxy_bench [COPY_MIB]. Prints one figure a line. */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int hipError_t;
typedef struct hipr_module *hipModule_t;
typedef struct hipr_function *hipFunction_t;
hipError_t hipGetDevice(int *);
hipError_t hipGetDevicePropertiesR0600(void *, int);
hipError_t hipDeviceGetAttribute(int *, int, int);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipDeviceSynchronize(void);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, void *, void **, void **);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define MUST(call)                                                      \
    do {                                                                \
        if ((call) != 0) {                                              \
            fprintf(stderr, "%s failed\n", #call);                      \
            return 1;                                                   \
        }                                                               \
    } while (0)

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64;
    static char props[1472];
    int dev = 0, value = 0;
    MUST(hipGetDevicePropertiesR0600(props, 0)); /* connect, fill the caches */

    int n = 1000000;
    double t = now();
    for (int i = 0; i < n; i++) MUST(hipGetDevice(&dev));
    printf("hipGetDevice_us %.4f\n", (now() - t) / n * 1e6);
    n = 100000;
    t = now();
    for (int i = 0; i < n; i++) MUST(hipGetDevicePropertiesR0600(props, 0));
    printf("hipGetDeviceProperties_us %.4f\n", (now() - t) / n * 1e6);
    t = now();
    for (int i = 0; i < n; i++) MUST(hipDeviceGetAttribute(&value, 87, 0));
    printf("hipDeviceGetAttribute_us %.4f\n", (now() - t) / n * 1e6);

    hipModule_t mod;
    hipFunction_t fill;
    void *p;
    MUST(hipModuleLoadData(&mod, "hipr:builtin"));
    MUST(hipModuleGetFunction(&fill, mod, "fill_f32"));
    MUST(hipMalloc(&p, 4096));
    float v = 1.0f;
    uint64_t count = 1;
    void *params[] = {&p, &v, &count};
    MUST(hipModuleLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    MUST(hipDeviceSynchronize());
    n = 2000;
    t = now();
    for (int i = 0; i < n; i++) {
        MUST(hipModuleLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        MUST(hipDeviceSynchronize());
    }
    printf("launch_sync_us %.2f\n", (now() - t) / n * 1e6);
    n = 1000;
    for (int r = 0; r < 3; r++) {
        t = now();
        for (int i = 0; i < n; i++)
            MUST(hipModuleLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        MUST(hipDeviceSynchronize());
        printf("launch_in_stream_us %.2f\n", (now() - t) / n * 1e6);
    }

    size_t size = mib << 20;
    char *host = malloc(size);
    void *dbig;
    memset(host, 1, size);
    MUST(hipMalloc(&dbig, size));
    MUST(hipMemcpy(dbig, host, size, 1));
    MUST(hipDeviceSynchronize());
    t = now();
    MUST(hipMemcpy(dbig, host, size, 1));
    MUST(hipDeviceSynchronize());
    printf("memcpy_h2d_GBps %.2f\n", (double)size / (now() - t) / 1e9);
    t = now();
    MUST(hipMemcpy(host, dbig, size, 2));
    printf("memcpy_d2h_GBps %.2f\n", (double)size / (now() - t) / 1e9);
    MUST(hipFree(dbig));
    MUST(hipFree(p));
    MUST(hipDeviceSynchronize());
    free(host);
    return 0;
}
