/* Feeds the proxy core's decoder (hipr/proxy/native/wire.c and cborx.c, compiled in)
 * well-formed, malformed, truncated and oversized reply frames, in pieces of random size,
 * then reads every decoded frame's CBOR part as the client does (error maps, fields).
 * Half the streams are read as the client reads large replies: into the decoder's own
 * buffer (hipr_wire_space/commit) with frame heads handed out early
 * (hipr_wire_next_head) and their bulk read straight into a destination. The resend log
 * (ack, rewind after RESUME) is checked against a model, and the data links' chunk heads
 * (hipr_chunk_head, hipr_chunk_offset) written, parsed back and damaged.
 * Deterministic for a seed; run under ASan/UBSan by tests/proxy/test_native_c.py.
 * Usage: fuzz_wire ITERATIONS SEED. Prints "ok" and the counts when nothing failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cborx.h"
#include "wire.h"

#include "xorshift.h"

#include "check.h"
/* A random CBOR map: a reply as the worker sends it (or an error map). */
static int random_map(uint8_t **out, size_t *len) {
    static const char *const keys[] = {"code", "kind", "message", "ptr", "count", "ms",
                                       "details", "done", "offsets", "x"};
    hipr_map m;
    size_t n = below(6);
    hipr_map_init(&m, n);
    for (size_t i = 0; i < n; i++) {
        const char *k = keys[below(10)];
        switch (below(5)) {
        case 0: hipr_map_u64(&m, k, next()); break;
        case 1: hipr_map_str(&m, k, "some text\nlog", below(14)); break;
        case 2: {
            uint8_t b[40];
            for (size_t j = 0; j < sizeof b; j++) b[j] = (uint8_t)next();
            hipr_map_bytes(&m, k, b, below(sizeof b));
            break;
        }
        case 3: {
            uint64_t v[5] = {next(), 1, 2, next() % 4096, 8};
            hipr_map_u64_list(&m, k, v, below(6));
            break;
        }
        default: hipr_map_item(&m, k, cbor_build_float8((double)next() / 7.0));
        }
    }
    int rc = hipr_map_encode(&m, out, len);
    hipr_map_free(&m);
    return rc;
}

/* Read a decoded frame's CBOR part the ways the client does. */
static void read_frame(const hipr_frame *f) {
    cbor_item_t *map = hipr_cbor_load(f->cbor, f->cbor_len);
    char msg[64];
    int code = hipr_error_code(map, msg, sizeof msg);
    EXPECT(code > 0);
    EXPECT(strlen(msg) < sizeof msg);
    uint64_t u;
    int64_t i;
    double d;
    char text[16];
    (void)hipr_cbor_uint(map, "ptr", &u);
    (void)hipr_cbor_int(map, "count", &i);
    (void)hipr_cbor_float(map, "ms", &d);
    (void)hipr_cbor_text(map, "kind", text, sizeof text);
    cbor_item_t *details = hipr_cbor_get(map, "details");
    if (details) (void)hipr_cbor_int(details, "rtc_result", &i);
    if (map) cbor_decref(&map);
}

/* The resend log against a model: requests (some with DATA continuations, some
 * fire-and-forget) are logged and sent, a reply acknowledges a prefix, RESUME says what
 * ran; what the log sends again must be exactly the requests the worker may not have
 * run, in order, with their bytes. */
