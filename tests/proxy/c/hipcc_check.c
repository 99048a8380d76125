/* The hipcc path and the rest of the HIP front, from C, against a running worker
 * (HIPR_URL). Kernels are registered the way hipcc-generated code registers them: a
 * constructor calls __hipRegisterFatBinary on a clang fat-binary wrapper and
 * __hipRegisterFunction for each host stub, before main and before any connection; each
 * `kernel<<<...>>>(args)` is written out as hipcc lowers it (__hipPushCallConfiguration,
 * then the stub: __hipPopCallConfiguration and hipLaunchKernel). The wrapped code object
 * is HIPCC_CHECK_IMAGE (a file: a cubin on a cuda worker) or the worker's built-in kernels
 * ("hipr:builtin", any worker). A device variable, `hipr_builtin_bias` (a float the
 * built-in module and the GPU check's CUBIN both have, read by add_bias_f32), is
 * registered as hipcc registers one (__hipRegisterVar, its host shadow's address) and
 * reached through the symbol calls. Also: ROCm 5's property struct, host allocations, pointer
 * attributes, stream flags, stream capture into a graph, hipExtModuleLaunchKernel.
 * Prints "ok"; run under ASan/UBSan by tests/proxy/test_native_c.py. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct hipr_module *hipModule_t;
typedef struct hipr_function *hipFunction_t;
typedef struct hipr_graph *hipGraph_t;
typedef struct hipr_graph_exec *hipGraphExec_t;
typedef struct { unsigned int x, y, z; } dim3;
typedef struct {
    int type, device;
    void *devicePointer, *hostPointer;
    int isManaged;
    unsigned int allocationFlags;
} hipPointerAttribute_t;

void **__hipRegisterFatBinary(const void *);
void __hipRegisterFunction(void **, const void *, char *, const char *, unsigned int, void *,
                           void *, void *, void *, int *);
void __hipUnregisterFatBinary(void **);
void __hipRegisterVar(void **, void *, char *, char *, int, size_t, int, int);
hipError_t hipMemcpyToSymbol(const void *, const void *, size_t, size_t, int);
hipError_t hipMemcpyFromSymbol(void *, const void *, size_t, size_t, int);
hipError_t hipMemcpyToSymbolAsync(const void *, const void *, size_t, size_t, int, hipStream_t);
hipError_t hipMemcpyFromSymbolAsync(void *, const void *, size_t, size_t, int, hipStream_t);
hipError_t hipGetSymbolAddress(void **, const void *);
hipError_t hipGetSymbolSize(size_t *, const void *);
hipError_t hipModuleGetGlobal(void **, size_t *, hipModule_t, const char *);
hipError_t __hipPushCallConfiguration(dim3, dim3, size_t, hipStream_t);
hipError_t __hipPopCallConfiguration(dim3 *, dim3 *, size_t *, hipStream_t *);
hipError_t hipLaunchKernel(const void *, dim3, dim3, void **, size_t, hipStream_t);
const char *hipGetErrorName(hipError_t);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipDeviceSynchronize(void);
hipError_t hipGetLastError(void);
hipError_t hipGetDeviceProperties(void *, int);
hipError_t hipGetDevicePropertiesR0000(void *, int);
hipError_t hipGetDevicePropertiesR0600(void *, int);
hipError_t hipDeviceGetName(char *, int, int);
hipError_t hipDeviceGetPCIBusId(char *, int, int);
hipError_t hipHostMalloc(void **, size_t, unsigned int);
hipError_t hipHostFree(void *);
hipError_t hipMallocHost(void **, size_t);
hipError_t hipFreeHost(void *);
hipError_t hipPointerGetAttributes(hipPointerAttribute_t *, const void *);
hipError_t hipStreamCreateWithPriority(hipStream_t *, unsigned int, int);
hipError_t hipStreamGetFlags(hipStream_t, unsigned int *);
hipError_t hipStreamGetPriority(hipStream_t, int *);
hipError_t hipDeviceGetStreamPriorityRange(int *, int *);
hipError_t hipStreamDestroy(hipStream_t);
hipError_t hipStreamSynchronize(hipStream_t);
hipError_t hipStreamBeginCapture(hipStream_t, int);
hipError_t hipStreamEndCapture(hipStream_t, hipGraph_t *);
hipError_t hipStreamIsCapturing(hipStream_t, int *);
hipError_t hipStreamGetCaptureInfo(hipStream_t, int *, unsigned long long *);
hipError_t hipGraphInstantiate(hipGraphExec_t *, hipGraph_t, void *, char *, size_t);
hipError_t hipGraphLaunch(hipGraphExec_t, hipStream_t);
hipError_t hipGraphExecDestroy(hipGraphExec_t);
hipError_t hipGraphDestroy(hipGraph_t);
hipError_t hipEventCreate(hipEvent_t *);
hipError_t hipEventDestroy(hipEvent_t);
hipError_t hipEventSynchronize(hipEvent_t);
hipError_t hipEventElapsedTime(float *, hipEvent_t, hipEvent_t);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleUnload(hipModule_t);
hipError_t hipExtModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, unsigned, size_t, hipStream_t, void **, void **,
                                    hipEvent_t, hipEvent_t, unsigned);
hipError_t hipMallocAsync(void **, size_t, hipStream_t);
const char *hipKernelNameRefByPtr(const void *, hipStream_t);
const char *hipKernelNameRef(hipFunction_t);
hipError_t hipMemsetD32(void *, int, size_t);
hipError_t hipMemsetD16Async(void *, unsigned short, size_t, hipStream_t);
hipError_t hipMemsetD8(void *, unsigned char, size_t);
hipError_t hipMemcpyWithStream(void *, const void *, size_t, int, hipStream_t);
hipError_t hipDeviceGet(int *, int);
hipError_t hipDeviceComputeCapability(int *, int *, int);
hipError_t hipFreeAsync(void *, hipStream_t);

#define H2D 1
#define D2H 2

#define NAME_OF(e) hipGetErrorName((hipError_t)(e))
#include "check.h"

/* --- what hipcc emits ------------------------------------------------------------------ */

