/* The HIP runtime API over the proxy's session: device facts (cached after the first
 * ask), memory, copies, streams, events, modules and launches. Per-thread current device
 * and last error, as HIP keeps them. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "gen_errors.h"
#include "hip_types.h"
#include "gen_props.h"
#include "modules.h"
#include "opcodes.h"

#define API HIPR_EXPORT

static __thread int tl_device;
static __thread hipError_t tl_last_error;

static hipError_t ret(hipError_t e) {
    if (e != hipSuccess) tl_last_error = e;
    return e;
}

/* --- device facts, asked once ----------------------------------------------------------- */

static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;
static int dev_count = -1;
static hipDeviceProp_tR0600 *dev_props;
static char *dev_props_ready;

static hipError_t device_count(int *count) {
    pthread_mutex_lock(&info_lock);
    hipError_t rc = hipSuccess;
    if (dev_count < 0) {
        hipr_reply r;
        rc = hipr_call(HIPR_ANY_DEVICE, OP_DEVICE_COUNT, NULL, NULL, 0, NULL, 0, &r);
        uint64_t n = 0;
        if (rc == hipSuccess && (hipr_cbor_uint(r.map, "count", &n) || n > 1024))
            rc = hipErrorUnknown;
        hipr_reply_free(&r);
        if (rc == hipSuccess) {
            dev_props = calloc(n ? n : 1, sizeof *dev_props);
            dev_props_ready = calloc(n ? n : 1, 1);
            if (!dev_props || !dev_props_ready) {
                free(dev_props);
                free(dev_props_ready);
                dev_props = NULL;
                dev_props_ready = NULL;
                rc = hipErrorOutOfMemory;
            } else {
                dev_count = (int)n;
            }
        }
    }
    *count = dev_count < 0 ? 0 : dev_count;
    pthread_mutex_unlock(&info_lock);
    return rc;
}

static const struct hipr_prop_field *prop_field(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof hipr_prop_fields / sizeof *hipr_prop_fields; i++)
        if (strlen(hipr_prop_fields[i].name) == len && !memcmp(hipr_prop_fields[i].name, name, len))
            return &hipr_prop_fields[i];
    return NULL;
}

static void store(hipDeviceProp_tR0600 *p, const struct hipr_prop_field *f, int index, uint64_t v) {
    if (index < 0 || index >= f->count) return;
    char *at = (char *)p + f->offset + (size_t)index * (size_t)f->size;
    if (f->size == 4) {
        int32_t x = (int32_t)v;
        memcpy(at, &x, 4);
    } else {
        memcpy(at, &v, 8);
    }
}

static void store_item(hipDeviceProp_tR0600 *p, const struct hipr_prop_field *f, int index,
                       const cbor_item_t *v) {
    if (cbor_isa_uint(v)) store(p, f, index, cbor_get_int(v));
    else if (cbor_isa_negint(v)) store(p, f, index, (uint64_t)(-1 - (int64_t)cbor_get_int(v)));
}

static void store_named(hipDeviceProp_tR0600 *p, const cbor_item_t *map, const char *key,
                        const char *field) {
    cbor_item_t *v = hipr_cbor_get(map, key);
    const struct hipr_prop_field *f = prop_field(field, strlen(field));
    if (v && f) store_item(p, f, 0, v);
}

