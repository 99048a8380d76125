/* CUDA modules, functions and launches: cubin / fatbin / PTX bytes loaded on the worker
 * (MODULE_LOAD), kernel parameter layouts asked once per function (FUNCTION_PARAMS) for
 * kernelParams and cuFuncGetParamInfo, launches fire-and-forget through the core, launch
 * attributes honoured or refused. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_front.h"
#include "file_bytes.h"
#include "graph_wire.h"
#include "launch_extra.h"
#include "module_send.h"
#include "opcodes.h"
#include "ptr_set.h"

/* FUNCTION_ATTRIBUTE (hipr/protocol/opcodes.py); here rather than in opcodes.h, which the
 * HIP proxy owns. */
#define OP_FUNCTION_ATTRIBUTE 0x0509
#define OP_FUNCTION_OCCUPANCY 0x050A
#define OP_MODULE_GET_GLOBAL 0x050B

/* The worker's built-in kernels (hipr.kernels.builtins), as for the HIP front. */
#define BUILTIN_IMAGE "hipr:builtin"

/* What a loaded function's attributes and occupancy read as: they cannot change while
 * nothing is set on the function (cuFuncSetAttribute, which empties this cache), so the
 * worker's answers are kept and a library asking again (cuBLAS asks
 * cuOccupancyMaxActiveClusters and function attributes around its launches) costs no
 * round trip. Only successful answers are kept; under hipr_cu_lock. */
#define ATTR_MAX 64
#define OCC_SLOTS 16
struct occ_key {
    uint64_t query; /* which cuOccupancy* question (enum occ_query) */
    uint64_t grid[3], block[3], cluster[3];
    int64_t block_size, smem, num_blocks, limit;
    uint64_t flags, have_cluster;
};
struct fn_cache {
    uint64_t attr_known; /* bit a: attr[a] holds attribute a's value */
    int attr[ATTR_MAX + 1];
    struct occ_key occ[OCC_SLOTS];
    int64_t occ_value[OCC_SLOTS], occ_second[OCC_SLOTS];
    unsigned occ_used, occ_next; /* filled slots; the next to replace (round robin) */
};
enum occ_query { OCC_ACTIVE_BLOCKS = 1, OCC_DYNAMIC_SMEM, OCC_BLOCK_SIZE, OCC_CLUSTERS };

struct hipr_cu_function {
    uint64_t id;
    int device;
    hipr_param_layout params; /* asked of the worker once, at the first need */
    struct hipr_cu_module *module;
    struct hipr_cu_function *next;
    struct fn_cache cache;
    char name[]; /* C++ kernels' mangled names run to thousands of characters */
};

struct hipr_cu_global {
    uint64_t ptr, size;
    char name[256];
};

struct hipr_cu_module {
    uint64_t id;
    int builtin;
    int device;
    struct hipr_cu_global *globals; /* cuModuleGetGlobal's answers, kept for copies */
    size_t n_globals;
    struct hipr_cu_function *functions;
    struct hipr_cu_module *next;
};

static struct hipr_cu_module *modules;

/* --- image sizes ------------------------------------------------------------------------ */