struct fatbin_wrapper {
    uint32_t magic, version;
    const void *binary;
    const void *unused;
};

static struct fatbin_wrapper wrapper = {0x48495046u /* "HIPF" */, 1, NULL, NULL};
static void **fatbin_handle;
static void *image_file;

/* The host stubs: each pops the configuration its call site pushed and launches itself. */
static void fill_f32(float *out, float value, uint64_t n) {
    void *args[] = {&out, &value, &n};
    dim3 grid, block;
    size_t shared;
    hipStream_t stream;
    CHECK(__hipPopCallConfiguration(&grid, &block, &shared, &stream));
    CHECK(hipLaunchKernel((const void *)fill_f32, grid, block, args, shared, stream));
}

static void scale_f32(float *x, float factor, uint64_t n) {
    void *args[] = {&x, &factor, &n};
    dim3 grid, block;
    size_t shared;
    hipStream_t stream;
    CHECK(__hipPopCallConfiguration(&grid, &block, &shared, &stream));
    CHECK(hipLaunchKernel((const void *)scale_f32, grid, block, args, shared, stream));
}

static void add_bias_f32(float *x, uint64_t n) {
    void *args[] = {&x, &n};
    dim3 grid, block;
    size_t shared;
    hipStream_t stream;
    CHECK(__hipPopCallConfiguration(&grid, &block, &shared, &stream));
    CHECK(hipLaunchKernel((const void *)add_bias_f32, grid, block, args, shared, stream));
}

/* The host shadow of `__device__ float hipr_builtin_bias`: hipcc gives the symbol calls
 * its address; its own value is never read. */
static float hipr_builtin_bias;
static float not_a_variable;

static void not_registered(void) {}

static void unregister(void) {
    __hipUnregisterFatBinary(fatbin_handle);
    free(image_file);
}

static void *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = n > 0 ? malloc((size_t)n) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

