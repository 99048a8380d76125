/* Modules, functions and launches: code objects loaded on the worker, kernel parameter
 * layouts asked once per function (kernelParams), `extra` buffers passed through. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "file_bytes.h"
#include "launch_extra.h"
#include "module_send.h"
#include "modules.h"
#include "opcodes.h"

#define API HIPR_EXPORT

struct hipr_function {
    uint64_t id;
    char *name; /* hipKernelNameRef */
    hipr_param_layout params; /* asked of the worker at the first launch */
    struct hipr_function *next;
};

struct hipr_module {
    uint64_t id; /* 0 for the built-in module until its first function names it */
    int builtin;
    struct hipr_function *functions;
};

static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor(102))) static void modules_init(void) {
    hipr_fork_guard(&module_lock, NULL);
}

/* --- code object sizes ------------------------------------------------------------------ */

static uint64_t rd(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static size_t elf_size(const uint8_t *p, size_t limit) {
    if (limit < 64 || p[4] != 2 || p[5] != 1) return 0; /* 64-bit little-endian only */
    uint64_t phoff = rd(p + 32, 8), shoff = rd(p + 40, 8);
    uint64_t phentsize = rd(p + 54, 2), phnum = rd(p + 56, 2);
    uint64_t shentsize = rd(p + 58, 2), shnum = rd(p + 60, 2);
    uint64_t end = 64;
    if (shoff && shoff + shnum * shentsize > end) end = shoff + shnum * shentsize;
    if (phoff && phoff + phnum * phentsize > end) end = phoff + phnum * phentsize;
    /* Section contents after the section header table (rare) extend the file. */
    if (shoff && shentsize >= 64 && end <= limit) {
        for (uint64_t i = 0; i < shnum; i++) {
            const uint8_t *sh = p + shoff + i * shentsize;
            uint64_t type = rd(sh + 4, 4), off = rd(sh + 24, 8), size = rd(sh + 32, 8);
            if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
        }
    }
    return end <= limit ? (size_t)end : 0;
}

static size_t bundle_size(const uint8_t *p, size_t limit) {
    /* "__CLANG_OFFLOAD_BUNDLE__", u64 entries, then per entry u64 offset, u64 size,
     * u64 triple length, the triple. */
    if (limit < 32) return 0;
    uint64_t n = rd(p + 24, 8), at = 32, end = 32;
    for (uint64_t i = 0; i < n && i < 4096; i++) {
        if (at + 24 > limit) return 0;
        uint64_t off = rd(p + at, 8), size = rd(p + at + 8, 8), tl = rd(p + at + 16, 8);
        at += 24 + tl;
        if (off + size > end) end = off + size;
        if (at > end) end = at;
    }
    return end <= limit ? (size_t)end : 0;
}

size_t hipr_image_size(const void *image, size_t limit) {
    const uint8_t *p = image;
    if (!p || limit < 4) return 0;
    if (limit >= sizeof HIPR_BUILTIN_IMAGE &&
        memcmp(p, HIPR_BUILTIN_IMAGE, sizeof HIPR_BUILTIN_IMAGE) == 0)
        return sizeof HIPR_BUILTIN_IMAGE;
    if (memcmp(p, "\x7f" "ELF", 4) == 0) return elf_size(p, limit);
    if (limit >= 24 && memcmp(p, "__CLANG_OFFLOAD_BUNDLE__", 24) == 0) return bundle_size(p, limit);
    if (rd(p, 4) == 0xBA55ED50u && limit >= 16) { /* CUDA fat binary: header + fatSize */
        uint64_t size = rd(p + 6, 2) + rd(p + 8, 8);
        return size <= limit ? (size_t)size : 0;
    }
    /* PTX: text up to its NUL. */
    const uint8_t *nul = memchr(p, 0, limit > (64u << 20) ? (64u << 20) : limit);
    if (nul && (memcmp(p, "//", 2) == 0 || memcmp(p, ".version", 8) == 0))
        return (size_t)(nul - p) + 1;
    return 0;
}

/* --- modules ------------------------------------------------------------------------- */

static hipError_t load_image(hipModule_t *module, const void *image, size_t size) {
    struct hipr_module *m = calloc(1, sizeof *m);
    if (!m) return hipErrorOutOfMemory;
    if (size == sizeof HIPR_BUILTIN_IMAGE && memcmp(image, HIPR_BUILTIN_IMAGE, size) == 0) {
        m->builtin = 1;
        *module = m;
        return hipSuccess;
    }
    hipr_reply r;
    hipError_t rc = hipr_module_load(hipr_front_device(), image, size, &m->id, &r);
    hipr_reply_free(&r);
    if (rc) {
        free(m);
        return rc;
    }
    *module = m;
    return hipSuccess;
}

API hipError_t hipModuleLoadData(hipModule_t *module, const void *image) {
    if (!module || !image) return hipr_front_ret(hipErrorInvalidValue);
    size_t size = hipr_image_size(image, SIZE_MAX);
    if (!size) return hipr_front_ret(hipErrorInvalidImage);
    return hipr_front_ret(load_image(module, image, size));
}

API hipError_t hipModuleLoadDataEx(hipModule_t *module, const void *image, unsigned int n,
                                   int *options, void **values) {
    (void)n;
    (void)options;
    (void)values;
    return hipModuleLoadData(module, image);
}

API hipError_t hipModuleLoad(hipModule_t *module, const char *fname) {
    if (!module || !fname) return hipr_front_ret(hipErrorInvalidValue);
    uint8_t *buf = NULL;
    size_t len = 0;
    hipError_t rc;
    switch (hipr_read_file(fname, &buf, &len)) {
    case HIPR_FILE_OK:
        rc = len ? load_image(module, buf, len) : hipErrorInvalidImage;
        free(buf);
        break;
    case HIPR_FILE_NOT_FOUND:
        rc = hipErrorFileNotFound;
        break;
    case HIPR_FILE_NO_MEMORY:
        rc = hipErrorOutOfMemory;
        break;
    default:
        rc = hipErrorInvalidImage;
    }
    return hipr_front_ret(rc);
}

API hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *name) {
    if (!function || !module || !name) return hipr_front_ret(hipErrorInvalidValue);
    struct hipr_function *f = calloc(1, sizeof *f);
    if (!f) return hipr_front_ret(hipErrorOutOfMemory);
    hipr_map m;
    hipr_map_init(&m, 2);
    if (!module->builtin) hipr_map_u64(&m, "module", module->id);
    hipr_map_str(&m, "name", name, strlen(name));
    hipr_reply r;
    hipError_t rc = hipr_call(hipr_front_device(),
                              module->builtin ? OP_MODULE_BUILTIN : OP_MODULE_GET_FUNCTION, &m,
                              NULL, 0, NULL, 0, &r);
    if (rc == hipSuccess && (hipr_cbor_uint(r.map, "function", &f->id) || !f->id))
        rc = hipErrorUnknown;
    hipr_reply_free(&r);
    if (rc == hipSuccess && !(f->name = strdup(name))) rc = hipErrorOutOfMemory;
    if (rc) {
        free(f);
        return hipr_front_ret(rc);
    }
    pthread_mutex_lock(&module_lock);
    f->next = module->functions;
    module->functions = f;
    pthread_mutex_unlock(&module_lock);
    *function = f;
    return hipSuccess;
}