static uint64_t rd(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static size_t elf_size(const uint8_t *p) {
    if (p[4] != 2 || p[5] != 1) return 0; /* 64-bit little-endian only */
    uint64_t phoff = rd(p + 32, 8), shoff = rd(p + 40, 8);
    uint64_t phentsize = rd(p + 54, 2), phnum = rd(p + 56, 2);
    uint64_t shentsize = rd(p + 58, 2), shnum = rd(p + 60, 2);
    uint64_t end = 64;
    if (shoff && shoff + shnum * shentsize > end) end = shoff + shnum * shentsize;
    if (phoff && phoff + phnum * phentsize > end) end = phoff + phnum * phentsize;
    if (shoff && shentsize >= 64) {
        for (uint64_t i = 0; i < shnum; i++) {
            const uint8_t *sh = p + shoff + i * shentsize;
            uint64_t type = rd(sh + 4, 4), off = rd(sh + 24, 8), size = rd(sh + 32, 8);
            if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
        }
    }
    return end < ((uint64_t)1 << 31) ? (size_t)end : 0;
}

/* The bytes of an image given without its size: an ELF cubin, a fat binary (its header
 * gives the size), the fat binary wrapper nvcc emits (followed to its fat binary), PTX
 * text up to its NUL, or the built-in marker. 0 when it is none of these. */
size_t hipr_cu_image_size(const void **image) {
    const uint8_t *p = *image;
    if (memcmp(p, BUILTIN_IMAGE, sizeof BUILTIN_IMAGE) == 0) return sizeof BUILTIN_IMAGE;
    if (rd(p, 4) == 0x466243b1u) { /* __fatBinC_Wrapper_t: magic, version, data */
        const void *data;
        memcpy(&data, p + 8, sizeof data);
        if (!data) return 0;
        *image = data;
        p = data;
    }
    if (rd(p, 4) == 0xBA55ED50u) return (size_t)(rd(p + 6, 2) + rd(p + 8, 8));
    if (memcmp(p, "\x7f" "ELF", 4) == 0) return elf_size(p);
    size_t lead = strspn((const char *)p, " \t\r\n");
    if (p[lead] != '/' && p[lead] != '.') return 0;
    size_t n = strnlen((const char *)p, 64u << 20);
    if (n < (64u << 20)) return n + 1; /* PTX, NUL included */
    return 0;
}

/* --- modules ----------------------------------------------------------------------------- */

CUresult hipr_cu_load(CUmodule *out, const void *image, size_t size) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    struct hipr_cu_module *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    m->device = dev;
    if (size == sizeof BUILTIN_IMAGE && memcmp(image, BUILTIN_IMAGE, size) == 0) {
        m->builtin = 1;
    } else {
        hipr_reply r;
        int hip = hipr_module_load(dev, image, size, &m->id, &r);
        if (hip && r.message[0]) fprintf(stderr, "hipr proxy: cuModuleLoad: %s\n", r.message);
        hipr_reply_free(&r);
        if (hip) {
            free(m);
            return hipr_cu_error(hip);
        }
    }
    pthread_mutex_lock(&hipr_cu_lock);
    m->next = modules;
    modules = m;
    pthread_mutex_unlock(&hipr_cu_lock);
    *out = m;
    return CUDA_SUCCESS;
}

API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    size_t size = hipr_cu_image_size(&image);
    if (!size) return CUDA_ERROR_INVALID_IMAGE;
    return hipr_cu_load(module, image, size);
}

API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fat) {
    return cuModuleLoadData(module, fat);
}

API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                CUjit_option *options, void **values) {
    if (n && (!options || !values)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuModuleLoadData(module, image);
    /* The JIT runs on the worker: the proxy has no log to give back, so the log sizes
     * say "empty" and the buffers hold an empty string. Other options are the
     * compiler's tuning, which the worker's driver decides. */
    for (unsigned i = 0; rc == CUDA_SUCCESS && i < n; i++) {
        if (options[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
            options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) {
            values[i] = NULL;
        } else if (options[i] == CU_JIT_INFO_LOG_BUFFER || options[i] == CU_JIT_ERROR_LOG_BUFFER) {
            /* The buffer's size is the matching *_SIZE_BYTES option; a non-empty buffer
             * holds at least its NUL. */
            for (unsigned j = 0; j < n; j++)
                if ((unsigned)options[j] == (unsigned)options[i] + 1 && values[i])
                    ((char *)values[i])[0] = '\0';
        }
    }
    return rc;
}

/* The whole file at `path` in a buffer of the caller's to free, NUL-terminated (PTX text
 * needs its NUL; *len does not count it): FILE_NOT_FOUND, OUT_OF_MEMORY, or INVALID_IMAGE
 * for an empty or unreadable file. */
CUresult hipr_cu_read_file(const char *path, uint8_t **out, size_t *len) {
    switch (hipr_read_file(path, out, len)) {
    case HIPR_FILE_OK:
        if (*len) return CUDA_SUCCESS;
        free(*out);
        return CUDA_ERROR_INVALID_IMAGE;
    case HIPR_FILE_NOT_FOUND:
        return CUDA_ERROR_FILE_NOT_FOUND;
    case HIPR_FILE_NO_MEMORY:
        return CUDA_ERROR_OUT_OF_MEMORY;
    default:
        return CUDA_ERROR_INVALID_IMAGE;
    }
}

API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    if (!module || !fname) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t *buf = NULL;
    size_t len = 0;
    CUresult rc = hipr_cu_read_file(fname, &buf, &len);
    if (rc == CUDA_SUCCESS) {
        int text = memcmp(buf, "\x7f" "ELF", 4) != 0 && rd(buf, 4) != 0xBA55ED50u;
        rc = hipr_cu_load(module, buf, text ? len + 1 : len);
    }
    free(buf);
    return rc;
}

/* Every function of the modules above: each launch checks its function here. */
static hipr_ptr_set live_functions;

static int unlink_module_locked(CUmodule m) {
    for (struct hipr_cu_module **p = &modules; *p; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            for (struct hipr_cu_function *f = m->functions; f; f = f->next)
                hipr_ptr_set_remove(&live_functions, f);
            return 1;
        }
    return 0;
}

static void free_module(CUmodule m) {
    for (struct hipr_cu_function *f = m->functions, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    free(m->globals);
    free(m);
}

API CUresult cuModuleUnload(CUmodule m) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&hipr_cu_lock);
    int found = m && unlink_module_locked(m);
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!found) return CUDA_ERROR_INVALID_HANDLE;
    int hip = 0;
    if (!m->builtin) { /* the built-in module is shared by the worker's sessions */
        hipr_map a;
        hipr_map_init(&a, 1);
        hipr_map_u64(&a, "module", m->id);
        hipr_reply r;
        hip = hipr_call(m->device, OP_MODULE_UNLOAD, &a, NULL, 0, NULL, 0, &r);
        hipr_reply_free(&r);
    }
    free_module(m);
    return hipr_cu_error(hip);
}

