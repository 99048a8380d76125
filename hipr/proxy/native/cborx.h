/* Small helpers over libcbor: build a request map key by key (a failed allocation is
 * remembered and reported once, at encoding), and read fields of a reply map. */
#ifndef HIPR_CBORX_H
#define HIPR_CBORX_H

#include <cbor.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hipr_map {
    cbor_item_t *item;
    int failed;
} hipr_map;

void hipr_map_init(hipr_map *m, size_t capacity);
void hipr_map_free(hipr_map *m);
void hipr_map_u64(hipr_map *m, const char *key, uint64_t value);
void hipr_map_str(hipr_map *m, const char *key, const char *value, size_t len);
void hipr_map_bytes(hipr_map *m, const char *key, const void *data, size_t len);
void hipr_map_u64_list(hipr_map *m, const char *key, const uint64_t *values, size_t n);
/* Takes ownership of `list` (an array item) whatever happens. */
void hipr_map_item(hipr_map *m, const char *key, cbor_item_t *list);
/* The map's CBOR encoding (malloc'd; the caller frees it); -1 on any earlier failure. */
int hipr_map_encode(hipr_map *m, uint8_t **out, size_t *len);

/* 0 when `data` is exactly one CBOR item of definite lengths whose declared sizes fit in
 * it (checked before libcbor allocates anything), else -1. */
int hipr_cbor_check(const uint8_t *data, size_t len);
/* Decoding: a whole CBOR item from `data`, NULL when malformed or trailing bytes follow. */
cbor_item_t *hipr_cbor_load(const uint8_t *data, size_t len);
/* The value of text key `key` in map `map`, or NULL. */
cbor_item_t *hipr_cbor_get(const cbor_item_t *map, const char *key);
/* 0 on success, -1 when absent or of another type. */
int hipr_cbor_uint(const cbor_item_t *map, const char *key, uint64_t *out);
int hipr_cbor_int(const cbor_item_t *map, const char *key, int64_t *out);
int hipr_cbor_float(const cbor_item_t *map, const char *key, double *out);
/* Copies a text or byte string into buf (NUL-terminated, truncated to size-1). */
int hipr_cbor_text(const cbor_item_t *map, const char *key, char *buf, size_t size);

/* The hipError_t of an error map {code, kind, message, details?} (hipErrorUnknown when
 * it has none or is malformed; `map` may be NULL), its message copied into msg. */
int hipr_error_code(const cbor_item_t *map, char *msg, size_t msg_size);

#endif
