/* A diagnosis tool for the GPU host, not part of the proxy: a libcuda.so.1 that forwards
 * every driver entry point to NVIDIA's driver (HIPR_SPY_DRIVER: its absolute path) and,
 * with HIPR_PROXY_TRACE set, wraps what cuGetProcAddress hands out and every function
 * slot of the private export tables with cuda_trace.c's trampolines. Run in front of an
 * unmodified program (cuBLAS, PyTorch), it prints which private tables and slots NVIDIA's
 * own driver is asked for, with the arguments passed and what they returned: the facts
 * the proxy's cuda_export.c is written from. Each table is described once when first
 * handed out: its size slot and, for each slot, whether it is code of the driver (and
 * where), NULL, or a value. Built by tests/proxy/cuda/build_spy.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_trace.h"

typedef int CUresult;
typedef struct {
    char bytes[16];
} CUuuid;

/* From the generated part: the forwarded names and where each jumps. */
extern const char *const hipr_spy_names[];
extern const size_t hipr_spy_count;
extern void *hipr_spy_fwd[];

static void *driver;
static uintptr_t code_lo[16], code_hi[16];
static int n_code;

static int is_code(uintptr_t p) {
    for (int i = 0; i < n_code; i++)
        if (p >= code_lo[i] && p < code_hi[i]) return 1;
    return 0;
}

static CUresult missing(void) { return 500; /* CUDA_ERROR_NOT_FOUND */ }

__attribute__((constructor)) static void spy_init(void) {
    const char *path = getenv("HIPR_SPY_DRIVER");
    driver = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!driver) {
        fprintf(stderr, "hipr spy: cannot open HIPR_SPY_DRIVER=%s: %s\n", path ? path : "(unset)",
                dlerror());
        abort();
    }
    for (size_t i = 0; i < hipr_spy_count; i++) {
        void *f = dlsym(driver, hipr_spy_names[i]);
        hipr_spy_fwd[i] = f ? f : (void *)missing;
    }
    /* The driver's executable mappings: a slot pointing there is one of its functions. */
    Dl_info info;
    void *any = dlsym(driver, "cuInit");
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    if (any && dladdr(any, &info) && maps) {
        char *real = realpath(info.dli_fname, NULL);
        while (fgets(line, sizeof line, maps) && n_code < 16) {
            unsigned long lo, hi;
            char perms[8], file[3000] = "";
            if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %2999s", &lo, &hi, perms, file) >= 3 &&
                perms[2] == 'x' && real && strcmp(file, real) == 0) {
                code_lo[n_code] = lo;
                code_hi[n_code++] = hi;
            }
        }
        free(real);
    }
    if (maps) fclose(maps);
    fprintf(stderr, "hipr spy: forwarding to %s (%d code mappings)\n", path, n_code);
}

static CUresult (*real_export(void))(const void **, const CUuuid *) {
    return (CUresult(*)(const void **, const CUuuid *))dlsym(driver, "cuGetExportTable");
}

static struct {
    char id[16];
    const void *copy;
} seen[64];
static int n_seen;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static const void *describe_and_wrap(const CUuuid *id, const void *table) {
    const unsigned char *b = (const unsigned char *)id->bytes;
    char guid[40], tag[32];
    snprintf(guid, sizeof guid,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    snprintf(tag, sizeof tag, "etbl %.8s", guid);
    const uintptr_t *t = table;
    /* A size slot (bytes, a multiple of 8) first, or none (a function from slot 0). */
    size_t n, first;
    if (t[0] >= 16 && t[0] <= 8 * 256 && t[0] % 8 == 0) {
        n = t[0] / 8;
        first = 1;
    } else {
        for (n = 0; n < 64 && is_code(t[n]); n++) {
        }
        first = 0;
    }
    fprintf(stderr, "hipr spy: table %s: slot 0 = %#lx, %zu slots\n", guid, (unsigned long)t[0],
            n);
    Dl_info info;
    for (size_t i = first; i < n; i++) {
        if (!t[i])
            fprintf(stderr, "hipr spy:   %s[%zu] NULL\n", tag, i);
        else if (is_code(t[i]) && dladdr((void *)t[i], &info))
            fprintf(stderr, "hipr spy:   %s[%zu] code %s+%#lx\n", tag, i,
                    info.dli_sname ? info.dli_sname : "libcuda",
                    (unsigned long)(t[i] - (uintptr_t)(info.dli_sname ? info.dli_saddr
                                                                       : info.dli_fbase)));
        else
            fprintf(stderr, "hipr spy:   %s[%zu] value %#lx\n", tag, i, (unsigned long)t[i]);
    }
    /* The runtime hashes where these two tables and the check's function are (the keyed
     * integrity check): they are handed out as they are, described but not wrapped. */
    static const unsigned char cudart[4] = {0x6b, 0xd5, 0xfb, 0x6c},
                               integrity[4] = {0xd4, 0x08, 0x20, 0x55};
    if (memcmp(b, cudart, 4) == 0 || memcmp(b, integrity, 4) == 0) return table;
    void **copy = malloc(n * sizeof *copy);
    if (!copy) return table;
    memcpy(copy, table, n * sizeof *copy);
    for (size_t i = first; i < n; i++)
        if (is_code(t[i])) {
            char name[64];
            snprintf(name, sizeof name, "%s[%zu]", tag, i);
            copy[i] = hipr_cu_trace_wrap(name, copy[i]);
        }
    return copy;
}

__attribute__((visibility("default"))) CUresult cuGetExportTable(const void **table,
                                                                 const CUuuid *id) {
    CUresult rc = real_export()(table, id);
    if (!hipr_cu_trace_enabled() || rc || !table || !*table || !id) return rc;
    pthread_mutex_lock(&seen_lock);
    const void *out = NULL;
    for (int i = 0; i < n_seen && !out; i++)
        if (memcmp(seen[i].id, id->bytes, 16) == 0) out = seen[i].copy;
    if (!out) {
        out = describe_and_wrap(id, *table);
        if (n_seen < 64) {
            memcpy(seen[n_seen].id, id->bytes, 16);
            seen[n_seen++].copy = out;
        }
    }
    pthread_mutex_unlock(&seen_lock);
    fprintf(stderr, "hipr spy: cuGetExportTable(%02x%02x%02x%02x) -> 0\n",
            (unsigned char)id->bytes[0], (unsigned char)id->bytes[1],
            (unsigned char)id->bytes[2], (unsigned char)id->bytes[3]);
    *table = out;
    return rc;
}

typedef CUresult (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char *symbol,
                                                                    void **pfn, int version,
                                                                    unsigned long long flags,
                                                                    int *status) {
    gpa2_fn real = (gpa2_fn)dlsym(driver, "cuGetProcAddress_v2");
    CUresult rc = real(symbol, pfn, version, flags, status);
    if (rc || !pfn || !*pfn || !symbol) return rc;
    /* The spy's own lookups and tables, not the driver's (same form as the driver gave). */
    if (strcmp(symbol, "cuGetExportTable") == 0) *pfn = (void *)cuGetExportTable;
    else if (strcmp(symbol, "cuGetProcAddress") == 0)
        *pfn = *pfn == dlsym(driver, "cuGetProcAddress") || version < 12000
                   ? (void *)cuGetProcAddress
                   : (void *)cuGetProcAddress_v2;
    if (hipr_cu_trace_enabled()) *pfn = hipr_cu_trace_wrap(symbol, *pfn);
    return rc;
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress(const char *symbol, void **pfn,
                                                                 int version,
                                                                 unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