static int module_live(CUmodule m) {
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_module *p = modules;
    while (p && p != m) p = p->next;
    pthread_mutex_unlock(&hipr_cu_lock);
    return p != NULL;
}

API CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name) {
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!m || !module_live(m)) return CUDA_ERROR_INVALID_HANDLE;
    size_t len = strlen(name);
    if (len > HIPR_CU_MAX_NAME) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&hipr_cu_lock);
    struct hipr_cu_function *f = m->functions;
    while (f && strcmp(f->name, name) != 0) f = f->next;
    pthread_mutex_unlock(&hipr_cu_lock);
    if (f) {
        *out = f;
        return CUDA_SUCCESS;
    }
    f = calloc(1, sizeof *f + len + 1);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    hipr_map a;
    hipr_map_init(&a, 2);
    if (!m->builtin) hipr_map_u64(&a, "module", m->id);
    hipr_map_str(&a, "name", name, len);
    hipr_reply r;
    int hip = hipr_call(m->device, m->builtin ? OP_MODULE_BUILTIN : OP_MODULE_GET_FUNCTION, &a,
                        NULL, 0, NULL, 0, &r);
    if (hip == 0 && (hipr_cbor_uint(r.map, "function", &f->id) || !f->id)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) {
        free(f);
        /* CUDA: a module without the name is CUDA_ERROR_NOT_FOUND */
        return hip == 500 ? CUDA_ERROR_NOT_FOUND : hipr_cu_error(hip);
    }
    memcpy(f->name, name, len + 1);
    f->module = m;
    f->device = m->device;
    pthread_mutex_lock(&hipr_cu_lock);
    int held = hipr_ptr_set_add(&live_functions, f) == 0;
    if (held) {
        f->next = m->functions;
        m->functions = f;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!held) {
        free(f); /* the worker's function id needs no release: it goes with its module */
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = f;
    return CUDA_SUCCESS;
}

/* With hipr_cu_lock held: the global `name` already asked of module m, or NULL. */
static const struct hipr_cu_global *known_global_locked(CUmodule m, const char *name) {
    for (size_t i = 0; i < m->n_globals; i++)
        if (strcmp(m->globals[i].name, name) == 0) return &m->globals[i];
    return NULL;
}

/* cuBLAS reads a global of its kernels' library while it creates a handle. The worker
 * gives its address and size (MODULE_GET_GLOBAL) and lets the session's copies name it. */
API CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name) {
    if (!name || (!dptr && !bytes)) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!m || !module_live(m)) return CUDA_ERROR_INVALID_HANDLE;
    size_t len = strlen(name);
    if (len >= sizeof ((struct hipr_cu_global *)0)->name) return CUDA_ERROR_INVALID_VALUE;
    if (m->builtin) return CUDA_ERROR_NOT_FOUND; /* hipr's built-in kernels have no variables */
    pthread_mutex_lock(&hipr_cu_lock);
    const struct hipr_cu_global *g = known_global_locked(m, name);
    uint64_t ptr = g ? g->ptr : 0, size = g ? g->size : 0;
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!g) {
        hipr_map a;
        hipr_map_init(&a, 2);
        hipr_map_u64(&a, "module", m->id);
        hipr_map_str(&a, "name", name, len);
        hipr_reply r;
        int hip = hipr_call(m->device, OP_MODULE_GET_GLOBAL, &a, NULL, 0, NULL, 0, &r);
        if (hip == 0 &&
            (hipr_cbor_uint(r.map, "ptr", &ptr) || hipr_cbor_uint(r.map, "size", &size)))
            hip = HIPR_UNKNOWN;
        hipr_reply_free(&r);
        if (hip) return hip == 500 ? CUDA_ERROR_NOT_FOUND : hipr_cu_error(hip);
        pthread_mutex_lock(&hipr_cu_lock);
        if (!known_global_locked(m, name)) {
            struct hipr_cu_global *more =
                realloc(m->globals, (m->n_globals + 1) * sizeof *m->globals);
            if (more) {
                m->globals = more;
                more[m->n_globals].ptr = ptr;
                more[m->n_globals].size = size;
                memcpy(more[m->n_globals].name, name, len + 1);
                m->n_globals++;
            }
        }
        pthread_mutex_unlock(&hipr_cu_lock);
    }
    if (dptr) *dptr = ptr;
    if (bytes) *bytes = (size_t)size;
    return CUDA_SUCCESS;
}

int hipr_cu_is_global(uint64_t p) {
    int found = 0;
    pthread_mutex_lock(&hipr_cu_lock);
    for (struct hipr_cu_module *m = modules; m && !found; m = m->next)
        for (size_t i = 0; i < m->n_globals && !found; i++)
            found = p >= m->globals[i].ptr && p - m->globals[i].ptr < m->globals[i].size;
    pthread_mutex_unlock(&hipr_cu_lock);
    return found;
}

void hipr_cu_forget_modules(void) {
    for (struct hipr_cu_module *m = modules, *next; m; m = next) {
        next = m->next;
        free_module(m);
    }
    modules = NULL;
    hipr_ptr_set_free(&live_functions);
}

/* --- functions ----------------------------------------------------------------------- */

/* The function's parameter layout, asked once (with hipr_cu_lock not held: the ask is a
 * round trip); 1 known, -1 the worker cannot tell. */
static int layout_of(struct hipr_cu_function *f) {
    pthread_mutex_lock(&hipr_cu_lock);
    int known = f->params.known;
    pthread_mutex_unlock(&hipr_cu_lock);
    if (known) return known;
    hipr_param_layout fetched;
    hipr_param_layout_fetch(f->device, f->id, &fetched);
    pthread_mutex_lock(&hipr_cu_lock);
    if (!f->params.known) f->params = fetched;
    known = f->params.known;
    pthread_mutex_unlock(&hipr_cu_lock);
    return known;
}

static int function_live(CUfunction f) {
    pthread_mutex_lock(&hipr_cu_lock);
    int found = hipr_ptr_set_has(&live_functions, f);
    pthread_mutex_unlock(&hipr_cu_lock);
    return found;
}

API CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size) {
    if (!offset || !size) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (layout_of(f) != 1) return CUDA_ERROR_NOT_SUPPORTED;
    if (index >= f->params.n_params) return CUDA_ERROR_INVALID_VALUE;
    *offset = f->params.offsets[index];
    *size = f->params.sizes[index];
    return CUDA_SUCCESS;
}

API CUresult cuFuncGetName(const char **name, CUfunction f) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    *name = f->name;
    return CUDA_SUCCESS;
}

API CUresult cuFuncGetModule(CUmodule *m, CUfunction f) {
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    *m = f->module;
    return CUDA_SUCCESS;
}

/* FUNCTION_ATTRIBUTE: the attribute as the worker's driver answers it, set first when
 * `set` is given. */
