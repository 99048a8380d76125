/* Checks of the proxy's client core against a running worker (HIPR_URL), built with the
 * proxy under ASan/UBSan by tests/proxy/test_core.py:
 *
 *   core_check basic        memory, a small and a 3 MiB copy each way (the large ones
 *                           go straight from and into the caller's buffers)
 *   core_check stream N     N rounds of fire-and-forget launches (axpy: y += x) and small
 *                           copies, a synchronize every 64 rounds and a 2 MiB round trip
 *                           every 256: the test cuts the link under it; every launch
 *                           must run exactly once and every copy land
 *   core_check fused N      N rounds of a launch (axpy) then hipDeviceSynchronize: one
 *                           request each on a worker of protocol 1.3 (the launch with
 *                           `synchronize`), two on an older one; the test cuts the link
 *                           under it: every launch must run exactly once
 *   core_check idle S       an allocation, S seconds without a call, then the allocation
 *                           used: the session lives on (heartbeats answered while idle)
 *   core_check threads      threads with their own current device and last error, all
 *                           sharing the session; then fork: the child gets a session of
 *                           its own, the parent's goes on
 *   core_check striped      uploads of 40 MiB + 123 and 6 MiB + 1 bytes read back whole
 *                           three times (whole, unaligned, a range inside): uploads and
 *                           reads striped over data links where the worker offers them
 *                           and HIPR_STRIPE_MIN_BYTES is below their size; then a forked
 *                           child's (its own session and data links), then the parent's
 *                           again
 *
 * Prints "ok ..." and exits 0 when every check holds. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int hipError_t;
typedef struct hipr_module *hipModule_t;
typedef struct hipr_function *hipFunction_t;

hipError_t hipGetDeviceCount(int *);
hipError_t hipSetDevice(int);
hipError_t hipGetDevice(int *);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipMemset(void *, int, size_t);
hipError_t hipDeviceSynchronize(void);
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);
const char *hipGetErrorName(hipError_t);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleUnload(hipModule_t);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, void *, void **, void **);
unsigned hipr_resumes(void); /* the core's, exported under HIPR_PRIVATE */
unsigned hipr_round_trips(void);

#define H2D 1
#define D2H 2

#define NAME_OF(e) hipGetErrorName((hipError_t)(e))
#include "check.h"

/* A round trip of `size` bytes of a pattern seeded by `seed`. */
static void round_trip(size_t size, unsigned seed) {
    uint8_t *out = malloc(size), *back = malloc(size);
    void *d = NULL;
    for (size_t i = 0; i < size; i++) out[i] = (uint8_t)(i * 31 + seed);
    memset(back, 0, size);
    CHECK(hipMalloc(&d, size));
    CHECK(hipMemcpy(d, out, size, H2D));
    CHECK(hipMemcpy(back, d, size, D2H));
    EXPECT(memcmp(out, back, size) == 0);
    CHECK(hipFree(d));
    free(out);
    free(back);
}

static int basic(void) {
    int count = 0;
    CHECK(hipGetDeviceCount(&count));
    EXPECT(count >= 1);
    round_trip(1000, 1);
    round_trip(3 << 20, 2);
    CHECK(hipDeviceSynchronize());
    printf("ok basic\n");
    return failures != 0;
}

/* y += x over AXPY_N floats (x all ones, y zero at first) with the built-in axpy_f32, one
 * block: after `rounds` launches that each ran exactly once, every y is `rounds`. */
enum { AXPY_N = 256 };
typedef struct {
    hipModule_t mod;
    hipFunction_t fn;
    void *y, *x;
    float a;
    unsigned long long n;
    void *params[4];
} axpy;

static void axpy_open(axpy *k, unsigned n) {
    float ones[AXPY_N];
    for (unsigned i = 0; i < n; i++) ones[i] = 1.0f;
    k->y = k->x = NULL;
    k->a = 1.0f;
    k->n = n;
    CHECK(hipModuleLoadData(&k->mod, "hipr:builtin"));
    CHECK(hipModuleGetFunction(&k->fn, k->mod, "axpy_f32"));
    CHECK(hipMalloc(&k->y, n * sizeof(float)));
    CHECK(hipMalloc(&k->x, n * sizeof(float)));
    CHECK(hipMemset(k->y, 0, n * sizeof(float)));
    CHECK(hipMemcpy(k->x, ones, n * sizeof(float), H2D));
    k->params[0] = &k->y;
    k->params[1] = &k->x;
    k->params[2] = &k->a;
    k->params[3] = &k->n;
}