hipError_t hipr_module_wire(hipModule_t module, uint64_t *id, int *builtin) {
    if (!module) return hipErrorInvalidHandle;
    *id = module->id;
    *builtin = module->builtin;
    return hipSuccess;
}

API hipError_t hipModuleUnload(hipModule_t module) {
    if (!module) return hipr_front_ret(hipErrorInvalidHandle);
    hipError_t rc = hipSuccess;
    /* The built-in module is shared by the worker's sessions and never unloaded. */
    if (!module->builtin) {
        hipr_map m;
        hipr_map_init(&m, 1);
        hipr_map_u64(&m, "module", module->id);
        hipr_reply r;
        rc = hipr_call(hipr_front_device(), OP_MODULE_UNLOAD, &m, NULL, 0, NULL, 0, &r);
        hipr_reply_free(&r);
    }
    if (rc == hipSuccess) hipr_module_forget(module);
    return hipr_front_ret(rc);
}

/* --- launches ------------------------------------------------------------------------- */

static hipError_t launch(struct hipr_function *f, const unsigned grid[3], const unsigned block[3],
                         unsigned shared, hipStream_t stream, void **params, void **extra) {
    pthread_mutex_lock(&module_lock);
    if (!f->params.known) hipr_param_layout_fetch(hipr_front_device(), f->id, &f->params);
    const hipr_param_layout *layout = &f->params;
    pthread_mutex_unlock(&module_lock);
    uint8_t buf[HIPR_MAX_ARGS_BYTES];
    const uint8_t *args = buf;
    size_t args_len = 0;
    if (extra) {
        const void *packed = NULL;
        if (hipr_launch_extra(extra, HIP_LAUNCH_PARAM_END, HIPR_MAX_ARGS_BYTES, &packed, &args_len)) return hipErrorInvalidValue;
        args = packed;
    } else if (params) {
        if (layout->known != 1) {
            static int warned;
            hipr_warn_once("hipModuleLaunchKernel with kernelParams needs the kernel's "
                           "parameter layout, which this worker cannot report; pass `extra`",
                           &warned);
            return hipErrorNotSupported;
        }
        if (hipr_param_layout_pack(layout, params, buf, &args_len)) return hipErrorInvalidValue;
    }
    /* Pointer arguments, where the layout tells them, are checked by the worker against
     * the session's allocations. */
    uint64_t ptrs[HIPR_MAX_PARAMS];
    size_t n_ptrs = 0;
    for (size_t i = 0; layout->known == 1 && i < layout->n_params; i++)
        if (layout->is_pointer[i] && layout->offsets[i] + 8 <= args_len)
            ptrs[n_ptrs++] = layout->offsets[i];
    hipr_launch_config c;
    memset(&c, 0, sizeof c);
    c.function = f->id;
    c.shared_mem = shared;
    c.stream = (uint64_t)(uintptr_t)stream;
    for (int i = 0; i < 3; i++) {
        c.grid[i] = grid[i];
        c.block[i] = block[i];
    }
    c.n_ptrs = n_ptrs;
    memcpy(c.ptrs, ptrs, n_ptrs * sizeof *ptrs);
    return hipr_launch(hipr_front_device(), &c, args, args_len);
}

hipError_t hipr_module_launch(hipFunction_t f, const unsigned grid[3], const unsigned block[3],
                              unsigned shared, hipStream_t stream, void **params, void **extra) {
    if (!f) return hipErrorInvalidHandle;
    return launch(f, grid, block, shared, stream, params, extra);
}

void hipr_module_forget(hipModule_t module) {
    if (!module) return;
    for (struct hipr_function *f = module->functions, *next; f; f = next) {
        next = f->next;
        free(f->name);
        free(f);
    }
    free(module);
}

API const char *hipKernelNameRef(const hipFunction_t f) { return f ? f->name : NULL; }

API hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gx, unsigned gy, unsigned gz,
                                     unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                     hipStream_t stream, void **kernelParams, void **extra) {
    if (!f) return hipr_front_ret(hipErrorInvalidHandle);
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return hipr_front_ret(launch(f, grid, block, shared, stream, kernelParams, extra));
}
