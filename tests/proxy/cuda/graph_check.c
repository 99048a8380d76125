/* Exercises the proxy's libcuda.so.1 stream capture, graphs, stream-ordered allocation and
 * managed memory's refusal against a running worker (HIPR_URL), through the CUDA driver
 * API and hipr's built-in kernels: a memset and two kernels captured into a graph,
 * instantiated and launched twice; a graph built node by node (memset, kernel, copy);
 * the capture state answered as it is; allocations from the default pool used and freed
 * in stream order; and the refusals (a destroyed executable graph, a capture never begun,
 * node kinds the worker has not) as CUDA errors. Prints "ok" and exits 0 when every check
 * holds; built and run under ASan/UBSan (leak checking on) by
 * tests/proxy/test_cuda_graphs.py. Declares the driver API itself: no CUDA headers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUmemPool_st *CUmemoryPool;

typedef struct {
    CUfunction func;
    unsigned gx, gy, gz, bx, by, bz, shared;
    void **params, **extra;
    void *kern;
    CUcontext ctx;
} KernelNodeParams; /* CUDA_KERNEL_NODE_PARAMS_v2 */
typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned value, element_size;
    size_t width, height;
} MemsetNodeParams;
typedef struct {
    size_t src_x, src_y, src_z, src_lod;
    int src_type;
    const void *src_host;
    CUdeviceptr src_device;
    void *src_array, *reserved0;
    size_t src_pitch, src_height;
    size_t dst_x, dst_y, dst_z, dst_lod;
    int dst_type;
    void *dst_host;
    CUdeviceptr dst_device;
    void *dst_array, *reserved1;
    size_t dst_pitch, dst_height;
    size_t width, height, depth;
} Memcpy3D;
typedef struct {
    cuuint64_t flags;
    CUstream upload_stream;
    CUgraphNode err_node;
    int result;
} InstantiateParams;

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamBeginCapture(CUstream);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuStreamGetCaptureInfo(CUstream, int *, cuuint64_t *);
CUresult cuStreamGetCaptureInfo_v2(CUstream, int *, cuuint64_t *, CUgraph *, const CUgraphNode **,
                                   size_t *);
CUresult cuThreadExchangeStreamCaptureMode(int *);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, InstantiateParams *);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                 const KernelNodeParams *);
CUresult cuGraphAddMemsetNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const MemsetNodeParams *, CUcontext);
CUresult cuGraphAddMemcpyNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const Memcpy3D *, CUcontext);
CUresult cuGraphExecUpdate_v2(CUgraphExec, CUgraph, void *);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);

#define NAME_OF(e) cu_name_of((CUresult)(e))
#include "check.h"


#define EXPECT_RC(want, call) EXPECT((call) == (want))

enum { N = 1024 };
enum { INVALID_VALUE = 1, INVALID_HANDLE = 400, ILLEGAL_STATE = 401, NOT_SUPPORTED = 801,
       CAPTURE_UNSUPPORTED = 900 };

static CUfunction fill, scale, axpy;

static int all_equal(const float *v, size_t n, float want) {
    for (size_t i = 0; i < n; i++)
        if (v[i] != want) return 0;
    return 1;
}

