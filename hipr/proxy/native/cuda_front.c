/* The CUDA driver API (libcuda.so.1) over the proxy's session: initialisation, devices
 * (facts cached after the first ask), primary and created contexts with CUDA's per-thread
 * context stack, memory, copies, memsets, streams, events and errors. Modules, launches
 * and cuGetProcAddress are in cuda_modules.c and cuda_proc.c. */
#define _GNU_SOURCE
#include "cuda_front.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_wire.h"
#include "opcodes.h"

/* --- errors ---------------------------------------------------------------------------- */

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {5, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled while using external profiling tool"},
    {6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device doesn't have valid Grid license"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {205, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {206, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {207, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {210, "CUDA_ERROR_ALREADY_ACQUIRED", "resource already acquired"},
    {211, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "resource not mapped as array"},
    {213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "resource not mapped as pointer"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "limit is not supported on this architecture"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "exclusive-thread device already in use by a different thread"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid OpenGL or DirectX context"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error detected during the execution"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain"},
    {223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation was disabled"},
    {224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the provided execution affinity is not supported"},
    {225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "the provided PTX contains unsupported call to cudaDeviceSynchronize"},
    {300, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object initialization failed"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {402, "CUDA_ERROR_LOSSY_QUERY", "attempted introspection would be semantically lossy"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch uses incompatible texturing mode"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {710, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {711, "CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "operation not supported on global/shared address space"},
    {718, "CUDA_ERROR_INVALID_PC", "invalid program counter"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {909, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

CUresult hipr_cu_error(int hip) {
    if (hip == 0) return CUDA_SUCCESS;
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == hip) return hip; /* HIP numbers its errors as CUDA does */
    switch (hip) {
    case 9:  /* hipErrorInvalidConfiguration */
    case 12: /* hipErrorInvalidPitchValue */
    case 17: /* hipErrorInvalidDevicePointer */
    case 21: /* hipErrorInvalidMemcpyDirection */
        return CUDA_ERROR_INVALID_VALUE;
    case 13: /* hipErrorInvalidSymbol */
        return CUDA_ERROR_NOT_FOUND;
    case 98: /* hipErrorInvalidDeviceFunction */
        return CUDA_ERROR_INVALID_HANDLE;
    default:
        return CUDA_ERROR_UNKNOWN;
    }
}

API CUresult cuGetErrorName(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == error) {
            *str = errors[i].name;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == error) {
            *str = errors[i].text;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* --- initialisation and devices -------------------------------------------------------- */

static int initialized;
pthread_mutex_t hipr_cu_lock = PTHREAD_MUTEX_INITIALIZER;

struct device {
    int ready;
    char name[256];
    char pci[64];
    uint64_t total_memory;
    int attrs[CU_DEVICE_ATTRIBUTE_MAX];
    uint8_t known[CU_DEVICE_ATTRIBUTE_MAX];
};
static int dev_count = -1;
static struct device *devices;

/* hipDeviceProp_t fields the worker reports (DEVICE_PROPERTIES' hip_props) and the CUDA
 * attributes they answer; a list answers consecutive attributes from `attr`. */
static const struct {
    const char *field;
    int attr;
} prop_attrs[] = {
    {"maxThreadsDim", 2}, {"maxGridSize", 5}, {"totalConstMem", 9}, {"regsPerBlock", 12},
    {"memPitch", 11}, {"textureAlignment", 14}, {"memoryClockRate", 36},
    {"memoryBusWidth", 37}, {"l2CacheSize", 38}, {"maxThreadsPerMultiProcessor", 39},
    {"concurrentKernels", 31}, {"ECCEnabled", 32}, {"pciDeviceID", 34}, {"pciDomainID", 50},
    {"integrated", 18}, {"computeMode", 20}, {"asyncEngineCount", 40},
    {"unifiedAddressing", 41}, {"sharedMemPerMultiprocessor", 81},
    {"regsPerMultiprocessor", 82}, {"cooperativeLaunch", 95}, {"sharedMemPerBlockOptin", 97},
    {"maxBlocksPerMultiProcessor", 106}, {"kernelExecTimeoutEnabled", 17},
    {"isMultiGpuBoard", 84}, {"persistingL2CacheMaxSize", 108},
};

/* The named fields every backend reports. */
static const struct {
    const char *key;
    int attr;
} named_attrs[] = {
    {"max_threads_per_block", 1}, {"max_shared_memory_per_block", 8}, {"warp_size", 10},
    {"clock_rate_khz", 13}, {"multiprocessor_count", 16}, {"major", 75}, {"minor", 76},
};

static void set_attr(struct device *d, int attr, const cbor_item_t *v) {
    if (attr < 0 || attr >= CU_DEVICE_ATTRIBUTE_MAX || !v) return;
    int64_t x;
    if (cbor_isa_uint(v)) x = (int64_t)cbor_get_int(v);
    else if (cbor_isa_negint(v)) x = -1 - (int64_t)cbor_get_int(v);
    else return;
    d->attrs[attr] = x > INT32_MAX ? INT32_MAX : (int)x;
    d->known[attr] = 1;
}

static void set_value(struct device *d, int attr, int value) {
    d->attrs[attr] = value;
    d->known[attr] = 1;
}

static void fill_device(struct device *d, const cbor_item_t *map) {
    memset(d, 0, sizeof *d);
    hipr_cbor_text(map, "name", d->name, sizeof d->name);
    hipr_cbor_text(map, "pci_bus_id", d->pci, sizeof d->pci);
    hipr_cbor_uint(map, "total_memory", &d->total_memory);
    for (size_t i = 0; i < sizeof named_attrs / sizeof *named_attrs; i++)
        set_attr(d, named_attrs[i].attr, hipr_cbor_get(map, named_attrs[i].key));
    cbor_item_t *extra = hipr_cbor_get(map, "hip_props");
    for (size_t i = 0; extra && cbor_isa_map(extra) && i < sizeof prop_attrs / sizeof *prop_attrs;
         i++) {
        cbor_item_t *v = hipr_cbor_get(extra, prop_attrs[i].field);
        if (v && cbor_isa_array(v)) {
            for (size_t j = 0; j < cbor_array_size(v) && j < 3; j++) {
                cbor_item_t *e = cbor_array_get(v, j);
                set_attr(d, prop_attrs[i].attr + (int)j, e);
                if (e) cbor_decref(&e);
            }
        } else {
            set_attr(d, prop_attrs[i].attr, v);
        }
    }
    unsigned domain = 0, bus = 0, dev = 0;
    if (sscanf(d->pci, "%x:%x:%x", &domain, &bus, &dev) == 3) {
        set_value(d, 50, (int)domain);
        set_value(d, 33, (int)bus);
        set_value(d, 34, (int)dev);
    }
    /* The worker's driver's own answers, where it reports them (a cuda worker reports
     * every attribute its driver knows). */
    cbor_item_t *ids = extra && cbor_isa_map(extra) ? hipr_cbor_get(extra, "cudaAttributeIds") : NULL;
    cbor_item_t *vals =
        extra && cbor_isa_map(extra) ? hipr_cbor_get(extra, "cudaAttributeValues") : NULL;
    if (ids && vals && cbor_isa_array(ids) && cbor_isa_array(vals) &&
        cbor_array_size(ids) == cbor_array_size(vals)) {
        for (size_t i = 0; i < cbor_array_size(ids); i++) {
            cbor_item_t *k = cbor_array_get(ids, i), *v = cbor_array_get(vals, i);
            if (k && cbor_isa_uint(k) && cbor_get_int(k) < CU_DEVICE_ATTRIBUTE_MAX)
                set_attr(d, (int)cbor_get_int(k), v);
            if (k) cbor_decref(&k);
            if (v) cbor_decref(&v);
        }
    }
    /* What the proxy itself offers, whatever the device can: features it does not serve
     * (textures, surfaces, mapped and managed host memory, stream memory operations,
     * cooperative and cluster launches, virtual memory management, IPC and pool sharing, RDMA,
     * graphics interop, NUMA host memory) are answered as absent, and stream priorities as
     * not carried (cuCtxGetStreamPriorityRange gives [0, 0]). */
    static const uint8_t absent[] = {
        19,  21,  22,  23,  24,  25,  26,  27,  28,  29,  30,  42,  43,  44,  45,  46,  47,
        48,  49,  51,  52,  53,  54,  55,  56,  57,  58,  59,  60,  61,  62,  63,  64,  65,
        66,  67,  68,  69,  70,  71,  72,  73,  74,  77,  78,  83,  86,  88,  89,  91,  92,
        93,  94,  95,  96,  98,  100, 101, 102, 103, 104, 105, 109, 112, 113, 114, 116,
        117, 118, 119, 120, 121, 122, 123, 124, 125, 127, 128, 129, 132, 135, 136, 137, 138,
        141, 142, 143, 144, 145, 146, 147,
    };
    for (size_t i = 0; i < sizeof absent; i++) set_value(d, absent[i], 0);
    /* Stream-ordered allocation from the default pool is served (cuda_pools.c). */
    set_value(d, 115, 1); /* CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED */
}

/* With hipr_cu_lock held. */
static CUresult device_count_locked(int *count) {
    if (dev_count < 0) {
        hipr_reply r;
        int rc = hipr_call(HIPR_ANY_DEVICE, OP_DEVICE_COUNT, NULL, NULL, 0, NULL, 0, &r);
        uint64_t n = 0;
        if (rc == 0 && (hipr_cbor_uint(r.map, "count", &n) || n > 1024)) rc = HIPR_UNKNOWN;
        hipr_reply_free(&r);
        if (rc) return hipr_cu_error(rc);
        devices = calloc(n ? n : 1, sizeof *devices);
        if (!devices) return CUDA_ERROR_OUT_OF_MEMORY;
        dev_count = (int)n;
    }
    *count = dev_count;
    return CUDA_SUCCESS;
}

static CUresult device_locked(CUdevice dev, struct device **out) {
    int n;
    CUresult rc = device_count_locked(&n);
    if (rc) return rc;
    if (dev < 0 || dev >= n) return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &devices[dev];
    if (!d->ready) {
        hipr_map m;
        hipr_map_init(&m, 1);
        hipr_map_u64(&m, "device", (uint64_t)dev);
        hipr_reply r;
        int hip = hipr_call(HIPR_ANY_DEVICE, OP_DEVICE_PROPERTIES, &m, NULL, 0, NULL, 0, &r);
        if (hip == 0) {
            fill_device(d, r.map);
            d->ready = 1;
        }
        hipr_reply_free(&r);
        if (hip) return hipr_cu_error(hip);
    }
    *out = d;
    return CUDA_SUCCESS;
}

API CUresult cuInit(unsigned int flags) {
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    int rc = hipr_ensure();
    if (rc) return rc == HIPR_NO_DEVICE ? CUDA_ERROR_NO_DEVICE : hipr_cu_error(rc);
    pthread_mutex_lock(&hipr_cu_lock);
    int n;
    CUresult cr = device_count_locked(&n);
    if (cr == CUDA_SUCCESS && n == 0) cr = CUDA_ERROR_NO_DEVICE;
    if (cr == CUDA_SUCCESS) initialized = 1;
    pthread_mutex_unlock(&hipr_cu_lock);
    return cr;
}

API CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = hipr_cu_driver_version();
    return CUDA_SUCCESS;
}

int hipr_cu_driver_version(void) {
    /* The driver API version this proxy implements (CUDA 13.0's cuda.h); a deployment
     * whose programs need another may say so. */
    const char *v = getenv("HIPR_CUDA_DRIVER_VERSION");
    int x = v && *v ? atoi(v) : 0;
    return x >= 3020 ? x : 13000;
}

int hipr_cu_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

#define NEED_INIT                                                                         \
    do {                                                                                  \
        if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;                    \
    } while (0)

API CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    CUresult rc = device_count_locked(count);
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    int n = 0;
    pthread_mutex_lock(&hipr_cu_lock);
    CUresult rc = device_count_locked(&n);
    pthread_mutex_unlock(&hipr_cu_lock);
    if (rc) return rc;
    if (ordinal < 0 || ordinal >= n) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct device *d;
    CUresult rc = device_locked(dev, &d);
    if (rc == CUDA_SUCCESS) snprintf(name, (size_t)len, "%s", d->name);
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct device *d;
    CUresult rc = device_locked(dev, &d);
    if (rc == CUDA_SUCCESS) *bytes = (size_t)d->total_memory;
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct device *d;
    CUresult rc = device_locked(dev, &d);
    int known = 0;
    if (rc == CUDA_SUCCESS && attrib >= 0 && attrib < CU_DEVICE_ATTRIBUTE_MAX && d->known[attrib]) {
        *value = d->attrs[attrib];
        known = 1;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (rc) return rc;
    if (!known) {
        static uint8_t warned[CU_DEVICE_ATTRIBUTE_MAX + 1];
        int slot = attrib >= 0 && attrib < CU_DEVICE_ATTRIBUTE_MAX ? attrib : CU_DEVICE_ATTRIBUTE_MAX;
        if (!__atomic_exchange_n(&warned[slot], 1, __ATOMIC_RELAXED))
            fprintf(stderr,
                    "hipr proxy: cuDeviceGetAttribute(%d): the worker does not report this "
                    "attribute (CUDA_ERROR_INVALID_VALUE)\n",
                    attrib);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* A device's UUID as the proxy names it: the worker does not report NVIDIA's, so it is
 * derived (FNV-1a) from the worker URL, the device's PCI address, name and ordinal; stable
 * for one worker and device, distinct between devices. */
static void derive_uuid(CUuuid *uuid, const struct device *d, CUdevice dev) {
    const char *url = getenv("HIPR_URL");
    char key[1400];
    snprintf(key, sizeof key, "%s|%s|%s|%d", url ? url : "", d->pci, d->name, dev);
    uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
    for (const char *p = key; *p; p++) {
        h1 = (h1 ^ (uint8_t)*p) * 0x100000001b3ull;
        h2 = (h2 ^ (uint8_t)*p) * 0x100000001b3ull + 1;
    }
    memcpy(uuid->bytes, &h1, 8);
    memcpy(uuid->bytes + 8, &h2, 8);
}

API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct device *d;
    CUresult rc = device_locked(dev, &d);
    if (rc == CUDA_SUCCESS) derive_uuid(uuid, d, dev);
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

API CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
    if (!bus_id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct device *d;
    CUresult rc = device_locked(dev, &d);
    if (rc == CUDA_SUCCESS) snprintf(bus_id, (size_t)len, "%s", d->pci);
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
    if (!major || !minor) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuDeviceGetAttribute(major, 75, dev);
    return rc ? rc : cuDeviceGetAttribute(minor, 76, dev);
}

/* --- contexts ------------------------------------------------------------------------- */

/* Every context made stays listed (dead ones marked) until the library unloads, so that a
 * handle used after its destruction is refused rather than read after free. */
static struct hipr_cu_ctx *all_ctxs;
static struct hipr_cu_ctx *primaries[1024];

#define STACK_MAX 64
static __thread CUcontext tl_stack[STACK_MAX];
static __thread int tl_depth;

CUcontext hipr_cu_current(void) { return tl_depth ? tl_stack[tl_depth - 1] : NULL; }

/* With hipr_cu_lock held. */
static int ctx_live_locked(CUcontext c) {
    for (struct hipr_cu_ctx *p = all_ctxs; p; p = p->next)
        if (p == c) return p->alive;
    return 0;
}

/* cuCtxGetId's ids count from 1 (NVIDIA's driver gave the first context 1); cuStreamGetId's
 * from 3 (1 and 2 are the legacy and per-thread default streams'). */
static uint64_t next_ctx_uid = 1, next_stream_uid = 3;

static struct hipr_cu_ctx *new_ctx_locked(CUdevice dev, unsigned flags, int primary) {
    struct hipr_cu_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->uid = next_ctx_uid++;
    c->device = dev;
    c->flags = flags;
    c->primary = primary;
    c->alive = 1;
    c->next = all_ctxs;
    all_ctxs = c;
    return c;
}

CUresult hipr_cu_ctx_device(int *device) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext c = hipr_cu_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&hipr_cu_lock);
    int live = ctx_live_locked(c);
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!live) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *device = c->device;
    return CUDA_SUCCESS;
}

static void free_ctx_memory(CUcontext c);

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    int n;
    CUresult rc = device_count_locked(&n);
    if (rc == CUDA_SUCCESS && (dev < 0 || dev >= n || dev >= 1024)) rc = CUDA_ERROR_INVALID_DEVICE;
    if (rc == CUDA_SUCCESS && !primaries[dev]) {
        primaries[dev] = new_ctx_locked(dev, 0, 1);
        if (!primaries[dev]) rc = CUDA_ERROR_OUT_OF_MEMORY;
        else primaries[dev]->refs = 0;
    }
    if (rc == CUDA_SUCCESS) {
        primaries[dev]->refs++;
        primaries[dev]->alive = 1;
        *pctx = primaries[dev];
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

static CUresult primary_of(CUdevice dev, struct hipr_cu_ctx **out) {
    int n;
    CUresult rc = device_count_locked(&n);
    if (rc) return rc;
    if (dev < 0 || dev >= n || dev >= 1024) return CUDA_ERROR_INVALID_DEVICE;
    *out = primaries[dev];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_ctx *c = NULL;
    CUresult rc = primary_of(dev, &c);
    int drop = 0;
    if (rc == CUDA_SUCCESS && (!c || c->refs <= 0)) rc = CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS && --c->refs == 0) drop = 1;
    pthread_mutex_unlock(&hipr_cu_lock);
    /* The last release destroys the primary context's resources, as CUDA's does; the
     * context itself stays (a later retain revives it). */
    if (drop) free_ctx_memory(c);
    return rc;
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_ctx *c = NULL;
    CUresult rc = primary_of(dev, &c);
    if (rc == CUDA_SUCCESS && c) {
        c->refs = 0;
        c->flags = 0;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (rc == CUDA_SUCCESS && c) free_ctx_memory(c);
    return rc;
}

API CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_ctx *c = NULL;
    CUresult rc = primary_of(dev, &c);
    if (rc == CUDA_SUCCESS) {
        *flags = c ? c->flags : 0;
        *active = c && c->refs > 0;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_ctx *c = NULL;
    CUresult rc = primary_of(dev, &c);
    if (rc == CUDA_SUCCESS && !c) {
        c = primaries[dev] = new_ctx_locked(dev, 0, 1);
        if (!c) rc = CUDA_ERROR_OUT_OF_MEMORY;
        else c->refs = 0;
    }
    /* Scheduling flags only decide how the host waits: the worker's thread waits. */
    if (rc == CUDA_SUCCESS) c->flags = flags;
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

static CUresult push(CUcontext c) {
    if (tl_depth >= STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    tl_stack[tl_depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult create_ctx(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    int n;
    CUresult rc = device_count_locked(&n);
    if (rc == CUDA_SUCCESS && (dev < 0 || dev >= n)) rc = CUDA_ERROR_INVALID_DEVICE;
    struct hipr_cu_ctx *c = NULL;
    if (rc == CUDA_SUCCESS) {
        c = new_ctx_locked(dev, flags, 0);
        if (!c) rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (rc == CUDA_SUCCESS) rc = push(c);
    if (rc == CUDA_SUCCESS) *pctx = c;
    else if (c) {
        pthread_mutex_lock(&hipr_cu_lock);
        c->alive = 0;
        pthread_mutex_unlock(&hipr_cu_lock);
    }
    return rc;
}

API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return create_ctx(pctx, flags, dev);
}

API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return create_ctx(pctx, flags, dev);
}

API CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned int flags,
                            CUdevice dev) {
    /* Execution affinity (SM partitions) is not carried: refused rather than dropped. */
    if (params && n > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
    return create_ctx(pctx, flags, dev);
}

API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                            CUdevice dev) {
    if (params && ((params->execAffinityParams && params->numExecAffinityParams > 0) ||
                   params->cigParams))
        return CUDA_ERROR_NOT_SUPPORTED;
    return create_ctx(pctx, flags, dev);
}

API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    int live = ctx && ctx_live_locked(ctx) && !ctx->primary;
    if (live) ctx->alive = 0;
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!live) return CUDA_ERROR_INVALID_CONTEXT;
    /* Off the calling thread's stack; other threads that still have it current get
     * CUDA_ERROR_CONTEXT_IS_DESTROYED from their next call. */
    int j = 0;
    for (int i = 0; i < tl_depth; i++)
        if (tl_stack[i] != ctx) tl_stack[j++] = tl_stack[i];
    tl_depth = j;
    free_ctx_memory(ctx);
    return CUDA_SUCCESS;
}

API CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

static CUresult check_ctx(CUcontext ctx) {
    pthread_mutex_lock(&hipr_cu_lock);
    int live = ctx_live_locked(ctx);
    pthread_mutex_unlock(&hipr_cu_lock);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult hipr_cu_ctx_id(CUcontext ctx, uint64_t *id) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    if (!ctx) ctx = hipr_cu_current();
    CUresult rc = ctx ? check_ctx(ctx) : CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS) *id = ctx->uid;
    return rc;
}

API CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
    uint64_t v;
    CUresult rc = hipr_cu_ctx_id(ctx, id ? &v : NULL);
    if (rc == CUDA_SUCCESS) *id = v;
    return rc;
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    NEED_INIT;
    CUresult rc = check_ctx(ctx);
    return rc ? rc : push(ctx);
}

API CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

API CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    NEED_INIT;
    if (!tl_depth) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = tl_stack[--tl_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

API CUresult cuCtxSetCurrent(CUcontext ctx) {
    NEED_INIT;
    if (!ctx) {
        if (tl_depth) tl_depth--;
        return CUDA_SUCCESS;
    }
    CUresult rc = check_ctx(ctx);
    if (rc) return rc;
    if (tl_depth) tl_stack[tl_depth - 1] = ctx;
    else tl_stack[tl_depth++] = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    *pctx = hipr_cu_current();
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *device) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    return hipr_cu_ctx_device(device);
}

API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) return cuCtxGetDevice(device);
    NEED_INIT;
    CUresult rc = check_ctx(ctx);
    if (rc == CUDA_SUCCESS) *device = ctx->device;
    return rc;
}

API CUresult cuCtxGetFlags(unsigned int *flags) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc == CUDA_SUCCESS) *flags = hipr_cu_current()->flags;
    return rc;
}

API CUresult cuCtxSetFlags(unsigned int flags) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc == CUDA_SUCCESS) hipr_cu_current()->flags = flags;
    return rc;
}

API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    if (!ctx) ctx = hipr_cu_current();
    CUresult rc = ctx ? check_ctx(ctx) : CUDA_ERROR_INVALID_CONTEXT;
    /* The context API of CUDA 3.2 and later (64-bit device pointers). */
    if (rc == CUDA_SUCCESS) *version = 3020;
    return rc;
}