static void fill_props(hipDeviceProp_tR0600 *p, const cbor_item_t *map) {
    memset(p, 0, sizeof *p);
    char pci[64] = "";
    if (hipr_cbor_text(map, "pci_bus_id", pci, sizeof pci) == 0) {
        unsigned domain = 0, bus = 0, dev = 0;
        if (sscanf(pci, "%x:%x:%x", &domain, &bus, &dev) == 3) {
            p->pciDomainID = (int)domain;
            p->pciBusID = (int)bus;
            p->pciDeviceID = (int)dev;
        }
    }
    /* The runtime's own figures first; the named fields below, which every backend
     * reports, win (as in hipr.facade.props). */
    cbor_item_t *extra = hipr_cbor_get(map, "hip_props");
    if (extra && cbor_isa_map(extra)) {
        struct cbor_pair *pairs = cbor_map_handle(extra);
        for (size_t i = 0; i < cbor_map_size(extra); i++) {
            cbor_item_t *k = pairs[i].key, *v = pairs[i].value;
            if (!cbor_isa_string(k) || !cbor_string_is_definite(k)) continue;
            const struct hipr_prop_field *f =
                prop_field((const char *)cbor_string_handle(k), cbor_string_length(k));
            if (!f) continue;
            if (cbor_isa_array(v)) {
                for (size_t j = 0; j < cbor_array_size(v) && j < (size_t)f->count; j++) {
                    cbor_item_t *e = cbor_array_get(v, j);
                    store_item(p, f, (int)j, e);
                    cbor_decref(&e);
                }
            } else {
                store_item(p, f, 0, v);
            }
        }
    }
    hipr_cbor_text(map, "name", p->name, sizeof p->name);
    hipr_cbor_text(map, "arch", p->gcnArchName, sizeof p->gcnArchName);
    store_named(p, map, "total_memory", "totalGlobalMem");
    store_named(p, map, "multiprocessor_count", "multiProcessorCount");
    store_named(p, map, "warp_size", "warpSize");
    store_named(p, map, "max_threads_per_block", "maxThreadsPerBlock");
    store_named(p, map, "clock_rate_khz", "clockRate");
    store_named(p, map, "major", "major");
    store_named(p, map, "minor", "minor");
    store_named(p, map, "max_shared_memory_per_block", "sharedMemPerBlock");
}

static hipError_t device_props(int device, const hipDeviceProp_tR0600 **out) {
    int n;
    hipError_t rc = device_count(&n);
    if (rc) return rc;
    if (device < 0 || device >= n) return hipErrorInvalidDevice;
    pthread_mutex_lock(&info_lock);
    if (!dev_props_ready[device]) {
        hipr_map m;
        hipr_map_init(&m, 1);
        hipr_map_u64(&m, "device", (uint64_t)device);
        hipr_reply r;
        rc = hipr_call(HIPR_ANY_DEVICE, OP_DEVICE_PROPERTIES, &m, NULL, 0, NULL, 0, &r);
        if (rc == hipSuccess) {
            fill_props(&dev_props[device], r.map);
            dev_props_ready[device] = 1;
        }
        hipr_reply_free(&r);
    }
    pthread_mutex_unlock(&info_lock);
    *out = &dev_props[device];
    return rc;
}

API hipError_t hipInit(unsigned int flags) {
    (void)flags;
    return ret(hipr_ensure());
}

API hipError_t hipGetDeviceCount(int *count) {
    if (!count) return ret(hipErrorInvalidValue);
    hipError_t rc = device_count(count);
    if (rc == hipSuccess && *count == 0) rc = hipErrorNoDevice;
    return ret(rc);
}

/* Set once any thread selects a device other than 0 (every thread starts on 0): a stream
 * or event may then belong to a device other than the caller's, whose idleness says
 * nothing of it, so their synchronizes are no longer answered without the network. */
static int sync_other_device;

API hipError_t hipSetDevice(int device) {
    int n;
    hipError_t rc = device_count(&n);
    if (rc) return ret(rc);
    if (device < 0 || device >= n) return ret(hipErrorInvalidDevice);
    tl_device = device;
    if (device != 0) __atomic_store_n(&sync_other_device, 1, __ATOMIC_RELAXED);
    return hipSuccess;
}

API hipError_t hipGetDevice(int *device) {
    if (!device) return ret(hipErrorInvalidValue);
    *device = tl_device;
    return hipSuccess;
}

API hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *prop, int device) {
    if (!prop) return ret(hipErrorInvalidValue);
    const hipDeviceProp_tR0600 *p;
    hipError_t rc = device_props(device, &p);
    if (rc == hipSuccess) memcpy(prop, p, sizeof *prop);
    return ret(rc);
}