static long check_resend_log(long rounds) {
    long done = 0;
    for (long r = 0; r < rounds; r++) {
        hipr_wire w;
        hipr_wire_init(&w, 1 << 20);
        enum { MAX = 40 };
        uint32_t ids[MAX], flags[MAX];
        size_t bulk[MAX];
        size_t n = 1 + below(MAX - 1);
        uint32_t base = (uint32_t)next(); /* ids wrap: start anywhere */
        size_t sent_upto = below(n + 1); /* requests [0, sent_upto) went out */
        uint8_t data[200];
        for (size_t j = 0; j < sizeof data; j++) data[j] = (uint8_t)(j * 7);
        for (size_t k = 0; k < n; k++) {
            ids[k] = base + (uint32_t)k;
            if (!ids[k]) ids[k] = base = base + 1, ids[k] = base + (uint32_t)k;
            flags[k] = below(2) ? HIPR_F_NO_REPLY : 0;
            bulk[k] = below(3) ? 0 : below(sizeof data);
            size_t first = bulk[k] > 50 ? 50 : bulk[k];
            EXPECT(hipr_wire_put(&w, 0x0210, ids[k], flags[k] | (first < bulk[k] ? HIPR_F_MORE : 0),
                                 (const uint8_t *)"\xa0", 1, data, first) == HIPR_WIRE_OK);
            if (first < bulk[k])
                EXPECT(hipr_wire_put(&w, HIPR_OP_DATA, ids[k], 0, NULL, 0, data + first,
                                     bulk[k] - first) == HIPR_WIRE_OK);
            if (k + 1 == sent_upto) {
                size_t len;
                hipr_wire_output(&w, &len);
                hipr_wire_sent(&w, len);
            }
        }
        /* A reply to a request that went out acknowledges it and all before it. */
        size_t acked = sent_upto ? below(sent_upto + 1) : 0; /* requests [0, acked) */
        if (acked) hipr_wire_ack(&w, ids[acked - 1]);
        size_t ran = acked + below(sent_upto - acked + 1); /* the worker ran [0, ran) */
        int resume = (int)below(2);
        if (resume) hipr_wire_rewind(&w, ran ? ids[ran - 1] : base - 1);
        /* Decode what the log sends now. */
        size_t len;
        const uint8_t *out = hipr_wire_output(&w, &len);
        hipr_wire dec;
        hipr_wire_init(&dec, 1 << 20);
        EXPECT(hipr_wire_feed(&dec, out, len) == HIPR_WIRE_OK);
        size_t k = resume ? acked : sent_upto;
        hipr_frame f;
        size_t got_bulk = 0;
        uint32_t current = 0;
        size_t prev = n;
        int rc;
        while ((rc = hipr_wire_next(&dec, &f)) == 1) {
            if (f.opcode == HIPR_OP_DATA) {
                EXPECT(f.request_id == current);
            } else {
                while (resume && k < ran && (flags[k] & HIPR_F_NO_REPLY)) k++;
                EXPECT(k < n && f.request_id == ids[k < n ? k : 0]);
                if (prev < n) EXPECT(got_bulk == bulk[prev]);
                current = f.request_id;
                got_bulk = 0;
                prev = k;
                k++;
            }
            for (size_t j = 0; j < f.bulk_len; j++) EXPECT(f.bulk[j] == data[got_bulk + j]);
            got_bulk += f.bulk_len;
        }
        EXPECT(rc == 0);
        if (prev < n) EXPECT(got_bulk == bulk[prev]);
        while (resume && k < ran && (flags[k] & HIPR_F_NO_REPLY)) k++;
        EXPECT(k == n);
        /* Acknowledging everything empties the log. */
        hipr_wire_sent(&w, len);
        hipr_wire_ack(&w, ids[n - 1]);
        EXPECT(hipr_wire_logged_bytes(&w) == 0);
        hipr_wire_free(&dec);
        hipr_wire_free(&w);
        done++;
    }
    return done;
}

/* Data links' chunk frames (protocol 1.4): a written chunk's head and {offset} parse back
 * to what was written; the same bytes damaged (flipped, truncated, a CBOR head of every
 * width, a payload near 2^64) never read past their length and are refused or give a
 * value that the bytes say. Returns the chunks parsed back. */
