/* The private export tables of the proxy's libcuda.so.1 (cuda_export.c), called from C as
 * the CUDA runtime and cuBLASLt call them: every table served has its size slot and no
 * NULL slot; a slot whose meaning is not known returns CUDA_ERROR_NOT_SUPPORTED (never a
 * jump to address 0); the tools-TLS slots are cuCtxSetCurrent/cuCtxGetCurrent; the
 * tools-context slot 4 gives cuCtxGetId's id; cuStreamGetId's ids are distinct. Prints
 * "ok" at the end.
 * Needs HIPR_URL (a worker). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../../hipr/proxy/native/cuda_types.h"

CUresult cuInit(unsigned int flags);
CUresult cuGetErrorName(CUresult error, const char **str);
CUresult cuGetExportTable(const void **table, const CUuuid *id);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id);
CUresult cuStreamCreate(CUstream *ps, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamGetId(CUstream s, unsigned long long *id);

static const char *name_of(long e) {
    const char *s = NULL;
    return cuGetErrorName((CUresult)e, &s) == CUDA_SUCCESS && s ? s : "?";
}
#define NAME_OF(e) name_of(e)
#include "check.h"

typedef void (*slot)(void);

static const slot *table(const char *hex) {
    CUuuid id;
    for (int i = 0; i < 16; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        id.bytes[i] = (char)v;
    }
    const void *t = NULL;
    CHECK(cuGetExportTable(&t, &id));
    EXPECT(t != NULL);
    return t;
}

/* Every slot from `first` on is a function; a size slot, when there is one, says `n`. */
static void no_null_slot(const slot *t, size_t n, size_t first) {
    if (first == 1) EXPECT((uintptr_t)t[0] == n * sizeof(void *));
    for (size_t i = first; i < n; i++) EXPECT(t[i] != NULL);
}