static CUresult function_attribute(CUfunction f, int attrib, const int *set, int *value) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (attrib < 0 || attrib > ATTR_MAX) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&hipr_cu_lock);
    if (set) {
        /* A setting may change other attributes and the occupancy: forget them all,
         * whether the worker takes it or not. */
        memset(&f->cache, 0, sizeof f->cache);
    } else if (f->cache.attr_known >> attrib & 1) {
        if (value) *value = f->cache.attr[attrib];
        pthread_mutex_unlock(&hipr_cu_lock);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    hipr_map m;
    hipr_map_init(&m, set ? 3 : 2);
    hipr_map_u64(&m, "function", f->id);
    hipr_map_u64(&m, "attribute", (uint64_t)attrib);
    if (set) {
        if (*set < 0) {
            hipr_map_free(&m);
            return CUDA_ERROR_INVALID_VALUE;
        }
        hipr_map_u64(&m, "value", (uint64_t)*set);
    }
    hipr_reply r;
    int hip = hipr_call(f->device, OP_FUNCTION_ATTRIBUTE, &m, NULL, 0, NULL, 0, &r);
    int64_t v = 0;
    if (hip == 0 && hipr_cbor_int(r.map, "value", &v)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) return hipr_cu_error(hip);
    if (value) *value = (int)v;
    if (!set) {
        pthread_mutex_lock(&hipr_cu_lock);
        f->cache.attr[attrib] = (int)v;
        f->cache.attr_known |= (uint64_t)1 << attrib;
        pthread_mutex_unlock(&hipr_cu_lock);
    }
    return CUDA_SUCCESS;
}

/* The cached answer to `key` (1), or 0. */
static int occ_cached(CUfunction f, const struct occ_key *key, int64_t *value, int64_t *second) {
    int hit = 0;
    pthread_mutex_lock(&hipr_cu_lock);
    for (unsigned i = 0; i < f->cache.occ_used && !hit; i++) {
        if (memcmp(&f->cache.occ[i], key, sizeof *key) == 0) {
            *value = f->cache.occ_value[i];
            if (second) *second = f->cache.occ_second[i];
            hit = 1;
        }
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    return hit;
}

static void occ_keep(CUfunction f, const struct occ_key *key, int64_t value, int64_t second) {
    pthread_mutex_lock(&hipr_cu_lock);
    struct fn_cache *c = &f->cache;
    unsigned i = c->occ_used < OCC_SLOTS ? c->occ_used++ : c->occ_next++ % OCC_SLOTS;
    c->occ[i] = *key;
    c->occ_value[i] = value;
    c->occ_second[i] = second;
    pthread_mutex_unlock(&hipr_cu_lock);
}

API CUresult cuFuncGetAttribute(int *value, int attrib, CUfunction f) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    CUfunction k = NULL;
    CUresult rc = CUDA_SUCCESS;
    if (f && hipr_cu_kernel_function((void *)f, &k, &rc)) {
        if (rc) return rc;
        f = k;
    }
    return function_attribute(f, attrib, NULL, value);
}

API CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    CUfunction k = NULL;
    CUresult rc = CUDA_SUCCESS;
    if (f && hipr_cu_kernel_function((void *)f, &k, &rc)) {
        if (rc) return rc;
        f = k;
    }
    return function_attribute(f, attrib, &value, NULL);
}

/* A kernel's attribute on `dev`: its function in the current context, which must be on
 * that device (the proxy loads a library per context). */
static CUresult kernel_here(void *kernel, CUdevice dev, CUfunction *f) {
    int cur;
    CUresult rc = hipr_cu_ctx_device(&cur);
    if (rc) return rc;
    if (cur != dev) return CUDA_ERROR_NOT_SUPPORTED;
    if (!hipr_cu_kernel_function(kernel, f, &rc)) return CUDA_ERROR_INVALID_HANDLE;
    return rc;
}

API CUresult cuKernelGetAttribute(int *value, int attrib, void *kernel, CUdevice dev) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = NULL;
    CUresult rc = kernel_here(kernel, dev, &f);
    return rc ? rc : function_attribute(f, attrib, NULL, value);
}