static CUresult sync_device(int dev) {
    /* Nothing asked of any device since the last synchronize succeeded: nothing to wait
     * for and no error to report (PyTorch synchronizes again after a copy that waited). */
    if (hipr_idle(dev)) return CUDA_SUCCESS;
    hipr_reply r;
    int hip = hipr_call(dev, OP_DEVICE_SYNCHRONIZE, NULL, NULL, 0, NULL, 0, &r);
    hipr_reply_free(&r);
    return hipr_cu_error(hip);
}

API CUresult cuCtxSynchronize(void) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    return rc ? rc : sync_device(dev);
}

API CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    if (!ctx) return cuCtxSynchronize();
    NEED_INIT;
    CUresult rc = check_ctx(ctx);
    return rc ? rc : sync_device(ctx->device);
}

API CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    /* Stream priorities are not carried to the worker: one priority, as on a device
     * without them (CUDA clamps a requested priority into this range). */
    if (least) *least = 0;
    if (greatest) *greatest = 0;
    return CUDA_SUCCESS;
}

/* --- memory --------------------------------------------------------------------------- */

static struct alloc {
    uint64_t ptr, size;
    CUcontext ctx;
    int pooled; /* from the default pool (cuMemAllocAsync) */
} *allocs;
static size_t n_allocs, cap_allocs;

