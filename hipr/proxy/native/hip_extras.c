/* The rest of what HIP programs and runtimes such as PyTorch call: ROCm 5's property
 * struct, host allocations, pointer attributes, stream flags and priorities, stream
 * capture and graphs (as the worker serves them), device names and peers, stream-ordered
 * allocation, hipExtModuleLaunchKernel. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "graph_wire.h"
#include "hip_types.h"
#include "modules.h"
#include "opcodes.h"

#define API HIPR_EXPORT

hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *prop, int device);
hipError_t hipMalloc(void **ptr, size_t size);
hipError_t hipFree(void *ptr);
hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, hipMemcpyKind kind,
                          hipStream_t stream);
hipError_t hipMemsetAsync(void *ptr, int value, size_t n, hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipDeviceSynchronize(void);
hipError_t hipGetDeviceCount(int *count);

static hipError_t ret(hipError_t e) { return hipr_front_ret(e); }

/* --- ROCm 5's hipDeviceProp_t (792 bytes) ---------------------------------------------- */

/* gcnArch, deprecated in ROCm 5: the digits of "gfx90a" read as 910 (a = 10), as HIP
 * computed it; 0 for a name that is not gfx (a cuda worker's sm_90). */
static int gcn_arch(const char *name) {
    if (strncmp(name, "gfx", 3) != 0) return 0;
    int v = 0;
    for (const char *c = name + 3; *c && *c != ':'; c++) {
        if (*c >= '0' && *c <= '9') v = v * 10 + (*c - '0');
        else if (*c >= 'a' && *c <= 'f') v = v * 10 + (*c - 'a' + 10);
        else break;
        if (v > 100000) return 0;
    }
    return v;
}

static void to_r0000(hipDeviceProp_tR0000 *o, const hipDeviceProp_tR0600 *p) {
    memset(o, 0, sizeof *o);
    memcpy(o->name, p->name, sizeof o->name);
    o->name[sizeof o->name - 1] = 0;
#define F(x) o->x = p->x
    F(totalGlobalMem); F(sharedMemPerBlock); F(regsPerBlock); F(warpSize);
    F(maxThreadsPerBlock); F(clockRate); F(memoryClockRate); F(memoryBusWidth);
    F(totalConstMem); F(major); F(minor); F(multiProcessorCount); F(l2CacheSize);
    F(maxThreadsPerMultiProcessor); F(computeMode); F(clockInstructionRate); F(arch);
    F(concurrentKernels); F(pciDomainID); F(pciBusID); F(pciDeviceID);
    F(maxSharedMemoryPerMultiProcessor); F(isMultiGpuBoard); F(canMapHostMemory);
    F(integrated); F(cooperativeLaunch); F(cooperativeMultiDeviceLaunch);
    F(maxTexture1DLinear); F(maxTexture1D); F(memPitch); F(textureAlignment);
    F(texturePitchAlignment); F(kernelExecTimeoutEnabled); F(ECCEnabled); F(tccDriver);
    F(cooperativeMultiDeviceUnmatchedFunc); F(cooperativeMultiDeviceUnmatchedGridDim);
    F(cooperativeMultiDeviceUnmatchedBlockDim); F(cooperativeMultiDeviceUnmatchedSharedMem);
    F(isLargeBar); F(asicRevision); F(managedMemory); F(directManagedMemAccessFromHost);
    F(concurrentManagedAccess); F(pageableMemoryAccess);
    F(pageableMemoryAccessUsesHostPageTables);
#undef F
    for (int i = 0; i < 3; i++) {
        o->maxThreadsDim[i] = p->maxThreadsDim[i];
        o->maxGridSize[i] = p->maxGridSize[i];
        o->maxTexture3D[i] = p->maxTexture3D[i];
    }
    o->maxTexture2D[0] = p->maxTexture2D[0];
    o->maxTexture2D[1] = p->maxTexture2D[1];
    memcpy(o->gcnArchName, p->gcnArchName, sizeof o->gcnArchName);
    o->gcnArchName[sizeof o->gcnArchName - 1] = 0;
    o->gcnArch = gcn_arch(o->gcnArchName);
    /* The runtime's own HDP registers are not the client's to write. */
    o->hdpMemFlushCntl = o->hdpRegFlushCntl = NULL;
}

