/* The hipcc path: `kernel<<<grid, block, shared, stream>>>(args)` compiles to
 * __hipPushCallConfiguration at the call site, then the kernel's host stub, which calls
 * __hipPopCallConfiguration and hipLaunchKernel(stub, ...). The code objects were
 * registered by __hipRegisterFatBinary / __hipRegisterFunction during static
 * initialisation, before any connection can be made: registration only records them,
 * and a code object is loaded on the worker at the first launch of one of its kernels. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "hip_types.h"
#include "modules.h"

#define API HIPR_EXPORT

hipError_t hipModuleLoadData(hipModule_t *module, const void *image);
hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *name);

/* clang's __CudaFatBinaryWrapper: "HIPF" for HIP's offload bundles; NVIDIA's magic for
 * nvcc's fat binaries. */
#define HIP_FATBIN_MAGIC 0x48495046u
#define CUDA_FATBIN_MAGIC 0x466243b1u

struct fatbin_wrapper {
    uint32_t magic;
    uint32_t version;
    const void *binary;
    const void *unused;
};

struct fatbin {
    const void *binary;
    hipModule_t module; /* loaded at the first launch */
    struct fatbin *next;
};

struct kernel {
    const void *host; /* the host stub's address: what hipLaunchKernel is given */
    char *name;
    struct fatbin *fatbin;
    hipFunction_t function; /* found at the first launch */
    struct kernel *next;
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fatbin *fatbins;
static struct kernel *kernels;

API void **__hipRegisterFatBinary(const void *data) {
    const struct fatbin_wrapper *w = data;
    if (!w || (w->magic != HIP_FATBIN_MAGIC && w->magic != CUDA_FATBIN_MAGIC) || !w->binary) {
        static int warned;
        hipr_warn_once("__hipRegisterFatBinary: not a fat binary wrapper; its kernels are "
                       "not registered",
                       &warned);
        return NULL;
    }
    struct fatbin *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->binary = w->binary;
    pthread_mutex_lock(&reg_lock);
    f->next = fatbins;
    fatbins = f;
    pthread_mutex_unlock(&reg_lock);
    return (void **)f;
}

API void __hipRegisterFunction(void **modules, const void *host_function, char *device_function,
                               const char *device_name, unsigned int thread_limit, void *tid,
                               void *bid, void *block_dim, void *grid_dim, int *wsize) {
    (void)device_function, (void)thread_limit, (void)tid, (void)bid, (void)block_dim;
    (void)grid_dim, (void)wsize;
    if (!modules || !host_function || !device_name) return;
    struct kernel *k = calloc(1, sizeof *k);
    char *name = strdup(device_name);
    if (!k || !name) {
        free(k);
        free(name);
        return;
    }
    k->host = host_function;
    k->name = name;
    k->fatbin = (struct fatbin *)modules;
    pthread_mutex_lock(&reg_lock);
    k->next = kernels;
    kernels = k;
    pthread_mutex_unlock(&reg_lock);
}

/* A device variable (__device__, __constant__): hipcc passes its host shadow's address,
 * which the symbol calls (hipMemcpyToSymbol, ...) are given. Found on the worker
 * (hipModuleGetGlobal) at its first use, after its code object is loaded. */
struct var {
    const void *host;
    char *name;
    size_t size;
    struct fatbin *fatbin;
    void *ptr; /* the device address, once looked up */
    size_t dev_size;
    struct var *next;
};
static struct var *vars;

API void __hipRegisterVar(void **modules, void *var, char *host_var, char *device_var, int ext,
                          size_t size, int constant, int global) {
    (void)host_var, (void)ext, (void)constant, (void)global;
    if (!modules || !var || !device_var) return;
    struct var *v = calloc(1, sizeof *v);
    char *name = strdup(device_var);
    if (!v || !name) {
        free(v);
        free(name);
        return;
    }
    v->host = var;
    v->name = name;
    v->size = size;
    v->fatbin = (struct fatbin *)modules;
    pthread_mutex_lock(&reg_lock);
    v->next = vars;
    vars = v;
    pthread_mutex_unlock(&reg_lock);
}

hipError_t hipModuleGetGlobal(void **ptr, size_t *bytes, hipModule_t module, const char *name);

hipError_t hipr_symbol_lookup(const void *symbol, void **ptr, size_t *size) {
    hipError_t rc = hipErrorInvalidSymbol;
    pthread_mutex_lock(&reg_lock);
    struct var *v = vars;
    while (v && v->host != symbol) v = v->next;
    if (v && v->ptr) {
        rc = hipSuccess;
    } else if (v) {
        struct fatbin *f = v->fatbin;
        rc = f->module ? hipSuccess : hipModuleLoadData(&f->module, f->binary);
        if (rc == hipSuccess) rc = hipModuleGetGlobal(&v->ptr, &v->dev_size, f->module, v->name);
        if (rc == hipErrorNotFound) rc = hipErrorInvalidSymbol;
    }
    if (rc == hipSuccess) {
        *ptr = v->ptr;
        *size = v->dev_size;
    }
    pthread_mutex_unlock(&reg_lock);
    return rc;
}

/* Frees what registration took; the module, if one was loaded, is the session's and
 * goes with it (this runs at exit, when the session may already be closed). */
API void __hipUnregisterFatBinary(void **modules) {
    struct fatbin *f = (struct fatbin *)modules;
    if (!f) return;
    pthread_mutex_lock(&reg_lock);
    for (struct kernel **k = &kernels; *k;) {
        if ((*k)->fatbin == f) {
            struct kernel *gone = *k;
            *k = gone->next;
            free(gone->name);
            free(gone);
        } else {
            k = &(*k)->next;
        }
    }
    for (struct var **v = &vars; *v;) {
        if ((*v)->fatbin == f) {
            struct var *gone = *v;
            *v = gone->next;
            free(gone->name);
            free(gone);
        } else {
            v = &(*v)->next;
        }
    }
    for (struct fatbin **p = &fatbins; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    pthread_mutex_unlock(&reg_lock);
    hipr_module_forget(f->module);
    free(f);
}

/* --- the per-thread configuration stack ----------------------------------------------- */

#define MAX_CONFIGS 64
struct config {
    dim3 grid, block;
    size_t shared;
    hipStream_t stream;
};
static __thread struct config tl_configs[MAX_CONFIGS];
static __thread int tl_depth;

API hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                          hipStream_t stream) {
    if (tl_depth == MAX_CONFIGS) return hipr_front_ret(hipErrorInvalidConfiguration);
    tl_configs[tl_depth++] = (struct config){grid, block, shared, stream};
    return hipSuccess;
}

API hipError_t __hipPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                         hipStream_t *stream) {
    if (tl_depth == 0) return hipr_front_ret(hipErrorMissingConfiguration);
    const struct config *c = &tl_configs[--tl_depth];
    if (grid) *grid = c->grid;
    if (block) *block = c->block;
    if (shared) *shared = c->shared;
    if (stream) *stream = c->stream;
    return hipSuccess;
}