static struct host {
    void *ptr;
    size_t size;
    unsigned flags;
    int ours; /* allocated here (else registered by the program) */
} *hosts;
static size_t n_hosts, cap_hosts;

static int grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return 0;
    size_t c = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, c * elem);
    if (!p) return -1;
    *arr = p;
    *cap = c;
    return 0;
}

/* With hipr_cu_lock held: the allocation holding `p`, or NULL. */
static struct alloc *find_alloc_locked(uint64_t p) {
    for (size_t i = 0; i < n_allocs; i++)
        if (p >= allocs[i].ptr && p - allocs[i].ptr < allocs[i].size) return &allocs[i];
    return NULL;
}

static struct host *find_host_locked(const void *p) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < n_hosts; i++)
        if (a >= (uintptr_t)hosts[i].ptr && a - (uintptr_t)hosts[i].ptr < hosts[i].size)
            return &hosts[i];
    return NULL;
}

int hipr_cu_is_device(uint64_t p) {
    pthread_mutex_lock(&hipr_cu_lock);
    int found = find_alloc_locked(p) != NULL;
    pthread_mutex_unlock(&hipr_cu_lock);
    return found || hipr_cu_is_global(p);
}

static void send_free(int dev, uint64_t ptr) {
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "ptr", ptr);
    (void)hipr_notify(dev, OP_FREE, &m, NULL, 0);
}

