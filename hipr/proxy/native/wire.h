/* Sans-I/O framing of the hipr wire protocol (docs/protocol.md): the session is fed the
 * bytes that arrived and asked for the bytes to send; it never touches a socket, so the
 * protocol logic is tested (and fuzzed) without one, as nghttp2 does for HTTP/2. */
#ifndef HIPR_WIRE_H
#define HIPR_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define HIPR_MAGIC "HIPR"
#define HIPR_PROTOCOL_VERSION 0x0104u
#define HIPR_HEADER_SIZE 24u

#define HIPR_F_NO_REPLY 0x1u
#define HIPR_F_REPLY 0x2u
#define HIPR_F_ERROR 0x4u
#define HIPR_F_MORE 0x8u

#define HIPR_OP_PING 0x0003u
#define HIPR_OP_DATA 0x0004u

/* Results of wire calls: 0 success, negative on failure. */
#define HIPR_WIRE_OK 0
#define HIPR_WIRE_NOMEM (-1)
#define HIPR_WIRE_PROTOCOL (-2)

typedef struct hipr_frame {
    uint16_t version;
    uint16_t opcode;
    uint32_t request_id;
    uint32_t flags;
    /* Views into the session's input buffer, valid until the next feed or next_frame. */
    const uint8_t *cbor;
    size_t cbor_len;
    const uint8_t *bulk;
    size_t bulk_len;
} hipr_frame;

/* A request frame kept in `out` until the worker shows that it ran (the resend log). */
typedef struct hipr_logged {
    uint32_t id;
    uint32_t flags;
    size_t off; /* where its frames start in `out`; they run to the next entry's off */
} hipr_logged;

typedef struct hipr_wire {
    /* The resend log: every request frame not yet acknowledged, in wire order. Bytes
     * [0, out_sent) went out; [out_sent, out_len) wait to be sent. */
    uint8_t *out;
    size_t out_len, out_cap, out_sent;
    hipr_logged *log;
    size_t log_len, log_cap;
    uint8_t *in;
    size_t in_len, in_off, in_cap;
    /* Bytes of the frame handed out by the last next_frame, dropped at the next call. */
    size_t in_taken;
    uint64_t max_payload;
    uint32_t next_id;
    /* Fire-and-forget frames waiting in `out` (coalesced until a sync point). */
    size_t queued_no_reply;
    /* Set once a protocol error was seen: the stream cannot be resynchronised. */
    int broken;
    char error[160];
} hipr_wire;

void hipr_wire_init(hipr_wire *w, uint64_t max_payload);
void hipr_wire_free(hipr_wire *w);
/* Drop buffered input and output, the resend log included (a new session), but keep the
 * request-id counter. */
void hipr_wire_reset(hipr_wire *w);
/* A new link of the same session: buffered input is dropped, the log is kept. */
void hipr_wire_reset_input(hipr_wire *w);

/* A new request id (never 0, which is the worker's). */
uint32_t hipr_wire_take_id(hipr_wire *w);

/* Append one frame to the output: header, u32 CBOR length, CBOR, bulk. A frame with
 * neither CBOR nor bulk has an empty payload. A request (id != 0, not DATA) starts a log
 * entry; DATA frames belong to the entry before them. */
int hipr_wire_put(hipr_wire *w, uint16_t opcode, uint32_t request_id, uint32_t flags,
                  const uint8_t *cbor, size_t cbor_len, const void *bulk, size_t bulk_len);
/* Encode one frame's header and CBOR length prefix into `head` (28 bytes); returns how
 * many of them the frame uses (24 without a payload). For frames sent straight from the
 * caller's memory, outside the log. */
size_t hipr_wire_head(uint8_t head[28], uint16_t opcode, uint32_t request_id, uint32_t flags,
                      size_t cbor_len, size_t bulk_len);

/* The bytes still to send, and how many of them were sent. */
const uint8_t *hipr_wire_output(const hipr_wire *w, size_t *len);
void hipr_wire_sent(hipr_wire *w, size_t n);
/* A final reply to `id` (not a PING's): the worker ran every request up to it, in
 * order; their frames leave the log. */
void hipr_wire_ack(hipr_wire *w, uint32_t id);
/* After RESUME: fire-and-forget requests up to `last_executed` ran and leave the log;
 * everything else in it is sent again, from its start. */
void hipr_wire_rewind(hipr_wire *w, uint32_t last_executed);
/* Bytes held for a resend. */
size_t hipr_wire_logged_bytes(const hipr_wire *w);

/* Received bytes. */
int hipr_wire_feed(hipr_wire *w, const uint8_t *data, size_t n);
/* Room for at least `want` received bytes in the input buffer (no copy: read into it,
 * then hipr_wire_commit); NULL when out of memory. */
uint8_t *hipr_wire_space(hipr_wire *w, size_t want, size_t *room);
void hipr_wire_commit(hipr_wire *w, size_t n);

/* 1 and a frame, 0 when more bytes are needed, HIPR_WIRE_PROTOCOL when the stream is
 * broken (bad magic, payload over max_payload, a CBOR part that overruns its payload);
 * `w->error` says which. */
int hipr_wire_next(hipr_wire *w, hipr_frame *frame);
/* As hipr_wire_next, but a frame whose header and CBOR part are buffered and whose bulk
 * part has at least `min_rest` bytes still to come is handed out early: returns 2,
 * `frame->bulk` the bulk bytes buffered so far and `*rest` the bytes still to come. The
 * caller then reads exactly `*rest` bytes itself (into the destination, no copy) and
 * calls hipr_wire_skip_rest before anything else. */
int hipr_wire_next_head(hipr_wire *w, hipr_frame *frame, size_t min_rest, size_t *rest);
void hipr_wire_skip_rest(hipr_wire *w);

/* A CBOR head, major type `major` (0-7) with argument `value` in its shortest form,
 * written at `out` (room for 9 bytes): its length. */
size_t hipr_cbor_head(uint8_t out[9], unsigned major, uint64_t value);

/* Data links (protocol 1.4): a striped copy's chunk is a DATA frame whose CBOR part is
 * exactly {"offset": n}, at most HIPR_CHUNK_ARGS_MAX bytes. */
#define HIPR_CHUNK_ARGS_MAX 17u
/* That CBOR part for `offset`, written at `out`: its length. */
size_t hipr_chunk_args(uint8_t out[HIPR_CHUNK_ARGS_MAX], uint64_t offset);
/* The offset a chunk's CBOR part `args` (n bytes) names: 0, or -1 when it is not exactly
 * {"offset": uint}. */
int hipr_chunk_offset(const uint8_t *args, size_t n, uint64_t *offset);
/* A chunk frame's header and its CBOR part's length (`head`, 28 bytes): 0 with the
 * request id, the CBOR part's length and the bulk's, or -1 when it is no chunk (another
 * magic or major version, another opcode than DATA, flags other than `flags`, a CBOR part
 * of 0 or over HIPR_CHUNK_ARGS_MAX bytes, or a payload too short for it). */
int hipr_chunk_head(const uint8_t head[HIPR_HEADER_SIZE + 4], uint32_t flags,
                    uint32_t *request_id, size_t *args_len, uint64_t *bulk_len);

#endif
