/* Context-independent loading (cuLibrary*, cuKernel*), which the CUDA runtime of CUDA 12
 * and later uses for the fat binaries it registers: a library keeps its image and loads
 * it on the worker, as a module, at the first use of one of its kernels in a context
 * (lazy loading); a kernel resolves to that module's function per device. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_front.h"
#include "ptr_set.h"

#define MAX_DEVICES 64
#define CU_LIBRARY_BINARY_IS_PRESERVED 1

CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name);
CUresult cuModuleUnload(CUmodule m);
CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size);

struct hipr_cu_kernel;

struct hipr_cu_library {
    const void *image;
    size_t size;
    void *owned; /* the copy of the image, unless the caller preserves it */
    CUmodule modules[MAX_DEVICES];
    struct hipr_cu_kernel *kernels;
    struct hipr_cu_library *next;
};

struct hipr_cu_kernel {
    struct hipr_cu_library *library;
    CUfunction functions[MAX_DEVICES];
    struct hipr_cu_kernel *next;
    char name[]; /* mangled names run to thousands of characters */
};

typedef struct hipr_cu_library *CUlibrary;
typedef struct hipr_cu_kernel *CUkernel;

static struct hipr_cu_library *libraries;
/* The libraries above, and each one's kernels: a launch of a CUkernel checks it here.
 * (libtorch_cuda loads a library per fat binary: thousands.) */
static hipr_ptr_set live_libraries, live_kernels;

static int preserved(const int *options, void **values, unsigned n) {
    for (unsigned i = 0; options && values && i < n; i++)
        if (options[i] == CU_LIBRARY_BINARY_IS_PRESERVED && values[i]) return 1;
    return 0;
}

static CUresult library_load(CUlibrary *out, const void *code, size_t size, int keep) {
    struct hipr_cu_library *l = calloc(1, sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    if (keep) {
        l->image = code;
    } else {
        l->owned = malloc(size);
        if (!l->owned) {
            free(l);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(l->owned, code, size);
        l->image = l->owned;
    }
    l->size = size;
    pthread_mutex_lock(&hipr_cu_lock);
    int held = hipr_ptr_set_add(&live_libraries, l) == 0;
    if (held) {
        l->next = libraries;
        libraries = l;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!held) {
        free(l->owned);
        free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = l;
    return CUDA_SUCCESS;
}

API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jit_options,
                               void **jit_values, unsigned int n_jit, int *lib_options,
                               void **lib_values, unsigned int n_lib) {
    (void)jit_options, (void)jit_values, (void)n_jit; /* the worker's JIT decides */
    if (!library || !code) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    const void *image = code;
    size_t size = hipr_cu_image_size(&image);
    if (!size) return CUDA_ERROR_INVALID_IMAGE;
    return library_load(library, image, size, preserved(lib_options, lib_values, n_lib));
}

API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, int *jit_options,
                                   void **jit_values, unsigned int n_jit, int *lib_options,
                                   void **lib_values, unsigned int n_lib) {
    (void)jit_options, (void)jit_values, (void)n_jit, (void)lib_options, (void)lib_values,
        (void)n_lib;
    if (!library || !path) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t *buf = NULL;
    size_t len = 0;
    CUresult rc = hipr_cu_read_file(path, &buf, &len);
    if (rc == CUDA_SUCCESS) {
        const void *image = buf;
        size_t size = hipr_cu_image_size(&image);
        if (!size || image != buf || size > len + 1) rc = CUDA_ERROR_INVALID_IMAGE;
        else rc = library_load(library, buf, size, 0);
    }
    free(buf);
    return rc;
}

/* With hipr_cu_lock held. */
static int library_live_locked(CUlibrary l) { return hipr_ptr_set_has(&live_libraries, l); }

/* With hipr_cu_lock held: the library's kernels are no longer live handles. */
static void forget_kernels_locked(CUlibrary l) {
    for (struct hipr_cu_kernel *k = l->kernels; k; k = k->next)
        hipr_ptr_set_remove(&live_kernels, k);
}

static void free_library(CUlibrary l) {
    for (struct hipr_cu_kernel *k = l->kernels, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    free(l->owned);
    free(l);
}

API CUresult cuLibraryUnload(CUlibrary l) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&hipr_cu_lock);
    int found = 0;
    for (struct hipr_cu_library **p = &libraries; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            hipr_ptr_set_remove(&live_libraries, l);
            forget_kernels_locked(l);
            found = 1;
            break;
        }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!found) return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = CUDA_SUCCESS;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (l->modules[d]) {
            CUresult r = cuModuleUnload(l->modules[d]);
            if (rc == CUDA_SUCCESS) rc = r;
        }
    free_library(l);
    return rc;
}

