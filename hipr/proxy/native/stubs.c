/* HIP symbols that exist so that programs and libraries linked against them load, but
 * are not served yet: each returns hipErrorNotSupported and names itself once on
 * stderr. docs/proxy.md's table lists them (generated from the STUB lines below). */
#include <stddef.h>

/* A stub ignores its arguments by definition. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#include "client.h"
#include "hip_types.h"
#include "modules.h"

#define STUB(name, params)                                                              \
    HIPR_EXPORT hipError_t name params {                                                \
        static int warned;                                                              \
        hipr_warn_once(#name " is not served by the hipr proxy yet (hipErrorNotSupported)", \
                       &warned);                                                        \
        return hipr_front_ret(hipErrorNotSupported);                                    \
    }

typedef struct { unsigned x, y, z; } dim3;

/* The 792-byte R0000 layout of ROCm 5 and earlier is not written yet: refusing is safer
 * than writing 1,472 bytes into a smaller struct. */
STUB(hipGetDeviceProperties, (void *prop, int device))
STUB(hipGetDevicePropertiesR0000, (void *prop, int device))
STUB(hipHostMalloc, (void **ptr, size_t size, unsigned int flags))
STUB(hipHostFree, (void *ptr))
STUB(hipMallocHost, (void **ptr, size_t size))
STUB(hipFreeHost, (void *ptr))
STUB(hipHostRegister, (void *ptr, size_t size, unsigned int flags))
STUB(hipHostUnregister, (void *ptr))
STUB(hipMallocManaged, (void **ptr, size_t size, unsigned int flags))
STUB(hipMallocAsync, (void **ptr, size_t size, hipStream_t stream))
STUB(hipFreeAsync, (void *ptr, hipStream_t stream))
STUB(hipMallocPitch, (void **ptr, size_t *pitch, size_t width, size_t height))
STUB(hipMemcpy2D, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, hipMemcpyKind kind))
STUB(hipMemcpyPeer, (void *dst, int dst_device, const void *src, int src_device, size_t n))
STUB(hipMemcpyToSymbol, (const void *symbol, const void *src, size_t n, size_t offset,
                         hipMemcpyKind kind))
STUB(hipPointerGetAttributes, (void *attributes, const void *ptr))
STUB(hipDeviceCanAccessPeer, (int *can, int device, int peer))
STUB(hipDeviceEnablePeerAccess, (int peer, unsigned int flags))
STUB(hipDeviceReset, (void))
STUB(hipSetDeviceFlags, (unsigned int flags))
STUB(hipDeviceGetPCIBusId, (char *bus_id, int len, int device))
STUB(hipDeviceGetName, (char *name, int len, int device))
STUB(hipFuncGetAttributes, (void *attr, const void *func))
STUB(hipFuncGetAttribute, (int *value, int attrib, hipFunction_t func))
STUB(hipLaunchKernel, (const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                       hipStream_t stream))
STUB(hipExtModuleLaunchKernel, (hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                unsigned bx, unsigned by, unsigned bz, size_t shared,
                                hipStream_t stream, void **params, void **extra,
                                hipEvent_t start, hipEvent_t stop, unsigned flags))
STUB(hipModuleLaunchCooperativeKernel, (hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                        hipStream_t stream, void **params))
STUB(hipModuleGetGlobal, (void **ptr, size_t *bytes, hipModule_t module, const char *name))
STUB(hipStreamBeginCapture, (hipStream_t stream, int mode))
STUB(hipStreamEndCapture, (hipStream_t stream, void **graph))
STUB(hipStreamIsCapturing, (hipStream_t stream, int *status))
STUB(hipStreamGetCaptureInfo, (hipStream_t stream, int *status, unsigned long long *id))
STUB(hipGraphLaunch, (void *exec, hipStream_t stream))
STUB(hipConfigureCall, (dim3 grid, dim3 block, size_t shared, hipStream_t stream))
STUB(__hipPushCallConfiguration, (dim3 grid, dim3 block, size_t shared, hipStream_t stream))
STUB(__hipPopCallConfiguration, (dim3 *grid, dim3 *block, size_t *shared, hipStream_t *stream))

/* hipcc's static registration runs before main: it must not fail the process. The
 * registration path (deferred until the first launch) is later work; launches of such
 * kernels go through hipLaunchKernel, which refuses above. */
HIPR_EXPORT void **__hipRegisterFatBinary(const void *data) {
    static int warned;
    (void)data;
    hipr_warn_once("__hipRegisterFatBinary: hipcc-compiled kernels are not served yet", &warned);
    return NULL;
}

HIPR_EXPORT void __hipRegisterFunction(void **modules, const void *host_function,
                                       char *device_function, const char *device_name,
                                       unsigned int thread_limit, void *tid, void *bid,
                                       void *block_dim, void *grid_dim, int *wsize) {
    (void)modules, (void)host_function, (void)device_function, (void)device_name;
    (void)thread_limit, (void)tid, (void)bid, (void)block_dim, (void)grid_dim, (void)wsize;
}

HIPR_EXPORT void __hipUnregisterFatBinary(void **modules) { (void)modules; }