API hipError_t hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int device) {
    if (!value) return ret(hipErrorInvalidValue);
    const hipDeviceProp_tR0600 *p;
    hipError_t rc = device_props(device, &p);
    if (rc) return ret(rc);
    for (size_t i = 0; i < sizeof hipr_attr_fields / sizeof *hipr_attr_fields; i++) {
        if (hipr_attr_fields[i].attribute != attr) continue;
        const char *name = hipr_attr_fields[i].field;
        const struct hipr_prop_field *f = prop_field(name, strlen(name));
        if (!f) break;
        int index = hipr_attr_fields[i].index < 0 ? 0 : hipr_attr_fields[i].index;
        const char *at = (const char *)p + f->offset + (size_t)index * (size_t)f->size;
        if (f->size == 4) {
            int32_t x;
            memcpy(&x, at, 4);
            *value = x;
        } else {
            uint64_t x;
            memcpy(&x, at, 8);
            *value = x > INT32_MAX ? INT32_MAX : (int)x;
        }
        return hipSuccess;
    }
    return ret(hipErrorInvalidValue);
}


API hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
    if (!free_bytes || !total) return ret(hipErrorInvalidValue);
    hipr_reply r;
    hipError_t rc = hipr_call(tl_device, OP_MEM_GET_INFO, NULL, NULL, 0, NULL, 0, &r);
    uint64_t f = 0, t = 0;
    if (rc == hipSuccess &&
        (hipr_cbor_uint(r.map, "free", &f) || hipr_cbor_uint(r.map, "total", &t)))
        rc = hipErrorUnknown;
    hipr_reply_free(&r);
    if (rc == hipSuccess) {
        *free_bytes = f;
        *total = t;
    }
    return ret(rc);
}

/* --- errors and versions ------------------------------------------------------------- */

API hipError_t hipGetLastError(void) {
    hipError_t e = tl_last_error;
    tl_last_error = hipSuccess;
    return e;
}

API hipError_t hipPeekAtLastError(void) { return tl_last_error; }

API const char *hipGetErrorName(hipError_t e) {
    for (size_t i = 0; i < sizeof hipr_error_names / sizeof *hipr_error_names; i++)
        if (hipr_error_names[i].code == e) return hipr_error_names[i].name;
    return "hipErrorUnknown";
}

API const char *hipGetErrorString(hipError_t e) {
    for (size_t i = 0; i < sizeof hipr_error_texts / sizeof *hipr_error_texts; i++)
        if (hipr_error_texts[i].code == e) return hipr_error_texts[i].text;
    for (size_t i = 0; i < sizeof hipr_error_names / sizeof *hipr_error_names; i++)
        if (hipr_error_names[i].code == e) return hipr_error_names[i].name;
    return "unknown error";
}

API hipError_t hipRuntimeGetVersion(int *version) {
    if (!version) return ret(hipErrorInvalidValue);
    *version = HIPR_HIP_VERSION;
    return hipSuccess;
}

API hipError_t hipDriverGetVersion(int *version) {
    if (!version) return ret(hipErrorInvalidValue);
    *version = HIPR_HIP_VERSION;
    return hipSuccess;
}

/* --- memory ------------------------------------------------------------------------- */

/* Allocations made through this proxy, so that hipMemcpyDefault can tell device from
 * host pointers (unified addressing). */
static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc { uint64_t ptr, size; } *allocs;
static size_t n_allocs, cap_allocs;

static void remember(uint64_t ptr, uint64_t size) {
    pthread_mutex_lock(&alloc_lock);
    if (n_allocs == cap_allocs) {
        size_t cap = cap_allocs ? cap_allocs * 2 : 64;
        struct alloc *p = realloc(allocs, cap * sizeof *p);
        if (p) {
            allocs = p;
            cap_allocs = cap;
        }
    }
    if (n_allocs < cap_allocs) allocs[n_allocs++] = (struct alloc){ptr, size};
    pthread_mutex_unlock(&alloc_lock);
}