int main(void) {
    CHECK(cuInit(0));
    static const struct {
        const char *id;
        size_t n, first;
    } served[] = {
        {"6bd5fb6c5bf4e74a8987d93912fd9df9", 13, 1}, /* runtime interface */
        {"a094798c2e742e7493f20800200c0a66", 7, 1},  /* tools callback hooks */
        {"42d85a8123f6cb478298f6e78a3aecdc", 3, 1},  /* tools TLS */
        {"21318c60971432488ca641ff7324c8f2", 93, 1}, /* tools context */
        {"c693336e1121df11a8c368f355d89593", 4, 0},  /* context-local storage */
        {"263e88607cd2614392f6bbd5006dfa7e", 15, 1}, /* context checks */
        {"d4082055bde6704b8d34ba123c66e1f2", 3, 1},  /* integrity check */
    };
    for (size_t k = 0; k < sizeof served / sizeof *served; k++)
        no_null_slot(table(served[k].id), served[k].n, served[k].first);

    /* A table not served: refused, and *table cleared. */
    CUuuid unknown;
    memset(&unknown, 0x5a, sizeof unknown);
    const void *t = (const void *)1;
    EXPECT(cuGetExportTable(&t, &unknown) == CUDA_ERROR_INVALID_VALUE && t == NULL);
    EXPECT(cuGetExportTable(NULL, &unknown) == CUDA_ERROR_INVALID_VALUE);

    /* A slot whose meaning is not known: an error code, whatever it is passed. */
    const slot *rt = table("6bd5fb6c5bf4e74a8987d93912fd9df9");
    EXPECT(((CUresult(*)(void *, void *, void *))rt[3])(NULL, NULL, NULL) ==
           CUDA_ERROR_NOT_SUPPORTED);
    const slot *tc = table("21318c60971432488ca641ff7324c8f2");
    EXPECT(((CUresult(*)(void))tc[1])() == CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(((CUresult(*)(void))tc[92])() == CUDA_ERROR_NOT_SUPPORTED);

    /* Tools TLS: set and get the calling thread's context, as cuCtxSetCurrent/GetCurrent. */
    const slot *tls = table("42d85a8123f6cb478298f6e78a3aecdc");
    CUresult (*tls_set)(CUcontext) = (CUresult(*)(CUcontext))tls[1];
    CUresult (*tls_get)(CUcontext *) = (CUresult(*)(CUcontext *))tls[2];
    CUcontext none = (CUcontext)1, primary = NULL, created = NULL, got = NULL;
    CHECK(tls_get(&none));
    EXPECT(none == NULL);
    EXPECT(tls_get(NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(tls_set(primary));
    CHECK(cuCtxGetCurrent(&got));
    EXPECT(got == primary);
    CHECK(cuCtxCreate_v2(&created, 0, 0)); /* pushed: now current */
    CHECK(tls_get(&got));
    EXPECT(got == created);
    CHECK(tls_set(primary));
    CHECK(tls_get(&got));
    EXPECT(got == primary);

    /* Tools context slot 4: a context's id as cuCtxGetId (NULL: the current one's); the
     * first context made has id 1, as on NVIDIA's driver. */
    CUresult (*ctx_id)(CUcontext, uint64_t *) = (CUresult(*)(CUcontext, uint64_t *))tc[4];
    uint64_t a = 0, b = 0, cur = 0;
    unsigned long long pa = 0, pb = 0;
    CHECK(ctx_id(primary, &a));
    CHECK(ctx_id(created, &b));
    CHECK(ctx_id(NULL, &cur));
    CHECK(cuCtxGetId(primary, &pa));
    CHECK(cuCtxGetId(created, &pb));
    EXPECT(a == 1 && b == 2 && a == pa && b == pb && cur == a);
    EXPECT(ctx_id(primary, NULL) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(ctx_id((CUcontext)&a, &b) == CUDA_ERROR_INVALID_CONTEXT);

    /* cuStreamGetId: distinct ids for created streams and the two default streams. */
    CUstream s = NULL, s2 = NULL;
    unsigned long long sid = 0, sid2 = 0, legacy = 0, per_thread = 0, null_id = 0;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuStreamCreate(&s2, 0));
    CHECK(cuStreamGetId(s, &sid));
    CHECK(cuStreamGetId(s2, &sid2));
    CHECK(cuStreamGetId(CU_STREAM_LEGACY, &legacy));
    CHECK(cuStreamGetId(CU_STREAM_PER_THREAD, &per_thread));
    CHECK(cuStreamGetId(NULL, &null_id));
    EXPECT(sid != sid2 && legacy != per_thread && null_id == legacy);
    EXPECT(sid != legacy && sid != per_thread && sid2 != legacy && sid2 != per_thread);
    EXPECT(cuStreamGetId(s, NULL) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamGetId((CUstream)&a, &sid) == CUDA_ERROR_INVALID_HANDLE);

    /* Tools context slots 51 and 39, as cuBLASLt calls them before a GEMM: a stream's
     * object (the null stream's is the legacy stream's), then that object's id, which is
     * cuStreamGetId's. */
    CUresult (*stream_object)(CUcontext, CUstream, CUstream *) =
        (CUresult(*)(CUcontext, CUstream, CUstream *))tc[51];
    CUresult (*object_id)(CUcontext, CUstream, uint64_t *) =
        (CUresult(*)(CUcontext, CUstream, uint64_t *))tc[39];
    CUstream obj = NULL, null_obj = NULL;
    uint64_t oid = 0, null_oid = 0;
    CHECK(stream_object(primary, s, &obj));
    CHECK(object_id(primary, obj, &oid));
    EXPECT(oid == sid);
    CHECK(stream_object(primary, NULL, &null_obj));
    EXPECT(null_obj != NULL);
    CHECK(object_id(primary, null_obj, &null_oid));
    EXPECT(null_oid == legacy);
    EXPECT(stream_object(primary, s, NULL) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(object_id(primary, obj, NULL) == CUDA_ERROR_INVALID_VALUE);
    EXPECT(stream_object(primary, (CUstream)&a, &obj) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuStreamDestroy_v2(s2));
    EXPECT(cuStreamGetId(s, &sid) == CUDA_ERROR_INVALID_HANDLE);
    EXPECT(stream_object(primary, s, &obj) == CUDA_ERROR_INVALID_HANDLE);

    /* A destroyed context's id is refused; ids are never reused. */
    CHECK(cuCtxDestroy_v2(created));
    EXPECT(ctx_id(created, &b) == CUDA_ERROR_INVALID_CONTEXT);
    CUcontext again = NULL;
    uint64_t c = 0;
    CHECK(cuCtxCreate_v2(&again, 0, 0));
    CHECK(ctx_id(again, &c));
    EXPECT(c == 3);
    CHECK(cuCtxDestroy_v2(again));
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease_v2(0));

    return verdict();
}