API hipError_t hipGetDevicePropertiesR0000(hipDeviceProp_tR0000 *prop, int device) {
    if (!prop) return ret(hipErrorInvalidValue);
    hipDeviceProp_tR0600 p;
    hipError_t rc = hipGetDevicePropertiesR0600(&p, device);
    if (rc == hipSuccess) to_r0000(prop, &p);
    return rc;
}

/* The unversioned symbol is ROCm 5's ABI (ROCm 6 headers rename calls to R0600). */
API hipError_t hipGetDeviceProperties(hipDeviceProp_tR0000 *prop, int device) {
    return hipGetDevicePropertiesR0000(prop, device);
}

API hipError_t hipDeviceGetName(char *name, int len, int device) {
    if (!name || len <= 0) return ret(hipErrorInvalidValue);
    hipDeviceProp_tR0600 p;
    hipError_t rc = hipGetDevicePropertiesR0600(&p, device);
    if (rc == hipSuccess) snprintf(name, (size_t)len, "%s", p.name);
    return rc;
}

API hipError_t hipDeviceGetPCIBusId(char *bus_id, int len, int device) {
    if (!bus_id || len <= 0) return ret(hipErrorInvalidValue);
    hipDeviceProp_tR0600 p;
    hipError_t rc = hipGetDevicePropertiesR0600(&p, device);
    if (rc == hipSuccess)
        snprintf(bus_id, (size_t)len, "%04x:%02x:%02x.0", (unsigned)p.pciDomainID,
                 (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
    return rc;
}

API hipError_t hipDeviceTotalMem(size_t *bytes, int device) {
    if (!bytes) return ret(hipErrorInvalidValue);
    hipDeviceProp_tR0600 p;
    hipError_t rc = hipGetDevicePropertiesR0600(&p, device);
    if (rc == hipSuccess) *bytes = p.totalGlobalMem;
    return rc;
}

/* Peer access: the worker serves each session's devices apart; no peer mappings. */
API hipError_t hipDeviceCanAccessPeer(int *can, int device, int peer) {
    if (!can) return ret(hipErrorInvalidValue);
    hipDeviceProp_tR0600 p;
    hipError_t rc = hipGetDevicePropertiesR0600(&p, device);
    if (rc == hipSuccess) rc = hipGetDevicePropertiesR0600(&p, peer);
    if (rc == hipSuccess) *can = 0;
    return rc;
}

/* --- device flags ----------------------------------------------------------------------- */

static __thread unsigned int tl_device_flags;

/* Scheduling hints (spin, yield, block) concern the worker's host thread, which the
 * worker chooses; they are kept so that hipGetDeviceFlags reports what was set. */
API hipError_t hipSetDeviceFlags(unsigned int flags) {
    if (flags & ~0x1fu) return ret(hipErrorInvalidValue);
    tl_device_flags = flags;
    return hipSuccess;
}

API hipError_t hipGetDeviceFlags(unsigned int *flags) {
    if (!flags) return ret(hipErrorInvalidValue);
    *flags = tl_device_flags;
    return hipSuccess;
}

/* --- host allocations ------------------------------------------------------------------- */

/* Host memory is the client's own: page-aligned, kept in a table so that pointer
 * attributes and hipHostFree know it. Pinning would not speed a copy that crosses the
 * network, so none is done. */
/* One lock for this file's table of host allocations. */
static pthread_mutex_t extras_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_alloc { uint64_t ptr, size; unsigned flags; } *hosts;
static size_t n_hosts, cap_hosts;

static hipError_t host_alloc(void **ptr, size_t size, unsigned flags) {
    if (!ptr) return hipErrorInvalidValue;
    *ptr = NULL;
    if (!size) return hipSuccess;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return hipErrorOutOfMemory;
    pthread_mutex_lock(&extras_lock);
    if (n_hosts == cap_hosts) {
        size_t cap = cap_hosts ? cap_hosts * 2 : 32;
        struct host_alloc *grown = realloc(hosts, cap * sizeof *grown);
        if (grown) {
            hosts = grown;
            cap_hosts = cap;
        }
    }
    int ok = n_hosts < cap_hosts;
    if (ok) hosts[n_hosts++] = (struct host_alloc){(uint64_t)(uintptr_t)p, size, flags};
    pthread_mutex_unlock(&extras_lock);
    if (!ok) {
        free(p);
        return hipErrorOutOfMemory;
    }
    *ptr = p;
    return hipSuccess;
}

static hipError_t host_free(void *ptr) {
    if (!ptr) return hipSuccess;
    int found = 0;
    pthread_mutex_lock(&extras_lock);
    for (size_t i = 0; i < n_hosts; i++)
        if (hosts[i].ptr == (uint64_t)(uintptr_t)ptr) {
            hosts[i] = hosts[--n_hosts];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&extras_lock);
    if (!found) return hipErrorInvalidValue;
    free(ptr);
    return hipSuccess;
}

int hipr_host_alloc_of(const void *p, uint64_t *base, uint64_t *size) {
    uint64_t a = (uint64_t)(uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&extras_lock);
    for (size_t i = 0; i < n_hosts && !found; i++)
        if (a >= hosts[i].ptr && a - hosts[i].ptr < hosts[i].size) {
            *base = hosts[i].ptr;
            *size = hosts[i].size;
            found = 1;
        }
    pthread_mutex_unlock(&extras_lock);
    return found;
}

API hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags) {
    return ret(host_alloc(ptr, size, flags));
}

API hipError_t hipHostAlloc(void **ptr, size_t size, unsigned int flags) {
    return ret(host_alloc(ptr, size, flags));
}

API hipError_t hipMallocHost(void **ptr, size_t size) { return ret(host_alloc(ptr, size, 0)); }

API hipError_t hipMemAllocHost(void **ptr, size_t size) { return ret(host_alloc(ptr, size, 0)); }

API hipError_t hipHostFree(void *ptr) { return ret(host_free(ptr)); }

API hipError_t hipFreeHost(void *ptr) { return ret(host_free(ptr)); }

API hipError_t hipHostGetFlags(unsigned int *flags, void *ptr) {
    if (!flags) return ret(hipErrorInvalidValue);
    int found = 0;
    pthread_mutex_lock(&extras_lock);
    for (size_t i = 0; i < n_hosts && !found; i++)
        if (hosts[i].ptr == (uint64_t)(uintptr_t)ptr) {
            *flags = hosts[i].flags;
            found = 1;
        }
    pthread_mutex_unlock(&extras_lock);
    return found ? hipSuccess : ret(hipErrorInvalidValue);
}

/* Registering host memory pins it for DMA on a local GPU; a remote worker copies it
 * through the connection either way, so registration succeeds and changes nothing. */
API hipError_t hipHostRegister(void *ptr, size_t size, unsigned int flags) {
    (void)flags;
    if (!ptr || !size) return ret(hipErrorInvalidValue);
    return hipSuccess;
}

API hipError_t hipHostUnregister(void *ptr) {
    if (!ptr) return ret(hipErrorInvalidValue);
    return hipSuccess;
}

/* --- pointer attributes ----------------------------------------------------------------- */

API hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attributes, const void *ptr) {
    if (!attributes || !ptr) return ret(hipErrorInvalidValue);
    uint64_t base = 0, size = 0;
    memset(attributes, 0, sizeof *attributes);
    if (hipr_front_alloc_of(ptr, &base, &size)) {
        attributes->type = hipMemoryTypeDevice;
        attributes->device = 0;
        attributes->devicePointer = (void *)ptr;
        return hipSuccess;
    }
    if (hipr_host_alloc_of(ptr, &base, &size)) {
        attributes->type = hipMemoryTypeHost;
        attributes->hostPointer = (void *)ptr;
        return hipSuccess;
    }
    /* HIP 6: memory it does not know is reported as unregistered, with an error. */
    attributes->type = hipMemoryTypeUnregistered;
    return ret(hipErrorInvalidValue);
}

