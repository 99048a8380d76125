/* The launch maps the proxy writes straight into a buffer (hipr/proxy/native/launch_cbor.c,
 * compiled in) against the same maps built with libcbor (cborx.c's hipr_map, as the proxy
 * built them before): random configurations (integers of every width, with and without a
 * stream, 0 to 256 pointers), one launch or many (argument lengths 0 to 4096), with and
 * without "synchronize". Each encoding must decode to exactly the libcbor map's keys and
 * values, in its order; every room smaller than the encoding must be refused without a
 * byte written past it (each try in a buffer of exactly that size, under ASan).
 * Deterministic for a seed; run under ASan/UBSan by tests/proxy/test_native_c.py.
 * Usage: launch_cbor_check ITERATIONS SEED. Prints "ok" when nothing failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cborx.h"
#include "launch_cbor.h"

#include "check.h"

#include "xorshift.h"

/* An integer whose shortest CBOR form is any of the five. */
static uint64_t any_width(void) {
    static const uint64_t edges[] = {0,     1,          23,         24,          255,
                                     256,   65535,      65536,      0xffffffffu, 1ull << 32,
                                     ~0ull, 0x7f00ff00, 0xdeadbeef, 1ull << 47};
    return below(3) ? edges[below(sizeof edges / sizeof edges[0])] : next() >> below(64);
}

/* The map as the proxy built it with libcbor before launch_cbor.c (client.c's
 * hipr_map_launch_config, then the arguments). */
static int with_libcbor(const hipr_launch_config *c, const uint8_t *args, const uint16_t *lens,
                        size_t count, int synchronize, uint8_t **out, size_t *len) {
    hipr_map m;
    hipr_map_init(&m, 8);
    hipr_map_u64(&m, "function", c->function);
    hipr_map_u64_list(&m, "grid", c->grid, 3);
    hipr_map_u64_list(&m, "block", c->block, 3);
    hipr_map_u64(&m, "shared_mem", c->shared_mem);
    if (c->stream) hipr_map_u64(&m, "stream", c->stream);
    hipr_map_u64_list(&m, "ptrs", c->ptrs, c->n_ptrs);
    if (count == 1) {
        hipr_map_bytes(&m, "args", args, lens[0]);
    } else {
        cbor_item_t *list = cbor_new_definite_array(count);
        for (size_t i = 0; list && i < count; i++) {
            cbor_item_t *b = cbor_build_bytestring(args, lens[i]);
            if (!b || !cbor_array_push(list, b)) m.failed = 1;
            if (b) cbor_decref(&b);
            args += lens[i];
        }
        if (!list) m.failed = 1;
        else hipr_map_item(&m, "args", list);
    }
    if (synchronize) hipr_map_item(&m, "synchronize", cbor_build_bool(true));
    int rc = hipr_map_encode(&m, out, len);
    hipr_map_free(&m);
    return rc;
}

/* Two decoded items equal in type, value and (for maps) key order. */
static int same(const cbor_item_t *a, const cbor_item_t *b) {
    if (cbor_typeof(a) != cbor_typeof(b)) return 0;
    switch (cbor_typeof(a)) {
    case CBOR_TYPE_UINT: return cbor_get_int(a) == cbor_get_int(b);
    case CBOR_TYPE_BYTESTRING:
    case CBOR_TYPE_STRING: {
        size_t n = cbor_typeof(a) == CBOR_TYPE_STRING ? cbor_string_length(a)
                                                      : cbor_bytestring_length(a);
        size_t m = cbor_typeof(b) == CBOR_TYPE_STRING ? cbor_string_length(b)
                                                      : cbor_bytestring_length(b);
        const unsigned char *pa = cbor_typeof(a) == CBOR_TYPE_STRING ? cbor_string_handle(a)
                                                                     : cbor_bytestring_handle(a);
        const unsigned char *pb = cbor_typeof(b) == CBOR_TYPE_STRING ? cbor_string_handle(b)
                                                                     : cbor_bytestring_handle(b);
        return n == m && (n == 0 || memcmp(pa, pb, n) == 0);
    }
    case CBOR_TYPE_ARRAY: {
        size_t n = cbor_array_size(a);
        if (n != cbor_array_size(b)) return 0;
        for (size_t i = 0; i < n; i++) {
            cbor_item_t *x = cbor_array_get(a, i), *y = cbor_array_get(b, i);
            int ok = x && y && same(x, y);
            if (x) cbor_decref(&x);
            if (y) cbor_decref(&y);
            if (!ok) return 0;
        }
        return 1;
    }
    case CBOR_TYPE_MAP: {
        size_t n = cbor_map_size(a);
        if (n != cbor_map_size(b)) return 0;
        struct cbor_pair *pa = cbor_map_handle(a), *pb = cbor_map_handle(b);
        for (size_t i = 0; i < n; i++)
            if (!same(pa[i].key, pb[i].key) || !same(pa[i].value, pb[i].value)) return 0;
        return 1;
    }
    case CBOR_TYPE_FLOAT_CTRL: return cbor_get_bool(a) == cbor_get_bool(b);
    default: return 0;
    }
}