static long check_chunks(long iterations) {
    long parsed = 0;
    for (long it = 0; it < iterations; it++) {
        uint64_t offset = next() >> below(64);
        uint8_t args[HIPR_CHUNK_ARGS_MAX];
        size_t alen = hipr_chunk_args(args, offset);
        EXPECT(alen >= 9 && alen <= HIPR_CHUNK_ARGS_MAX);
        uint64_t bulk_len = below(1 << 20);
        uint32_t id = (uint32_t)next(), flags = below(2) ? HIPR_F_REPLY : 0;
        uint8_t head[HIPR_HEADER_SIZE + 4];
        EXPECT(hipr_wire_head(head, HIPR_OP_DATA, id, flags, alen, bulk_len) == sizeof head);
        uint32_t rid = 0;
        size_t got_args = 0;
        uint64_t got_bulk = 0, got_offset = 0;
        EXPECT(hipr_chunk_head(head, flags, &rid, &got_args, &got_bulk) == 0);
        EXPECT(rid == id && got_args == alen && got_bulk == bulk_len);
        EXPECT(hipr_chunk_head(head, flags ^ HIPR_F_REPLY, &rid, &got_args, &got_bulk) != 0);
        EXPECT(hipr_chunk_offset(args, alen, &got_offset) == 0 && got_offset == offset);
        parsed++;
        /* Damaged: each parser reads only the bytes it is given (ASan checks that), and
         * a head it takes still says a payload long enough for its CBOR part. */
        uint8_t bad[HIPR_HEADER_SIZE + 4];
        memcpy(bad, head, sizeof bad);
        for (size_t j = 0, n = 1 + below(4); j < n; j++)
            bad[below(sizeof bad)] ^= (uint8_t)(1 + below(255));
        if (below(4) == 0)
            for (int j = 16; j < 24; j++) bad[j] = 0xff;
        if (hipr_chunk_head(bad, flags, &rid, &got_args, &got_bulk) == 0)
            EXPECT(got_args >= 1 && got_args <= HIPR_CHUNK_ARGS_MAX);
        size_t cut = below(alen + 1);
        uint8_t *piece = malloc(cut ? cut : 1);
        memcpy(piece, args, cut);
        int flipped = cut && below(2);
        if (flipped) piece[below(cut)] ^= (uint8_t)(1 + below(255));
        /* Cut short and intact, only the whole part parses (and to the same value). */
        if (hipr_chunk_offset(piece, cut, &got_offset) == 0 && !flipped)
            EXPECT(cut == alen && got_offset == offset);
        free(piece);
    }
    return parsed;
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 1000;
    state = argc > 2 ? strtoull(argv[2], NULL, 10) | 1 : 88172645463325252ull;
    long frames = 0, broken = 0, roundtrips = 0;
    /* Headers that declare more than the bytes that follow are refused before libcbor
     * allocates for them: a map of 2^32 pairs, a string of 2^40 bytes, deep nesting. */
    static const uint8_t huge_map[] = {0xbb, 0, 0, 0, 1, 0, 0, 0, 0};
    static const uint8_t huge_text[] = {0x7b, 0, 0, 1, 0, 0, 0, 0, 0, 'a'};
    uint8_t deep[100];
    memset(deep, 0x81, sizeof deep); /* [[[[...]]]] */
    deep[sizeof deep - 1] = 0x00;
    EXPECT(hipr_cbor_load(huge_map, sizeof huge_map) == NULL);
    EXPECT(hipr_cbor_load(huge_text, sizeof huge_text) == NULL);
    EXPECT(hipr_cbor_load(deep, sizeof deep) == NULL);
    static const uint8_t ok_map[] = {0xa1, 0x64, 'c', 'o', 'd', 'e', 0x18, 101};
    cbor_item_t *okm = hipr_cbor_load(ok_map, sizeof ok_map);
    EXPECT(okm != NULL && hipr_error_code(okm, NULL, 0) == 101);
    if (okm) cbor_decref(&okm);
    for (long it = 0; it < iterations; it++) {
        /* Build a stream of 1-4 frames with the encoder, then damage it (or not). */
        hipr_wire enc;
        hipr_wire_init(&enc, 1 << 20);
        size_t count = 1 + below(4);
        uint16_t ops[4];
        size_t bulks[4];
        for (size_t k = 0; k < count; k++) {
            uint8_t *cbor = NULL;
            size_t cbor_len = 0;
            if (below(4) && random_map(&cbor, &cbor_len) != 0) cbor_len = 0;
            uint8_t bulk[300];
            for (size_t j = 0; j < sizeof bulk; j++) bulk[j] = (uint8_t)j;
            bulks[k] = below(4) ? 0 : below(sizeof bulk);
            ops[k] = (uint16_t)next();
            EXPECT(hipr_wire_put(&enc, ops[k], (uint32_t)next(), (uint32_t)below(16), cbor,
                                 cbor_len, bulk, bulks[k]) == HIPR_WIRE_OK);
            free(cbor);
        }
        size_t len;
        const uint8_t *wire = hipr_wire_output(&enc, &len);
        uint8_t *data = malloc(len + 64);
        memcpy(data, wire, len);
        int damage = (int)below(6);
        switch (damage) {
        case 1: /* flip bytes anywhere */
            for (size_t j = 0, n = 1 + below(8); j < n; j++) data[below(len)] ^= (uint8_t)(1 + below(255));
            break;
        case 2: /* truncated */
            len = below(len);
            break;
        case 3: /* oversized payload length */
            for (int j = 16; j < 24; j++) data[j] = 0xff;
            break;
        case 4: /* a CBOR length that overruns the payload */
            if (len >= 28) data[24 + below(4)] = 0xff;
            break;
        case 5: /* garbage appended */
            for (size_t j = 0; j < 64; j++) data[len + j] = (uint8_t)next();
            len += 64;
            break;
        }
        /* Decode, fed in random pieces; or read as the client reads (direct). */
        hipr_wire dec;
        hipr_wire_init(&dec, 1 << 20);
        size_t off = 0, got_frames = 0;
        int stream_broken = 0;
        int direct = (int)below(2);
        while (off < len && !stream_broken) {
            size_t piece = 1 + below(len - off);
            if (direct) {
                size_t room;
                uint8_t *space = hipr_wire_space(&dec, piece, &room);
                EXPECT(space != NULL && room >= piece);
                if (!space) break;
                memcpy(space, data + off, piece);
                hipr_wire_commit(&dec, piece);
            } else {
                EXPECT(hipr_wire_feed(&dec, data + off, piece) == HIPR_WIRE_OK);
            }
            off += piece;
            hipr_frame f;
            int rc;
            size_t rest = 0;
            while ((rc = direct ? hipr_wire_next_head(&dec, &f, 1 + below(200), &rest)
                                : hipr_wire_next(&dec, &f)) >= 1) {
                uint8_t whole[400];
                size_t bulk_len = f.bulk_len;
                EXPECT(f.cbor_len + f.bulk_len <= len);
                if (rc == 2) {
                    /* The rest of the bulk straight from the "socket". */
                    EXPECT(rest > 0);
                    if (rest > len - off || f.bulk_len + rest > sizeof whole) {
                        hipr_wire_skip_rest(&dec);
                        off = len;
                        break;
                    }
                    if (f.bulk_len) memcpy(whole, f.bulk, f.bulk_len);
                    memcpy(whole + f.bulk_len, data + off, rest);
                    off += rest;
                    bulk_len += rest;
                } else {
                    if (f.bulk_len && f.bulk_len <= sizeof whole) memcpy(whole, f.bulk, f.bulk_len);
                }
                read_frame(&f);
                if (damage == 0 && got_frames < count) {
                    EXPECT(f.opcode == ops[got_frames]);
                    EXPECT(bulk_len == bulks[got_frames]);
                    for (size_t j = 0; j < bulk_len && j < sizeof whole; j++)
                        EXPECT(whole[j] == (uint8_t)j);
                }
                if (rc == 2) hipr_wire_skip_rest(&dec);
                got_frames++;
                frames++;
            }
            if (rc < 0) {
                stream_broken = 1;
                broken++;
                EXPECT(dec.error[0] != '\0');
            }
        }
        if (damage == 0) {
            EXPECT(got_frames == count && !stream_broken);
            roundtrips++;
        }
        if (damage == 3) EXPECT(stream_broken);
        hipr_wire_free(&dec);
        hipr_wire_free(&enc);
        free(data);

        /* Raw CBOR garbage straight into the reply readers. */
        uint8_t junk[48];
        size_t jl = below(sizeof junk);
        for (size_t j = 0; j < jl; j++) junk[j] = (uint8_t)next();
        hipr_frame f = {.cbor = junk, .cbor_len = jl};
        read_frame(&f);
    }
    long logs = check_resend_log(iterations / 4 + 1);
    long chunks = check_chunks(iterations);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("ok %ld iterations, %ld frames decoded, %ld broken streams, %ld clean round trips, "
           "%ld resend logs, %ld chunk heads\n",
           iterations, frames, broken, roundtrips, logs, chunks);
    return 0;
}