/* A destroyed context's allocations go with it. */
static void free_ctx_memory(CUcontext c) {
    for (;;) {
        uint64_t ptr = 0;
        pthread_mutex_lock(&hipr_cu_lock);
        for (size_t i = 0; i < n_allocs; i++)
            if (allocs[i].ctx == c) {
                ptr = allocs[i].ptr;
                allocs[i] = allocs[--n_allocs];
                break;
            }
        pthread_mutex_unlock(&hipr_cu_lock);
        if (!ptr) return;
        send_free(c->device, ptr);
    }
}

CUresult hipr_cu_mem_alloc(CUdeviceptr *dptr, size_t size, int pooled) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "size", size);
    hipr_reply r;
    int hip = hipr_call(dev, OP_MALLOC, &m, NULL, 0, NULL, 0, &r);
    uint64_t p = 0;
    if (hip == 0 && (hipr_cbor_uint(r.map, "ptr", &p) || !p)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) return hipr_cu_error(hip);
    pthread_mutex_lock(&hipr_cu_lock);
    int ok = grow((void **)&allocs, &cap_allocs, n_allocs, sizeof *allocs) == 0;
    if (ok) allocs[n_allocs++] = (struct alloc){p, size, hipr_cu_current(), pooled};
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!ok) {
        send_free(dev, p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = p;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return hipr_cu_mem_alloc(dptr, size, 0); }

uint64_t hipr_cu_pooled_bytes(int device) {
    uint64_t total = 0;
    pthread_mutex_lock(&hipr_cu_lock);
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].pooled && allocs[i].ctx && allocs[i].ctx->device == device)
            total += allocs[i].size;
    pthread_mutex_unlock(&hipr_cu_lock);
    return total;
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    NEED_INIT;
    if (!ptr) return CUDA_SUCCESS;
    pthread_mutex_lock(&hipr_cu_lock);
    int found = 0, dev = 0;
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].ptr == ptr) {
            dev = allocs[i].ctx ? allocs[i].ctx->device : 0;
            allocs[i] = allocs[--n_allocs];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "ptr", ptr);
    return hipr_cu_error(hipr_notify(dev, OP_FREE, &m, NULL, 0));
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    hipr_reply r;
    int hip = hipr_call(dev, OP_MEM_GET_INFO, NULL, NULL, 0, NULL, 0, &r);
    uint64_t f = 0, t = 0;
    if (hip == 0 && (hipr_cbor_uint(r.map, "free", &f) || hipr_cbor_uint(r.map, "total", &t)))
        hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) return hipr_cu_error(hip);
    *free_bytes = f;
    *total = t;
    return CUDA_SUCCESS;
}

