/* What the proxy's C benchmarks (proxy_bench.c, cuda_bench.c) share: the clock, the median
 * of timed repeats, and MUST for a call that has to succeed. The including file defines
 * _POSIX_C_SOURCE (for clock_gettime) before its first include. */
#ifndef HIPR_BENCH_UTIL_H
#define HIPR_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), which it sorts. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds on the monotonic clock. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A call returning 0 on success (hipSuccess, CUDA_SUCCESS); anything else ends main with 1. */
#define MUST(call)                                                      \
    do {                                                                \
        long rc_ = (long)(call);                                        \
        if (rc_ != 0) {                                                 \
            fprintf(stderr, "%s failed: %ld\n", #call, rc_);            \
            return 1;                                                   \
        }                                                               \
    } while (0)

#endif
