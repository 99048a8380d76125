/* Loads code objects through the proxy (the CUDA driver API, or with -DHIP_API the HIP
 * one) against a worker serving hipr.testing.module_images' emulator: one fat binary of
 * argv[1] bytes (contents from the seed argv[2]) and one of 1 KiB, each launched
 * (fill_f32) and unloaded. Run twice by tests/proxy/test_module_store.py, which reads from
 * the worker's metrics what crossed the wire: the second run names the large image by its
 * hash alone. Prints "ok" and exits 0 when every check holds; built under ASan/UBSan. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* hipr.testing.module_images.MARKER, right after the fat binary's 16-byte header. */
static const char MARKER[] = "HIPR-EMULATED-CODE-OBJECT";

#ifdef HIP_API
typedef int hipError_t;
typedef struct hipr_module *hipModule_t;
typedef struct hipr_function *hipFunction_t;
hipError_t hipSetDevice(int);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipModuleUnload(hipModule_t);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, void *, void **, void **);
const char *hipGetErrorName(hipError_t);
#define NAME_OF(e) hipGetErrorName((hipError_t)(e))
#else
#include "cuda_api.h"
#define NAME_OF(e) cu_name_of((CUresult)(e))
#endif
#include "check.h"

enum { N = 16 };

/* A fat binary of `size` bytes: magic, version, header size, then the size of what
 * follows (what the proxies read its size from), the marker, and filler from `seed`. */
static unsigned char *fatbin(size_t size, uint64_t seed) {
    unsigned char *p = malloc(size);
    if (!p) return NULL;
    uint32_t magic = 0xBA55ED50u;
    uint16_t version = 1, header = 16;
    uint64_t rest = size - 16;
    memcpy(p, &magic, 4);
    memcpy(p + 4, &version, 2);
    memcpy(p + 6, &header, 2);
    memcpy(p + 8, &rest, 8);
    memcpy(p + 16, MARKER, sizeof MARKER);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 16 + sizeof MARKER; i < size; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (unsigned char)x;
    }
    return p;
}

/* Load `image`, fill N floats with 2.5 by its fill_f32, check them, unload. */
static void load_and_launch(const unsigned char *image) {
    float back[N];
    uint64_t n = N;
    float value = 2.5f;
    memset(back, 0, sizeof back);
#ifdef HIP_API
    hipModule_t mod = NULL;
    hipFunction_t fill = NULL;
    void *out = NULL;
    CHECK(hipMalloc(&out, sizeof back));
    CHECK(hipModuleLoadData(&mod, image));
    CHECK(hipModuleGetFunction(&fill, mod, "fill_f32"));
    void *params[] = {&out, &value, &n};
    CHECK(hipModuleLaunchKernel(fill, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL));
    CHECK(hipMemcpy(back, out, sizeof back, 2 /* hipMemcpyDeviceToHost */));
    CHECK(hipModuleUnload(mod));
    CHECK(hipFree(out));
#else
    CUmodule mod = NULL;
    CUfunction fill = NULL;
    CUdeviceptr out = 0;
    CHECK(cuMemAlloc_v2(&out, sizeof back));
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_f32"));
    void *params[] = {&out, &value, &n};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL));
    CHECK(cuMemcpyDtoH_v2(back, out, sizeof back));
    CHECK(cuModuleUnload(mod));
    CHECK(cuMemFree_v2(out));
#endif
    int filled = 1;
    for (int i = 0; i < N; i++) filled &= back[i] == 2.5f;
    EXPECT(filled);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IMAGE_BYTES SEED\n", argv[0]);
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    uint64_t seed = strtoull(argv[2], NULL, 10);
#ifdef HIP_API
    CHECK(hipSetDevice(0));
#else
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
#endif
    unsigned char *large = fatbin(size, seed), *small = fatbin(1024, seed + 1);
    EXPECT(large && small);
    if (large && small) {
        load_and_launch(large);
        load_and_launch(small);
    }
    free(large);
    free(small);
#ifndef HIP_API
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
#endif
    if (failures) return 1;
    puts("ok");
    return 0;
}