/* The older spelling of the same stack (hipConfigureCall then hipLaunchByPtr). */
API hipError_t hipConfigureCall(dim3 grid, dim3 block, size_t shared, hipStream_t stream) {
    return __hipPushCallConfiguration(grid, block, shared, stream);
}

/* --- launches --------------------------------------------------------------------------- */

static hipError_t resolve(const void *host, hipFunction_t *out) {
    hipError_t rc = hipErrorInvalidDeviceFunction;
    pthread_mutex_lock(&reg_lock);
    struct kernel *k = kernels;
    while (k && k->host != host) k = k->next;
    if (k && k->function) {
        *out = k->function;
        rc = hipSuccess;
    } else if (k) {
        rc = k->fatbin->module ? hipSuccess : hipModuleLoadData(&k->fatbin->module, k->fatbin->binary);
        if (rc == hipSuccess) rc = hipModuleGetFunction(&k->function, k->fatbin->module, k->name);
        if (rc == hipSuccess) *out = k->function;
    }
    pthread_mutex_unlock(&reg_lock);
    return rc;
}

API hipError_t hipLaunchKernel(const void *function, dim3 grid, dim3 block, void **args,
                               size_t shared, hipStream_t stream) {
    if (!function) return hipr_front_ret(hipErrorInvalidDeviceFunction);
    if (shared > UINT32_MAX) return hipr_front_ret(hipErrorInvalidValue);
    hipFunction_t f = NULL;
    hipError_t rc = resolve(function, &f);
    if (rc) return hipr_front_ret(rc);
    const unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
    return hipr_front_ret(hipr_module_launch(f, g, b, (unsigned)shared, stream, args, NULL));
}

/* The device name a host stub was registered with. */
API const char *hipKernelNameRefByPtr(const void *host_function, hipStream_t stream) {
    (void)stream;
    const char *name = NULL;
    pthread_mutex_lock(&reg_lock);
    for (struct kernel *k = kernels; k && !name; k = k->next)
        if (k->host == host_function) name = k->name;
    pthread_mutex_unlock(&reg_lock);
    return name;
}

static void forget_loaded(void) {
    /* A forked child's session has none of the parent's modules: load again on first use. */
    for (struct fatbin *f = fatbins; f; f = f->next) {
        hipr_module_forget(f->module);
        f->module = NULL;
    }
    for (struct kernel *k = kernels; k; k = k->next) k->function = NULL;
    for (struct var *v = vars; v; v = v->next) v->ptr = NULL;
}

__attribute__((constructor(102))) static void hipcc_init(void) {
    hipr_fork_guard(&reg_lock, forget_loaded);
}