__attribute__((constructor)) static void register_kernels(void) {
    const char *path = getenv("HIPCC_CHECK_IMAGE");
    image_file = path && *path ? read_file(path) : NULL;
    wrapper.binary = image_file ? image_file : "hipr:builtin";
    fatbin_handle = __hipRegisterFatBinary(&wrapper);
    __hipRegisterFunction(fatbin_handle, (const void *)fill_f32, "fill_f32", "fill_f32",
                          (unsigned)-1, NULL, NULL, NULL, NULL, NULL);
    __hipRegisterFunction(fatbin_handle, (const void *)scale_f32, "scale_f32", "scale_f32",
                          (unsigned)-1, NULL, NULL, NULL, NULL, NULL);
    __hipRegisterFunction(fatbin_handle, (const void *)add_bias_f32, "add_bias_f32",
                          "add_bias_f32", (unsigned)-1, NULL, NULL, NULL, NULL, NULL);
    __hipRegisterVar(fatbin_handle, &hipr_builtin_bias, "hipr_builtin_bias",
                     "hipr_builtin_bias", 0, sizeof hipr_builtin_bias, 0, 0);
    atexit(unregister);
}

/* kernel<<<grid, block, shared, stream>>>(...) */
#define LAUNCH(kernel, grid, block, stream, ...)                                          \
    do {                                                                                  \
        CHECK(__hipPushCallConfiguration((dim3){grid, 1, 1}, (dim3){block, 1, 1}, 0,      \
                                         stream));                                        \
        kernel(__VA_ARGS__);                                                              \
    } while (0)

/* --- threads launch at once, each with its own configuration stack ------------------- */

struct job {
    float *d;
    float value;
    int ok;
};

static void *thread_main(void *arg) {
    struct job *j = arg;
    float back[64];
    for (int round = 0; round < 20; round++) {
        LAUNCH(fill_f32, 1, 64, NULL, j->d, j->value + (float)round, 64);
        CHECK(hipMemcpy(back, j->d, sizeof back, D2H));
        for (int i = 0; i < 64; i++)
            if (back[i] != j->value + (float)round) return NULL;
    }
    j->ok = 1;
    return NULL;
}