/* --- stream flags and priorities -------------------------------------------------------- */

/* The worker's streams are non-blocking (they do not wait for the null stream) and of
 * one priority: that is what these report, and the priority range says so. */
API hipError_t hipStreamGetFlags(hipStream_t stream, unsigned int *flags) {
    if (!flags) return ret(hipErrorInvalidValue);
    *flags = stream ? hipStreamNonBlocking : hipStreamDefault;
    return hipSuccess;
}

API hipError_t hipStreamGetPriority(hipStream_t stream, int *priority) {
    (void)stream;
    if (!priority) return ret(hipErrorInvalidValue);
    *priority = 0;
    return hipSuccess;
}

/* The device the stream was created on (the null stream: the current device's). */
API hipError_t hipStreamGetDevice(hipStream_t stream, int *device) {
    if (!device) return ret(hipErrorInvalidValue);
    if (hipr_stream_device(stream, device)) return ret(hipErrorInvalidHandle);
    return hipSuccess;
}

/* --- stream capture and graphs (graph_wire.c, shared with the CUDA front) ---------------- */

static __thread int tl_capture_mode;

#define HANDLE(p) ((uint64_t)(uintptr_t)(p))

void hipr_capture_forget(hipStream_t stream) { hipr_capture_drop(HANDLE(stream)); }

