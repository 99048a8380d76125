/* libhiprtc.so's programs with headers, bitcode and linking, hipModuleGetGlobal, and each
 * stream's device, from C against a running worker (HIPR_URL). On the emulator (the
 * default): a compile and a link are refused with the worker's reason in the logs, and
 * every argument check holds; with two devices, a stream reports the device it was
 * created on whatever the calling thread's is; the built-in module's variable is found
 * with hipModuleGetGlobal and copied to and from. With FRONT_CHECK_GPU=1 (a cuda worker):
 * two programs compiled with -fgpu-rdc (one including a header given to
 * hiprtcCreateProgram) are linked, as relocatable CUBINs and as PTX, loaded and launched;
 * a link missing a definition fails with the linker's log. Prints "ok". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct hipr_module *hipModule_t;
typedef struct hipr_function *hipFunction_t;
typedef struct hipr_program *hiprtcProgram;
typedef struct hipr_link *hiprtcLinkState;

const char *hipGetErrorName(hipError_t);
hipError_t hipGetDeviceCount(int *);
hipError_t hipSetDevice(int);
hipError_t hipStreamCreate(hipStream_t *);
hipError_t hipStreamDestroy(hipStream_t);
hipError_t hipStreamGetDevice(hipStream_t, int *);
int hipGetStreamDeviceId(hipStream_t);
hipError_t hipGetLastError(void);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleUnload(hipModule_t);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleGetGlobal(void **, size_t *, hipModule_t, const char *);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, unsigned, hipStream_t, void **, void **);
hipError_t hipDeviceSynchronize(void);

int hiprtcCreateProgram(hiprtcProgram *, const char *, const char *, int, const char **,
                        const char **);
int hiprtcCompileProgram(hiprtcProgram, int, const char **);
int hiprtcGetProgramLogSize(hiprtcProgram, size_t *);
int hiprtcGetProgramLog(hiprtcProgram, char *);
int hiprtcGetCodeSize(hiprtcProgram, size_t *);
int hiprtcGetCode(hiprtcProgram, char *);
int hiprtcGetBitcodeSize(hiprtcProgram, size_t *);
int hiprtcGetBitcode(hiprtcProgram, char *);
int hiprtcDestroyProgram(hiprtcProgram *);
int hiprtcLinkCreate(unsigned, int *, void **, hiprtcLinkState *);
int hiprtcLinkAddData(hiprtcLinkState, int, void *, size_t, const char *, unsigned, int *,
                      void **);
int hiprtcLinkAddFile(hiprtcLinkState, int, const char *, unsigned, int *, void **);
int hiprtcLinkComplete(hiprtcLinkState, void **, size_t *);
int hiprtcLinkDestroy(hiprtcLinkState);

#define NAME_OF(e) hipGetErrorName((hipError_t)(e))
#include "check.h"

enum { INPUT_CUBIN = 0, INPUT_PTX = 1, INPUT_LLVM_BITCODE = 100 };
enum { RTC_INVALID_INPUT = 3, RTC_INVALID_PROGRAM = 4, RTC_INTERNAL = 11, RTC_LINKING = 100 };
enum { INFO_LOG = 3, INFO_LOG_SIZE = 4, ERROR_LOG = 5, ERROR_LOG_SIZE = 6 };

static const char *const APPLY =
    "#include <hip/hip_runtime.h>\n"
    "#include \"offset.h\"\n"
    "extern __device__ float helper(float v);\n"
    "extern \"C\" __global__ void apply(float *x, unsigned long long n) {\n"
    "  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] = helper(x[i]) + OFFSET;\n"
    "}\n";
static const char *const HELPER =
    "#include <hip/hip_runtime.h>\n"
    "__device__ float helper(float v) { return 2.0f * v; }\n";
static const char *HEADER_NAMES[] = {"offset.h"};
static const char *HEADERS[] = {"#define OFFSET 0.25f\n"};

/* A program compiled with `options`; its code (the bitcode hiprtc hands out for a
 * -fgpu-rdc compile) in *code. 0, or the hiprtcResult with the log on stderr. */