static void forget(uint64_t ptr) {
    pthread_mutex_lock(&alloc_lock);
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].ptr == ptr) {
            allocs[i] = allocs[--n_allocs];
            break;
        }
    pthread_mutex_unlock(&alloc_lock);
}

static int is_device(const void *p) {
    uint64_t a = (uint64_t)(uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&alloc_lock);
    for (size_t i = 0; i < n_allocs && !found; i++)
        found = a >= allocs[i].ptr && a - allocs[i].ptr < allocs[i].size;
    pthread_mutex_unlock(&alloc_lock);
    return found;
}

int hipr_front_alloc_of(const void *p, uint64_t *base, uint64_t *size) {
    uint64_t a = (uint64_t)(uintptr_t)p;
    int found = 0;
    pthread_mutex_lock(&alloc_lock);
    for (size_t i = 0; i < n_allocs && !found; i++)
        if (a >= allocs[i].ptr && a - allocs[i].ptr < allocs[i].size) {
            *base = allocs[i].ptr;
            *size = allocs[i].size;
            found = 1;
        }
    pthread_mutex_unlock(&alloc_lock);
    return found;
}

API hipError_t hipMalloc(void **ptr, size_t size) {
    if (!ptr) return ret(hipErrorInvalidValue);
    *ptr = NULL;
    if (!size) return hipSuccess;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "size", size);
    hipr_reply r;
    hipError_t rc = hipr_call(tl_device, OP_MALLOC, &m, NULL, 0, NULL, 0, &r);
    uint64_t p = 0;
    if (rc == hipSuccess && hipr_cbor_uint(r.map, "ptr", &p)) rc = hipErrorUnknown;
    hipr_reply_free(&r);
    if (rc == hipSuccess) {
        *ptr = (void *)(uintptr_t)p;
        remember(p, size);
    }
    return ret(rc);
}

API hipError_t hipFree(void *ptr) {
    if (!ptr) return hipSuccess;
    forget((uint64_t)(uintptr_t)ptr);
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "ptr", (uint64_t)(uintptr_t)ptr);
    return ret(hipr_notify(tl_device, OP_FREE, &m, NULL, 0));
}

static void add_stream(hipr_map *m, hipStream_t stream) {
    if (stream) hipr_map_u64(m, "stream", (uint64_t)(uintptr_t)stream);
}

static hipError_t copy(void *dst, const void *src, size_t n, hipMemcpyKind kind, hipStream_t s) {
    if (!n) return hipSuccess;
    if (!dst || !src) return hipErrorInvalidValue;
    if (kind == hipMemcpyDefault) {
        int d = is_device(dst), h = is_device(src);
        kind = d ? (h ? hipMemcpyDeviceToDevice : hipMemcpyHostToDevice)
                 : (h ? hipMemcpyDeviceToHost : hipMemcpyHostToHost);
    }
    hipr_map m;
    switch (kind) {
    case hipMemcpyHostToHost:
        memmove(dst, src, n);
        return hipSuccess;
    case hipMemcpyHostToDevice:
        hipr_map_init(&m, s ? 3 : 2);
        hipr_map_u64(&m, "dst", (uint64_t)(uintptr_t)dst);
        hipr_map_u64(&m, "size", n);
        add_stream(&m, s);
        return hipr_notify(tl_device, OP_MEMCPY_HTOD, &m, src, n);
    case hipMemcpyDeviceToDevice:
        hipr_map_init(&m, s ? 4 : 3);
        hipr_map_u64(&m, "dst", (uint64_t)(uintptr_t)dst);
        hipr_map_u64(&m, "src", (uint64_t)(uintptr_t)src);
        hipr_map_u64(&m, "size", n);
        add_stream(&m, s);
        return hipr_notify(tl_device, OP_MEMCPY_DTOD, &m, NULL, 0);
    case hipMemcpyDeviceToHost: {
        hipr_map_init(&m, s ? 3 : 2);
        hipr_map_u64(&m, "src", (uint64_t)(uintptr_t)src);
        hipr_map_u64(&m, "size", n);
        add_stream(&m, s);
        hipr_reply r;
        hipError_t rc = hipr_call(tl_device, OP_MEMCPY_DTOH, &m, NULL, 0, dst, n, &r);
        if (rc == hipSuccess && r.sink_len != n) rc = hipErrorUnknown;
        hipr_reply_free(&r);
        return rc;
    }
    default:
        return hipErrorInvalidMemcpyDirection;
    }
}

