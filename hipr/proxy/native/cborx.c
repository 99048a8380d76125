/* See cborx.h. */
#include "cborx.h"

#include <stdlib.h>
#include <string.h>

void hipr_map_init(hipr_map *m, size_t capacity) {
    m->item = cbor_new_definite_map(capacity);
    m->failed = m->item == NULL;
}

void hipr_map_free(hipr_map *m) {
    if (m->item) cbor_decref(&m->item);
    m->item = NULL;
}

static void add(hipr_map *m, const char *key, cbor_item_t *value) {
    if (m->failed || !value) {
        m->failed = 1;
        if (value) cbor_decref(&value);
        return;
    }
    cbor_item_t *k = cbor_build_string(key);
    if (!k) {
        m->failed = 1;
        cbor_decref(&value);
        return;
    }
    if (!cbor_map_add(m->item, (struct cbor_pair){.key = k, .value = value})) m->failed = 1;
    /* The map holds its own references now (or failed and holds none). */
    cbor_decref(&k);
    cbor_decref(&value);
}

static cbor_item_t *build_uint(uint64_t v) { return cbor_build_uint64(v); }

void hipr_map_u64(hipr_map *m, const char *key, uint64_t value) {
    add(m, key, build_uint(value));
}

void hipr_map_str(hipr_map *m, const char *key, const char *value, size_t len) {
    add(m, key, cbor_build_stringn(value, len));
}

void hipr_map_bytes(hipr_map *m, const char *key, const void *data, size_t len) {
    /* cbor_build_bytestring copies; a zero-length string still needs a valid pointer. */
    static const unsigned char empty[1] = {0};
    add(m, key, cbor_build_bytestring(len ? (cbor_data)data : empty, len));
}

void hipr_map_u64_list(hipr_map *m, const char *key, const uint64_t *values, size_t n) {
    cbor_item_t *list = cbor_new_definite_array(n);
    if (!list) {
        m->failed = 1;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        cbor_item_t *v = build_uint(values[i]);
        if (!v || !cbor_array_push(list, v)) m->failed = 1;
        if (v) cbor_decref(&v);
    }
    add(m, key, list);
}

void hipr_map_item(hipr_map *m, const char *key, cbor_item_t *item) { add(m, key, item); }

