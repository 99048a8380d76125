/* Exercises the proxy's libcuda.so.1 against a running worker (HIPR_URL) through the CUDA
 * driver API: initialisation, devices, primary and created contexts, memory, copies sync
 * and async, memsets of every width, streams, events, errors, cuGetProcAddress, and
 * launches of hipr's built-in kernels (kernelParams, extra, cuLaunchKernelEx with its
 * attributes). With an argument, a module file (cubin / fatbin / PTX) holding
 * `extern "C" __global__ void scale_f32(float*, float, unsigned long long)` is loaded and
 * launched too (the GPU host). Prints "ok" and exits 0 when every check holds; built and
 * run under ASan/UBSan (leak checking on) by tests/proxy/test_cuda_c.py. Declares the
 * driver API itself: no CUDA headers are needed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
typedef struct { char bytes[16]; } CUuuid;
typedef struct {
    int id;
    char pad[4];
    union { char raw[64]; int i; struct { unsigned x, y, z; } dim; } value;
} CUlaunchAttribute;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shared;
    CUstream stream;
    CUlaunchAttribute *attrs;
    unsigned n_attrs;
} CUlaunchConfig;

CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned *, int *);
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice, unsigned);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuCtxGetStreamPriorityRange(int *, int *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemHostAlloc(void **, size_t, unsigned);
CUresult cuMemFreeHost(void *);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD16_v2(CUdeviceptr, unsigned short, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamCreateWithPriority(CUstream *, unsigned, int);
CUresult cuStreamGetPriority(CUstream, int *);
CUresult cuStreamGetFlags(CUstream, unsigned *);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamQuery(CUstream);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventQuery(CUevent);
CUresult cuEventElapsedTime(float *, CUevent, CUevent);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuGetErrorString(CUresult, const char **);
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
CUresult cuLibraryLoadData(CUlibrary *, const void *, int *, void **, unsigned, int *, void **,
                           unsigned);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);
CUresult cuCtxGetLimit(size_t *, int);
CUresult cuFuncGetParamInfo(CUfunction, size_t, size_t *, size_t *);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuFuncGetAttribute(int *, int, CUfunction);
CUresult cuFuncSetAttribute(CUfunction, int, int);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, CUfunction, int, size_t);
CUresult cuOccupancyMaxActiveClusters(int *, CUfunction, const CUlaunchConfig *);

#define NAME_OF(e) cu_name_of((CUresult)(e))
#include "check.h"


#define EXPECT_RC(want, call)                                                             \
    do {                                                                                  \
        CUresult e_ = (call);                                                             \
        if (e_ != (want)) {                                                               \
            fprintf(stderr, "%s:%d: %s -> %s, want %d\n", __FILE__, __LINE__, #call,      \
                    cu_name_of(e_), (want));                                              \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

enum { N = 1024 };

static void devices_and_contexts(CUdevice *dev, CUcontext *primary) {
    int version = 0, count = 0;
    CHECK(cuDriverGetVersion(&version));
    EXPECT(version >= 12000);
    CHECK(cuDeviceGetCount(&count));
    EXPECT(count >= 1);
    CHECK(cuDeviceGet(dev, 0));
    EXPECT_RC(101, cuDeviceGet(dev + 0, count)); /* CUDA_ERROR_INVALID_DEVICE */
    CHECK(cuDeviceGet(dev, 0));
    char name[256] = "";
    CHECK(cuDeviceGetName(name, sizeof name, *dev));
    EXPECT(name[0] != '\0');
    int major = -1, warp = 0, sms = 0;
    CHECK(cuDeviceGetAttribute(&major, 75, *dev)); /* COMPUTE_CAPABILITY_MAJOR */
    CHECK(cuDeviceGetAttribute(&warp, 10, *dev));  /* WARP_SIZE */
    CHECK(cuDeviceGetAttribute(&sms, 16, *dev));   /* MULTIPROCESSOR_COUNT */
    EXPECT(major >= 0 && warp > 0 && sms > 0);
    int v;
    EXPECT_RC(1, cuDeviceGetAttribute(&v, 100000, *dev));
    size_t total = 0;
    CHECK(cuDeviceTotalMem_v2(&total, *dev));
    EXPECT(total > 0);
    CUuuid u1, u2;
    CHECK(cuDeviceGetUuid_v2(&u1, *dev));
    CHECK(cuDeviceGetUuid_v2(&u2, *dev));
    EXPECT(memcmp(&u1, &u2, sizeof u1) == 0);

    /* no context yet: calls that need one say so */
    CUdeviceptr p;
    EXPECT_RC(201, cuMemAlloc_v2(&p, 16)); /* CUDA_ERROR_INVALID_CONTEXT */
    CUcontext cur = (CUcontext)1;
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == NULL);

    unsigned flags = 99;
    int active = 1;
    CHECK(cuDevicePrimaryCtxSetFlags_v2(*dev, 4)); /* CU_CTX_SCHED_BLOCKING_SYNC */
    CHECK(cuDevicePrimaryCtxGetState(*dev, &flags, &active));
    EXPECT(flags == 4 && active == 0);
    CHECK(cuDevicePrimaryCtxRetain(primary, *dev));
    CHECK(cuDevicePrimaryCtxGetState(*dev, &flags, &active));
    EXPECT(active == 1);
    CHECK(cuCtxSetCurrent(*primary));
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == *primary);
    CUdevice d = -1;
    CHECK(cuCtxGetDevice(&d));
    EXPECT(d == *dev);

    /* a created context: pushed, its memory freed with it, popped back to the primary */
    CUcontext mine = NULL, popped = NULL;
    CHECK(cuCtxCreate_v2(&mine, 0, *dev));
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == mine);
    CUdeviceptr in_mine = 0;
    CHECK(cuMemAlloc_v2(&in_mine, 4096));
    CHECK(cuCtxPopCurrent_v2(&popped));
    EXPECT(popped == mine);
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == *primary);
    CHECK(cuCtxPushCurrent_v2(mine));
    CHECK(cuCtxDestroy_v2(mine));
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == *primary);
    EXPECT_RC(1, cuMemFree_v2(in_mine)); /* went with its context */
    EXPECT_RC(201, cuCtxPushCurrent_v2(mine));
    int least = 1, greatest = 1;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    EXPECT(least == 0 && greatest == 0);
}