int main(void) {
    enum { N = 1024 };
    float *d = NULL;
    static float host[N];
    CHECK(hipMalloc((void **)&d, N * sizeof(float)));

    /* hipcc's launches: registration ran before main, the module loads now */
    LAUNCH(fill_f32, N / 256, 256, NULL, d, 1.5f, N);
    LAUNCH(scale_f32, N / 256, 256, NULL, d, 4.0f, N);
    CHECK(hipMemcpy(host, d, sizeof host, D2H));
    EXPECT(host[0] == 6.0f && host[N - 1] == 6.0f);

    /* a device variable through its host shadow (__hipRegisterVar) */
    size_t var_size = 0;
    void *var_ptr = NULL;
    CHECK(hipGetSymbolSize(&var_size, &hipr_builtin_bias));
    CHECK(hipGetSymbolAddress(&var_ptr, &hipr_builtin_bias));
    EXPECT(var_size == sizeof(float) && var_ptr != NULL);
    float bias = 0.5f, bias_back = 0;
    CHECK(hipMemcpyToSymbol(&hipr_builtin_bias, &bias, sizeof bias, 0, H2D));
    LAUNCH(add_bias_f32, N / 256, 256, NULL, d, N);
    CHECK(hipMemcpy(host, d, sizeof host, D2H));
    EXPECT(host[0] == 6.5f && host[N - 1] == 6.5f);
    CHECK(hipMemcpyFromSymbol(&bias_back, &hipr_builtin_bias, sizeof bias_back, 0, D2H));
    EXPECT(bias_back == 0.5f);
    /* hipMemcpyDefault: a host source; a device source (an allocation of this session) */
    bias = -6.5f;
    CHECK(hipMemcpy(d + 1, &bias, sizeof bias, H2D));
    CHECK(hipMemcpyToSymbol(&hipr_builtin_bias, d + 1, sizeof bias, 0, 4));
    CHECK(hipMemcpyFromSymbol(d + 2, &hipr_builtin_bias, sizeof bias, 0, 4));
    LAUNCH(add_bias_f32, N / 256, 256, NULL, d, N);
    CHECK(hipMemcpy(host, d, sizeof host, D2H));
    EXPECT(host[0] == 0.0f && host[2] == -13.0f && host[N - 1] == 0.0f);
    /* the async forms, and the variable's bytes as the module's global */
    uint16_t half = 0x3f80, half_back = 0; /* the high half of 1.0f */
    bias = 0;
    CHECK(hipMemcpyToSymbolAsync(&hipr_builtin_bias, &bias, sizeof bias, 0, H2D, NULL));
    CHECK(hipMemcpyToSymbolAsync(&hipr_builtin_bias, &half, 2, 2, H2D, NULL));
    CHECK(hipMemcpyFromSymbolAsync(&half_back, &hipr_builtin_bias, 2, 2, D2H, NULL));
    CHECK(hipDeviceSynchronize());
    CHECK(hipMemcpyFromSymbol(&bias_back, &hipr_builtin_bias, sizeof bias_back, 0, 4));
    EXPECT(half_back == 0x3f80 && bias_back == 1.0f);
    /* refusals: past the variable's end, a wrong direction, an address no variable has */
    EXPECT(hipMemcpyToSymbol(&hipr_builtin_bias, &bias, sizeof bias, 1, H2D) == 1);
    EXPECT(hipMemcpyToSymbol(&hipr_builtin_bias, &bias, sizeof bias, 0, D2H) == 21);
    EXPECT(hipMemcpyFromSymbol(&bias, &not_a_variable, sizeof bias, 0, D2H) == 13);
    EXPECT(hipGetSymbolAddress(&var_ptr, &not_a_variable) == 13);
    EXPECT(hipGetLastError() == 13);

    /* a stub with no pushed configuration, a function nobody registered */
    dim3 g, b;
    size_t sh;
    hipStream_t st;
    EXPECT(__hipPopCallConfiguration(&g, &b, &sh, &st) == 52); /* MissingConfiguration */
    EXPECT(hipLaunchKernel((const void *)not_registered, (dim3){1, 1, 1}, (dim3){1, 1, 1},
                           NULL, 0, NULL) == 98); /* InvalidDeviceFunction */
    EXPECT(hipGetLastError() == 98);
    EXPECT(strcmp(hipKernelNameRefByPtr((const void *)scale_f32, NULL), "scale_f32") == 0);
    EXPECT(hipKernelNameRefByPtr((const void *)not_registered, NULL) == NULL);
    /* nested configurations pop in order */
    CHECK(__hipPushCallConfiguration((dim3){1, 1, 1}, (dim3){2, 1, 1}, 0, NULL));
    CHECK(__hipPushCallConfiguration((dim3){3, 1, 1}, (dim3){4, 1, 1}, 8, NULL));
    CHECK(__hipPopCallConfiguration(&g, &b, &sh, &st));
    EXPECT(g.x == 3 && b.x == 4 && sh == 8);
    CHECK(__hipPopCallConfiguration(&g, &b, &sh, &st));
    EXPECT(g.x == 1 && b.x == 2 && sh == 0);

    /* four threads launching at once */
    pthread_t threads[4];
    struct job jobs[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (struct job){NULL, 10.0f * (float)(t + 1), 0};
        CHECK(hipMalloc((void **)&jobs[t].d, 64 * sizeof(float)));
        pthread_create(&threads[t], NULL, thread_main, &jobs[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(threads[t], NULL);
        EXPECT(jobs[t].ok);
        CHECK(hipFree(jobs[t].d));
    }

    /* ROCm 5's 792-byte struct beside ROCm 6's, guarded on both sides */
    unsigned char *old = calloc(1, 792 + 64), *old2 = calloc(1, 792 + 64);
    unsigned char *cur = calloc(1, 1472);
    memset(old + 792, 0xAB, 64);
    CHECK(hipGetDevicePropertiesR0000(old, 0));
    CHECK(hipGetDeviceProperties(old2, 0));
    CHECK(hipGetDevicePropertiesR0600(cur, 0));
    EXPECT(old[792] == 0xAB && old[792 + 63] == 0xAB);
    EXPECT(strcmp((char *)old, (char *)cur) == 0 && old[0] != 0);        /* name */
    EXPECT(memcmp(old, old2, 792) == 0);
    EXPECT(strcmp((char *)old + 396, (char *)cur + 1160) == 0);          /* gcnArchName */
    int warp_old, warp_cur;
    memcpy(&warp_old, old + 276, 4);                                      /* warpSize */
    memcpy(&warp_cur, cur + 308, 4);
    EXPECT(warp_old == warp_cur && warp_old > 0);
    free(old);
    free(old2);
    free(cur);
    char name[16], bus[32];
    CHECK(hipDeviceGetName(name, sizeof name, 0));
    EXPECT(strlen(name) < sizeof name && name[0] != 0);
    CHECK(hipDeviceGetPCIBusId(bus, sizeof bus, 0));
    EXPECT(strlen(bus) == 12 && bus[4] == ':');

    /* host allocations and pointer attributes */
    float *pinned = NULL, *pinned2 = NULL;
    CHECK(hipHostMalloc((void **)&pinned, N * sizeof(float), 0));
    CHECK(hipMallocHost((void **)&pinned2, 64));
    EXPECT(pinned && ((uintptr_t)pinned & 4095) == 0);
    for (int i = 0; i < N; i++) pinned[i] = (float)i;
    CHECK(hipMemcpy(d, pinned, N * sizeof(float), 4 /* Default: from host memory */));
    memset(pinned, 0, N * sizeof(float));
    CHECK(hipMemcpy(pinned, d, N * sizeof(float), 4));
    EXPECT(pinned[N - 1] == (float)(N - 1));
    hipPointerAttribute_t attr;
    CHECK(hipPointerGetAttributes(&attr, d + 5));
    EXPECT(attr.type == 2 && attr.devicePointer == d + 5);
    CHECK(hipPointerGetAttributes(&attr, pinned + 5));
    EXPECT(attr.type == 1 && attr.hostPointer == pinned + 5);
    int stack_var = 0;
    EXPECT(hipPointerGetAttributes(&attr, &stack_var) == 1 && attr.type == 0);
    CHECK(hipHostFree(pinned));
    CHECK(hipFreeHost(pinned2));
    EXPECT(hipHostFree(&stack_var) == 1);
    hipGetLastError();

    /* streams: the flags and priority the worker's streams have */
    hipStream_t s = NULL;
    int least = 9, greatest = 9, prio = 9;
    unsigned flags = 9;
    CHECK(hipDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK(hipStreamCreateWithPriority(&s, 0, greatest));
    CHECK(hipStreamGetFlags(s, &flags));
    CHECK(hipStreamGetPriority(s, &prio));
    EXPECT(flags == 1 && prio >= greatest && prio <= least);

    /* stream capture into a graph, launched twice */
    int status = 9;
    unsigned long long id = 0;
    CHECK(hipStreamIsCapturing(s, &status));
    EXPECT(status == 0);
    CHECK(hipStreamBeginCapture(s, 0));
    CHECK(hipStreamIsCapturing(s, &status));
    CHECK(hipStreamGetCaptureInfo(s, &status, &id));
    EXPECT(status == 1 && id != 0);
    LAUNCH(scale_f32, N / 256, 256, s, d, 2.0f, N);
    hipGraph_t graph = NULL;
    hipGraphExec_t exec = NULL;
    CHECK(hipStreamEndCapture(s, &graph));
    CHECK(hipStreamIsCapturing(s, &status));
    EXPECT(status == 0 && graph != NULL);
    CHECK(hipGraphInstantiate(&exec, graph, NULL, NULL, 0));
    LAUNCH(fill_f32, N / 256, 256, s, d, 1.0f, N);
    CHECK(hipGraphLaunch(exec, s));
    CHECK(hipGraphLaunch(exec, s));
    CHECK(hipStreamSynchronize(s));
    CHECK(hipMemcpy(host, d, sizeof host, D2H));
    EXPECT(host[0] == 4.0f && host[N - 1] == 4.0f);
    CHECK(hipGraphExecDestroy(exec));
    CHECK(hipGraphDestroy(graph));
    EXPECT(hipStreamEndCapture(s, &graph) == 401); /* IllegalState: not capturing */
    hipGetLastError();

    /* hipExtModuleLaunchKernel: global sizes in threads, events around the launch */
    hipModule_t mod = NULL;
    hipFunction_t fill = NULL;
    hipEvent_t e0 = NULL, e1 = NULL;
    CHECK(hipModuleLoadData(&mod, image_file ? image_file : "hipr:builtin"));
    CHECK(hipModuleGetFunction(&fill, mod, "fill_f32"));
    EXPECT(fill && strcmp(hipKernelNameRef(fill), "fill_f32") == 0);
    void *global = NULL;
    size_t global_size = 0;
    CHECK(hipModuleGetGlobal(&global, &global_size, mod, "hipr_builtin_bias"));
    CHECK(hipGetSymbolAddress(&var_ptr, &hipr_builtin_bias));
    EXPECT(global_size == sizeof(float) && global != NULL);
    /* the same variable where the module is hipcc's own (the built-in module, one per
     * device, or the same CUBIN loaded twice, which has its own copy) */
    EXPECT(image_file ? global != var_ptr : global == var_ptr);
    CHECK(hipModuleGetGlobal(NULL, &global_size, mod, "hipr_builtin_bias"));
    EXPECT(hipModuleGetGlobal(&global, NULL, mod, "no_such_variable") == 500);
    hipGetLastError();
    CHECK(hipEventCreate(&e0));
    CHECK(hipEventCreate(&e1));
    float seven = 7.0f;
    uint64_t n = N;
    void *params[] = {&d, &seven, &n};
    CHECK(hipExtModuleLaunchKernel(fill, N, 1, 1, 256, 1, 1, 0, s, params, NULL, e0, e1, 0));
    CHECK(hipEventSynchronize(e1));
    float ms = -1;
    CHECK(hipEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0);
    CHECK(hipMemcpy(host, d, sizeof host, D2H));
    EXPECT(host[0] == 7.0f && host[N - 1] == 7.0f);
    EXPECT(hipExtModuleLaunchKernel(fill, N + 1, 1, 1, 256, 1, 1, 0, s, params, NULL, NULL,
                                    NULL, 0) == 801);
    hipGetLastError();
    CHECK(hipEventDestroy(e0));
    CHECK(hipEventDestroy(e1));
    CHECK(hipModuleUnload(mod));

    /* wide memsets (a pattern travels as data; 1.5 MiB of it goes in two chunks) */
    enum { W = 3 << 18 };
    uint32_t *wide = NULL, *wback = calloc(W, 4);
    CHECK(hipMalloc((void **)&wide, (size_t)W * 4));
    CHECK(hipMemsetD32(wide, (int)0xdeadbeef, W));
    CHECK(hipMemsetD16Async((char *)wide + 8, 0x1234, 2, s));
    CHECK(hipMemsetD8((char *)wide + 16, 0x7f, 4));
    CHECK(hipMemcpyWithStream(wback, wide, (size_t)W * 4, D2H, s));
    EXPECT(wback[0] == 0xdeadbeefu && wback[1] == 0xdeadbeefu && wback[W - 1] == 0xdeadbeefu);
    EXPECT(wback[2] == 0x12341234u && wback[3] == 0xdeadbeefu && wback[4] == 0x7f7f7f7fu);
    CHECK(hipFree(wide));
    free(wback);
    int dev = -1, major = -1, minor = -1;
    CHECK(hipDeviceGet(&dev, 0));
    CHECK(hipDeviceComputeCapability(&major, &minor, dev));
    EXPECT(dev == 0 && major >= 0 && minor >= 0);
    EXPECT(hipDeviceGet(&dev, 99) == 101);
    hipGetLastError();

    /* stream-ordered allocation */
    void *a = NULL;
    CHECK(hipMallocAsync(&a, 4096, s));
    CHECK(hipMemcpy(a, host, 4096, H2D));
    CHECK(hipFreeAsync(a, s));
    CHECK(hipStreamSynchronize(s));
    CHECK(hipStreamDestroy(s));

    CHECK(hipFree(d));
    CHECK(hipDeviceSynchronize());
    return verdict();
}