static int compile(const char *src, int headers, const char **options, int n, char **code,
                   size_t *len) {
    hiprtcProgram p = NULL;
    int r = hiprtcCreateProgram(&p, src, "front.hip", headers, headers ? HEADERS : NULL,
                                headers ? HEADER_NAMES : NULL);
    if (r) return r;
    r = hiprtcCompileProgram(p, n, options);
    if (r) {
        size_t size = 0;
        hiprtcGetProgramLogSize(p, &size);
        char *log = calloc(1, size + 1);
        if (log && hiprtcGetProgramLog(p, log) == 0) fprintf(stderr, "log: %s\n", log);
        free(log);
    } else {
        r = hiprtcGetBitcodeSize(p, len);
        *code = r ? NULL : malloc(*len);
        if (*code) r = hiprtcGetBitcode(p, *code);
    }
    hiprtcDestroyProgram(&p);
    return r;
}

/* Link the inputs; the image loaded, `apply` launched on {1, 2, 3, 4}. */
static void link_and_run(int kind, char *a, size_t a_len, char *b, size_t b_len) {
    char errors[4096] = "", info[4096] = "";
    int keys[] = {INFO_LOG, INFO_LOG_SIZE, ERROR_LOG, ERROR_LOG_SIZE};
    void *values[] = {info, (void *)(uintptr_t)sizeof info, errors,
                      (void *)(uintptr_t)sizeof errors};
    hiprtcLinkState link = NULL;
    EXPECT(hiprtcLinkCreate(4, keys, values, &link) == 0);
    EXPECT(hiprtcLinkAddData(link, kind, a, a_len, "apply", 0, NULL, NULL) == 0);
    EXPECT(hiprtcLinkAddData(link, kind, b, b_len, "helper", 0, NULL, NULL) == 0);
    void *image = NULL;
    size_t size = 0;
    int r = hiprtcLinkComplete(link, &image, &size);
    if (r) fprintf(stderr, "link (kind %d): %d: %s\n", kind, r, errors);
    EXPECT(r == 0 && image && size > 0);
    hipModule_t mod = NULL;
    hipFunction_t apply = NULL;
    if (r == 0) {
        CHECK(hipModuleLoadData(&mod, image));
        CHECK(hipModuleGetFunction(&apply, mod, "apply"));
    }
    EXPECT(hiprtcLinkDestroy(link) == 0);
    if (!apply) return;
    float host[4] = {1, 2, 3, 4};
    float *d = NULL;
    unsigned long long n = 4;
    CHECK(hipMalloc((void **)&d, sizeof host));
    CHECK(hipMemcpy(d, host, sizeof host, 1));
    void *params[] = {&d, &n};
    CHECK(hipModuleLaunchKernel(apply, 1, 1, 1, 4, 1, 1, 0, NULL, params, NULL));
    CHECK(hipMemcpy(host, d, sizeof host, 2));
    EXPECT(host[0] == 2.25f && host[3] == 8.25f);
    printf("linked (kind %d): %zu bytes; apply({1,2,3,4}) = {%g, %g, %g, %g}\n", kind, size,
           host[0], host[1], host[2], host[3]);
    CHECK(hipFree(d));
    CHECK(hipModuleUnload(mod));
}