API CUresult cuKernelSetAttribute(int attrib, int value, void *kernel, CUdevice dev) {
    CUfunction f = NULL;
    CUresult rc = kernel_here(kernel, dev, &f);
    return rc ? rc : function_attribute(f, attrib, &value, NULL);
}

/* --- occupancy: the worker's driver computes it for the kernel ---------------------------- */

static CUresult occupancy(CUfunction f, const char *query, int64_t block_size, int64_t smem,
                          int64_t num_blocks, int64_t limit, unsigned flags, int64_t *value,
                          int64_t *second) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    CUfunction k = NULL;
    CUresult rc = CUDA_SUCCESS;
    if (f && hipr_cu_kernel_function((void *)f, &k, &rc)) {
        if (rc) return rc;
        f = k;
    }
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    if (block_size < 0 || smem < 0 || num_blocks < 0 || limit < 0 || smem > INT32_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    struct occ_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp: no stray padding bytes */
    key.query = strcmp(query, "max_active_blocks") == 0        ? OCC_ACTIVE_BLOCKS
                : strcmp(query, "available_dynamic_smem") == 0 ? OCC_DYNAMIC_SMEM
                                                               : OCC_BLOCK_SIZE;
    key.block_size = block_size;
    key.smem = smem;
    key.num_blocks = num_blocks;
    key.limit = limit;
    key.flags = flags;
    if (occ_cached(f, &key, value, second)) return CUDA_SUCCESS;
    hipr_map m;
    hipr_map_init(&m, 7);
    hipr_map_u64(&m, "function", f->id);
    hipr_map_str(&m, "query", query, strlen(query));
    hipr_map_u64(&m, "block_size", (uint64_t)block_size);
    hipr_map_u64(&m, "dynamic_smem", (uint64_t)smem);
    hipr_map_u64(&m, "num_blocks", (uint64_t)num_blocks);
    hipr_map_u64(&m, "block_limit", (uint64_t)limit);
    hipr_map_u64(&m, "flags", flags);
    hipr_reply r;
    int hip = hipr_call(f->device, OP_FUNCTION_OCCUPANCY, &m, NULL, 0, NULL, 0, &r);
    if (hip == 0) {
        int bad = second ? hipr_cbor_int(r.map, "min_grid", value) ||
                               hipr_cbor_int(r.map, "block_size", second)
                         : hipr_cbor_int(r.map, "value", value);
        if (bad) hip = HIPR_UNKNOWN;
    }
    hipr_reply_free(&r);
    if (hip == 0) occ_keep(f, &key, *value, second ? *second : 0);
    return hipr_cu_error(hip);
}

API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, CUfunction f,
                                                                  int block, size_t smem,
                                                                  unsigned flags) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    int64_t v = 0;
    CUresult rc = occupancy(f, "max_active_blocks", block, (int64_t)smem, 0, 0, flags, &v, NULL);
    if (rc == CUDA_SUCCESS) *n = (int)v;
    return rc;
}

API CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block,
                                                         size_t smem) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, smem, 0);
}

API CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *smem, CUfunction f, int blocks,
                                                     int block) {
    if (!smem) return CUDA_ERROR_INVALID_VALUE;
    int64_t v = 0;
    CUresult rc = occupancy(f, "available_dynamic_smem", block, 0, blocks, 0, 0, &v, NULL);
    if (rc == CUDA_SUCCESS) *smem = (size_t)v;
    return rc;
}

/* With a callback giving the shared memory per block size the driver would call back
 * into this process: not served (refused, never approximated). */
API CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block, CUfunction f,
                                                       void *to_smem, size_t smem, int limit,
                                                       unsigned flags) {
    if (!min_grid || !block) return CUDA_ERROR_INVALID_VALUE;
    if (to_smem) {
        static int warned;
        hipr_warn_once("cuOccupancyMaxPotentialBlockSize with a shared-memory callback is not "
                       "served (CUDA_ERROR_NOT_SUPPORTED)",
                       &warned);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int64_t g = 0, b = 0;
    CUresult rc =
        occupancy(f, "max_potential_block_size", 0, (int64_t)smem, 0, limit, flags, &g, &b);
    if (rc == CUDA_SUCCESS) {
        *min_grid = (int)g;
        *block = (int)b;
    }
    return rc;
}

API CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block, CUfunction f,
                                              void *to_smem, size_t smem, int limit) {
    return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block, f, to_smem, smem, limit, 0);
}