#define OP_DEVICE_LIMIT 0x0107

/* Read from the worker's driver (cuBLAS asks while it sets up a matmul). Setting one
 * (cuCtxSetLimit) stays refused: the worker's context may be shared by tenants. */
API CUresult cuCtxGetLimit(size_t *value, int limit) {
    if (!value || limit < 0) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "limit", (uint64_t)limit);
    hipr_reply r;
    int hip = hipr_call(dev, OP_DEVICE_LIMIT, &m, NULL, 0, NULL, 0, &r);
    uint64_t v = 0;
    if (hip == 0 && hipr_cbor_uint(r.map, "value", &v)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) return hipr_cu_error(hip);
    *value = (size_t)v;
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct alloc *a = find_alloc_locked(ptr);
    if (a) {
        if (base) *base = a->ptr;
        if (size) *size = a->size;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* Host memory: the worker's device cannot reach this process's memory, so "pinned" host
 * memory is ordinary page-aligned memory here; copies from and to it work as from any
 * host memory. Mapping it into the device (cuMemHostGetDevicePointer) is refused. */
static CUresult host_alloc(void **pp, size_t size, unsigned flags) {
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&hipr_cu_lock);
    int ok = grow((void **)&hosts, &cap_hosts, n_hosts, sizeof *hosts) == 0;
    if (ok) hosts[n_hosts++] = (struct host){p, size, flags, 1};
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!ok) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocHost_v2(void **pp, size_t size) { return host_alloc(pp, size, 0); }

API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, size, flags);
}

static CUresult host_forget(void *p, int ours) {
    pthread_mutex_lock(&hipr_cu_lock);
    int found = 0;
    for (size_t i = 0; i < n_hosts; i++)
        if (hosts[i].ptr == p && hosts[i].ours == ours) {
            hosts[i] = hosts[--n_hosts];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&hipr_cu_lock);
    return found ? CUDA_SUCCESS : ours ? CUDA_ERROR_INVALID_VALUE
                                       : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

API CUresult cuMemFreeHost(void *p) {
    NEED_INIT;
    CUresult rc = host_forget(p, 1);
    if (rc == CUDA_SUCCESS) free(p);
    return rc;
}

API CUresult cuMemHostGetFlags(unsigned int *flags, void *p) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct host *h = find_host_locked(p);
    if (h) *flags = h->flags;
    pthread_mutex_unlock(&hipr_cu_lock);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    /* Device mapping and I/O memory need the device to reach this host: refused. */
    if (flags & (CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY))
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&hipr_cu_lock);
    CUresult rc = find_host_locked(p) ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS && grow((void **)&hosts, &cap_hosts, n_hosts, sizeof *hosts))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) hosts[n_hosts++] = (struct host){p, size, flags, 0};
    pthread_mutex_unlock(&hipr_cu_lock);
    return rc;
}

API CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) {
    return cuMemHostRegister_v2(p, size, flags);
}

API CUresult cuMemHostUnregister(void *p) {
    NEED_INIT;
    return host_forget(p, 0);
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags) {
    (void)dptr, (void)p, (void)flags;
    static int warned;
    hipr_warn_once("cuMemHostGetDevicePointer: host memory cannot be mapped into a remote "
                   "device (CUDA_ERROR_NOT_SUPPORTED)",
                   &warned);
    return CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    struct alloc a = {0, 0, NULL, 0};
    struct alloc *found = find_alloc_locked(ptr);
    if (found) a = *found;
    struct host *h = found ? NULL : find_host_locked((const void *)(uintptr_t)ptr);
    struct host hc = h ? *h : (struct host){NULL, 0, 0, 0};
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!found && !h) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        if (!found) return CUDA_ERROR_INVALID_VALUE;
        *(CUcontext *)data = a.ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = found ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (!found) return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (found) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        if (!found) return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = a.ctx ? a.ctx->device : 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = found ? a.ptr : (CUdeviceptr)(uintptr_t)hc.ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = found ? (size_t)a.size : hc.size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = found ? 1 : 0;
        return CUDA_SUCCESS;
    default: {
        static int warned;
        hipr_warn_once("cuPointerGetAttribute: only context, memory type, device/host "
                       "pointer, managed, ordinal, range and mapped are served",
                       &warned);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    }
}

/* --- streams and events ---------------------------------------------------------------- */

static struct hipr_cu_stream *streams;
static struct hipr_cu_event *events;

CUresult hipr_cu_stream(CUstream s, uint64_t *id) {
    *id = 0;
    /* The null stream, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the worker's null
     * stream: per-thread default streams serialise with it (stronger ordering, never
     * weaker). */
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_SUCCESS;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_stream *p = streams;
    while (p && p != s) p = p->next;
    if (p) *id = p->id;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* cuStreamGetId: `s`'s id; CU_STREAM_LEGACY and CU_STREAM_PER_THREAD (and the null stream,
 * as the one `per_thread` says) have ids of their own; INVALID_HANDLE when unknown. */