API hipError_t hipMemcpy(void *dst, const void *src, size_t n, hipMemcpyKind kind) {
    return ret(copy(dst, src, n, kind, NULL));
}

API hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, hipMemcpyKind kind,
                              hipStream_t stream) {
    return ret(copy(dst, src, n, kind, stream));
}

API hipError_t hipMemcpyHtoD(void *dst, const void *src, size_t n) {
    return ret(copy(dst, src, n, hipMemcpyHostToDevice, NULL));
}

API hipError_t hipMemcpyDtoH(void *dst, const void *src, size_t n) {
    return ret(copy(dst, src, n, hipMemcpyDeviceToHost, NULL));
}

API hipError_t hipMemcpyDtoD(void *dst, const void *src, size_t n) {
    return ret(copy(dst, src, n, hipMemcpyDeviceToDevice, NULL));
}

static hipError_t fill(void *ptr, int value, size_t n, hipStream_t s) {
    if (!n) return hipSuccess;
    if (!ptr) return hipErrorInvalidValue;
    hipr_map m;
    hipr_map_init(&m, s ? 4 : 3);
    hipr_map_u64(&m, "ptr", (uint64_t)(uintptr_t)ptr);
    hipr_map_u64(&m, "value", (uint64_t)(value & 0xff));
    hipr_map_u64(&m, "size", n);
    add_stream(&m, s);
    return hipr_notify(tl_device, OP_MEMSET, &m, NULL, 0);
}

API hipError_t hipMemset(void *ptr, int value, size_t n) { return ret(fill(ptr, value, n, NULL)); }

API hipError_t hipMemsetAsync(void *ptr, int value, size_t n, hipStream_t stream) {
    return ret(fill(ptr, value, n, stream));
}

/* --- streams and events ---------------------------------------------------------------- */

static hipError_t create(uint16_t opcode, const char *key, uint64_t *handle) {
    hipr_reply r;
    hipError_t rc = hipr_call(tl_device, opcode, NULL, NULL, 0, NULL, 0, &r);
    if (rc == hipSuccess && (hipr_cbor_uint(r.map, key, handle) || *handle == 0))
        rc = hipErrorUnknown;
    hipr_reply_free(&r);
    return rc;
}

static hipError_t on_handle(uint16_t opcode, const char *key, uint64_t handle, int wait) {
    hipr_map m;
    hipr_map_init(&m, 1);
    if (handle) hipr_map_u64(&m, key, handle);
    if (!wait) return hipr_notify(tl_device, opcode, &m, NULL, 0);
    hipr_reply r;
    hipError_t rc = hipr_call(tl_device, opcode, &m, NULL, 0, NULL, 0, &r);
    if (rc == hipSuccess && (opcode == OP_STREAM_QUERY || opcode == OP_EVENT_QUERY)) {
        cbor_item_t *done = hipr_cbor_get(r.map, "done");
        if (!done || !cbor_is_bool(done)) rc = hipErrorUnknown;
        else if (!cbor_get_bool(done)) rc = hipErrorNotReady;
    }
    hipr_reply_free(&r);
    return rc;
}

/* --- synchronizes answered without the network -----------------------------------------
 * As the CUDA front's: when a device synchronize succeeded and nothing was asked of any
 * device since (hipr_idle), a synchronize or query would wait for nothing and report no
 * error. A stream or event handle must still be one the worker knows: the front keeps no
 * table of them, so a handle is answered here only once the worker has answered a
 * synchronize or query of it (it is live), until it is destroyed (a destroy is work, so
 * the next such call goes to the worker again, and the handle is forgotten here), and
 * only while every thread has kept to device 0 (sync_other_device). Forgotten in a forked
 * child, whose session is new. */