static void axpy_launch(axpy *k) {
    CHECK(hipModuleLaunchKernel(k->fn, 1, 1, 1, (unsigned)k->n, 1, 1, 0, NULL, k->params, NULL));
}

/* Every y is `rounds`, else a launch was lost or repeated; then the memory and module go. */
static void axpy_close(axpy *k, long rounds) {
    float got[AXPY_N];
    CHECK(hipMemcpy(got, k->y, k->n * sizeof(float), D2H));
    for (unsigned i = 0; i < k->n; i++)
        if (got[i] != (float)rounds) {
            fprintf(stderr, "y[%u] = %g after %ld launches: a launch was %s\n", i, got[i], rounds,
                    got[i] > (float)rounds ? "repeated" : "lost");
            failures++;
            break;
        }
    CHECK(hipFree(k->y));
    CHECK(hipFree(k->x));
    CHECK(hipModuleUnload(k->mod));
}

static int stream(long rounds) {
    axpy k;
    axpy_open(&k, AXPY_N);
    void *marks = NULL;
    CHECK(hipMalloc(&marks, (size_t)rounds * sizeof(uint32_t)));
    CHECK(hipMemset(marks, 0xff, (size_t)rounds * sizeof(uint32_t)));
    for (long i = 0; i < rounds; i++) {
        axpy_launch(&k);
        uint32_t mark = (uint32_t)i;
        CHECK(hipMemcpy((uint32_t *)marks + i, &mark, sizeof mark, H2D));
        if (i % 64 == 63) CHECK(hipDeviceSynchronize());
        if (i % 256 == 255) round_trip(2 << 20, (unsigned)i);
    }
    CHECK(hipDeviceSynchronize());
    axpy_close(&k, rounds);
    uint32_t *m = malloc((size_t)rounds * sizeof *m);
    CHECK(hipMemcpy(m, marks, (size_t)rounds * sizeof *m, D2H));
    for (long i = 0; i < rounds; i++)
        if (m[i] != (uint32_t)i) {
            fprintf(stderr, "copy %ld was lost (found %u)\n", i, m[i]);
            failures++;
            break;
        }
    free(m);
    CHECK(hipFree(marks));
    CHECK(hipDeviceSynchronize());
    printf("ok stream rounds=%ld resumes=%u\n", rounds, hipr_resumes());
    return failures != 0;
}

static int fused(long rounds) {
    axpy k;
    axpy_open(&k, 64);
    unsigned trips = hipr_round_trips();
    for (long i = 0; i < rounds; i++) {
        axpy_launch(&k);
        CHECK(hipDeviceSynchronize());
    }
    trips = hipr_round_trips() - trips;
    axpy_close(&k, rounds);
    printf("ok fused rounds=%ld trips=%u resumes=%u\n", rounds, trips, hipr_resumes());
    return failures != 0;
}

static int idle(double seconds) {
    void *d = NULL;
    uint64_t v = 0x1234567890abcdefull, back = 0;
    CHECK(hipMalloc(&d, sizeof v));
    CHECK(hipMemcpy(d, &v, sizeof v, H2D));
    CHECK(hipDeviceSynchronize());
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    CHECK(hipMemcpy(&back, d, sizeof back, D2H));
    EXPECT(back == v);
    CHECK(hipFree(d));
    CHECK(hipDeviceSynchronize());
    printf("ok idle resumes=%u\n", hipr_resumes());
    return failures != 0;
}

static int device_count;

