/* Device variables: hipModuleGetGlobal (MODULE_GET_GLOBAL: the worker gives the
 * variable's address and size and lets this session's copies name it) and hipcc's symbol
 * calls, which name a variable by its host shadow (registered by __hipRegisterVar,
 * hipcc.c) and copy to and from its device address. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "client.h"
#include "hip_types.h"
#include "modules.h"
#include "opcodes.h"

#define API HIPR_EXPORT

hipError_t hipMemcpy(void *dst, const void *src, size_t n, hipMemcpyKind kind);
hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, hipMemcpyKind kind,
                          hipStream_t stream);

/* The built-in module's id in this session (MODULE_BUILTIN names it with any of its
 * kernels). */
static hipError_t builtin_id(uint64_t *id) {
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_str(&m, "name", "fill_f32", strlen("fill_f32"));
    hipr_reply r;
    hipError_t rc = hipr_call(hipr_front_device(), OP_MODULE_BUILTIN, &m, NULL, 0, NULL, 0, &r);
    if (rc == hipSuccess && (hipr_cbor_uint(r.map, "module", id) || !*id)) rc = hipErrorUnknown;
    hipr_reply_free(&r);
    return rc;
}

static hipError_t module_global(void **ptr, size_t *bytes, hipModule_t module, const char *name) {
    uint64_t id = 0;
    int builtin = 0;
    hipError_t rc = hipr_module_wire(module, &id, &builtin);
    if (rc == hipSuccess && builtin) rc = builtin_id(&id);
    if (rc) return rc;
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_u64(&m, "module", id);
    hipr_map_str(&m, "name", name, strlen(name));
    hipr_reply r;
    uint64_t p = 0, size = 0;
    rc = hipr_call(hipr_front_device(), OP_MODULE_GET_GLOBAL, &m, NULL, 0, NULL, 0, &r);
    if (rc == hipSuccess &&
        (hipr_cbor_uint(r.map, "ptr", &p) || hipr_cbor_uint(r.map, "size", &size)))
        rc = hipErrorUnknown;
    hipr_reply_free(&r);
    if (rc) return rc;
    if (ptr) *ptr = (void *)(uintptr_t)p;
    if (bytes) *bytes = (size_t)size;
    return hipSuccess;
}

/* Both outputs are optional, as in HIP. */
API hipError_t hipModuleGetGlobal(void **ptr, size_t *bytes, hipModule_t module, const char *name) {
    if (!module) return hipr_front_ret(hipErrorInvalidHandle);
    if (!name || strlen(name) > 1024) return hipr_front_ret(hipErrorInvalidValue);
    return hipr_front_ret(module_global(ptr, bytes, module, name));
}

API hipError_t hipGetSymbolAddress(void **dev_ptr, const void *symbol) {
    if (!dev_ptr) return hipr_front_ret(hipErrorInvalidValue);
    size_t size;
    return hipr_front_ret(hipr_symbol_lookup(symbol, dev_ptr, &size));
}

API hipError_t hipGetSymbolSize(size_t *size, const void *symbol) {
    if (!size) return hipr_front_ret(hipErrorInvalidValue);
    void *ptr;
    return hipr_front_ret(hipr_symbol_lookup(symbol, &ptr, size));
}

/* The variable's bytes [offset, offset + n), or an error. */
static hipError_t symbol_range(const void *symbol, size_t n, size_t offset, char **at) {
    void *ptr;
    size_t size;
    hipError_t rc = hipr_symbol_lookup(symbol, &ptr, &size);
    if (rc) return rc;
    if (offset > size || n > size - offset) return hipErrorInvalidValue;
    *at = (char *)ptr + offset;
    return hipSuccess;
}

/* A symbol copy's direction: to the device from the host or another device address;
 * hipMemcpyDefault tells them apart by this session's allocations. */
static hipError_t to_kind(hipMemcpyKind kind, const void *other, int to_symbol,
                          hipMemcpyKind *out) {
    uint64_t base, size;
    if (kind == hipMemcpyDefault)
        kind = hipr_front_alloc_of(other, &base, &size)
                   ? hipMemcpyDeviceToDevice
                   : (to_symbol ? hipMemcpyHostToDevice : hipMemcpyDeviceToHost);
    int host = to_symbol ? kind == hipMemcpyHostToDevice : kind == hipMemcpyDeviceToHost;
    if (!host && kind != hipMemcpyDeviceToDevice) return hipErrorInvalidMemcpyDirection;
    *out = kind;
    return hipSuccess;
}

static hipError_t to_symbol(const void *symbol, const void *src, size_t n, size_t offset,
                            hipMemcpyKind kind, int async, hipStream_t stream) {
    char *at;
    hipError_t rc = symbol_range(symbol, n, offset, &at);
    if (rc == hipSuccess && !src && n) rc = hipErrorInvalidValue;
    if (rc == hipSuccess) rc = to_kind(kind, src, 1, &kind);
    if (rc) return hipr_front_ret(rc);
    return async ? hipMemcpyAsync(at, src, n, kind, stream) : hipMemcpy(at, src, n, kind);
}

static hipError_t from_symbol(void *dst, const void *symbol, size_t n, size_t offset,
                              hipMemcpyKind kind, int async, hipStream_t stream) {
    char *at;
    hipError_t rc = symbol_range(symbol, n, offset, &at);
    if (rc == hipSuccess && !dst && n) rc = hipErrorInvalidValue;
    if (rc == hipSuccess) rc = to_kind(kind, dst, 0, &kind);
    if (rc) return hipr_front_ret(rc);
    return async ? hipMemcpyAsync(dst, at, n, kind, stream) : hipMemcpy(dst, at, n, kind);
}

API hipError_t hipMemcpyToSymbol(const void *symbol, const void *src, size_t n, size_t offset,
                                 hipMemcpyKind kind) {
    return to_symbol(symbol, src, n, offset, kind, 0, NULL);
}

API hipError_t hipMemcpyToSymbolAsync(const void *symbol, const void *src, size_t n,
                                      size_t offset, hipMemcpyKind kind, hipStream_t stream) {
    return to_symbol(symbol, src, n, offset, kind, 1, stream);
}

API hipError_t hipMemcpyFromSymbol(void *dst, const void *symbol, size_t n, size_t offset,
                                   hipMemcpyKind kind) {
    return from_symbol(dst, symbol, n, offset, kind, 0, NULL);
}

API hipError_t hipMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t n, size_t offset,
                                        hipMemcpyKind kind, hipStream_t stream) {
    return from_symbol(dst, symbol, n, offset, kind, 1, stream);
}