#define SYNC_KNOWN 64
static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint16_t kind; /* OP_STREAM_CREATE or OP_EVENT_CREATE; 0: free */
    uint64_t handle;
} sync_known[SYNC_KNOWN];
static unsigned sync_next;

static void sync_forget_all(void) { memset(sync_known, 0, sizeof sync_known); }

__attribute__((constructor(103))) static void sync_guard(void) {
    hipr_fork_guard(&sync_lock, sync_forget_all);
}

static uint16_t handle_kind(uint16_t opcode) {
    return opcode == OP_STREAM_SYNCHRONIZE || opcode == OP_STREAM_QUERY ||
                   opcode == OP_STREAM_DESTROY
               ? OP_STREAM_CREATE
               : OP_EVENT_CREATE;
}

static int sync_find_locked(uint16_t kind, uint64_t handle) {
    for (int i = 0; i < SYNC_KNOWN; i++)
        if (sync_known[i].kind == kind && sync_known[i].handle == handle) return i;
    return -1;
}

/* 1: `handle` (0: the null stream) of `opcode`'s kind may be answered here now. */
static int sync_local(uint16_t opcode, uint64_t handle) {
    if (!hipr_idle(tl_device)) return 0;
    if (!handle) return 1;
    if (__atomic_load_n(&sync_other_device, __ATOMIC_RELAXED)) return 0;
    pthread_mutex_lock(&sync_lock);
    int known = sync_find_locked(handle_kind(opcode), handle) >= 0;
    pthread_mutex_unlock(&sync_lock);
    return known;
}

/* The worker answered a synchronize or query of `handle` (live), or it was destroyed. */
static void sync_note(uint16_t opcode, uint64_t handle, int live) {
    if (!handle) return;
    uint16_t kind = handle_kind(opcode);
    pthread_mutex_lock(&sync_lock);
    int i = sync_find_locked(kind, handle);
    if (!live && i >= 0) sync_known[i].kind = 0;
    if (live && i < 0) {
        i = (int)(sync_next++ % SYNC_KNOWN);
        sync_known[i].kind = kind;
        sync_known[i].handle = handle;
    }
    pthread_mutex_unlock(&sync_lock);
}

/* A synchronize or query of a stream or event, or there without the network. */
static hipError_t sync_handle(uint16_t opcode, const char *key, uint64_t handle) {
    if (sync_local(opcode, handle)) return hipSuccess;
    hipError_t rc = on_handle(opcode, key, handle, 1);
    if (rc == hipSuccess || rc == hipErrorNotReady) sync_note(opcode, handle, 1);
    return rc;
}

API hipError_t hipDeviceSynchronize(void) {
    if (hipr_idle(tl_device)) return hipSuccess;
    hipr_reply r;
    hipError_t rc = hipr_call(tl_device, OP_DEVICE_SYNCHRONIZE, NULL, NULL, 0, NULL, 0, &r);
    hipr_reply_free(&r);
    return ret(rc);
}

API hipError_t hipStreamCreate(hipStream_t *stream) {
    if (!stream) return ret(hipErrorInvalidValue);
    uint64_t h = 0;
    hipError_t rc = create(OP_STREAM_CREATE, "stream", &h);
    *stream = rc == hipSuccess ? (hipStream_t)(uintptr_t)h : NULL;
    if (rc == hipSuccess) hipr_stream_note(*stream, tl_device);
    return ret(rc);
}

/* Flags and priority are not carried by the protocol: the worker's streams are plain. */
API hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags) {
    (void)flags;
    return hipStreamCreate(stream);
}

API hipError_t hipStreamCreateWithPriority(hipStream_t *stream, unsigned int flags, int priority) {
    (void)flags;
    (void)priority;
    return hipStreamCreate(stream);
}

API hipError_t hipDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = 0;
    return hipSuccess;
}