/* A memset and two kernels captured on a stream, then launched twice: y += 1.5 * 2 each. */
static void capture_and_launch_twice(CUstream s) {
    static float host[N], back[N];
    CUdeviceptr x = 0, y = 0;
    CHECK(cuMemAlloc_v2(&x, sizeof host));
    CHECK(cuMemAlloc_v2(&y, sizeof host));
    for (int i = 0; i < N; i++) host[i] = 1.0f;
    CHECK(cuMemcpyHtoD_v2(y, host, sizeof host));
    CHECK(cuMemsetD8_v2(x, 0x7f, sizeof host));

    int status = -1;
    cuuint64_t id = 99;
    CHECK(cuStreamIsCapturing(s, &status));
    EXPECT(status == 0);
    CHECK(cuStreamBeginCapture_v2(s, 2 /* RELAXED */));
    CHECK(cuStreamIsCapturing(s, &status));
    EXPECT(status == 1); /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
    CHECK(cuStreamGetCaptureInfo(s, &status, &id));
    EXPECT(status == 1 && id != 0);
    CUgraph during = (CUgraph)1;
    const CUgraphNode *deps = (const CUgraphNode *)1;
    size_t n_deps = 9;
    cuuint64_t id2 = 0;
    CHECK(cuStreamGetCaptureInfo_v2(s, &status, &id2, &during, &deps, &n_deps));
    EXPECT(status == 1 && id2 == id && during == NULL && deps == NULL && n_deps == 0);
    CHECK(cuStreamIsCapturing(NULL, &status)); /* the null stream does not capture */
    EXPECT(status == 0);
    EXPECT_RC(ILLEGAL_STATE, cuStreamBeginCapture_v2(s, 2)); /* captures already */
    EXPECT_RC(ILLEGAL_STATE, cuStreamDestroy_v2(s));         /* end the capture first */

    unsigned long long n = N;
    float two = 2.0f, a = 1.5f;
    void *fill_args[] = {&x, &two, &n};
    void *axpy_args[] = {&y, &x, &a, &n};
    CHECK(cuMemsetD8Async(x, 0, sizeof host, s));
    CHECK(cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, s, fill_args, NULL));
    CHECK(cuLaunchKernel(axpy, 4, 1, 1, 256, 1, 1, 0, s, axpy_args, NULL));
    CUgraph graph = NULL;
    CHECK(cuStreamEndCapture(s, &graph));
    EXPECT(graph != NULL);
    size_t nodes = 0; /* PyTorch asks, to warn of an empty capture */
    CHECK(cuGraphGetNodes(graph, NULL, &nodes));
    EXPECT(nodes == 3);
    CUgraphNode handles[3];
    EXPECT_RC(NOT_SUPPORTED, cuGraphGetNodes(graph, handles, &nodes)); /* not kept */
    CHECK(cuStreamIsCapturing(s, &status));
    EXPECT(status == 0);
    CHECK(cuStreamGetCaptureInfo(s, &status, &id));
    EXPECT(status == 0 && id == 0);

    /* captured, not run: y and x are as they were */
    CHECK(cuMemcpyDtoH_v2(back, y, sizeof back));
    EXPECT(all_equal(back, N, 1.0f));
    CUgraphExec exec = NULL;
    EXPECT_RC(NOT_SUPPORTED, cuGraphInstantiateWithFlags(&exec, graph, 4 /* DEVICE_LAUNCH */));
    EXPECT(exec == NULL);
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 1 /* AUTO_FREE_ON_LAUNCH */));
    CHECK(cuGraphDestroy(graph)); /* its executable graph lives on */
    CHECK(cuGraphUpload(exec, s));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpyDtoH_v2(back, y, sizeof back));
    EXPECT(all_equal(back, N, 4.0f));
    CHECK(cuMemsetD8_v2(x, 0x7f, sizeof host)); /* the graph's memset sets it again */
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuMemcpyDtoHAsync_v2(back, y, sizeof back, s));
    CHECK(cuStreamSynchronize(s));
    EXPECT(all_equal(back, N, 7.0f));
    CHECK(cuMemcpyDtoH_v2(back, x, sizeof back));
    EXPECT(all_equal(back, N, 2.0f));

    /* refusals: a destroyed executable graph, a graph destroyed twice, a capture never begun */
    CHECK(cuGraphExecDestroy(exec));
    EXPECT_RC(INVALID_HANDLE, cuGraphLaunch(exec, s));
    EXPECT_RC(INVALID_HANDLE, cuGraphExecDestroy(exec));
    EXPECT_RC(INVALID_HANDLE, cuGraphDestroy(graph));
    EXPECT_RC(INVALID_HANDLE, cuGraphInstantiateWithFlags(&exec, graph, 0));
    CUgraph none = (CUgraph)1;
    EXPECT_RC(ILLEGAL_STATE, cuStreamEndCapture(s, &none));
    EXPECT(none == NULL);
    EXPECT_RC(CAPTURE_UNSUPPORTED, cuStreamBeginCapture(NULL)); /* the null stream */
    EXPECT_RC(INVALID_VALUE, cuStreamBeginCapture_v2(s, 7));     /* no such mode */
    CHECK(cuStreamSynchronize(s)); /* no refused request left an error behind */
    CHECK(cuMemFree_v2(x));
    CHECK(cuMemFree_v2(y));
}