static void memory_and_copies(void) {
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
    CUdeviceptr a = 0, b = 0;
    size_t free_b = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free_b, &total));
    EXPECT(total > 0 && free_b <= total);
    EXPECT_RC(1, cuMemAlloc_v2(&a, 0));
    CHECK(cuMemAlloc_v2(&a, sizeof host));
    CHECK(cuMemAlloc_v2(&b, sizeof host));
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, a + 100));
    EXPECT(base == a && size == sizeof host);
    unsigned mtype = 0;
    CHECK(cuPointerGetAttribute(&mtype, 2, a + 8)); /* MEMORY_TYPE */
    EXPECT(mtype == 2);                             /* CU_MEMORYTYPE_DEVICE */

    CHECK(cuMemcpyHtoD_v2(a, host, sizeof host));
    CHECK(cuMemcpyDtoD_v2(b, a, sizeof host));
    memset(back, 0, sizeof back);
    CHECK(cuMemcpyDtoH_v2(back, b, sizeof back));
    EXPECT(memcmp(host, back, sizeof host) == 0);
    memset(back, 0, sizeof back);
    CHECK(cuMemcpy((CUdeviceptr)(uintptr_t)back, a, sizeof back)); /* unified addressing */
    EXPECT(memcmp(host, back, sizeof host) == 0);

    /* memsets: one byte, and 2- and 4-byte patterns whose bytes differ */
    uint8_t bytes[64];
    CHECK(cuMemsetD8_v2(b, 0xab, sizeof bytes));
    CHECK(cuMemcpyDtoH_v2(bytes, b, sizeof bytes));
    int all = 1;
    for (size_t i = 0; i < sizeof bytes; i++) all &= bytes[i] == 0xab;
    EXPECT(all);
    uint16_t halves[32];
    CHECK(cuMemsetD16_v2(b, 0x1234, 32));
    CHECK(cuMemcpyDtoH_v2(halves, b, sizeof halves));
    all = 1;
    for (int i = 0; i < 32; i++) all &= halves[i] == 0x1234;
    EXPECT(all);
    uint32_t words[N];
    CHECK(cuMemsetD32_v2(b, 0xdeadbeef, N));
    CHECK(cuMemcpyDtoH_v2(words, b, sizeof words));
    all = 1;
    for (int i = 0; i < N; i++) all &= words[i] == 0xdeadbeef;
    EXPECT(all);
    CHECK(cuMemsetD32_v2(b, 0x07070707, N)); /* uniform bytes: one MEMSET */
    CHECK(cuMemcpyDtoH_v2(words, b, sizeof words));
    EXPECT(words[0] == 0x07070707 && words[N - 1] == 0x07070707);
    EXPECT_RC(1, cuMemsetD32_v2(b + 2, 1, 4)); /* misaligned */

    /* a copy larger than one chunk (several DATA frames each way) */
    size_t big = (size_t)3 << 20 | 4096;
    unsigned char *src = malloc(big), *dst = malloc(big);
    CUdeviceptr dbig = 0;
    for (size_t i = 0; i < big; i++) src[i] = (unsigned char)(i * 131u);
    CHECK(cuMemAlloc_v2(&dbig, big));
    CHECK(cuMemcpyHtoD_v2(dbig, src, big));
    CHECK(cuMemcpyDtoH_v2(dst, dbig, big));
    EXPECT(memcmp(src, dst, big) == 0);
    CHECK(cuMemFree_v2(dbig));
    free(src);
    free(dst);

    /* host allocations */
    void *pinned = NULL, *mapped = NULL;
    CHECK(cuMemAllocHost_v2(&pinned, 1 << 16));
    CHECK(cuMemHostAlloc(&mapped, 1 << 12, 1 /* PORTABLE */));
    memcpy(pinned, host, sizeof host);
    CHECK(cuMemcpyHtoD_v2(a, pinned, sizeof host));
    CHECK(cuMemcpyDtoH_v2(back, a, sizeof back));
    EXPECT(memcmp(host, back, sizeof host) == 0);
    CHECK(cuPointerGetAttribute(&mtype, 2, (CUdeviceptr)(uintptr_t)pinned));
    EXPECT(mtype == 1); /* CU_MEMORYTYPE_HOST */
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFreeHost(mapped));
    EXPECT_RC(1, cuMemFreeHost(pinned));

    CHECK(cuMemFree_v2(a));
    CHECK(cuMemFree_v2(b));
    EXPECT_RC(1, cuMemFree_v2(a)); /* freed already */
}