API hipError_t hipStreamDestroy(hipStream_t stream) {
    if (!stream) return ret(hipErrorInvalidHandle);
    hipr_capture_forget(stream);
    hipr_stream_forget(stream);
    sync_note(OP_STREAM_DESTROY, (uint64_t)(uintptr_t)stream, 0);
    return ret(on_handle(OP_STREAM_DESTROY, "stream", (uint64_t)(uintptr_t)stream, 0));
}

API hipError_t hipStreamSynchronize(hipStream_t stream) {
    return ret(sync_handle(OP_STREAM_SYNCHRONIZE, "stream", (uint64_t)(uintptr_t)stream));
}

API hipError_t hipStreamQuery(hipStream_t stream) {
    return ret(sync_handle(OP_STREAM_QUERY, "stream", (uint64_t)(uintptr_t)stream));
}

API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
    (void)flags;
    if (!event) return ret(hipErrorInvalidHandle);
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "event", (uint64_t)(uintptr_t)event);
    add_stream(&m, stream);
    return ret(hipr_notify(tl_device, OP_STREAM_WAIT_EVENT, &m, NULL, 0));
}

API hipError_t hipEventCreate(hipEvent_t *event) {
    if (!event) return ret(hipErrorInvalidValue);
    uint64_t h = 0;
    hipError_t rc = create(OP_EVENT_CREATE, "event", &h);
    *event = rc == hipSuccess ? (hipEvent_t)(uintptr_t)h : NULL;
    return ret(rc);
}

/* Flags are not carried: every event of the worker records timing. */
API hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned int flags) {
    (void)flags;
    return hipEventCreate(event);
}

API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    if (!event) return ret(hipErrorInvalidHandle);
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "event", (uint64_t)(uintptr_t)event);
    add_stream(&m, stream);
    return ret(hipr_notify(tl_device, OP_EVENT_RECORD, &m, NULL, 0));
}

API hipError_t hipEventSynchronize(hipEvent_t event) {
    if (!event) return ret(hipErrorInvalidHandle);
    return ret(sync_handle(OP_EVENT_SYNCHRONIZE, "event", (uint64_t)(uintptr_t)event));
}

API hipError_t hipEventQuery(hipEvent_t event) {
    if (!event) return ret(hipErrorInvalidHandle);
    return ret(sync_handle(OP_EVENT_QUERY, "event", (uint64_t)(uintptr_t)event));
}

API hipError_t hipEventDestroy(hipEvent_t event) {
    if (!event) return ret(hipErrorInvalidHandle);
    sync_note(OP_EVENT_SYNCHRONIZE, (uint64_t)(uintptr_t)event, 0);
    return ret(on_handle(OP_EVENT_DESTROY, "event", (uint64_t)(uintptr_t)event, 0));
}

API hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop) {
    if (!ms) return ret(hipErrorInvalidValue);
    if (!start || !stop) return ret(hipErrorInvalidHandle);
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "start", (uint64_t)(uintptr_t)start);
    hipr_map_u64(&m, "end", (uint64_t)(uintptr_t)stop);
    hipr_reply r;
    hipError_t rc = hipr_call(tl_device, OP_EVENT_ELAPSED_TIME, &m, NULL, 0, NULL, 0, &r);
    double v = 0;
    if (rc == hipSuccess && hipr_cbor_float(r.map, "ms", &v)) rc = hipErrorUnknown;
    hipr_reply_free(&r);
    if (rc == hipSuccess) *ms = (float)v;
    return ret(rc);
}

static void forget_all(void) { n_allocs = 0; }

__attribute__((constructor(102))) static void hip_front_init(void) {
    hipr_fork_guard(&info_lock, NULL);
    /* The parent's allocations are not the child's session's. */
    hipr_fork_guard(&alloc_lock, forget_all);
}

/* For modules.c, which shares the thread's device and last error. */
int hipr_front_device(void) { return tl_device; }
hipError_t hipr_front_ret(hipError_t e) { return ret(e); }