static void one_case(void) {
    static hipr_launch_config c;
    static uint8_t args[16 * 4096];
    uint16_t lens[16];
    memset(&c, 0, sizeof c);
    c.function = any_width();
    for (int i = 0; i < 3; i++) {
        c.grid[i] = any_width();
        c.block[i] = any_width();
    }
    c.shared_mem = any_width();
    c.stream = below(2) ? any_width() : 0;
    c.n_ptrs = below(4) ? below(8) : below(257);
    for (size_t i = 0; i < c.n_ptrs; i++) c.ptrs[i] = any_width();
    size_t count = below(3) ? 1 : 1 + below(16);
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        lens[i] = (uint16_t)(below(8) ? below(600) : below(4097));
        for (size_t k = 0; k < lens[i]; k++) args[used + k] = (uint8_t)next();
        used += lens[i];
    }
    int synchronize = (int)below(2);

    size_t room = HIPR_LAUNCH_CBOR_ROOM(used, count);
    uint8_t *direct = malloc(room);
    EXPECT(direct != NULL);
    if (!direct) return;
    size_t n = hipr_launch_cbor(direct, room, &c, args, lens, count, synchronize);
    EXPECT(n > 0);
    uint8_t *reference = NULL;
    size_t reference_len = 0;
    EXPECT(with_libcbor(&c, args, lens, count, synchronize, &reference, &reference_len) == 0);
    cbor_item_t *mine = n ? hipr_cbor_load(direct, n) : NULL;
    cbor_item_t *theirs = reference ? hipr_cbor_load(reference, reference_len) : NULL;
    EXPECT(mine && theirs && same(mine, theirs));
    EXPECT(n <= reference_len); /* shortest integers: never longer than libcbor's */
    if (mine) cbor_decref(&mine);
    if (theirs) cbor_decref(&theirs);
    free(reference);

    /* Every room short of the encoding is refused, nothing written past it. */
    size_t shorter[] = {0, 1, n / 2, n - 1, below(n)};
    for (size_t i = 0; n && i < sizeof shorter / sizeof shorter[0]; i++) {
        uint8_t *tight = malloc(shorter[i] ? shorter[i] : 1);
        EXPECT(tight != NULL);
        if (tight) {
            EXPECT(hipr_launch_cbor(tight, shorter[i], &c, args, lens, count, synchronize) == 0);
            free(tight);
        }
    }
    /* Exactly enough room is enough, and gives the same bytes. */
    uint8_t *exact = malloc(n ? n : 1);
    EXPECT(exact != NULL);
    if (exact) {
        EXPECT(hipr_launch_cbor(exact, n, &c, args, lens, count, synchronize) == n);
        EXPECT(memcmp(exact, direct, n) == 0);
        free(exact);
    }
    free(direct);
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 2000;
    state = argc > 2 ? strtoull(argv[2], NULL, 10) * 2654435761u + 1 : 88172645463325252ull;
    for (long i = 0; i < iterations; i++) one_case();
    /* No launch, or more pointers than a configuration holds: nothing to write. */
    static hipr_launch_config c;
    uint8_t buf[64];
    uint16_t len = 0;
    EXPECT(hipr_launch_cbor(buf, sizeof buf, &c, buf, &len, 0, 1) == 0);
    c.n_ptrs = 257;
    EXPECT(hipr_launch_cbor(buf, sizeof buf, &c, buf, &len, 1, 1) == 0);
    return verdict();
}