static CUresult check_attribute(const CUlaunchAttribute *a);

API CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction f, const CUlaunchConfig *config) {
    if (!clusters || !config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t cluster[3] = {1, 1, 1};
    int have_cluster = 0;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        const CUlaunchAttribute *a = &config->attrs[i];
        if (a->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
            cluster[0] = a->value.clusterDim.x;
            cluster[1] = a->value.clusterDim.y;
            cluster[2] = a->value.clusterDim.z;
            have_cluster = 1;
        } else {
            CUresult rc = check_attribute(a);
            if (rc) return rc;
        }
    }
    CUfunction k = NULL;
    CUresult rc = CUDA_SUCCESS;
    if (f && hipr_cu_kernel_function((void *)f, &k, &rc)) {
        if (rc) return rc;
        f = k;
    }
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const uint64_t block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    struct occ_key key;
    memset(&key, 0, sizeof key);
    key.query = OCC_CLUSTERS;
    memcpy(key.grid, grid, sizeof grid);
    memcpy(key.block, block, sizeof block);
    memcpy(key.cluster, cluster, sizeof cluster);
    key.have_cluster = (uint64_t)have_cluster;
    key.smem = (int64_t)config->sharedMemBytes;
    int64_t cached = 0;
    if (occ_cached(f, &key, &cached, NULL)) {
        *clusters = (int)cached;
        return CUDA_SUCCESS;
    }
    hipr_map m;
    hipr_map_init(&m, 6);
    hipr_map_u64(&m, "function", f->id);
    hipr_map_str(&m, "query", "max_active_clusters", strlen("max_active_clusters"));
    hipr_map_u64_list(&m, "grid", grid, 3);
    hipr_map_u64_list(&m, "block", block, 3);
    hipr_map_u64(&m, "dynamic_smem", config->sharedMemBytes);
    if (have_cluster) hipr_map_u64_list(&m, "cluster", cluster, 3);
    hipr_reply r;
    int hip = hipr_call(f->device, OP_FUNCTION_OCCUPANCY, &m, NULL, 0, NULL, 0, &r);
    int64_t v = 0;
    if (hip == 0 && hipr_cbor_int(r.map, "value", &v)) hip = HIPR_UNKNOWN;
    hipr_reply_free(&r);
    if (hip) return hipr_cu_error(hip);
    occ_keep(f, &key, v, 0);
    *clusters = (int)v;
    return CUDA_SUCCESS;
}

/* Cache and shared-memory configurations are preferences, which CUDA itself may ignore:
 * accepted (after checking them) and not carried. */
API CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE;
    CUfunction k = NULL;
    CUresult rc = CUDA_SUCCESS;
    if (f && hipr_cu_kernel_function((void *)f, &k, &rc)) return rc;
    return f && function_live(f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuKernelSetCacheConfig(void *kernel, int config, CUdevice dev) {
    if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = NULL;
    return kernel_here(kernel, dev, &f);
}

API CUresult cuCtxSetCacheConfig(int config) {
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc) return rc;
    return config < 0 || config > 3 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

API CUresult cuCtxGetCacheConfig(int *config) {
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc == CUDA_SUCCESS) *config = 0; /* CU_FUNC_CACHE_PREFER_NONE: none is carried */
    return rc;
}

/* --- launches ----------------------------------------------------------------------------- */

