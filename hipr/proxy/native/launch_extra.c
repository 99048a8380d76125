#include "launch_extra.h"

#include <string.h>

#include "cborx.h"
#include "client.h"
#include "opcodes.h"

int hipr_launch_extra(void **extra, const void *end, size_t max, const void **args, size_t *len) {
    const void *p = NULL;
    size_t size = 0;
    int have_size = 0;
    for (size_t i = 0; extra[i] != end; i += 2) {
        if (i >= 64) return -1;
        if (extra[i] == (void *)0x01) p = extra[i + 1];
        else if (extra[i] == (void *)0x02 && extra[i + 1]) {
            memcpy(&size, extra[i + 1], sizeof size);
            have_size = 1;
        } else return -1;
    }
    if (!have_size || (size && !p) || size > max) return -1;
    *args = p;
    *len = size;
    return 0;
}

/* A reply's list of small non-negative integers (at most HIPR_MAX_PARAMS of them, each at
 * most HIPR_MAX_ARGS_BYTES); -1 when absent or otherwise. */
static int read_list(const cbor_item_t *map, const char *key, uint32_t *out, size_t *n) {
    cbor_item_t *list = hipr_cbor_get(map, key);
    if (!list || !cbor_isa_array(list) || cbor_array_size(list) > HIPR_MAX_PARAMS) return -1;
    *n = cbor_array_size(list);
    for (size_t i = 0; i < *n; i++) {
        cbor_item_t *v = cbor_array_get(list, i);
        int bad = !v || !cbor_isa_uint(v) || cbor_get_int(v) > HIPR_MAX_ARGS_BYTES;
        if (!bad) out[i] = (uint32_t)cbor_get_int(v);
        if (v) cbor_decref(&v);
        if (bad) return -1;
    }
    return 0;
}

void hipr_param_layout_fetch(int device, uint64_t function, hipr_param_layout *out) {
    memset(out, 0, sizeof *out);
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "function", function);
    hipr_reply r;
    int rc = hipr_call(device, OP_FUNCTION_PARAMS, &m, NULL, 0, NULL, 0, &r);
    uint32_t ptrs[HIPR_MAX_PARAMS];
    size_t n = 0, n2 = 0, np = 0;
    int ok = rc == 0 && read_list(r.map, "offsets", out->offsets, &n) == 0 &&
             read_list(r.map, "sizes", out->sizes, &n2) == 0 && n == n2 &&
             read_list(r.map, "pointers", ptrs, &np) == 0;
    hipr_reply_free(&r);
    for (size_t i = 0; ok && i < n; i++) {
        size_t end = (size_t)out->offsets[i] + out->sizes[i];
        if (end > HIPR_MAX_ARGS_BYTES || out->sizes[i] == 0) ok = 0;
        else if (end > out->args_size) out->args_size = end;
    }
    for (size_t i = 0; ok && i < np; i++) {
        if (ptrs[i] >= n) ok = 0;
        else out->is_pointer[ptrs[i]] = 1;
    }
    if (!ok) memset(out, 0, sizeof *out);
    out->n_params = ok ? n : 0;
    out->known = ok ? 1 : -1;
}

int hipr_param_layout_pack(const hipr_param_layout *layout, void **params, uint8_t *buf,
                           size_t *len) {
    if (layout->n_params && !params) return -1;
    memset(buf, 0, layout->args_size);
    for (size_t i = 0; i < layout->n_params; i++) {
        if (!params[i]) return -1;
        memcpy(buf + layout->offsets[i], params[i], layout->sizes[i]);
    }
    *len = layout->args_size;
    return 0;
}