static void gpu_link(void) {
    const char *cubin[] = {"-fgpu-rdc"};
    const char *ptx[] = {"-fgpu-rdc", "--gpu-architecture=compute_90"};
    char *a = NULL, *b = NULL;
    size_t a_len = 0, b_len = 0;
    /* relocatable CUBINs, handed over as hiprtc on AMD hands over bitcode */
    EXPECT(compile(APPLY, 1, cubin, 1, &a, &a_len) == 0);
    EXPECT(compile(HELPER, 0, cubin, 1, &b, &b_len) == 0);
    if (a && b) link_and_run(INPUT_LLVM_BITCODE, a, a_len, b, b_len);
    /* a definition missing: the linker says which */
    if (a) {
        char errors[4096] = "";
        int keys[] = {ERROR_LOG, ERROR_LOG_SIZE};
        void *values[] = {errors, (void *)(uintptr_t)sizeof errors};
        hiprtcLinkState link = NULL;
        void *image = NULL;
        EXPECT(hiprtcLinkCreate(2, keys, values, &link) == 0);
        EXPECT(hiprtcLinkAddData(link, INPUT_CUBIN, a, a_len, "apply", 0, NULL, NULL) == 0);
        EXPECT(hiprtcLinkComplete(link, &image, NULL) == RTC_LINKING && !image);
        printf("link without helper: HIPRTC_ERROR_LINKING: %.200s\n", errors);
        EXPECT(strlen(errors) > 0);
        EXPECT(hiprtcLinkDestroy(link) == 0);
    }
    free(a);
    free(b);
    /* PTX (a virtual architecture gives no CUBIN) */
    a = b = NULL;
    EXPECT(compile(APPLY, 1, ptx, 2, &a, &a_len) == 0);
    EXPECT(compile(HELPER, 0, ptx, 2, &b, &b_len) == 0);
    if (a && b) link_and_run(INPUT_PTX, a, a_len, b, b_len);
    free(a);
    free(b);
}

static void emulator_rtc(void) {
    hiprtcProgram p = NULL;
    size_t size = 0;
    char code[8];
    /* headers are accepted now; a missing include name is refused */
    const char *no_name[] = {NULL};
    EXPECT(hiprtcCreateProgram(&p, APPLY, "a.hip", 1, HEADERS, no_name) == RTC_INVALID_INPUT);
    EXPECT(hiprtcCreateProgram(&p, APPLY, "a.hip", 1, HEADERS, NULL) == RTC_INVALID_INPUT);
    EXPECT(hiprtcCreateProgram(&p, APPLY, "a.hip", 1, HEADERS, HEADER_NAMES) == 0);
    EXPECT(hiprtcGetBitcodeSize(p, &size) == RTC_INVALID_PROGRAM);
    EXPECT(hiprtcGetBitcode(p, code) == RTC_INVALID_PROGRAM);
    const char *opts[] = {"-fgpu-rdc"};
    EXPECT(hiprtcCompileProgram(p, 1, opts) == RTC_INTERNAL);
    EXPECT(hiprtcGetProgramLogSize(p, &size) == 0 && size > 1);
    char *log = calloc(1, size);
    EXPECT(log && hiprtcGetProgramLog(p, log) == 0 && strstr(log, "no device compiler"));
    free(log);
    EXPECT(hiprtcDestroyProgram(&p) == 0 && p == NULL);

    /* a link: the emulator has no linker, and says so in the error log */
    char errors[256], info[64] = "x";
    memset(errors, 'x', sizeof errors);
    int keys[] = {ERROR_LOG, ERROR_LOG_SIZE, INFO_LOG, INFO_LOG_SIZE};
    void *values[] = {errors, (void *)(uintptr_t)sizeof errors, info,
                      (void *)(uintptr_t)sizeof info};
    hiprtcLinkState link = NULL;
    EXPECT(hiprtcLinkCreate(4, keys, values, &link) == 0);
    char ptx[] = "//\n.version 8.0\n.target sm_90\n";
    EXPECT(hiprtcLinkAddData(link, INPUT_PTX, ptx, sizeof ptx, "a.ptx", 0, NULL, NULL) == 0);
    EXPECT(hiprtcLinkAddData(link, 7, ptx, sizeof ptx, "bad", 0, NULL, NULL) == RTC_INVALID_INPUT);
    EXPECT(hiprtcLinkAddData(link, INPUT_PTX, ptx, 0, "empty", 0, NULL, NULL) == RTC_INVALID_INPUT);
    EXPECT(hiprtcLinkAddData(link, INPUT_PTX, NULL, 4, "null", 0, NULL, NULL) == RTC_INVALID_INPUT);
    EXPECT(hiprtcLinkAddFile(link, INPUT_PTX, "/no/such/file.ptx", 0, NULL, NULL) ==
           RTC_INVALID_INPUT);
    /* a file is read here, on the program's side */
    char path[] = "/tmp/hipr-front-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    if (fd >= 0) {
        FILE *f = fdopen(fd, "wb");
        fputs(ptx, f);
        fclose(f);
        EXPECT(hiprtcLinkAddFile(link, INPUT_PTX, path, 0, NULL, NULL) == 0);
        remove(path);
    }
    void *image = (void *)1;
    size_t image_size = 99;
    EXPECT(hiprtcLinkComplete(link, &image, &image_size) == RTC_INTERNAL);
    EXPECT(memchr(errors, 0, sizeof errors) && strstr(errors, "no device linker"));
    EXPECT(image == (void *)1 && image_size == 99);
    EXPECT(hiprtcLinkComplete(NULL, &image, &image_size) == RTC_INVALID_INPUT);
    EXPECT(hiprtcLinkDestroy(link) == 0);
    hiprtcLinkState empty = NULL;
    EXPECT(hiprtcLinkCreate(0, NULL, NULL, &empty) == 0);
    EXPECT(hiprtcLinkComplete(empty, &image, &image_size) == RTC_INVALID_INPUT);
    EXPECT(hiprtcLinkDestroy(empty) == 0);
    EXPECT(hiprtcLinkCreate(1, NULL, NULL, &empty) == RTC_INVALID_INPUT);
}