/* A graph built node by node: memset -> fill kernel -> copy; launched twice. */
static void explicit_graph(CUstream s) {
    static float back[N];
    CUdeviceptr x = 0, z = 0;
    CHECK(cuMemAlloc_v2(&x, N * sizeof(float)));
    CHECK(cuMemAlloc_v2(&z, N * sizeof(float)));
    CUgraph g = NULL, other = NULL;
    EXPECT_RC(INVALID_VALUE, cuGraphCreate(&g, 1));
    CHECK(cuGraphCreate(&g, 0));
    CHECK(cuGraphCreate(&other, 0));
    CUgraphNode set = NULL, kernel = NULL, copy = NULL, stray = NULL;
    MemsetNodeParams ms = {x, 0, 0, 4, N, 1};
    CHECK(cuGraphAddMemsetNode(&set, g, NULL, 0, &ms, NULL));
    EXPECT(set != NULL);
    ms.value = 0x3f800000; /* 1.0f: bytes that differ, not the worker's byte memset */
    EXPECT_RC(NOT_SUPPORTED, cuGraphAddMemsetNode(&stray, g, NULL, 0, &ms, NULL));
    ms.value = 0;
    ms.element_size = 3;
    EXPECT_RC(INVALID_VALUE, cuGraphAddMemsetNode(&stray, g, NULL, 0, &ms, NULL));
    unsigned long long n = N / 2;
    float v = 5.0f;
    void *args[] = {&x, &v, &n};
    KernelNodeParams kp = {fill, 2, 1, 1, 256, 1, 1, 0, args, NULL, NULL, NULL};
    CHECK(cuGraphAddKernelNode_v2(&kernel, g, &set, 1, &kp));
    /* a dependency of another graph: the worker refuses it, the call says so */
    EXPECT_RC(INVALID_VALUE, cuGraphAddKernelNode_v2(&stray, other, &set, 1, &kp));
    EXPECT(stray == NULL);
    Memcpy3D cp;
    memset(&cp, 0, sizeof cp);
    cp.src_type = cp.dst_type = 2; /* CU_MEMORYTYPE_DEVICE */
    cp.src_device = x;
    cp.dst_device = z;
    cp.width = N * sizeof(float);
    cp.height = cp.depth = 1;
    CHECK(cuGraphAddMemcpyNode(&copy, g, &kernel, 1, &cp, NULL));
    cp.src_type = 1; /* from host memory: not a node the worker has */
    cp.src_host = back;
    EXPECT_RC(NOT_SUPPORTED, cuGraphAddMemcpyNode(&stray, g, &kernel, 1, &cp, NULL));
    CUgraphExec exec = NULL;
    char log[16] = "x";
    CUgraphNode err = (CUgraphNode)1;
    size_t nodes = 0;
    CHECK(cuGraphGetNodes(g, NULL, &nodes));
    EXPECT(nodes == 3);
    CHECK(cuGraphGetNodes(other, NULL, &nodes));
    EXPECT(nodes == 0);
    CHECK(cuGraphInstantiate_v2(&exec, g, &err, log, sizeof log));
    EXPECT(err == NULL && log[0] == '\0');
    for (int round = 0; round < 2; round++) {
        CHECK(cuMemsetD8_v2(z, 0x7f, N * sizeof(float)));
        CHECK(cuGraphLaunch(exec, NULL));
        CHECK(cuMemcpyDtoH_v2(back, z, sizeof back));
        EXPECT(all_equal(back, N / 2, 5.0f) && all_equal(back + N / 2, N / 2, 0.0f));
    }
    /* what the worker cannot do stays a stub that refuses */
    EXPECT_RC(NOT_SUPPORTED, cuGraphExecUpdate_v2(exec, g, NULL));
    InstantiateParams ip = {2 /* UPLOAD */, s, (CUgraphNode)1, 7};
    CUgraphExec second = NULL;
    CHECK(cuGraphInstantiateWithParams(&second, g, &ip));
    EXPECT(ip.result == 0 && ip.err_node == NULL && second != NULL);
    CHECK(cuGraphExecDestroy(second));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(g));
    CHECK(cuGraphDestroy(other));
    CHECK(cuMemFree_v2(x));
    CHECK(cuMemFree_v2(z));
}