/* Capture on the worker's streams; the null stream cannot be captured (as in HIP). */
API hipError_t hipStreamBeginCapture(hipStream_t stream, int mode) {
    (void)mode;
    return ret(hipr_capture_begin(hipr_front_device(), HANDLE(stream)));
}

API hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t *graph) {
    if (!graph) return ret(hipErrorInvalidValue);
    uint64_t id = 0;
    hipError_t rc = hipr_capture_end(hipr_front_device(), HANDLE(stream), &id, NULL);
    *graph = (hipGraph_t)(uintptr_t)id;
    return ret(rc);
}

API hipError_t hipStreamIsCapturing(hipStream_t stream, int *status) {
    if (!status) return ret(hipErrorInvalidValue);
    *status = hipr_capture_active(HANDLE(stream), NULL) ? hipStreamCaptureStatusActive
                                                         : hipStreamCaptureStatusNone;
    return hipSuccess;
}

API hipError_t hipStreamGetCaptureInfo(hipStream_t stream, int *status,
                                       unsigned long long *id) {
    if (!status) return ret(hipErrorInvalidValue);
    unsigned long long cid = 0;
    *status = hipr_capture_active(HANDLE(stream), &cid) ? hipStreamCaptureStatusActive
                                                         : hipStreamCaptureStatusNone;
    if (id) *id = cid;
    return hipSuccess;
}

API hipError_t hipStreamGetCaptureInfo_v2(hipStream_t stream, int *status,
                                          unsigned long long *id, hipGraph_t *graph,
                                          const hipGraphNode_t **deps, size_t *n_deps) {
    hipError_t rc = hipStreamGetCaptureInfo(stream, status, id);
    /* The graph being captured exists only on the worker until the capture ends. */
    if (graph) *graph = NULL;
    if (deps) *deps = NULL;
    if (n_deps) *n_deps = 0;
    return rc;
}

API hipError_t hipThreadExchangeStreamCaptureMode(int *mode) {
    if (!mode) return ret(hipErrorInvalidValue);
    int old = tl_capture_mode;
    tl_capture_mode = *mode;
    *mode = old;
    return hipSuccess;
}

API hipError_t hipGraphCreate(hipGraph_t *graph, unsigned int flags) {
    (void)flags;
    if (!graph) return ret(hipErrorInvalidValue);
    uint64_t id = 0;
    hipError_t rc = hipr_graph_create(hipr_front_device(), &id);
    *graph = (hipGraph_t)(uintptr_t)id;
    return ret(rc);
}

API hipError_t hipGraphDestroy(hipGraph_t graph) {
    if (!graph) return ret(hipErrorInvalidValue);
    return ret(hipr_graph_destroy(hipr_front_device(), HANDLE(graph)));
}

static hipError_t instantiate(hipGraphExec_t *exec, hipGraph_t graph) {
    if (!exec || !graph) return hipErrorInvalidValue;
    uint64_t id = 0;
    hipError_t rc = hipr_graph_instantiate(hipr_front_device(), HANDLE(graph), &id);
    *exec = (hipGraphExec_t)(uintptr_t)id;
    return rc;
}