int hipr_map_encode(hipr_map *m, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (m->failed) return -1;
    unsigned char *buf = NULL;
    size_t cap = 0;
    size_t n = cbor_serialize_alloc(m->item, &buf, &cap);
    if (!n) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

int hipr_error_code(const cbor_item_t *map, char *msg, size_t msg_size) {
    uint64_t code = 0;
    if (!map || hipr_cbor_uint(map, "code", &code) != 0 || code == 0 || code > 0x7fffffff)
        code = 999; /* hipErrorUnknown */
    if (msg && msg_size) {
        msg[0] = '\0';
        if (map) hipr_cbor_text(map, "message", msg, msg_size);
    }
    return (int)code;
}

/* libcbor allocates a container of the size its header declares before reading it: a
 * peer's 5-byte "map of 2^32 entries" would cost gigabytes. So a structure is walked first
 * without allocating: every declared count must fit in the bytes left (an item takes at
 * least one), nesting is bounded, and only definite lengths are taken (the worker's
 * encoder writes nothing else). Returns the item's end, or NULL. */
#define MAX_DEPTH 32

static const uint8_t *check_item(const uint8_t *p, const uint8_t *end, int depth) {
    if (p >= end || depth > MAX_DEPTH) return NULL;
    uint8_t type = *p >> 5, info = *p & 31;
    p++;
    uint64_t value = info;
    if (info >= 24) {
        if (info > 27) return NULL; /* reserved, or an indefinite length */
        size_t n = (size_t)1 << (info - 24);
        if ((size_t)(end - p) < n) return NULL;
        value = 0;
        for (size_t i = 0; i < n; i++) value = (value << 8) | p[i];
        p += n;
    }
    size_t left = (size_t)(end - p);
    switch (type) {
    case 0: case 1: case 7:
        return p;
    case 2: case 3:
        return value <= left ? p + value : NULL;
    case 4: case 5: {
        uint64_t items = type == 5 ? value * 2 : value;
        if (value > left || items > left) return NULL;
        for (uint64_t i = 0; i < items && p; i++) p = check_item(p, end, depth + 1);
        return p;
    }
    default: /* 6: a tag, then one item */
        return check_item(p, end, depth + 1);
    }
}

int hipr_cbor_check(const uint8_t *data, size_t len) {
    return len && check_item(data, data + len, 0) == data + len ? 0 : -1;
}

cbor_item_t *hipr_cbor_load(const uint8_t *data, size_t len) {
    struct cbor_load_result result;
    if (!len || hipr_cbor_check(data, len) != 0) return NULL;
    cbor_item_t *item = cbor_load(data, len, &result);
    if (!item) return NULL;
    if (result.error.code != CBOR_ERR_NONE || result.read != len) {
        cbor_decref(&item);
        return NULL;
    }
    return item;
}

cbor_item_t *hipr_cbor_get(const cbor_item_t *map, const char *key) {
    if (!map || !cbor_isa_map(map)) return NULL;
    size_t klen = strlen(key);
    size_t n = cbor_map_size(map);
    struct cbor_pair *pairs = cbor_map_handle(map);
    for (size_t i = 0; i < n; i++) {
        cbor_item_t *k = pairs[i].key;
        if (cbor_isa_string(k) && cbor_string_is_definite(k) && cbor_string_length(k) == klen &&
            memcmp(cbor_string_handle(k), key, klen) == 0)
            return pairs[i].value;
    }
    return NULL;
}

int hipr_cbor_uint(const cbor_item_t *map, const char *key, uint64_t *out) {
    cbor_item_t *v = hipr_cbor_get(map, key);
    if (!v || !cbor_isa_uint(v)) return -1;
    *out = cbor_get_int(v);
    return 0;
}

int hipr_cbor_int(const cbor_item_t *map, const char *key, int64_t *out) {
    cbor_item_t *v = hipr_cbor_get(map, key);
    if (!v) return -1;
    if (cbor_isa_uint(v)) {
        uint64_t u = cbor_get_int(v);
        if (u > INT64_MAX) return -1;
        *out = (int64_t)u;
        return 0;
    }
    if (cbor_isa_negint(v)) {
        uint64_t u = cbor_get_int(v);
        if (u > INT64_MAX) return -1;
        *out = -1 - (int64_t)u;
        return 0;
    }
    return -1;
}

int hipr_cbor_float(const cbor_item_t *map, const char *key, double *out) {
    cbor_item_t *v = hipr_cbor_get(map, key);
    if (!v) return -1;
    if (cbor_isa_float_ctrl(v) && cbor_float_ctrl_is_ctrl(v) == false) {
        *out = cbor_float_get_float(v);
        return 0;
    }
    int64_t i;
    if (hipr_cbor_int(map, key, &i) == 0) {
        *out = (double)i;
        return 0;
    }
    return -1;
}

int hipr_cbor_text(const cbor_item_t *map, const char *key, char *buf, size_t size) {
    cbor_item_t *v = hipr_cbor_get(map, key);
    if (!v || !size) return -1;
    const unsigned char *data;
    size_t n;
    if (cbor_isa_string(v) && cbor_string_is_definite(v)) {
        data = cbor_string_handle(v);
        n = cbor_string_length(v);
    } else if (cbor_isa_bytestring(v) && cbor_bytestring_is_definite(v)) {
        data = cbor_bytestring_handle(v);
        n = cbor_bytestring_length(v);
    } else {
        return -1;
    }
    if (n > size - 1) n = size - 1;
    if (n) memcpy(buf, data, n);
    buf[n] = '\0';
    return 0;
}