static CUresult stream_id(CUstream s, int per_thread, uint64_t *id) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    if (!s) s = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        *id = s == CU_STREAM_LEGACY ? 1 : 2;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_stream *p = streams;
    while (p && p != s) p = p->next;
    if (p) *id = p->uid;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuStreamGetId(CUstream s, unsigned long long *id) {
    uint64_t v;
    CUresult rc = id ? stream_id(s, 0, &v) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) *id = v;
    return rc;
}

API CUresult cuStreamGetId_ptsz(CUstream s, unsigned long long *id) {
    uint64_t v;
    CUresult rc = id ? stream_id(s, 1, &v) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) *id = v;
    return rc;
}

static CUresult create_handle(int dev, uint16_t opcode, const char *key, uint64_t *handle) {
    hipr_reply r;
    int hip = hipr_call(dev, opcode, NULL, NULL, 0, NULL, 0, &r);
    if (hip == 0 && (hipr_cbor_uint(r.map, key, handle) || *handle == 0)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    return hipr_cu_error(hip);
}

static CUresult stream_create(CUstream *ps, unsigned int flags, int priority) {
    if (!ps) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    struct hipr_cu_stream *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = create_handle(dev, OP_STREAM_CREATE, "stream", &s->id);
    if (rc) {
        free(s);
        return rc;
    }
    s->flags = flags;
    (void)priority; /* clamped into [0, 0], cuCtxGetStreamPriorityRange's range */
    s->priority = 0;
    s->ctx = hipr_cu_current();
    s->device = dev;
    pthread_mutex_lock(&hipr_cu_lock);
    s->uid = next_stream_uid++;
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&hipr_cu_lock);
    *ps = s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamCreate(CUstream *ps, unsigned int flags) { return stream_create(ps, flags, 0); }

API CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority) {
    return stream_create(ps, flags, priority);
}

/* With hipr_cu_lock held: unlinks `s` from the list; 0 when it is not there. */
static int unlink_stream_locked(CUstream s) {
    for (struct hipr_cu_stream **p = &streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            return 1;
        }
    return 0;
}

API CUresult cuStreamDestroy_v2(CUstream s) {
    NEED_INIT;
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_stream *p = streams;
    while (p && p != s) p = p->next;
    /* The worker keeps a capturing stream (its capture must be ended first): so does this. */
    int capturing = p && hipr_capture_active(p->id, NULL);
    int found = p && !capturing && unlink_stream_locked(s);
    pthread_mutex_unlock(&hipr_cu_lock);
    if (capturing) return CUDA_ERROR_ILLEGAL_STATE;
    if (!found) return CUDA_ERROR_INVALID_HANDLE;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "stream", s->id);
    int dev = s->device;
    free(s);
    return hipr_cu_error(hipr_notify(dev, OP_STREAM_DESTROY, &m, NULL, 0));
}

API CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

/* 1 when some created stream of device `dev` is CU_STREAM_NON_BLOCKING (its work does not
 * wait for the null stream's, nor the null stream's for it). */
static int nonblocking_streams(int dev) {
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_stream *p = streams;
    while (p && !(p->device == dev && (p->flags & CU_STREAM_NON_BLOCKING))) p = p->next;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p != NULL;
}

static CUresult on_stream(uint16_t opcode, CUstream s) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &id);
    if (rc) return rc;
    /* The null stream waits for every blocking stream: where no stream is non-blocking,
     * synchronizing it is synchronizing the device, which the worker answers without a
     * GPU-thread hop when the work is done (and the proxy without the network when
     * nothing was asked since the last one). Stronger ordering, never weaker. */
    if (opcode == OP_STREAM_SYNCHRONIZE && !id && !nonblocking_streams(dev)) return sync_device(dev);
    /* Nothing asked of the device since its last synchronize: every stream is done. */
    if (hipr_idle(dev)) return CUDA_SUCCESS;
    hipr_map m;
    hipr_map_init(&m, 1);
    if (id) hipr_map_u64(&m, "stream", id);
    hipr_reply r;
    int hip = hipr_call(dev, opcode, &m, NULL, 0, NULL, 0, &r);
    if (hip == 0 && opcode == OP_STREAM_QUERY) {
        cbor_item_t *done = hipr_cbor_get(r.map, "done");
        if (!done || !cbor_is_bool(done)) hip = HIPR_UNKNOWN;
        else if (!cbor_get_bool(done)) hip = CUDA_ERROR_NOT_READY;
    }
    hipr_reply_free(&r);
    return hipr_cu_error(hip);
}

API CUresult cuStreamSynchronize(CUstream s) { return on_stream(OP_STREAM_SYNCHRONIZE, s); }
API CUresult cuStreamQuery(CUstream s) { return on_stream(OP_STREAM_QUERY, s); }

static struct hipr_cu_stream *stream_info(CUstream s) {
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_stream *p = streams;
    while (p && p != s) p = p->next;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p;
}

API CUresult cuStreamGetPriority(CUstream s, int *priority) {
    if (!priority) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && !stream_info(s))
        return CUDA_ERROR_INVALID_HANDLE;
    *priority = 0;
    return CUDA_SUCCESS;
}

API CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        *flags = CU_STREAM_DEFAULT;
        return CUDA_SUCCESS;
    }
    struct hipr_cu_stream *p = stream_info(s);
    if (!p) return CUDA_ERROR_INVALID_HANDLE;
    *flags = p->flags;
    return CUDA_SUCCESS;
}

API CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        *pctx = hipr_cu_current();
        return *pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    struct hipr_cu_stream *p = stream_info(s);
    if (!p) return CUDA_ERROR_INVALID_HANDLE;
    *pctx = p->ctx;
    return CUDA_SUCCESS;
}

static CUresult event_id(CUevent e, struct hipr_cu_event *out) {
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_event *p = events;
    while (p && p != e) p = p->next;
    if (p) *out = *p;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    if (flags & ~1u) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    uint64_t id = 0;
    struct hipr_cu_event ev;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &id);
    if (rc == CUDA_SUCCESS) rc = event_id(e, &ev);
    if (rc) return rc;
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "event", ev.id);
    if (id) hipr_map_u64(&m, "stream", id);
    return hipr_cu_error(hipr_notify(dev, OP_STREAM_WAIT_EVENT, &m, NULL, 0));
}

API CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
    if (!pe) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_EVENT_INTERPROCESS) return CUDA_ERROR_NOT_SUPPORTED; /* no IPC remotely */
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    struct hipr_cu_event *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    rc = create_handle(dev, OP_EVENT_CREATE, "event", &e->id);
    if (rc) {
        free(e);
        return rc;
    }
    e->flags = flags;
    e->device = dev;
    pthread_mutex_lock(&hipr_cu_lock);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&hipr_cu_lock);
    *pe = e;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent e, CUstream s) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    uint64_t id = 0;
    struct hipr_cu_event ev;
    if (rc == CUDA_SUCCESS) rc = event_id(e, &ev);
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &id);
    if (rc) return rc;
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "event", ev.id);
    if (id) hipr_map_u64(&m, "stream", id);
    hipr_capture_note(id, 1);
    return hipr_cu_error(hipr_notify(dev, OP_EVENT_RECORD, &m, NULL, 0));
}

API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
    /* CU_EVENT_RECORD_EXTERNAL belongs to graph capture, which is not served. */
    if (flags) return flags == 1 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    return cuEventRecord(e, s);
}

static CUresult on_event(uint16_t opcode, CUevent e) {
    NEED_INIT;
    struct hipr_cu_event ev;
    CUresult rc = event_id(e, &ev);
    if (rc) return rc;
    /* Recording is work: an event recorded before the device's last synchronize, with
     * nothing asked since, has completed (as has one never recorded, CUDA's answer too). */
    if (hipr_idle(ev.device)) return CUDA_SUCCESS;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "event", ev.id);
    hipr_reply r;
    int hip = hipr_call(ev.device, opcode, &m, NULL, 0, NULL, 0, &r);
    if (hip == 0 && opcode == OP_EVENT_QUERY) {
        cbor_item_t *done = hipr_cbor_get(r.map, "done");
        if (!done || !cbor_is_bool(done)) hip = HIPR_UNKNOWN;
        else if (!cbor_get_bool(done)) hip = CUDA_ERROR_NOT_READY;
    }
    hipr_reply_free(&r);
    return hipr_cu_error(hip);
}

API CUresult cuEventSynchronize(CUevent e) { return on_event(OP_EVENT_SYNCHRONIZE, e); }
API CUresult cuEventQuery(CUevent e) { return on_event(OP_EVENT_QUERY, e); }

API CUresult cuEventDestroy_v2(CUevent e) {
    NEED_INIT;
    pthread_mutex_lock(&hipr_cu_lock);
    int found = 0;
    for (struct hipr_cu_event **p = &events; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!found) return CUDA_ERROR_INVALID_HANDLE;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "event", e->id);
    int dev = e->device;
    free(e);
    return hipr_cu_error(hipr_notify(dev, OP_EVENT_DESTROY, &m, NULL, 0));
}

API CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

API CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    struct hipr_cu_event a, b;
    CUresult rc = event_id(start, &a);
    if (rc == CUDA_SUCCESS) rc = event_id(end, &b);
    if (rc) return rc;
    if ((a.flags | b.flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "start", a.id);
    hipr_map_u64(&m, "end", b.id);
    hipr_reply r;
    int hip = hipr_call(a.device, OP_EVENT_ELAPSED_TIME, &m, NULL, 0, NULL, 0, &r);
    double v = 0;
    if (hip == 0 && hipr_cbor_float(r.map, "ms", &v)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) return hipr_cu_error(hip);
    *ms = (float)v;
    return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    return cuEventElapsedTime_v2(ms, start, end);
}

/* --- copies and memsets --------------------------------------------------------------- */

static void add_stream(hipr_map *m, uint64_t id) {
    if (id) hipr_map_u64(m, "stream", id);
}

static CUresult htod(int dev, CUdeviceptr dst, const void *src, size_t n, uint64_t stream) {
    hipr_map m;
    hipr_map_init(&m, stream ? 3 : 2);
    hipr_map_u64(&m, "dst", dst);
    hipr_map_u64(&m, "size", n);
    add_stream(&m, stream);
    return hipr_cu_error(hipr_notify(dev, OP_MEMCPY_HTOD, &m, src, n));
}

static CUresult dtoh(int dev, void *dst, CUdeviceptr src, size_t n, uint64_t stream) {
    hipr_map m;
    hipr_map_init(&m, stream ? 3 : 2);
    hipr_map_u64(&m, "src", src);
    hipr_map_u64(&m, "size", n);
    add_stream(&m, stream);
    hipr_reply r;
    int hip = hipr_call(dev, OP_MEMCPY_DTOH, &m, NULL, 0, dst, n, &r);
    if (hip == 0 && r.sink_len != n) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    return hipr_cu_error(hip);
}

static CUresult dtod(int dev, CUdeviceptr dst, CUdeviceptr src, size_t n, uint64_t stream) {
    hipr_map m;
    hipr_map_init(&m, stream ? 4 : 3);
    hipr_map_u64(&m, "dst", dst);
    hipr_map_u64(&m, "src", src);
    hipr_map_u64(&m, "size", n);
    add_stream(&m, stream);
    return hipr_cu_error(hipr_notify(dev, OP_MEMCPY_DTOD, &m, NULL, 0));
}

/* kind: 1 host to device, 2 device to host, 3 device to device, 0 told by the pointers. */
static CUresult copy(int kind, uint64_t dst, uint64_t src, size_t n, CUstream s) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &id);
    if (rc) return rc;
    if (!n) return CUDA_SUCCESS;
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    if (kind == 0) {
        int d = hipr_cu_is_device(dst), h = hipr_cu_is_device(src);
        kind = d ? (h ? 3 : 1) : (h ? 2 : 4);
    }
    if (kind != 4) hipr_capture_note(id, 1);
    switch (kind) {
    case 1:
        return htod(dev, dst, (const void *)(uintptr_t)src, n, id);
    case 2:
        return dtoh(dev, (void *)(uintptr_t)dst, src, n, id);
    case 3:
        return dtod(dev, dst, src, n, id);
    default:
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
        return CUDA_SUCCESS;
    }
}

#define HOST(p) ((uint64_t)(uintptr_t)(p))

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    return copy(1, dst, HOST(src), n, NULL);
}
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    return copy(2, HOST(dst), src, n, NULL);
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy(3, dst, src, n, NULL);
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy(1, dst, HOST(src), n, s);
}
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(2, HOST(dst), src, n, s);
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(3, dst, src, n, s);
}
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(0, dst, src, n, NULL); }
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(0, dst, src, n, s);
}

/* Memsets of 1, 2 or 4-byte elements: one MEMSET where every byte of the element is the
 * same, else the pattern copied from host in chunks (fire-and-forget, in stream order). */
#define PATTERN_CHUNK (1u << 20)