static void *worker_thread(void *arg) {
    long t = (long)arg;
    int mine = (int)(t % device_count);
    CHECK(hipSetDevice(mine));
    for (int i = 0; i < 40; i++) {
        int dev = -1;
        CHECK(hipGetDevice(&dev));
        EXPECT(dev == mine);
        round_trip(4096 + (size_t)t * 512, (unsigned)(t * 100 + i));
        if (t == 0 && i == 5) {
            /* An error in this thread is this thread's last error only. */
            EXPECT(hipSetDevice(device_count + 7) != 0);
            EXPECT(hipPeekAtLastError() != 0);
            EXPECT(hipGetLastError() != 0);
            EXPECT(hipGetLastError() == 0);
        } else {
            EXPECT(hipPeekAtLastError() == 0);
        }
    }
    return NULL;
}

static int threads(void) {
    CHECK(hipGetDeviceCount(&device_count));
    if (device_count < 1) return 1;
    enum { T = 8 };
    pthread_t th[T];
    for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, worker_thread, (void *)t);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    int dev = -1;
    CHECK(hipGetDevice(&dev));
    EXPECT(dev == 0); /* the main thread's device did not follow the others' */

    /* fork: the child has its own session; the parent's pointer stays the parent's. */
    void *d = NULL;
    uint32_t v = 0xC0FFEE, back = 0;
    CHECK(hipMalloc(&d, sizeof v));
    CHECK(hipMemcpy(d, &v, sizeof v, H2D));
    pid_t pid = fork();
    if (pid == 0) {
        round_trip(2 << 20, 77);
        round_trip(100, 78);
        _exit(failures ? 3 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(hipMemcpy(&back, d, sizeof back, D2H));
    EXPECT(back == v);
    CHECK(hipFree(d));
    CHECK(hipDeviceSynchronize());
    printf("ok threads devices=%d\n", device_count);
    return failures != 0;
}

/* As round_trip, with bytes that differ from one KiB and one MiB to the next: a chunk
 * landed at another chunk's offset does not compare equal. Read back three times (each
 * a striped download where the size allows): whole, whole again into a buffer one byte
 * off alignment, and a range from inside the allocation (4097 bytes in, 8193 short). */
static void striped_trip(size_t size, unsigned seed) {
    uint8_t *out = malloc(size), *back = malloc(size + 1);
    void *d = NULL;
    for (size_t i = 0; i < size; i++)
        out[i] = (uint8_t)(i * 31 + (i >> 10) * 7 + (i >> 20) * 131 + seed);
    memset(back, 0, size + 1);
    CHECK(hipMalloc(&d, size));
    CHECK(hipMemcpy(d, out, size, H2D));
    CHECK(hipMemcpy(back, d, size, D2H));
    EXPECT(memcmp(out, back, size) == 0);
    memset(back, 0, size + 1);
    CHECK(hipMemcpy(back + 1, d, size, D2H));
    EXPECT(back[0] == 0 && memcmp(out, back + 1, size) == 0);
    memset(back, 0, size + 1);
    CHECK(hipMemcpy(back, (uint8_t *)d + 4097, size - 8193, D2H));
    EXPECT(memcmp(out + 4097, back, size - 8193) == 0);
    EXPECT(back[size - 8193] == 0);
    CHECK(hipFree(d));
    free(out);
    free(back);
}

static int striped(void) {
    striped_trip((40u << 20) + 123, 5);
    striped_trip((6u << 20) + 1, 6);
    pid_t pid = fork();
    if (pid == 0) {
        striped_trip((9u << 20) + 7, 9);
        _exit(failures ? 3 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    striped_trip((40u << 20) + 123, 10);
    CHECK(hipDeviceSynchronize());
    printf("ok striped resumes=%u\n", hipr_resumes());
    return failures != 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "basic";
    int rc;
    if (strcmp(mode, "stream") == 0) rc = stream(argc > 2 ? atol(argv[2]) : 2000);
    else if (strcmp(mode, "threads") == 0) rc = threads();
    else if (strcmp(mode, "fused") == 0) rc = fused(argc > 2 ? atol(argv[2]) : 200);
    else if (strcmp(mode, "striped") == 0) rc = striped();
    else if (strcmp(mode, "idle") == 0) rc = idle(argc > 2 ? atof(argv[2]) : 2.0);
    else rc = basic();
    return rc;
}