enum { REUSE_FOLLOW = 1, RELEASE_THRESHOLD = 4, RESERVED_CURRENT = 5, USED_CURRENT = 7,
       USED_HIGH = 8 };

/* Allocations from the default pool: used, freed and counted in stream order. */
static void stream_ordered(CUdevice dev, CUstream s) {
    int supported = -1;
    CHECK(cuDeviceGetAttribute(&supported, 115, dev)); /* MEMORY_POOLS_SUPPORTED */
    EXPECT(supported == 1);
    CUmemoryPool pool = NULL, current = NULL;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    CHECK(cuDeviceGetMemPool(&current, dev));
    EXPECT(pool != NULL && pool == current);
    EXPECT_RC(101, cuDeviceGetDefaultMemPool(&current, 4096)); /* INVALID_DEVICE */
    cuuint64_t threshold = 1 << 20, got = 0;
    CHECK(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &threshold));
    CHECK(cuMemPoolGetAttribute(pool, RELEASE_THRESHOLD, &got));
    EXPECT(got == threshold);
    int follow = -1;
    CHECK(cuMemPoolGetAttribute(pool, REUSE_FOLLOW, &follow));
    EXPECT(follow == 1);
    EXPECT_RC(INVALID_VALUE, cuMemPoolSetAttribute(pool, USED_CURRENT, &got)); /* read-only */
    EXPECT_RC(INVALID_VALUE, cuMemPoolGetAttribute((CUmemoryPool)&got, USED_CURRENT, &got));

    static float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    CUdeviceptr p = 0, q = 0;
    CHECK(cuMemAllocAsync(&p, sizeof host, s));
    CHECK(cuMemAllocFromPoolAsync(&q, 64, pool, s));
    CHECK(cuMemPoolGetAttribute(pool, USED_CURRENT, &got));
    EXPECT(got == sizeof host + 64);
    CHECK(cuMemPoolGetAttribute(pool, RESERVED_CURRENT, &got));
    EXPECT(got == sizeof host + 64);
    /* used on the stream, then freed behind that work without a synchronize between */
    float three = 3.0f;
    unsigned long long n = N;
    void *args[] = {&p, &three, &n};
    CHECK(cuMemcpyHtoDAsync_v2(p, host, sizeof host, s));
    CHECK(cuLaunchKernel(scale, 4, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CHECK(cuMemcpyDtoHAsync_v2(back, p, sizeof back, s));
    CHECK(cuMemFreeAsync(p, s));
    CHECK(cuStreamSynchronize(s));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= back[i] == host[i] * 3.0f;
    EXPECT(ok);
    EXPECT_RC(INVALID_VALUE, cuMemFreeAsync(p, s)); /* freed already */
    EXPECT_RC(INVALID_HANDLE, cuMemFreeAsync(q, (CUstream)&got)); /* no such stream */
    CHECK(cuMemPoolGetAttribute(pool, USED_CURRENT, &got));
    EXPECT(got == 64);
    CHECK(cuMemPoolGetAttribute(pool, USED_HIGH, &got));
    EXPECT(got == sizeof host + 64);
    cuuint64_t zero = 0;
    CHECK(cuMemPoolSetAttribute(pool, USED_HIGH, &zero));
    CHECK(cuMemPoolGetAttribute(pool, USED_HIGH, &got));
    EXPECT(got == 64);
    CHECK(cuMemFreeAsync(q, NULL));
    CHECK(cuMemPoolTrimTo(pool, 0));
    EXPECT_RC(INVALID_VALUE, cuMemAllocFromPoolAsync(&q, 64, (CUmemoryPool)&got, s));

    /* allocated during a capture: the graph keeps it until the graph is destroyed */
    CUdeviceptr t = 0;
    CUgraph g = NULL;
    CUgraphExec exec = NULL;
    float seven = 7.0f;
    void *fill_args[] = {&t, &seven, &n};
    CHECK(cuStreamBeginCapture_v2(s, 2));
    CHECK(cuMemAllocAsync(&t, sizeof host, s));
    CHECK(cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, s, fill_args, NULL));
    CHECK(cuMemFreeAsync(t, s));
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(g));
    CHECK(cuStreamSynchronize(s));
}

