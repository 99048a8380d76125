/* The CUDA driver API as the C test programs see it: the handle types and the entry
 * points most of them call, declared from NVIDIA's public cuda.h rather than taken from
 * the proxy's own cuda_types.h, so that a program checks the proxy's ABI against the
 * documented one (and runs against NVIDIA's driver alike). Each program declares the
 * rest of what it calls, and the structs it passes, itself. */
#ifndef HIPR_TEST_CUDA_API_H
#define HIPR_TEST_CUDA_API_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

/* A result's name as the driver gives it, for check.h's messages (NAME_OF). */
static inline const char *cu_name_of(CUresult e) {
    const char *s = NULL;
    return cuGetErrorName(e, &s) == 0 ? s : "(unnamed)";
}

#endif