static CUresult fill(CUdeviceptr ptr, uint32_t value, unsigned width, size_t count, CUstream s) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(s, &id);
    if (rc) return rc;
    if (!count) return CUDA_SUCCESS;
    if (!ptr || ptr % width) return CUDA_ERROR_INVALID_VALUE;
    if (count > SIZE_MAX / width) return CUDA_ERROR_INVALID_VALUE;
    size_t total = count * width;
    uint8_t b[4];
    memcpy(b, &value, 4); /* little-endian, as the device */
    int uniform = width == 1 || (b[0] == b[1] && (width == 2 || (b[1] == b[2] && b[2] == b[3])));
    size_t chunk = total < PATTERN_CHUNK ? total : PATTERN_CHUNK;
    hipr_capture_note(id, uniform ? 1 : (unsigned)((total + chunk - 1) / chunk));
    if (uniform) {
        hipr_map m;
        hipr_map_init(&m, id ? 4 : 3);
        hipr_map_u64(&m, "ptr", ptr);
        hipr_map_u64(&m, "value", b[0]);
        hipr_map_u64(&m, "size", total);
        add_stream(&m, id);
        return hipr_cu_error(hipr_notify(dev, OP_MEMSET, &m, NULL, 0));
    }
    uint8_t *buf = malloc(chunk);
    if (!buf) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < chunk; i += width) memcpy(buf + i, b, width);
    for (size_t off = 0; rc == CUDA_SUCCESS && off < total; off += chunk) {
        size_t n = total - off < chunk ? total - off : chunk;
        rc = htod(dev, ptr + off, buf, n, id);
    }
    free(buf);
    return rc;
}

API CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { return fill(p, v, 1, n, NULL); }
API CUresult cuMemsetD16_v2(CUdeviceptr p, unsigned short v, size_t n) {
    return fill(p, v, 2, n, NULL);
}
API CUresult cuMemsetD32_v2(CUdeviceptr p, unsigned int v, size_t n) { return fill(p, v, 4, n, NULL); }
API CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
    return fill(p, v, 1, n, s);
}
API CUresult cuMemsetD16Async(CUdeviceptr p, unsigned short v, size_t n, CUstream s) {
    return fill(p, v, 2, n, s);
}
API CUresult cuMemsetD32Async(CUdeviceptr p, unsigned int v, size_t n, CUstream s) {
    return fill(p, v, 4, n, s);
}

/* The per-thread-default-stream forms (_ptds, _ptsz): the same calls, since the proxy's
 * default streams are all the worker's null stream. */
ALIAS(CUresult, cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))
ALIAS(CUresult, cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t))
ALIAS(CUresult, cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2, (CUdeviceptr, CUdeviceptr, size_t))
ALIAS(CUresult, cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2,
      (CUdeviceptr, const void *, size_t, CUstream))
ALIAS(CUresult, cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2,
      (void *, CUdeviceptr, size_t, CUstream))
ALIAS(CUresult, cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2,
      (CUdeviceptr, CUdeviceptr, size_t, CUstream))
ALIAS(CUresult, cuMemcpy_ptds, cuMemcpy, (CUdeviceptr, CUdeviceptr, size_t))
ALIAS(CUresult, cuMemcpyAsync_ptsz, cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))
ALIAS(CUresult, cuMemsetD8_v2_ptds, cuMemsetD8_v2, (CUdeviceptr, unsigned char, size_t))
ALIAS(CUresult, cuMemsetD16_v2_ptds, cuMemsetD16_v2, (CUdeviceptr, unsigned short, size_t))
ALIAS(CUresult, cuMemsetD32_v2_ptds, cuMemsetD32_v2, (CUdeviceptr, unsigned int, size_t))
ALIAS(CUresult, cuMemsetD8Async_ptsz, cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))
ALIAS(CUresult, cuMemsetD16Async_ptsz, cuMemsetD16Async,
      (CUdeviceptr, unsigned short, size_t, CUstream))
ALIAS(CUresult, cuMemsetD32Async_ptsz, cuMemsetD32Async, (CUdeviceptr, unsigned int, size_t, CUstream))
ALIAS(CUresult, cuStreamSynchronize_ptsz, cuStreamSynchronize, (CUstream))
ALIAS(CUresult, cuStreamQuery_ptsz, cuStreamQuery, (CUstream))
ALIAS(CUresult, cuStreamWaitEvent_ptsz, cuStreamWaitEvent, (CUstream, CUevent, unsigned int))
ALIAS(CUresult, cuStreamGetPriority_ptsz, cuStreamGetPriority, (CUstream, int *))
ALIAS(CUresult, cuStreamGetFlags_ptsz, cuStreamGetFlags, (CUstream, unsigned int *))
ALIAS(CUresult, cuStreamGetCtx_ptsz, cuStreamGetCtx, (CUstream, CUcontext *))
ALIAS(CUresult, cuEventRecord_ptsz, cuEventRecord, (CUevent, CUstream))
ALIAS(CUresult, cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags, (CUevent, CUstream, unsigned int))

/* --- fork and unload --------------------------------------------------------------------- */

static void forget_session(void) {
    /* A forked child gets its own session: the parent's handles are not valid there. */
    n_allocs = 0;
    for (struct hipr_cu_stream *s = streams, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    streams = NULL;
    for (struct hipr_cu_event *e = events, *next; e; e = next) {
        next = e->next;
        free(e);
    }
    events = NULL;
    hipr_cu_forget_modules();
    hipr_cu_forget_libraries();
    hipr_cu_forget_graphs();
}

__attribute__((constructor(102))) static void cuda_front_init(void) {
    hipr_fork_guard(&hipr_cu_lock, forget_session);
}

/* Several attributes at once; a pointer the proxy does not know (ordinary host memory)
 * reads as unregistered (memory type 0), as the driver reports it. */
API CUresult cuPointerGetAttributes(unsigned int n, int *attributes, void **data,
                                    CUdeviceptr ptr) {
    if (!n || !attributes || !data) return CUDA_ERROR_INVALID_VALUE;
    NEED_INIT;
    for (unsigned i = 0; i < n; i++) {
        if (!data[i]) continue;
        CUresult rc = cuPointerGetAttribute(data[i], attributes[i], ptr);
        if (rc == CUDA_ERROR_INVALID_VALUE) {
            /* unknown pointer, or an attribute that does not apply to it */
            switch (attributes[i]) {
            case CU_POINTER_ATTRIBUTE_CONTEXT:
                *(CUcontext *)data[i] = NULL;
                break;
            case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            case CU_POINTER_ATTRIBUTE_MAPPED:
                *(unsigned *)data[i] = 0;
                break;
            case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
                *(int *)data[i] = -2; /* the driver's "no device" ordinal */
                break;
            default:
                *(uint64_t *)data[i] = 0;
            }
        } else if (rc) {
            return rc;
        }
    }
    return CUDA_SUCCESS;
}