static void streams_and_events(void) {
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)(N - i);
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc_v2(&a, sizeof host));
    CUstream s = NULL, hi = NULL;
    CHECK(cuStreamCreate(&s, 1 /* NON_BLOCKING */));
    CHECK(cuStreamCreateWithPriority(&hi, 0, -5));
    int prio = 1;
    unsigned flags = 0;
    CHECK(cuStreamGetPriority(hi, &prio));
    EXPECT(prio == 0); /* clamped into the range [0, 0] */
    CHECK(cuStreamGetFlags(s, &flags));
    EXPECT(flags == 1);
    CUevent e0 = NULL, e1 = NULL, untimed = NULL;
    CHECK(cuEventCreate(&e0, 0));
    CHECK(cuEventCreate(&e1, 0));
    CHECK(cuEventCreate(&untimed, 2 /* DISABLE_TIMING */));
    CHECK(cuEventRecord(e0, s));
    CHECK(cuMemsetD32Async(a, 0, N, s));
    CHECK(cuMemcpyHtoDAsync_v2(a, host, sizeof host, s));
    CHECK(cuEventRecord(e1, s));
    CHECK(cuEventRecord(untimed, s));
    CHECK(cuStreamWaitEvent(hi, e1, 0));
    CHECK(cuEventSynchronize(e1));
    CHECK(cuEventQuery(e1));
    float ms = -1;
    CHECK(cuEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    EXPECT_RC(400, cuEventElapsedTime(&ms, e0, untimed)); /* INVALID_HANDLE */
    CHECK(cuMemcpyDtoHAsync_v2(back, a, sizeof back, hi));
    CHECK(cuStreamSynchronize(hi));
    CHECK(cuStreamQuery(s));
    EXPECT(memcmp(host, back, sizeof host) == 0);
    CUdeviceptr b = 0;
    CHECK(cuMemAlloc_v2(&b, sizeof host));
    CHECK(cuMemcpyDtoDAsync_v2(b, a, sizeof host, (CUstream)0x2 /* PER_THREAD */));
    CHECK(cuMemcpyDtoHAsync_v2(back, b, sizeof back, (CUstream)0x1 /* LEGACY */));
    EXPECT(memcmp(host, back, sizeof host) == 0);
    CHECK(cuCtxSynchronize());
    CHECK(cuEventDestroy_v2(e0));
    CHECK(cuEventDestroy_v2(e1));
    CHECK(cuEventDestroy_v2(untimed));
    EXPECT_RC(400, cuEventQuery(e0));
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuStreamDestroy_v2(hi));
    EXPECT_RC(400, cuStreamSynchronize(s));
    CHECK(cuMemFree_v2(a));
    CHECK(cuMemFree_v2(b));
}