/* The built-in module's variable through hipModuleGetGlobal (any worker: a GPU one
 * compiles the built-in module, the emulator keeps the variable in its memory). */
static void builtin_global(void) {
    hipModule_t mod = NULL;
    void *ptr = NULL;
    size_t bytes = 0;
    float bias = 0.75f, back = 0;
    CHECK(hipModuleLoadData(&mod, "hipr:builtin"));
    CHECK(hipModuleGetGlobal(&ptr, &bytes, mod, "hipr_builtin_bias"));
    EXPECT(ptr && bytes == 4);
    CHECK(hipMemcpy(ptr, &bias, 4, 1));
    CHECK(hipMemcpy(&back, ptr, 4, 2));
    EXPECT(back == 0.75f);
    EXPECT(hipModuleGetGlobal(&ptr, &bytes, mod, "nope") == 500);
    EXPECT(hipModuleGetGlobal(&ptr, &bytes, NULL, "nope") == 400);
    hipGetLastError();
    CHECK(hipModuleUnload(mod));
}

/* --- each stream's device ------------------------------------------------------------ */

struct probe {
    hipStream_t stream;
    int device, id;
};

static void *other_thread(void *arg) {
    struct probe *p = arg;
    p->device = -1;
    hipStreamGetDevice(p->stream, &p->device); /* this thread's device is 0 */
    p->id = hipGetStreamDeviceId(p->stream);
    return NULL;
}

static void stream_devices(void) {
    int count = 0;
    CHECK(hipGetDeviceCount(&count));
    int last = count - 1, dev = -1;
    hipStream_t s = NULL;
    CHECK(hipSetDevice(last));
    CHECK(hipStreamCreate(&s));
    CHECK(hipSetDevice(0));
    CHECK(hipStreamGetDevice(s, &dev));
    EXPECT(dev == last && hipGetStreamDeviceId(s) == last);
    struct probe p = {s, -1, -1};
    pthread_t t;
    pthread_create(&t, NULL, other_thread, &p);
    pthread_join(t, NULL);
    EXPECT(p.device == last && p.id == last);
    CHECK(hipStreamGetDevice(NULL, &dev)); /* the null stream: the current device's */
    EXPECT(dev == 0 && hipGetStreamDeviceId(NULL) == 0);
    CHECK(hipStreamDestroy(s));
    EXPECT(hipStreamGetDevice(s, &dev) == 400 && hipGetStreamDeviceId(s) == -1);
    EXPECT(hipStreamGetDevice(s, NULL) == 1);
    hipGetLastError();
    printf("streams on %d device(s): ok\n", count);
}

int main(void) {
    const char *gpu = getenv("FRONT_CHECK_GPU");
    stream_devices();
    builtin_global();
    if (gpu && *gpu == '1')
        gpu_link();
    else
        emulator_rtc();
    CHECK(hipDeviceSynchronize());
    return verdict();
}
