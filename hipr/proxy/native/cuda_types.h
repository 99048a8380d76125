/* The CUDA driver API's types and constants that the proxy's libcuda.so.1 serves, written
 * from the values documented in NVIDIA's public cuda.h (CUDA 13.0): the proxy needs no
 * CUDA toolkit to build. Only what cuda_front.c uses is declared. */
#ifndef HIPR_CUDA_TYPES_H
#define HIPR_CUDA_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;

typedef struct hipr_cu_ctx *CUcontext;
typedef struct hipr_cu_module *CUmodule;
typedef struct hipr_cu_function *CUfunction;
typedef struct hipr_cu_stream *CUstream;
typedef struct hipr_cu_event *CUevent;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* CUresult values. */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY 224
#define CUDA_ERROR_INVALID_SOURCE 300
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701
#define CUDA_ERROR_CONTEXT_IS_DESTROYED 709
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CUDA_ERROR_LAUNCH_FAILED 719
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

/* Stream handles with a meaning of their own. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

#define CU_STREAM_DEFAULT 0x0
#define CU_STREAM_NON_BLOCKING 0x1

#define CU_EVENT_DEFAULT 0x0
#define CU_EVENT_BLOCKING_SYNC 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_EVENT_INTERPROCESS 0x4

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x04

#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08

#define CU_MEMORYTYPE_HOST 0x01
#define CU_MEMORYTYPE_DEVICE 0x02

/* CUpointer_attribute values served. */
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define CU_POINTER_ATTRIBUTE_HOST_POINTER 4
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_POINTER_ATTRIBUTE_MAPPED 13

/* cuLaunchKernel's `extra`. */
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* cuGetProcAddress flags and results. */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

/* cuModuleLoadDataEx JIT options whose outputs the proxy writes. */
#define CU_JIT_INFO_LOG_BUFFER 3
#define CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES 4
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
typedef int CUjit_option;

/* Launch attributes (CUlaunchAttributeID). */
#define CU_LAUNCH_ATTRIBUTE_IGNORE 0
#define CU_LAUNCH_ATTRIBUTE_COOPERATIVE 2
#define CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4
#define CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
#define CU_LAUNCH_ATTRIBUTE_PRIORITY 8

typedef union CUlaunchAttributeValue_union {
    char pad[64];
    int cooperative;
    int programmaticStreamSerializationAllowed;
    int priority;
    struct {
        unsigned int x, y, z;
    } clusterDim;
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    int id; /* CUlaunchAttributeID, an enum */
    char pad[8 - sizeof(int)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct CUctxCreateParams_st {
    void *execAffinityParams;
    int numExecAffinityParams;
    void *cigParams;
} CUctxCreateParams;

/* Graphs (cuda_graphs.c): a graph and an executable graph are the proxy's records of the
 * worker's handles; a node is the worker's node handle itself. */
typedef struct hipr_cu_graph *CUgraph;
typedef struct hipr_cu_graph *CUgraphExec;
typedef struct hipr_cu_graph_node *CUgraphNode;

#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900

#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

/* cuGraphInstantiate* flags. */
#define CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH 1
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2
#define CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH 4
#define CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY 8

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out; /* CUgraphInstantiateResult: 0 success, 1 error */
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS;

/* CUDA 12's: version 1's fields (laid out alike), then these. */
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUDA_KERNEL_NODE_PARAMS v1;
    void *kern; /* CUkernel, used when func is NULL */
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

typedef struct CUDA_MEMSET_NODE_PARAMS_st {
    CUdeviceptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
} CUDA_MEMSET_NODE_PARAMS;

#define CU_MEMORYTYPE_UNIFIED 0x04
typedef struct CUDA_MEMCPY3D_st {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

/* Stream-ordered allocation (cuda_pools.c): the device's default pool. */
typedef struct hipr_cu_pool *CUmemoryPool;
#define CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES 1
#define CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC 2
#define CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES 3
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH 6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH 8

/* Device attributes read from the worker's properties (CUdevice_attribute). */
#define CU_DEVICE_ATTRIBUTE_MAX 256

#endif
