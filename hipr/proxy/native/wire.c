/* Frame encoding and incremental decoding; see wire.h. */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void hipr_wire_init(hipr_wire *w, uint64_t max_payload) {
    memset(w, 0, sizeof *w);
    w->max_payload = max_payload;
    w->next_id = 1;
}

void hipr_wire_free(hipr_wire *w) {
    free(w->out);
    free(w->in);
    uint32_t next = w->next_id;
    uint64_t max = w->max_payload;
    hipr_wire_init(w, max);
    w->next_id = next;
}

void hipr_wire_reset(hipr_wire *w) {
    w->out_len = 0;
    w->in_len = w->in_off = w->in_taken = 0;
    w->queued_no_reply = 0;
    w->broken = 0;
    w->error[0] = '\0';
}

uint32_t hipr_wire_take_id(hipr_wire *w) {
    uint32_t id = w->next_id++;
    if (w->next_id == 0) w->next_id = 1;
    return id;
}

static int reserve(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return HIPR_WIRE_OK;
    size_t cap2 = *cap ? *cap : 4096;
    while (cap2 < need) {
        if (cap2 > SIZE_MAX / 2) return HIPR_WIRE_NOMEM;
        cap2 *= 2;
    }
    uint8_t *p = realloc(*buf, cap2);
    if (!p) return HIPR_WIRE_NOMEM;
    *buf = p;
    *cap = cap2;
    return HIPR_WIRE_OK;
}

int hipr_wire_put(hipr_wire *w, uint16_t opcode, uint32_t request_id, uint32_t flags,
                  const uint8_t *cbor, size_t cbor_len, const void *bulk, size_t bulk_len) {
    int has_payload = cbor_len || bulk_len;
    size_t payload = has_payload ? 4 + cbor_len + bulk_len : 0;
    if (cbor_len > UINT32_MAX || payload < bulk_len) return HIPR_WIRE_NOMEM;
    size_t need = w->out_len + HIPR_HEADER_SIZE + payload;
    if (need < w->out_len || reserve(&w->out, &w->out_cap, need)) return HIPR_WIRE_NOMEM;
    uint8_t *p = w->out + w->out_len;
    memcpy(p, HIPR_MAGIC, 4);
    put_u16(p + 4, HIPR_PROTOCOL_VERSION);
    put_u16(p + 6, opcode);
    put_u32(p + 8, request_id);
    put_u32(p + 12, flags);
    put_u64(p + 16, payload);
    p += HIPR_HEADER_SIZE;
    if (has_payload) {
        put_u32(p, (uint32_t)cbor_len);
        if (cbor_len) memcpy(p + 4, cbor, cbor_len);
        if (bulk_len) memcpy(p + 4 + cbor_len, bulk, bulk_len);
    }
    w->out_len = need;
    if (flags & HIPR_F_NO_REPLY) w->queued_no_reply++;
    return HIPR_WIRE_OK;
}

const uint8_t *hipr_wire_output(const hipr_wire *w, size_t *len) {
    *len = w->out_len;
    return w->out;
}

void hipr_wire_sent(hipr_wire *w, size_t n) {
    if (n >= w->out_len) {
        w->out_len = 0;
        w->queued_no_reply = 0;
        return;
    }
    memmove(w->out, w->out + n, w->out_len - n);
    w->out_len -= n;
}

static void drop_taken(hipr_wire *w) {
    w->in_off += w->in_taken;
    w->in_taken = 0;
    if (w->in_off == w->in_len) w->in_off = w->in_len = 0;
}

int hipr_wire_feed(hipr_wire *w, const uint8_t *data, size_t n) {
    if (!n) return HIPR_WIRE_OK;
    drop_taken(w);
    if (w->in_off && w->in_len + n > w->in_cap) {
        memmove(w->in, w->in + w->in_off, w->in_len - w->in_off);
        w->in_len -= w->in_off;
        w->in_off = 0;
    }
    if (w->in_len + n < n || reserve(&w->in, &w->in_cap, w->in_len + n)) return HIPR_WIRE_NOMEM;
    memcpy(w->in + w->in_len, data, n);
    w->in_len += n;
    return HIPR_WIRE_OK;
}

static int fail(hipr_wire *w, const char *what) {
    w->broken = 1;
    snprintf(w->error, sizeof w->error, "%s", what);
    return HIPR_WIRE_PROTOCOL;
}

int hipr_wire_next(hipr_wire *w, hipr_frame *f) {
    if (w->broken) return HIPR_WIRE_PROTOCOL;
    drop_taken(w);
    size_t avail = w->in_len - w->in_off;
    if (avail < HIPR_HEADER_SIZE) return 0;
    const uint8_t *p = w->in + w->in_off;
    if (memcmp(p, HIPR_MAGIC, 4) != 0) return fail(w, "bad magic in a frame from the worker");
    uint64_t payload = get_u64(p + 16);
    if (payload > w->max_payload) return fail(w, "frame payload over the size limit");
    if (avail - HIPR_HEADER_SIZE < payload) return 0;
    memset(f, 0, sizeof *f);
    f->version = get_u16(p + 4);
    f->opcode = get_u16(p + 6);
    f->request_id = get_u32(p + 8);
    f->flags = get_u32(p + 12);
    const uint8_t *body = p + HIPR_HEADER_SIZE;
    if (payload) {
        if (payload < 4) return fail(w, "payload shorter than its length prefix");
        uint32_t cbor_len = get_u32(body);
        if ((uint64_t)cbor_len > payload - 4) return fail(w, "CBOR part overruns its payload");
        f->cbor = body + 4;
        f->cbor_len = cbor_len;
        f->bulk = body + 4 + cbor_len;
        f->bulk_len = (size_t)(payload - 4 - cbor_len);
    }
    w->in_taken = HIPR_HEADER_SIZE + (size_t)payload;
    return 1;
}
