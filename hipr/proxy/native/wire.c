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
    free(w->log);
    uint32_t next = w->next_id;
    uint64_t max = w->max_payload;
    hipr_wire_init(w, max);
    w->next_id = next;
}

void hipr_wire_reset_input(hipr_wire *w) {
    w->in_len = w->in_off = w->in_taken = 0;
    w->broken = 0;
    w->error[0] = '\0';
}

void hipr_wire_reset(hipr_wire *w) {
    hipr_wire_reset_input(w);
    w->out_len = w->out_sent = 0;
    w->log_len = 0;
    w->queued_no_reply = 0;
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

size_t hipr_wire_head(uint8_t head[28], uint16_t opcode, uint32_t request_id, uint32_t flags,
                      size_t cbor_len, size_t bulk_len) {
    int has_payload = cbor_len || bulk_len;
    uint64_t payload = has_payload ? 4 + (uint64_t)cbor_len + bulk_len : 0;
    memcpy(head, HIPR_MAGIC, 4);
    put_u16(head + 4, HIPR_PROTOCOL_VERSION);
    put_u16(head + 6, opcode);
    put_u32(head + 8, request_id);
    put_u32(head + 12, flags);
    put_u64(head + 16, payload);
    if (!has_payload) return HIPR_HEADER_SIZE;
    put_u32(head + HIPR_HEADER_SIZE, (uint32_t)cbor_len);
    return HIPR_HEADER_SIZE + 4;
}

int hipr_wire_put(hipr_wire *w, uint16_t opcode, uint32_t request_id, uint32_t flags,
                  const uint8_t *cbor, size_t cbor_len, const void *bulk, size_t bulk_len) {
    int has_payload = cbor_len || bulk_len;
    size_t payload = has_payload ? 4 + cbor_len + bulk_len : 0;
    if (cbor_len > UINT32_MAX || payload < bulk_len) return HIPR_WIRE_NOMEM;
    size_t need = w->out_len + HIPR_HEADER_SIZE + payload;
    if (need < w->out_len || reserve(&w->out, &w->out_cap, need)) return HIPR_WIRE_NOMEM;
    int logged = request_id != 0 && opcode != HIPR_OP_DATA;
    if (logged && w->log_len == w->log_cap) {
        size_t cap = w->log_cap ? w->log_cap * 2 : 64;
        hipr_logged *l = realloc(w->log, cap * sizeof *l);
        if (!l) return HIPR_WIRE_NOMEM;
        w->log = l;
        w->log_cap = cap;
    }
    uint8_t *p = w->out + w->out_len;
    uint8_t head[28];
    size_t n = hipr_wire_head(head, opcode, request_id, flags, cbor_len, bulk_len);
    memcpy(p, head, n);
    p += n;
    if (cbor_len) memcpy(p, cbor, cbor_len);
    if (bulk_len) memcpy(p + cbor_len, bulk, bulk_len);
    if (logged) w->log[w->log_len++] = (hipr_logged){request_id, flags, w->out_len};
    w->out_len = need;
    if (flags & HIPR_F_NO_REPLY) w->queued_no_reply++;
    return HIPR_WIRE_OK;
}

const uint8_t *hipr_wire_output(const hipr_wire *w, size_t *len) {
    *len = w->out_len - w->out_sent;
    return w->out + w->out_sent;
}

void hipr_wire_sent(hipr_wire *w, size_t n) {
    w->out_sent += n < w->out_len - w->out_sent ? n : w->out_len - w->out_sent;
    if (w->out_sent == w->out_len) w->queued_no_reply = 0;
    /* Frames sent outside the log (none logged): nothing to keep. */
    if (!w->log_len && w->out_sent == w->out_len) w->out_len = w->out_sent = 0;
}

/* Ids wrap (the worker's are 32-bit, 0 skipped): compare as serial numbers. */
static int id_le(uint32_t a, uint32_t b) { return (int32_t)(a - b) <= 0; }

/* Drop the first `k` log entries and their bytes (only bytes already sent). */
static void drop_front(hipr_wire *w, size_t k) {
    if (!k) return;
    size_t cut = k < w->log_len ? w->log[k].off : w->out_sent;
    if (cut > w->out_sent) cut = w->out_sent;
    memmove(w->log, w->log + k, (w->log_len - k) * sizeof *w->log);
    w->log_len -= k;
    for (size_t i = 0; i < w->log_len; i++) w->log[i].off -= cut;
    memmove(w->out, w->out + cut, w->out_len - cut);
    w->out_len -= cut;
    w->out_sent -= cut;
}

void hipr_wire_ack(hipr_wire *w, uint32_t id) {
    size_t k = 0;
    while (k < w->log_len && id_le(w->log[k].id, id) && w->log[k].off < w->out_sent) k++;
    if (k == w->log_len && w->out_sent == w->out_len) {
        w->log_len = 0;
        w->out_len = w->out_sent = 0;
        return;
    }
    drop_front(w, k);
}

void hipr_wire_rewind(hipr_wire *w, uint32_t last_executed) {
    /* Compacted in place: kept entries move down over dropped ones. */
    size_t o = 0, kept = 0;
    for (size_t i = 0; i < w->log_len; i++) {
        size_t start = w->log[i].off;
        size_t end = i + 1 < w->log_len ? w->log[i + 1].off : w->out_len;
        int ran = (w->log[i].flags & HIPR_F_NO_REPLY) && id_le(w->log[i].id, last_executed);
        if (ran) continue;
        memmove(w->out + o, w->out + start, end - start);
        w->log[kept] = w->log[i];
        w->log[kept].off = o;
        kept++;
        o += end - start;
    }
    w->log_len = kept;
    w->out_len = o;
    w->out_sent = 0;
    w->queued_no_reply = 0;
}

size_t hipr_wire_logged_bytes(const hipr_wire *w) { return w->out_len; }

static void drop_taken(hipr_wire *w) {
    w->in_off += w->in_taken;
    w->in_taken = 0;
    if (w->in_off == w->in_len) w->in_off = w->in_len = 0;
}

static void make_room(hipr_wire *w, size_t n) {
    if (w->in_off && w->in_len + n > w->in_cap) {
        memmove(w->in, w->in + w->in_off, w->in_len - w->in_off);
        w->in_len -= w->in_off;
        w->in_off = 0;
    }
}

int hipr_wire_feed(hipr_wire *w, const uint8_t *data, size_t n) {
    if (!n) return HIPR_WIRE_OK;
    drop_taken(w);
    make_room(w, n);
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

uint8_t *hipr_wire_space(hipr_wire *w, size_t want, size_t *room) {
    drop_taken(w);
    make_room(w, want);
    if (w->in_len + want < want || reserve(&w->in, &w->in_cap, w->in_len + want)) return NULL;
    *room = w->in_cap - w->in_len;
    return w->in + w->in_len;
}

void hipr_wire_commit(hipr_wire *w, size_t n) { w->in_len += n; }

static int next_frame(hipr_wire *w, hipr_frame *f, size_t min_rest, size_t *rest);

int hipr_wire_next(hipr_wire *w, hipr_frame *f) { return next_frame(w, f, 0, NULL); }

int hipr_wire_next_head(hipr_wire *w, hipr_frame *f, size_t min_rest, size_t *rest) {
    return next_frame(w, f, min_rest ? min_rest : 1, rest);
}

void hipr_wire_skip_rest(hipr_wire *w) { drop_taken(w); }

static int next_frame(hipr_wire *w, hipr_frame *f, size_t min_rest, size_t *rest) {
    if (w->broken) return HIPR_WIRE_PROTOCOL;
    drop_taken(w);
    size_t avail = w->in_len - w->in_off;
    if (avail < HIPR_HEADER_SIZE) return 0;
    const uint8_t *p = w->in + w->in_off;
    if (memcmp(p, HIPR_MAGIC, 4) != 0) return fail(w, "bad magic in a frame from the worker");
    uint64_t payload = get_u64(p + 16);
    if (payload > w->max_payload) return fail(w, "frame payload over the size limit");
    int partial = avail - HIPR_HEADER_SIZE < payload;
    /* A head is handed out early only once its CBOR part is here. */
    if (partial && (!min_rest || avail < HIPR_HEADER_SIZE + 4 ||
                    payload - (avail - HIPR_HEADER_SIZE) < min_rest))
        return 0;
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
        if (partial && avail - HIPR_HEADER_SIZE - 4 < cbor_len) return 0;
        f->cbor = body + 4;
        f->cbor_len = cbor_len;
        f->bulk = body + 4 + cbor_len;
        f->bulk_len = (size_t)(payload - 4 - cbor_len);
    }
    if (partial) {
        size_t here = avail - HIPR_HEADER_SIZE - 4 - f->cbor_len;
        *rest = (size_t)(f->bulk_len - here);
        f->bulk_len = here;
        w->in_taken = avail;
        return 2;
    }
    w->in_taken = HIPR_HEADER_SIZE + (size_t)payload;
    return 1;
}

size_t hipr_cbor_head(uint8_t out[9], unsigned major, uint64_t value) {
    uint8_t type = (uint8_t)(major << 5);
    if (value < 24) {
        out[0] = type | (uint8_t)value;
        return 1;
    }
    size_t n = value <= 0xff ? 1 : value <= 0xffff ? 2 : value <= 0xffffffffu ? 4 : 8;
    out[0] = type | (uint8_t)(n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27);
    for (size_t i = 0; i < n; i++) out[1 + i] = (uint8_t)(value >> (8 * (n - 1 - i)));
    return 1 + n;
}

/* {"offset": ...}: a map of one pair, the key a text of 6 bytes. */
static const uint8_t CHUNK_KEY[8] = {0xa1, 0x66, 'o', 'f', 'f', 's', 'e', 't'};

size_t hipr_chunk_args(uint8_t out[HIPR_CHUNK_ARGS_MAX], uint64_t offset) {
    memcpy(out, CHUNK_KEY, sizeof CHUNK_KEY);
    return sizeof CHUNK_KEY + hipr_cbor_head(out + sizeof CHUNK_KEY, 0, offset);
}

int hipr_chunk_offset(const uint8_t *args, size_t n, uint64_t *offset) {
    const size_t k = sizeof CHUNK_KEY;
    if (n < k + 1 || memcmp(args, CHUNK_KEY, k) != 0 || args[k] >> 5) return -1;
    unsigned info = args[k] & 0x1f;
    if (info > 27) return -1;
    size_t extra = info < 24 ? 0 : (size_t)1 << (info - 24);
    if (n != k + 1 + extra) return -1;
    uint64_t v = info < 24 ? info : 0;
    for (size_t i = 0; i < extra; i++) v = v << 8 | args[k + 1 + i];
    *offset = v;
    return 0;
}

int hipr_chunk_head(const uint8_t head[HIPR_HEADER_SIZE + 4], uint32_t flags,
                    uint32_t *request_id, size_t *args_len, uint64_t *bulk_len) {
    uint64_t payload = get_u64(head + 16);
    uint32_t args = get_u32(head + HIPR_HEADER_SIZE);
    if (memcmp(head, HIPR_MAGIC, 4) != 0 || get_u16(head + 4) >> 8 != HIPR_PROTOCOL_VERSION >> 8 ||
        get_u16(head + 6) != HIPR_OP_DATA || get_u32(head + 12) != flags || args == 0 ||
        args > HIPR_CHUNK_ARGS_MAX || payload < 4 + (uint64_t)args)
        return -1;
    *request_id = get_u32(head + 8);
    *args_len = args;
    *bulk_len = payload - 4 - args;
    return 0;
}
