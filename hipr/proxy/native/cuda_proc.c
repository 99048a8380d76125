/* cuGetProcAddress (v1 and _v2) for every entry point the proxy exports, and
 * cuGetExportTable. A symbol is asked for by its base name ("cuMemAlloc") and a CUDA
 * version; the table gives the newest form of that name introduced at or before the
 * version (cuMemAlloc_v2 from 3.2 on). Names the proxy does not serve resolve to their
 * stubs (CUDA_ERROR_NOT_SUPPORTED, naming themselves), so a runtime that looks them up
 * finds them as it would in NVIDIA's driver. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_front.h"
#include "cuda_proc.h"
#include "cuda_trace.h"

#define F(name) ((void *)(name))

/* Declarations of the served entry points (defined in cuda_front.c / cuda_modules.c). */
#define X(base, since, sym) extern CUresult sym();
#include "cuda_served.def"
#undef X

static const struct {
    const char *base;
    int since;
    const char *symbol;
    void *fn;
} served[] = {
#define X(base, since, sym) {#base, since, #sym, F(sym)},
#include "cuda_served.def"
#undef X
};

static int by_name(const void *a, const void *b) {
    return strcmp(((const struct hipr_cu_proc *)a)->name, ((const struct hipr_cu_proc *)b)->name);
}

static void *stub(const char *name) {
    struct hipr_cu_proc key = {name, NULL};
    const struct hipr_cu_proc *hit =
        bsearch(&key, hipr_cu_stubs, hipr_cu_n_stubs, sizeof *hipr_cu_stubs, by_name);
    return hit ? hit->fn : NULL;
}

/* The entry point for `symbol` at `version`; *status as cuGetProcAddress_v2 reports it. */
static void *lookup(const char *symbol, int version, CUdriverProcAddressQueryResult *status) {
    void *best = NULL;
    int best_since = -1, older = 0;
    for (size_t i = 0; i < sizeof served / sizeof *served; i++) {
        if (strcmp(served[i].base, symbol) != 0) continue;
        if (served[i].since > version) {
            older = 1;
            continue;
        }
        if (served[i].since > best_since) {
            best = served[i].fn;
            best_since = served[i].since;
        }
    }
    if (!best) {
        /* A served name asked for by its full spelling ("cuCtxGetDevice_v2"). */
        for (size_t i = 0; i < sizeof served / sizeof *served && !best; i++)
            if (strcmp(served[i].symbol, symbol) == 0) best = served[i].fn;
    }
    if (!best) {
        /* An older form of a served name (cuMemAlloc's 32-bit v1), or a name not served:
         * its stub, newest spelling first. */
        char name[256];
        for (int v = 4; v >= 2 && !best; v--) {
            snprintf(name, sizeof name, "%s_v%d", symbol, v);
            best = stub(name);
        }
        if (!best) best = stub(symbol);
        if (!best && older) {
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return NULL;
        }
    }
    *status = best ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    if (pfn) *pfn = NULL;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    /* Per-thread and legacy forms are the same calls here: every default stream is the
     * worker's null stream. */
    CUdriverProcAddressQueryResult st;
    *pfn = lookup(symbol, version, &st);
    if (status) *status = st;
    if (getenv("HIPR_PROXY_DEBUG") && !*pfn)
        fprintf(stderr, "hipr proxy: cuGetProcAddress(%s, %d): not found\n", symbol, version);
    if (hipr_cu_trace_enabled()) {
        fprintf(stderr, "hipr trace: cuGetProcAddress(%s, %d, %#llx) -> %s\n", symbol, version,
                (unsigned long long)flags, *pfn ? "found" : "not found");
        *pfn = hipr_cu_trace_wrap(symbol, *pfn);
    }
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

API CUresult cuGetProcAddress_v2_ptsz(const char *, void **, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult *)
    __attribute__((alias("cuGetProcAddress_v2")));