static void errors_and_lookup(void) {
    const char *str = NULL;
    CHECK(cuGetErrorName(201, &str));
    EXPECT(str && strcmp(str, "CUDA_ERROR_INVALID_CONTEXT") == 0);
    CHECK(cuGetErrorString(2, &str));
    EXPECT(str && strcmp(str, "out of memory") == 0);
    EXPECT_RC(1, cuGetErrorName(123456, &str));
    EXPECT(str == NULL);

    void *fn = NULL;
    int status = -1;
    CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &status));
    EXPECT(fn == (void *)cuMemAlloc_v2 && status == 0);
    CHECK(cuGetProcAddress("cuLaunchKernel", &fn, 12000, 2 /* PER_THREAD */));
    EXPECT(fn == (void *)cuLaunchKernel);
    CHECK(cuGetProcAddress_v2("cuCtxCreate", &fn, 11000, 0, &status));
    EXPECT(fn == (void *)cuCtxCreate_v2);
    EXPECT_RC(500, cuGetProcAddress_v2("cuNoSuchThing", &fn, 12000, 0, &status));
    EXPECT(fn == NULL && status == 1);
    /* a symbol exported but not served resolves to its stub, which refuses */
    CHECK(cuGetProcAddress_v2("cuMemAllocManaged", &fn, 12000, 0, &status));
    EXPECT(fn != NULL);
    CUdeviceptr p = 0;
    EXPECT_RC(801, cuMemAllocManaged(&p, 64, 1));
    if (fn) {
        CUresult (*managed)(CUdeviceptr *, size_t, unsigned) =
            (CUresult (*)(CUdeviceptr *, size_t, unsigned))fn;
        EXPECT_RC(801, managed(&p, 64, 1));
    }
}