CUresult hipr_cu_launch_prepare(struct hipr_cu_launch *l, CUfunction f, const unsigned grid[3],
                                const unsigned block[3], unsigned shared, void **params,
                                void **extra) {
    CUresult rc = hipr_cu_ctx_device(&l->device);
    if (rc) return rc;
    /* A CUkernel (cuLibraryGetKernel) launches as its function in the current context. */
    CUfunction from_kernel = NULL;
    if (f && hipr_cu_kernel_function((void *)f, &from_kernel, &rc)) {
        if (rc) return rc;
        f = from_kernel;
    }
    if (!f || !function_live(f)) return CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; i < 3; i++)
        if (!grid[i] || !block[i]) return CUDA_ERROR_INVALID_VALUE;
    if (params && extra) return CUDA_ERROR_INVALID_VALUE;
    int layout = layout_of(f);
    l->args = l->buf;
    l->args_len = 0;
    if (extra) {
        const void *packed = NULL;
        if (hipr_launch_extra(extra, CU_LAUNCH_PARAM_END, HIPR_MAX_ARGS_BYTES, &packed, &l->args_len)) return CUDA_ERROR_INVALID_VALUE;
        l->args = packed;
    } else if (params || layout == 1) {
        if (layout != 1) {
            static int warned;
            hipr_warn_once("cuLaunchKernel with kernelParams needs the kernel's parameter "
                           "layout, which this worker cannot report; pass `extra`",
                           &warned);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        if (hipr_param_layout_pack(&f->params, params, l->buf, &l->args_len))
            return CUDA_ERROR_INVALID_VALUE;
    }
    hipr_launch_config *c = &l->config;
    memset(c, 0, sizeof *c);
    c->function = f->id;
    c->shared_mem = shared;
    for (int i = 0; i < 3; i++) {
        c->grid[i] = grid[i];
        c->block[i] = block[i];
    }
    /* Pointer arguments, where the layout tells them, are checked by the worker. */
    for (size_t i = 0; layout == 1 && i < f->params.n_params; i++)
        if (f->params.is_pointer[i] && f->params.offsets[i] + 8 <= l->args_len)
            c->ptrs[c->n_ptrs++] = f->params.offsets[i];
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                       unsigned shared, CUstream stream, void **params, void **extra) {
    int dev;
    uint64_t sid = 0;
    CUresult rc = hipr_cu_ctx_device(&dev);
    if (rc == CUDA_SUCCESS) rc = hipr_cu_stream(stream, &sid);
    struct hipr_cu_launch l;
    if (rc == CUDA_SUCCESS) rc = hipr_cu_launch_prepare(&l, f, grid, block, shared, params, extra);
    if (rc) return rc;
    l.config.stream = sid;
    hipr_capture_note(sid, 1);
    return hipr_cu_error(hipr_launch(l.device, &l.config, l.args, l.args_len));
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared, CUstream stream,
                            void **params, void **extra) {
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return launch(f, grid, block, shared, stream, params, extra);
}

/* Each launch attribute is honoured or refused, never dropped: what the worker's plain
 * launch already does (no cooperation, a 1x1x1 cluster, the one priority there is, no
 * programmatic serialisation) is accepted; anything else returns NOT_SUPPORTED and says
 * which attribute on stderr once. */
static CUresult check_attribute(const CUlaunchAttribute *a) {
    const CUlaunchAttributeValue *v = &a->value;
    int honoured;
    switch (a->id) {
    case CU_LAUNCH_ATTRIBUTE_IGNORE:
        honoured = 1;
        break;
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
        honoured = v->cooperative == 0;
        break;
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        honoured = v->clusterDim.x <= 1 && v->clusterDim.y <= 1 && v->clusterDim.z <= 1;
        break;
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
        honoured = v->programmaticStreamSerializationAllowed == 0;
        break;
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        honoured = 1; /* clamped into [0, 0], as every stream's */
        break;
    default:
        honoured = 0;
    }
    if (honoured) return CUDA_SUCCESS;
    static uint8_t warned[64];
    unsigned slot = (unsigned)a->id < 63 ? (unsigned)a->id : 63;
    if (!__atomic_exchange_n(&warned[slot], 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "hipr proxy: cuLaunchKernelEx: launch attribute %d with this value is not "
                "served (CUDA_ERROR_NOT_SUPPORTED)\n",
                a->id);
    return CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                              void **extra) {
    if (!config || (config->numAttrs && !config->attrs)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        CUresult rc = check_attribute(&config->attrs[i]);
        if (rc) return rc;
    }
    const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return launch(f, grid, block, config->sharedMemBytes, config->hStream, params, extra);
}

API CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, CUstream, void **, void **)
    __attribute__((alias("cuLaunchKernel")));
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **)
    __attribute__((alias("cuLaunchKernelEx")));

/* Libraries (cuLibraryLoadData) load on the worker at the first use of one of their
 * kernels in a context: lazy loading, as the runtime is told. */
API CUresult cuModuleGetLoadingMode(int *mode) {
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    *mode = 2; /* CU_MODULE_LAZY_LOADING */
    return CUDA_SUCCESS;
}