static void managed_refused(CUdevice dev) {
    int managed = -1, concurrent = -1;
    CHECK(cuDeviceGetAttribute(&managed, 83, dev));    /* MANAGED_MEMORY */
    CHECK(cuDeviceGetAttribute(&concurrent, 89, dev)); /* CONCURRENT_MANAGED_ACCESS */
    EXPECT(managed == 0 && concurrent == 0);
    CUdeviceptr p = 1;
    EXPECT_RC(NOT_SUPPORTED, cuMemAllocManaged(&p, 4096, 1 /* GLOBAL */));
    EXPECT(p == 0);
    EXPECT_RC(NOT_SUPPORTED, cuMemAllocManaged(&p, 64, 1)); /* named once on stderr */
}

static void lookups(void) {
    static const struct {
        const char *name;
        int version;
        void *want;
    } cases[] = {
        {"cuGraphInstantiate", 12000, (void *)cuGraphInstantiateWithFlags},
        {"cuGraphInstantiate", 11000, (void *)cuGraphInstantiate_v2},
        {"cuStreamBeginCapture", 12000, (void *)cuStreamBeginCapture_v2},
        {"cuStreamBeginCapture", 10000, (void *)cuStreamBeginCapture},
        {"cuGraphAddKernelNode", 12000, (void *)cuGraphAddKernelNode_v2},
        {"cuMemAllocAsync", 12000, (void *)cuMemAllocAsync},
        {"cuMemPoolTrimTo", 12000, (void *)cuMemPoolTrimTo},
        {"cuGraphLaunch", 12000, (void *)cuGraphLaunch},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        void *fn = NULL;
        int status = -1;
        CHECK(cuGetProcAddress_v2(cases[i].name, &fn, cases[i].version, 0, &status));
        if (fn != cases[i].want) {
            fprintf(stderr, "cuGetProcAddress(%s, %d): not the served form\n", cases[i].name,
                    cases[i].version);
            failures++;
        }
    }
    int mode = 2, old = -1;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    old = mode;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == 2 && old == 0);
}

int main(void) {
    CHECK(cuInit(0));
    if (failures) return 1; /* no worker: nothing else can run */
    CUdevice dev = 0;
    CUcontext primary = NULL;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuCtxSetCurrent(primary));
    CUmodule mod = NULL;
    CHECK(cuModuleLoadData(&mod, "hipr:builtin"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_f32"));
    CHECK(cuModuleGetFunction(&scale, mod, "scale_f32"));
    CHECK(cuModuleGetFunction(&axpy, mod, "axpy_f32"));
    CUstream s = NULL;
    CHECK(cuStreamCreate(&s, 1 /* NON_BLOCKING */));
    if (failures) return 1;
    capture_and_launch_twice(s);
    explicit_graph(s);
    stream_ordered(dev, s);
    managed_refused(dev);
    lookups();
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
