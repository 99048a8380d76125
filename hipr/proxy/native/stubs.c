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

STUB(hipMallocManaged, (void **ptr, size_t size, unsigned int flags))
STUB(hipMallocPitch, (void **ptr, size_t *pitch, size_t width, size_t height))
STUB(hipMemcpy2D, (void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, hipMemcpyKind kind))
STUB(hipMemcpyPeer, (void *dst, int dst_device, const void *src, int src_device, size_t n))
STUB(hipDeviceEnablePeerAccess, (int peer, unsigned int flags))
STUB(hipDeviceReset, (void))
STUB(hipFuncGetAttributes, (void *attr, const void *func))
STUB(hipFuncGetAttribute, (int *value, int attrib, hipFunction_t func))
STUB(hipModuleLaunchCooperativeKernel, (hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                        hipStream_t stream, void **params))

/* The rest, generated: no parameters are declared, which the x86-64 and AArch64 calling
 * conventions allow for a function that reads none of its arguments. */
#define GSTUB(name)                                                                     \
    HIPR_EXPORT hipError_t name(void) {                                                 \
        static int warned;                                                              \
        hipr_warn_once(#name " is not served by the hipr proxy yet (hipErrorNotSupported)", \
                       &warned);                                                        \
        return hipr_front_ret(hipErrorNotSupported);                                    \
    }

#include "gen_stubs.h"
