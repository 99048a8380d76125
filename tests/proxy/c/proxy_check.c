/* Exercises the native proxy against a running worker (HIPR_URL): memory, copies,
 * streams, events, errors, and launches of hipr's built-in kernels with kernelParams of
 * mixed widths and with `extra`. Prints "ok" and exits 0 when every check holds; built and
 * run under ASan/UBSan (leak checking on) by tests/proxy/test_native_c.py. Declares the
 * HIP API itself: no ROCm headers are needed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct hipr_module *hipModule_t;
typedef struct hipr_function *hipFunction_t;

hipError_t hipGetDeviceCount(int *);
hipError_t hipSetDevice(int);
hipError_t hipGetDevice(int *);
hipError_t hipDeviceGetAttribute(int *, int, int);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipMemcpyAsync(void *, const void *, size_t, int, hipStream_t);
hipError_t hipMemset(void *, int, size_t);
hipError_t hipMemsetAsync(void *, int, size_t, hipStream_t);
hipError_t hipMemGetInfo(size_t *, size_t *);
hipError_t hipDeviceSynchronize(void);
hipError_t hipStreamCreate(hipStream_t *);
hipError_t hipStreamDestroy(hipStream_t);
hipError_t hipStreamSynchronize(hipStream_t);
hipError_t hipEventCreate(hipEvent_t *);
hipError_t hipEventRecord(hipEvent_t, hipStream_t);
hipError_t hipEventSynchronize(hipEvent_t);
hipError_t hipEventElapsedTime(float *, hipEvent_t, hipEvent_t);
hipError_t hipEventDestroy(hipEvent_t);
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);
const char *hipGetErrorName(hipError_t);
const char *hipGetErrorString(hipError_t);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleUnload(hipModule_t);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, hipStream_t, void **, void **);

#define H2D 1
#define D2H 2
#define D2D 3
#define DEFAULT 4

#define NAME_OF(e) hipGetErrorName((hipError_t)(e))
#include "check.h"

struct probe { signed char a; double b; short c; };

int main(void) {
    int count = 0, device = -1, value = 0;
    CHECK(hipGetDeviceCount(&count));
    EXPECT(count >= 1);
    CHECK(hipSetDevice(0));
    CHECK(hipGetDevice(&device));
    EXPECT(device == 0);
    CHECK(hipDeviceGetAttribute(&value, 87 /* WarpSize */, 0));
    EXPECT(value > 0);

    /* errors: a bad device is refused locally, kept as the thread's last error */
    EXPECT(hipSetDevice(count + 5) == 101);
    EXPECT(hipPeekAtLastError() == 101);
    EXPECT(hipGetLastError() == 101);
    EXPECT(hipGetLastError() == 0);
    EXPECT(strcmp(hipGetErrorName(101), "hipErrorInvalidDevice") == 0);
    EXPECT(strcmp(hipGetErrorString(1), "invalid argument") == 0);

    size_t free_b = 0, total_b = 0;
    CHECK(hipMemGetInfo(&free_b, &total_b));
    EXPECT(total_b > 0 && free_b <= total_b);

    /* memory and copies of every kind */
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
    void *a = NULL, *b = NULL;
    CHECK(hipMalloc(&a, sizeof host));
    CHECK(hipMalloc(&b, sizeof host));
    CHECK(hipMemcpy(a, host, sizeof host, H2D));
    CHECK(hipMemcpy(b, a, sizeof host, D2D));
    memset(back, 0, sizeof back);
    CHECK(hipMemcpy(back, b, sizeof back, D2H));
    EXPECT(memcmp(host, back, sizeof host) == 0);
    memset(back, 0, sizeof back);
    CHECK(hipMemcpy(back, a, sizeof back, DEFAULT));
    EXPECT(memcmp(host, back, sizeof host) == 0);
    CHECK(hipMemset(b, 0, sizeof host));
    CHECK(hipMemcpy(back, b, sizeof back, D2H));
    EXPECT(back[0] == 0.0f && back[N - 1] == 0.0f);

    /* a copy larger than one chunk (several DATA frames each way) */
    size_t big = (size_t)3 << 20 | 12345;
    unsigned char *src = malloc(big), *dst = malloc(big);
    void *dbig = NULL;
    for (size_t i = 0; i < big; i++) src[i] = (unsigned char)(i * 131u);
    CHECK(hipMalloc(&dbig, big));
    CHECK(hipMemcpy(dbig, src, big, H2D));
    CHECK(hipMemcpy(dst, dbig, big, D2H));
    EXPECT(memcmp(src, dst, big) == 0);
    CHECK(hipFree(dbig));
    free(src);
    free(dst);

    /* streams and events */
    hipStream_t s = NULL;
    hipEvent_t e0 = NULL, e1 = NULL;
    CHECK(hipStreamCreate(&s));
    CHECK(hipEventCreate(&e0));
    CHECK(hipEventCreate(&e1));
    CHECK(hipEventRecord(e0, s));
    CHECK(hipMemsetAsync(a, 0, sizeof host, s));
    CHECK(hipMemcpyAsync(a, host, sizeof host, H2D, s));
    CHECK(hipEventRecord(e1, s));
    CHECK(hipEventSynchronize(e1));
    float ms = -1;
    CHECK(hipEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    CHECK(hipStreamSynchronize(s));
    CHECK(hipMemcpyAsync(back, a, sizeof back, D2H, s));
    EXPECT(memcmp(host, back, sizeof host) == 0);

    /* launches: the worker's built-in module */
    hipModule_t mod = NULL;
    hipFunction_t scale = NULL, probe = NULL;
    CHECK(hipModuleLoadData(&mod, "hipr:builtin"));
    CHECK(hipModuleGetFunction(&scale, mod, "scale_f32"));
    CHECK(hipModuleGetFunction(&probe, mod, "mixed_args_probe"));
    float factor = 2.0f;
    uint64_t n = N;
    void *params[] = {&a, &factor, &n};
    CHECK(hipModuleLaunchKernel(scale, 4, 1, 1, 256, 1, 1, 0, s, params, NULL));
    CHECK(hipStreamSynchronize(s));
    CHECK(hipMemcpy(back, a, sizeof back, D2H));
    int scaled = 1;
    for (int i = 0; i < N; i++) scaled &= back[i] == host[i] * 2.0f;
    EXPECT(scaled);

    /* kernelParams of every width: i8, i32, f32, f64, i16 and a 24-byte struct */
    void *out = NULL;
    enum { M = 8 };
    CHECK(hipMalloc(&out, M * sizeof(double)));
    signed char i8 = -3;
    int32_t i32 = 70000;
    float f32 = 0.25f;
    double f64 = 1e-3;
    short i16 = -300;
    struct probe st = {5, 2.5, 7};
    uint64_t m = M;
    void *mixed[] = {&out, &i8, &i32, &f32, &f64, &i16, &st, &m};
    CHECK(hipModuleLaunchKernel(probe, 1, 1, 1, 32, 1, 1, 0, NULL, mixed, NULL));
    double got[M];
    CHECK(hipMemcpy(got, out, sizeof got, D2H));
    for (int i = 0; i < M; i++) {
        double want = i8 + i32 + f32 + f64 + i16 + st.a + st.b + st.c + i;
        EXPECT(fabs(got[i] - want) < 1e-9);
    }

    /* the same launch through `extra` (the argument buffer given whole) */
    struct { void *out; float value; uint32_t pad; uint64_t n; } packed = {out, 4.0f, 0, 2};
    size_t packed_size = sizeof packed;
    CHECK(hipModuleGetFunction(&scale, mod, "fill_f32"));
    void *extra[] = {(void *)1, &packed, (void *)2, &packed_size, (void *)3};
    CHECK(hipModuleLaunchKernel(scale, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra));
    float filled[2];
    CHECK(hipMemcpy(filled, out, sizeof filled, D2H));
    EXPECT(filled[0] == 4.0f && filled[1] == 4.0f);

    /* launches in a row of one configuration travel as one frame (LAUNCH_KERNELS), a long
     * run as several, the first sent before the run ends (BATCH_EARLY): they must still
     * run in order, before and after the calls around them */
    hipFunction_t fill = NULL, scale2 = NULL;
    CHECK(hipModuleGetFunction(&fill, mod, "fill_f32"));
    CHECK(hipModuleGetFunction(&scale2, mod, "scale_f32"));
    float one = 1.0f, two = 2.0f, three = 3.0f;
    uint64_t sixteen = 16;
    void *fill_args[] = {&out, &one, &sixteen};
    void *twice[] = {&out, &two, &sixteen};
    void *thrice[] = {&out, &three, &sixteen};
    CHECK(hipModuleLaunchKernel(fill, 1, 1, 1, 16, 1, 1, 0, NULL, fill_args, NULL));
    for (int i = 0; i < 100; i++)
        CHECK(hipModuleLaunchKernel(scale2, 1, 1, 1, 16, 1, 1, 0, NULL, twice, NULL));
    CHECK(hipModuleLaunchKernel(scale2, 1, 1, 1, 16, 1, 1, 0, NULL, thrice, NULL));
    CHECK(hipMemset(out, 0, 4)); /* element 0 only, between two launches */
    for (int i = 0; i < 3; i++)
        CHECK(hipModuleLaunchKernel(scale2, 1, 1, 1, 16, 1, 1, 0, NULL, twice, NULL));
    float chain[16];
    CHECK(hipMemcpy(chain, out, sizeof chain, D2H));
    EXPECT(chain[0] == 0.0f);
    EXPECT(chain[1] == ldexpf(3.0f, 103) && chain[15] == ldexpf(3.0f, 103));

    /* a deferred error: a memset past an allocation is fire-and-forget, its error comes
     * with the next synchronising call, as HIP reports asynchronous errors */
    CHECK(hipMemset((char *)a + sizeof host - 4, 0, 64));
    hipError_t late = hipDeviceSynchronize();
    EXPECT(late != 0);
    EXPECT(hipGetLastError() == late);
    CHECK(hipDeviceSynchronize());

    /* a kernel that does not exist */
    hipFunction_t missing = NULL;
    EXPECT(hipModuleGetFunction(&missing, mod, "no_such_kernel") == 500);
    (void)hipGetLastError();

    CHECK(hipModuleUnload(mod));
    CHECK(hipEventDestroy(e0));
    CHECK(hipEventDestroy(e1));
    CHECK(hipStreamDestroy(s));
    CHECK(hipFree(out));
    CHECK(hipFree(a));
    CHECK(hipFree(b));
    CHECK(hipDeviceSynchronize());
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
