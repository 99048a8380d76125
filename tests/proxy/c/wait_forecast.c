/* The proxy's wait forecast, seen from the CPU the waiting thread spends: each step queues
 * a 16 MiB memset (fire-and-forget; the emulator worker takes milliseconds over it) and
 * synchronizes. Prints "<thread CPU seconds> <wall seconds>" of the waits after the first
 * few (which teach the forecast); run by tests/proxy/test_wait_forecast.py under each
 * HIPR_FORECAST setting, which compares the shares. */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>

typedef int hipError_t;
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemset(void *, int, size_t);
hipError_t hipDeviceSynchronize(void);

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    const size_t n = 16u << 20;
    void *p = NULL;
    if (hipMalloc(&p, n) != 0) return 1;
    double cpu = 0, wall = 0;
    for (int i = 0; i < 40; i++) {
        if (hipMemset(p, i, n) != 0) return 1;
        double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), w0 = clock_s(CLOCK_MONOTONIC);
        if (hipDeviceSynchronize() != 0) return 1;
        if (i >= 10) {
            cpu += clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
            wall += clock_s(CLOCK_MONOTONIC) - w0;
        }
    }
    hipFree(p);
    printf("%.6f %.6f\n", cpu, wall);
    return 0;
}