API hipError_t hipGraphInstantiate(hipGraphExec_t *exec, hipGraph_t graph,
                                   hipGraphNode_t *error_node, char *log, size_t log_size) {
    if (error_node) *error_node = NULL;
    if (log && log_size) log[0] = 0;
    return ret(instantiate(exec, graph));
}

API hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *exec, hipGraph_t graph,
                                            unsigned long long flags) {
    if (flags) return ret(hipErrorNotSupported);
    return ret(instantiate(exec, graph));
}

API hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
    if (!exec) return ret(hipErrorInvalidValue);
    return ret(hipr_graph_launch(hipr_front_device(), HANDLE(exec), HANDLE(stream)));
}

API hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
    if (!exec) return ret(hipErrorInvalidValue);
    return ret(hipr_graph_exec_destroy(hipr_front_device(), HANDLE(exec)));
}

/* --- stream-ordered allocation ------------------------------------------------------- */

/* The worker allocates at once; a free is queued behind the session's earlier work, as
 * hipFree is, so the stream's order is kept. */
API hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream) {
    (void)stream;
    return hipMalloc(ptr, size);
}

API hipError_t hipFreeAsync(void *ptr, hipStream_t stream) {
    (void)stream;
    return hipFree(ptr);
}

/* --- hipExtModuleLaunchKernel ------------------------------------------------------------ */

/* HIP's extension takes the global work size (threads), not the grid (blocks): served
 * where each global size is a multiple of the block's, which a grid of blocks can express. */
API hipError_t hipExtModuleLaunchKernel(hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, size_t shared,
                                        hipStream_t stream, void **params, void **extra,
                                        hipEvent_t start, hipEvent_t stop, unsigned flags) {
    (void)flags;
    if (!f) return ret(hipErrorInvalidHandle);
    if (!bx || !by || !bz || shared > UINT32_MAX) return ret(hipErrorInvalidValue);
    if (gx % bx || gy % by || gz % bz) {
        static int warned;
        hipr_warn_once("hipExtModuleLaunchKernel: a global work size that is not a multiple "
                       "of the block size is not served (hipErrorNotSupported)",
                       &warned);
        return ret(hipErrorNotSupported);
    }
    const unsigned grid[3] = {gx / bx, gy / by, gz / bz}, block[3] = {bx, by, bz};
    hipError_t rc = start ? hipEventRecord(start, stream) : hipSuccess;
    if (rc == hipSuccess)
        rc = hipr_module_launch(f, grid, block, (unsigned)shared, stream, params, extra);
    if (rc == hipSuccess && stop) rc = hipEventRecord(stop, stream);
    return ret(rc);
}

API hipError_t hipHccModuleLaunchKernel(hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, size_t shared,
                                        hipStream_t stream, void **params, void **extra,
                                        hipEvent_t start, hipEvent_t stop) {
    return hipExtModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra,
                                    start, stop, 0);
}

/* --- what hipr.hip serves besides: driver-style spellings, wide memsets ------------------ */

API hipError_t hipDeviceGet(int *device, int ordinal) {
    if (!device) return ret(hipErrorInvalidValue);
    int n = 0;
    hipError_t rc = hipGetDeviceCount(&n);
    if (rc) return rc;
    if (ordinal < 0 || ordinal >= n) return ret(hipErrorInvalidDevice);
    *device = ordinal;
    return hipSuccess;
}

API hipError_t hipDeviceComputeCapability(int *major, int *minor, int device) {
    if (!major || !minor) return ret(hipErrorInvalidValue);
    hipDeviceProp_tR0600 p;
    hipError_t rc = hipGetDevicePropertiesR0600(&p, device);
    if (rc == hipSuccess) {
        *major = p.major;
        *minor = p.minor;
    }
    return rc;
}

API hipError_t hipCtxSynchronize(void) { return hipDeviceSynchronize(); }

API hipError_t hipMemcpyHtoDAsync(void *dst, const void *src, size_t n, hipStream_t stream) {
    return hipMemcpyAsync(dst, src, n, hipMemcpyHostToDevice, stream);
}

