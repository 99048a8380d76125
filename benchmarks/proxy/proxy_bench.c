/* Per-call costs through the native proxy (HIPR_URL): calls answered locally, a tiny
 * launch + synchronize, launches in a stream, and large copies. Build against the proxy:
 *   cc -O2 -std=c11 benchmarks/proxy/proxy_bench.c -o /tmp/proxy_bench \
 *      -L$(hipr proxy --path) -l:libamdhip64.so -Wl,-rpath,$(hipr proxy --path)
 * Usage: proxy_bench [COPY_MIB]. Prints one figure a line ("name value"): medians of the
 * timed repeats (benchmarks/proxy/compare.py reads them beside the floors). */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

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
    static double each[2000];
    for (int i = 0; i < n; i++) { /* a synchronize with nothing to wait for */
        t = now();
        MUST(hipDeviceSynchronize());
        each[i] = now() - t;
    }
    printf("sync_us %.2f\n", median(each, n) * 1e6);
    for (int i = 0; i < 200; i++) { /* warm-up */
        MUST(hipModuleLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        MUST(hipDeviceSynchronize());
    }
    for (int i = 0; i < n; i++) {
        t = now();
        MUST(hipModuleLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        MUST(hipDeviceSynchronize());
        each[i] = now() - t;
    }
    printf("launch_sync_us %.2f\n", median(each, n) * 1e6);
    n = 1000;
    double per[5];
    for (int r = 0; r < 5; r++) {
        t = now();
        for (int i = 0; i < n; i++)
            MUST(hipModuleLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        MUST(hipDeviceSynchronize());
        per[r] = (now() - t) / n;
    }
    printf("launch_in_stream_us %.2f\n", median(per, 5) * 1e6);

    size_t size = mib << 20;
    char *host = malloc(size);
    char *back = malloc(size);
    void *dbig;
    memset(host, 7, size);
    MUST(hipMalloc(&dbig, size));
    enum { REPEATS = 3 };
    double up[REPEATS], down[REPEATS];
    for (int r = -1; r < REPEATS; r++) { /* the first round warms up */
        MUST(hipDeviceSynchronize());
        t = now();
        MUST(hipMemcpy(dbig, host, size, 1));
        MUST(hipDeviceSynchronize());
        double u = now() - t;
        t = now();
        MUST(hipMemcpy(back, dbig, size, 2));
        double d = now() - t;
        if (r >= 0) {
            up[r] = u;
            down[r] = d;
        }
    }
    if (back[0] != 7 || back[size - 1] != 7) {
        fprintf(stderr, "the copy came back wrong\n");
        return 1;
    }
    printf("memcpy_h2d_GBps %.2f\n", (double)size / median(up, REPEATS) / 1e9);
    printf("memcpy_d2h_GBps %.2f\n", (double)size / median(down, REPEATS) / 1e9);
    free(back);
    MUST(hipFree(dbig));
    MUST(hipFree(p));
    MUST(hipDeviceSynchronize());
    free(host);
    return 0;
}
