/* Sans-I/O framing of the hipr wire protocol (docs/protocol.md): the session is fed the
 * bytes that arrived and asked for the bytes to send; it never touches a socket, so the
 * protocol logic is tested (and fuzzed) without one, as nghttp2 does for HTTP/2. */
#ifndef HIPR_WIRE_H
#define HIPR_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define HIPR_MAGIC "HIPR"
#define HIPR_PROTOCOL_VERSION 0x0101u
#define HIPR_HEADER_SIZE 24u

#define HIPR_F_NO_REPLY 0x1u
#define HIPR_F_REPLY 0x2u
#define HIPR_F_ERROR 0x4u
#define HIPR_F_MORE 0x8u

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

typedef struct hipr_wire {
    uint8_t *out;
    size_t out_len, out_cap;
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
/* Drop buffered input and output (a new link) but keep the request-id counter. */
void hipr_wire_reset(hipr_wire *w);

/* A new request id (never 0, which is the worker's). */
uint32_t hipr_wire_take_id(hipr_wire *w);

/* Append one frame to the output: header, u32 CBOR length, CBOR, bulk. A frame with
 * neither CBOR nor bulk has an empty payload. */
int hipr_wire_put(hipr_wire *w, uint16_t opcode, uint32_t request_id, uint32_t flags,
                  const uint8_t *cbor, size_t cbor_len, const void *bulk, size_t bulk_len);

/* The bytes to send, and how many of them were sent. */
const uint8_t *hipr_wire_output(const hipr_wire *w, size_t *len);
void hipr_wire_sent(hipr_wire *w, size_t n);

/* Received bytes. */
int hipr_wire_feed(hipr_wire *w, const uint8_t *data, size_t n);

/* 1 and a frame, 0 when more bytes are needed, HIPR_WIRE_PROTOCOL when the stream is
 * broken (bad magic, payload over max_payload, a CBOR part that overruns its payload);
 * `w->error` says which. */
int hipr_wire_next(hipr_wire *w, hipr_frame *frame);

#endif
