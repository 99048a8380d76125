/* The frames an unmodified program sends most are launches (every PyTorch kernel, and
 * the fused launch + synchronize of its small ops). Built as libcbor items (hipr_map) each
 * costs a dozen allocations, their encoding and their release: microseconds between the
 * program's call and the request's send (benchmarks/proxy/stages.py, HIPR_PROXY_MARKS).
 * Here the same map is written straight into the caller's buffer. */
#include "launch_cbor.h"

#include <string.h>

#include "wire.h"

typedef struct {
    uint8_t *p, *end;
    int ok;
} writer;

/* A CBOR head in its shortest form (hipr_cbor_head), or the writer's end. */
static void head(writer *w, unsigned major, uint64_t value) {
    uint8_t bytes[9];
    size_t n = hipr_cbor_head(bytes, major, value);
    if (!w->ok || (size_t)(w->end - w->p) < n) {
        w->ok = 0;
        return;
    }
    memcpy(w->p, bytes, n);
    w->p += n;
}

static void raw(writer *w, const void *data, size_t len) {
    if (!w->ok || (size_t)(w->end - w->p) < len) {
        w->ok = 0;
        return;
    }
    if (len) memcpy(w->p, data, len);
    w->p += len;
}

enum { UINT = 0, BYTES = 2, TEXT = 3, ARRAY = 4, MAP = 5 };

static void key(writer *w, const char *name) {
    size_t len = strlen(name);
    head(w, TEXT, len);
    raw(w, name, len);
}

static void uints(writer *w, const char *name, const uint64_t *values, size_t n) {
    key(w, name);
    head(w, ARRAY, n);
    for (size_t i = 0; i < n; i++) head(w, UINT, values[i]);
}

size_t hipr_launch_cbor(uint8_t *out, size_t room, const hipr_launch_config *c,
                        const uint8_t *args, const uint16_t *lens, size_t count, int synchronize) {
    if (!count || c->n_ptrs > sizeof c->ptrs / sizeof c->ptrs[0]) return 0;
    writer w = {out, out + room, 1};
    head(&w, MAP, 6 + (c->stream != 0) + (synchronize != 0));
    key(&w, "function");
    head(&w, UINT, c->function);
    uints(&w, "grid", c->grid, 3);
    uints(&w, "block", c->block, 3);
    key(&w, "shared_mem");
    head(&w, UINT, c->shared_mem);
    if (c->stream) {
        key(&w, "stream");
        head(&w, UINT, c->stream);
    }
    uints(&w, "ptrs", c->ptrs, c->n_ptrs);
    key(&w, "args");
    if (count > 1) head(&w, ARRAY, count);
    for (size_t i = 0; i < count; i++) {
        head(&w, BYTES, lens[i]);
        raw(&w, args, lens[i]);
        args += lens[i];
    }
    if (synchronize) {
        key(&w, "synchronize");
        raw(&w, "\xf5", 1); /* true */
    }
    return w.ok ? (size_t)(w.p - out) : 0;
}