static void launches(const char *module_file) {
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc_v2(&a, sizeof host));
    CHECK(cuMemcpyHtoD_v2(a, host, sizeof host));
    CUmodule mod = NULL;
    CUfunction scale = NULL, fill = NULL, again = NULL;
    CHECK(cuModuleLoadData(&mod, "hipr:builtin"));
    CHECK(cuModuleGetFunction(&scale, mod, "scale_f32"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_f32"));
    CHECK(cuModuleGetFunction(&again, mod, "scale_f32"));
    EXPECT(again == scale);
    EXPECT_RC(500, cuModuleGetFunction(&again, mod, "no_such_kernel"));
    /* names longer than 255 characters (C++ kernels' mangled names) are asked for too */
    char long_name[600];
    memset(long_name, 'k', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    EXPECT_RC(500, cuModuleGetFunction(&again, mod, long_name));
    size_t off = 99, size = 99;
    CHECK(cuFuncGetParamInfo(scale, 1, &off, &size));
    EXPECT(off == 8 && size == 4);
    CHECK(cuFuncGetParamInfo(scale, 2, &off, &size));
    EXPECT(off == 16 && size == 8);
    EXPECT_RC(1, cuFuncGetParamInfo(scale, 3, &off, &size));

    /* kernel attributes come from the worker's driver; the emulator cannot tell */
    int max_threads = 0;
    CUresult fa = cuFuncGetAttribute(&max_threads, 0 /* MAX_THREADS_PER_BLOCK */, scale);
    if (module_file) EXPECT(fa == 0 && max_threads > 0);
    else EXPECT(fa == 801);
    int blocks = -1;
    CUresult occ = cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, scale, 256, 0);
    if (module_file) EXPECT(occ == 0 && blocks > 0);
    else EXPECT(occ == 801);
    CUlaunchConfig one = {1, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
    int clusters = -1;
    occ = cuOccupancyMaxActiveClusters(&clusters, scale, &one);
    if (!module_file) EXPECT(occ == 801);
    /* a code object larger than one frame travels in DATA frames: the worker takes it
     * whole (the emulator then refuses it as an image, a driver as bad PTX) */
    size_t big = (size_t)3 << 20;
    char *text = malloc(big + 1);
    if (text) {
        memset(text, ' ', big);
        memcpy(text, "//", 2);
        text[big] = '\0';
        CUmodule junk = NULL;
        CUresult lr = cuModuleLoadData(&junk, text);
        EXPECT(lr != 0 && lr != 1);
        if (!module_file) EXPECT(lr == 200); /* CUDA_ERROR_INVALID_IMAGE */
        free(text);
    }
    int capturing = -1;
    CHECK(cuStreamIsCapturing(NULL, &capturing));
    EXPECT(capturing == 0);

    float factor = 3.0f;
    unsigned long long n = N;
    void *params[] = {&a, &factor, &n};
    CHECK(cuLaunchKernel(scale, 4, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuMemcpyDtoH_v2(back, a, sizeof back));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= back[i] == host[i] * 3.0f;
    EXPECT(ok);

    /* `extra`: the argument buffer whole */
    struct { CUdeviceptr out; float value; uint32_t pad; unsigned long long n; } packed = {
        a, 7.0f, 0, 2};
    size_t packed_size = sizeof packed;
    void *extra[] = {(void *)1, &packed, (void *)2, &packed_size, (void *)0};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuMemcpyDtoH_v2(back, a, 3 * sizeof(float)));
    EXPECT(back[0] == 7.0f && back[1] == 7.0f && back[2] == 6.0f);

    /* cuLaunchKernelEx: attributes the plain launch honours, and one it refuses */
    CUlaunchAttribute attrs[3];
    memset(attrs, 0, sizeof attrs);
    attrs[0].id = 8; /* PRIORITY */
    attrs[0].value.i = 3;
    attrs[1].id = 4; /* CLUSTER_DIMENSION 1x1x1 */
    attrs[1].value.dim.x = attrs[1].value.dim.y = attrs[1].value.dim.z = 1;
    attrs[2].id = 2; /* COOPERATIVE off */
    CUlaunchConfig cfg = {4, 1, 1, 256, 1, 1, 0, NULL, attrs, 3};
    float half = 0.5f;
    void *halve[] = {&a, &half, &n};
    CHECK(cuLaunchKernelEx(&cfg, scale, halve, NULL));
    CHECK(cuMemcpyDtoH_v2(back, a, sizeof back));
    EXPECT(back[0] == 3.5f && back[N - 1] == host[N - 1] * 1.5f);
    attrs[2].value.i = 1; /* COOPERATIVE on: not served, refused */
    EXPECT_RC(801, cuLaunchKernelEx(&cfg, scale, halve, NULL));
    CHECK(cuMemcpyDtoH_v2(back, a, sizeof(float)));
    EXPECT(back[0] == 3.5f); /* the refused launch did not run */
    /* a device limit (CU_LIMIT_STACK_SIZE) from the worker's driver; the emulator has none */
    size_t limit = 0;
    CUresult lr0 = cuCtxGetLimit(&limit, 0);
    if (module_file) EXPECT(lr0 == 0 && limit > 0);
    else EXPECT(lr0 == 801);
    EXPECT_RC(1, cuCtxGetLimit(NULL, 0));
    /* module globals: hipr's built-in kernels have none */
    CUdeviceptr var = 0;
    size_t var_size = 0;
    EXPECT_RC(500, cuModuleGetGlobal_v2(&var, &var_size, mod, "hipr_probe"));
    CHECK(cuModuleUnload(mod));
    EXPECT_RC(400, cuLaunchKernel(scale, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));

    if (module_file) {
        CUmodule user = NULL;
        CUfunction k = NULL;
        CHECK(cuModuleLoad(&user, module_file));
        CHECK(cuModuleGetFunction(&k, user, "scale_f32"));
        CHECK(cuMemcpyHtoD_v2(a, host, sizeof host));
        float two = 2.0f;
        void *p2[] = {&a, &two, &n};
        /* more than 48 KiB of dynamic shared memory needs the attribute set first */
        CHECK(cuFuncSetAttribute(k, 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */, 64 * 1024));
        int dyn = 0;
        CHECK(cuFuncGetAttribute(&dyn, 8, k));
        EXPECT(dyn == 64 * 1024);
        CHECK(cuLaunchKernel(k, 4, 1, 1, 256, 1, 1, 64 * 1024, NULL, p2, NULL));
        CHECK(cuMemcpyDtoH_v2(back, a, sizeof back));
        ok = 1;
        for (int i = 0; i < N; i++) ok &= back[i] == host[i] * 2.0f;
        EXPECT(ok);
        /* a __device__ variable: its address and size, written and read back by copies
         * (the generic cuMemcpy tells it from host memory) */
        int probe[4] = {11, 22, 33, 44}, probe_back[4] = {0, 0, 0, 0};
        CHECK(cuModuleGetGlobal_v2(&var, &var_size, user, "hipr_probe"));
        EXPECT(var != 0 && var_size == sizeof probe);
        CHECK(cuMemcpyHtoD_v2(var, probe, sizeof probe));
        CHECK(cuMemcpy((CUdeviceptr)(uintptr_t)probe_back, var, sizeof probe_back));
        EXPECT(memcmp(probe, probe_back, sizeof probe) == 0);
        EXPECT_RC(500, cuModuleGetGlobal_v2(&var, &var_size, user, "no_such_variable"));
        CHECK(cuModuleUnload(user));
    }
    CHECK(cuMemFree_v2(a));
}

/* The CUDA runtime's path (cudart 12 loads each fat binary as a library and launches
 * its CUkernel handles): many libraries, kernels taken by name, a CUkernel launched as
 * a function, and every handle refused once its library is gone. */
static void libraries(void) {
    enum { LIBS = 300 };
    CUlibrary *libs = calloc(LIBS, sizeof *libs);
    if (!libs) {
        failures++;
        return;
    }
    for (int i = 0; i < LIBS; i++)
        CHECK(cuLibraryLoadData(&libs[i], "hipr:builtin", NULL, NULL, 0, NULL, NULL, 0));
    CUkernel fill = NULL, again = NULL;
    CHECK(cuLibraryGetKernel(&fill, libs[LIBS / 2], "fill_f32"));
    CHECK(cuLibraryGetKernel(&again, libs[LIBS / 2], "fill_f32"));
    EXPECT(fill == again);
    CUdeviceptr out = 0;
    CHECK(cuMemAlloc_v2(&out, 4 * sizeof(float)));
    float value = 5.0f;
    unsigned long long n = 4;
    void *params[] = {&out, &value, &n};
    CHECK(cuLaunchKernel((CUfunction)fill, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    float back[4] = {0};
    CHECK(cuMemcpyDtoH_v2(back, out, sizeof back));
    EXPECT(back[0] == 5.0f && back[3] == 5.0f);
    CUfunction as_function = NULL;
    CHECK(cuKernelGetFunction(&as_function, fill));
    value = 6.0f;
    CHECK(cuLaunchKernel(as_function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    CHECK(cuMemcpyDtoH_v2(back, out, sizeof back));
    EXPECT(back[1] == 6.0f);
    for (int i = 0; i < LIBS; i++) CHECK(cuLibraryUnload(libs[i]));
    /* Gone with its library: the kernel, its function, and the library itself. */
    EXPECT_RC(400, cuLaunchKernel((CUfunction)fill, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    EXPECT_RC(400, cuLaunchKernel(as_function, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    EXPECT_RC(400, cuKernelGetFunction(&as_function, fill));
    EXPECT_RC(400, cuLibraryGetKernel(&again, libs[0], "fill_f32"));
    EXPECT_RC(400, cuLibraryUnload(libs[0]));
    CHECK(cuMemFree_v2(out));
    free(libs);
}

int main(int argc, char **argv) {
    CUdeviceptr p;
    EXPECT_RC(3, cuMemAlloc_v2(&p, 16)); /* CUDA_ERROR_NOT_INITIALIZED before cuInit */
    EXPECT_RC(1, cuInit(1));
    CHECK(cuInit(0));
    if (failures) return 1; /* no worker: nothing else can run */
    CUdevice dev = 0;
    CUcontext primary = NULL;
    devices_and_contexts(&dev, &primary);
    memory_and_copies();
    streams_and_events();
    errors_and_lookup();
    launches(argc > 1 ? argv[1] : NULL);
    libraries();
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    EXPECT_RC(201, cuDevicePrimaryCtxRelease_v2(dev));
    /* Which libcuda this process runs on (the proxy's, not NVIDIA's driver). */
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[1024];
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "libcuda.so")) {
            fprintf(stderr, "mapped: %s", strchr(line, '/') ? strchr(line, '/') : line);
            break;
        }
    if (maps) fclose(maps);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