API hipError_t hipMemcpyDtoHAsync(void *dst, const void *src, size_t n, hipStream_t stream) {
    return hipMemcpyAsync(dst, src, n, hipMemcpyDeviceToHost, stream);
}

API hipError_t hipMemcpyDtoDAsync(void *dst, const void *src, size_t n, hipStream_t stream) {
    return hipMemcpyAsync(dst, src, n, hipMemcpyDeviceToDevice, stream);
}

/* A copy that has finished when it returns, on `stream`'s order. */
API hipError_t hipMemcpyWithStream(void *dst, const void *src, size_t n, hipMemcpyKind kind,
                                   hipStream_t stream) {
    hipError_t rc = hipMemcpyAsync(dst, src, n, kind, stream);
    return rc ? rc : hipStreamSynchronize(stream);
}

/* `count` elements of `width` bytes set to `value`. A repeated byte is a plain memset;
 * any other pattern travels as data (the protocol has no wide fill), a chunk at a time. */
static hipError_t fill_wide(void *dst, uint32_t value, size_t width, size_t count,
                            hipStream_t stream) {
    if (!count) return hipSuccess;
    if (!dst) return ret(hipErrorInvalidValue);
    if (count > SIZE_MAX / width) return ret(hipErrorInvalidValue);
    uint8_t b[4];
    for (size_t i = 0; i < width; i++) b[i] = (uint8_t)(value >> (8 * i));
    int repeated = 1;
    for (size_t i = 1; i < width; i++) repeated &= b[i] == b[0];
    if (repeated) return hipMemsetAsync(dst, b[0], count * width, stream);
    enum { CHUNK = 1 << 20 };
    size_t total = count * width, chunk = total < CHUNK ? total : CHUNK;
    uint8_t *buf = malloc(chunk);
    if (!buf) return ret(hipErrorOutOfMemory);
    for (size_t i = 0; i < chunk; i += width) memcpy(buf + i, b, width);
    hipError_t rc = hipSuccess;
    for (size_t off = 0; off < total && rc == hipSuccess; off += chunk) {
        size_t n = total - off < chunk ? total - off : chunk;
        rc = hipMemcpyAsync((uint8_t *)dst + off, buf, n, hipMemcpyHostToDevice, stream);
    }
    free(buf);
    return rc;
}

API hipError_t hipMemsetD8(void *dst, unsigned char value, size_t count) {
    return fill_wide(dst, value, 1, count, NULL);
}

API hipError_t hipMemsetD16(void *dst, unsigned short value, size_t count) {
    return fill_wide(dst, value, 2, count, NULL);
}

API hipError_t hipMemsetD32(void *dst, int value, size_t count) {
    return fill_wide(dst, (uint32_t)value, 4, count, NULL);
}

API hipError_t hipMemsetD8Async(void *dst, unsigned char value, size_t count,
                                hipStream_t stream) {
    return fill_wide(dst, value, 1, count, stream);
}

API hipError_t hipMemsetD16Async(void *dst, unsigned short value, size_t count,
                                 hipStream_t stream) {
    return fill_wide(dst, value, 2, count, stream);
}

API hipError_t hipMemsetD32Async(void *dst, int value, size_t count, hipStream_t stream) {
    return fill_wide(dst, (uint32_t)value, 4, count, stream);
}

/* --- small functions that return no hipError_t ---------------------------------------- */

typedef struct { int x, y, z, w, f; } hipChannelFormatDesc;

API hipChannelFormatDesc hipCreateChannelDesc(int x, int y, int z, int w, int f) {
    return (hipChannelFormatDesc){x, y, z, w, f};
}

/* As hipStreamGetDevice; -1 for a stream this session did not create, as HIP answers
 * an invalid stream. */
API int hipGetStreamDeviceId(hipStream_t stream) {
    int device;
    return hipr_stream_device(stream, &device) ? -1 : device;
}

/* HIP's tracing ids are not carried: every id reads as unknown. */
API const char *hipApiName(uint32_t id) {
    (void)id;
    return "unknown";
}

__attribute__((constructor(102))) static void extras_init(void) {
    /* A forked child's host memory is its own copy and stays valid. */
    hipr_fork_guard(&extras_lock, NULL);
}