API CUresult cuLibraryGetKernel(CUkernel *out, CUlibrary l, const char *name) {
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    size_t len = strlen(name);
    if (len > HIPR_CU_MAX_NAME) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&hipr_cu_lock);
    CUresult rc = library_live_locked(l) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    struct hipr_cu_kernel *k = NULL;
    if (rc == CUDA_SUCCESS) {
        k = l->kernels;
        while (k && strcmp(k->name, name) != 0) k = k->next;
        /* Whether the library has the kernel is known when it loads on the worker: a
         * missing name fails the kernel's first use with CUDA_ERROR_NOT_FOUND. */
        if (!k && (k = calloc(1, sizeof *k + len + 1)) != NULL) {
            if (hipr_ptr_set_add(&live_kernels, k)) {
                free(k);
                k = NULL;
            } else {
                k->library = l;
                memcpy(k->name, name, len + 1);
                k->next = l->kernels;
                l->kernels = k;
            }
        }
        if (!k) rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&hipr_cu_lock);
    if (rc == CUDA_SUCCESS) *out = k;
    return rc;
}

/* With hipr_cu_lock held. */
static int kernel_live_locked(CUkernel k) { return hipr_ptr_set_has(&live_kernels, k); }

/* The library's module on the current context's device, loaded there on first use. */
static CUresult module_here(CUlibrary l, int *device, CUmodule *out) {
    CUresult rc = hipr_cu_ctx_device(device);
    if (rc) return rc;
    if (*device < 0 || *device >= MAX_DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&hipr_cu_lock);
    CUmodule m = l->modules[*device];
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!m) {
        rc = hipr_cu_load(&m, l->image, l->size);
        if (rc) return rc;
        pthread_mutex_lock(&hipr_cu_lock);
        CUmodule raced = l->modules[*device];
        if (!raced) l->modules[*device] = m;
        pthread_mutex_unlock(&hipr_cu_lock);
        if (raced) { /* another thread loaded it first */
            cuModuleUnload(m);
            m = raced;
        }
    }
    *out = m;
    return CUDA_SUCCESS;
}

static CUresult kernel_function(CUkernel k, CUfunction *f) {
    int dev;
    CUmodule m;
    CUresult rc = module_here(k->library, &dev, &m);
    if (rc) return rc;
    pthread_mutex_lock(&hipr_cu_lock);
    *f = k->functions[dev];
    pthread_mutex_unlock(&hipr_cu_lock);
    if (*f) return CUDA_SUCCESS;
    rc = cuModuleGetFunction(f, m, k->name);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&hipr_cu_lock);
        k->functions[dev] = *f;
        pthread_mutex_unlock(&hipr_cu_lock);
    }
    return rc;
}

int hipr_cu_kernel_function(void *p, CUfunction *f, CUresult *rc) {
    pthread_mutex_lock(&hipr_cu_lock);
    int is_kernel = kernel_live_locked(p);
    pthread_mutex_unlock(&hipr_cu_lock);
    if (is_kernel) *rc = kernel_function(p, f);
    return is_kernel;
}

static CUresult live_kernel(CUkernel k) {
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&hipr_cu_lock);
    int live = kernel_live_locked(k);
    pthread_mutex_unlock(&hipr_cu_lock);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = live_kernel(k);
    return rc ? rc : kernel_function(k, f);
}

API CUresult cuKernelGetName(const char **name, CUkernel k) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = live_kernel(k);
    if (rc == CUDA_SUCCESS) *name = k->name;
    return rc;
}

API CUresult cuKernelGetLibrary(CUlibrary *l, CUkernel k) {
    if (!l) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = live_kernel(k);
    if (rc == CUDA_SUCCESS) *l = k->library;
    return rc;
}

API CUresult cuKernelGetParamInfo(CUkernel k, size_t index, size_t *offset, size_t *size) {
    CUfunction f;
    CUresult rc = cuKernelGetFunction(&f, k);
    return rc ? rc : cuFuncGetParamInfo(f, index, offset, size);
}

API CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l) {
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    if (!hipr_cu_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&hipr_cu_lock);
    int live = library_live_locked(l);
    pthread_mutex_unlock(&hipr_cu_lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    int dev;
    return module_here(l, &dev, m);
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name);

/* The library's global in the current context (its module loaded there first). */
API CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary l, const char *name) {
    CUmodule m;
    CUresult rc = cuLibraryGetModule(&m, l);
    return rc ? rc : cuModuleGetGlobal_v2(dptr, bytes, m, name);
}

void hipr_cu_forget_libraries(void) {
    for (struct hipr_cu_library *l = libraries, *next; l; l = next) {
        next = l->next;
        free_library(l);
    }
    libraries = NULL;
    hipr_ptr_set_free(&live_libraries);
    hipr_ptr_set_free(&live_kernels);
}
