/* The proxy's session with the worker; see client.h. The protocol state lives in the
 * sans-I/O hipr_wire (framing and the resend log); this file adds the link, the lock,
 * reconnection with RESUME, heartbeats and fork.
 *
 * Exactly once over a flaky link, as the Python client (hipr/client/link.py): request
 * ids increase in wire order; every request stays in the wire's resend log until a reply
 * to it or to a later request proves that the worker ran it (the worker runs a session's
 * requests in order). When the link drops, the session reconnects, sends RESUME, drops
 * the fire-and-forget requests up to the worker's last_executed_id and sends the rest of
 * the log again; the worker skips what already ran and answers replied requests from its
 * reply cache. A request whose bulk is large (DIRECT_BYTES) is not copied into the log:
 * it goes straight from the caller's memory and the call waits for its reply, so the
 * caller's buffer is there to send again until the worker has it. */
#define _GNU_SOURCE
#include "client.h"
#include "launch_cbor.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "opcodes.h"
#include "quiet_thread.h"
#include "transport.h"
#include "wire.h"

#ifndef OP_RESUME
#define OP_RESUME 0x0005
#endif
#ifndef OP_BARRIER
#define OP_BARRIER 0x0007
#endif

#define DEFAULT_URL "tcp://127.0.0.1:18515"
/* Before HELLO tells the worker's limits. */
#define DEFAULT_MAX_PAYLOAD ((uint64_t)64 * 1024 * 1024 + 64 * 1024)
/* Fire-and-forget frames are sent once this many bytes wait (HIP Remote used 64 KiB). */
#define COALESCE_BYTES (64 * 1024)
/* Request bulk this large goes straight from the caller's memory (no copy into the log)
 * and its call waits for the reply. */
#define DIRECT_BYTES (1024 * 1024)
/* Reply bulk this large is read straight into the caller's buffer. */
#define DIRECT_RECV (64 * 1024)
/* Bytes of unacknowledged requests kept for a resend before the session waits for the
 * worker to catch up (a BARRIER). */
#define LOG_LIMIT (16 * 1024 * 1024)
#define RECV_CHUNK (256 * 1024)
/* Internal: the link failed; the caller recovers (reconnect + RESUME) and goes on. */
#define LINK_DOWN (-1)

enum state { S_IDLE, S_READY, S_FAILED, S_LOST };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    enum state state;
    int fail_code;
    hipr_link *link;
    pid_t owner;
    hipr_wire wire;
    int wire_ready;
    uint64_t chunk_bytes;
    int worker_device;
    double heartbeat_s;
    double silent_limit_s; /* a link silent this long is dead */
    double last_rx;
    double spin_s;
    int keeper_running;
    int closing;
    char url[1024];
    char backend[64];
    char session_id[128];
    char resume_token[256];
    char why[400]; /* why the last link failed */
    int minor; /* the worker's protocol minor version */
    int debug; /* HIPR_PROXY_DEBUG: error replies' messages on stderr */
    double reconnect_s;
    int reconnect_attempts;
    unsigned resumes;
    double connect_s; /* HIPR_CONNECT_TIMEOUT */
    /* Data links (protocol 1.4): how many the worker offers, how many HIPR_DATA_LINKS
     * allows (0: none), and the smallest upload striped over them. */
    uint64_t data_links;
    int dl_limit;
    double stripe_min;
} S = {.state = S_IDLE};

/* Launches of one configuration waiting to go out as one frame. */
#define BATCH_MAX 1024
#define BATCH_BYTES (60 * 1024)
/* Launches of one run framed and sent at once, before the run ends: the worker runs them
 * while the program queues the rest, rather than all of them after its synchronize. */
#define BATCH_EARLY 64
static struct {
    int count;
    hipr_launch_config config;
    uint8_t data[BATCH_BYTES];
    size_t used;
    uint16_t lens[BATCH_MAX];
} B;

static int put_batch(void);
static int put_batch_as(int synchronize, uint32_t *id_out);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --- synchronize marks ------------------------------------------------------------------
 * HIPR_PROXY_MARKS=FILE, for benchmarks/proxy/stages.py: for each synchronize sent fused
 * with its launches, when the call reached the core and when its request went to the
 * socket (CLOCK_MONOTONIC ns, the clock of Python's perf_counter_ns), written to FILE as
 * "reached sent" lines when the process ends. Off, a synchronize pays one load. */
#define MARKS_MAX 65536
static struct {
    int on;
    char path[512];
    size_t count;
    uint64_t (*at)[2];
    int forked;
} M;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Under `lock`, once per connection. */
static void marks_init(void) {
    const char *path = getenv("HIPR_PROXY_MARKS");
    if (M.at || M.forked || !path || !*path || strlen(path) >= sizeof M.path) return;
    M.at = calloc(MARKS_MAX, sizeof *M.at);
    if (!M.at) return;
    snprintf(M.path, sizeof M.path, "%s", path);
    __atomic_store_n(&M.on, 1, __ATOMIC_RELAXED); /* read outside the lock by hipr_call */
}

/* Under `lock`: a fused synchronize that reached the core at `reached` goes out now. */
static void marks_note(uint64_t reached) {
    if (!M.on || !reached || M.count >= MARKS_MAX) return;
    M.at[M.count][0] = reached;
    M.at[M.count][1] = now_ns();
    M.count++;
}

/* The marks let go: once written, and in a forked child, which never marks (the file
 * is the parent's: a DataLoader worker ending would overwrite it). */
static void marks_forget(int forked) {
    __atomic_store_n(&M.on, 0, __ATOMIC_RELAXED);
    free(M.at);
    M.at = NULL;
    M.count = 0;
    if (forked) M.forked = 1;
}

/* Under `lock`, as the process ends. */
static void marks_write(void) {
    if (!M.at) return;
    FILE *f = fopen(M.path, "w");
    if (f) {
        for (size_t i = 0; i < M.count; i++)
            fprintf(f, "%llu %llu\n", (unsigned long long)M.at[i][0],
                    (unsigned long long)M.at[i][1]);
        fclose(f);
    }
    marks_forget(0);
}

void hipr_warn_once(const char *what, int *flag) {
    if (__atomic_exchange_n(flag, 1, __ATOMIC_RELAXED)) return;
    fprintf(stderr, "hipr proxy: %s\n", what);
}

void hipr_reply_free(hipr_reply *r) {
    if (!r) return;
    if (r->map) cbor_decref(&r->map);
    free(r->bulk);
    r->bulk = NULL;
    r->bulk_len = 0;
}

static void set_message(hipr_reply *r, const char *fmt, const char *arg) {
    if (r) snprintf(r->message, sizeof r->message, fmt, arg);
}

/* --- the link ----------------------------------------------------------------------- */

static void drop_link(void) {
    hipr_link_close(S.link);
    S.link = NULL;
}

/* The session is over for good: every call returns hipErrorUnknown from now on. */
static void dl_close_all(int forget);

static int lose(const char *why) {
    dl_close_all(0);
    if (S.state == S_READY)
        fprintf(stderr,
                "hipr proxy: lost the session with the worker at %s (%s); HIP calls now "
                "return hipErrorUnknown\n",
                S.url, why);
    drop_link();
    S.state = S_LOST;
    S.fail_code = HIPR_UNKNOWN;
    return HIPR_UNKNOWN;
}

/* Notes why the link failed (the transport's own words where it has them). */
static int link_down(const char *why) {
    const char *more = S.link ? hipr_link_failure(S.link) : "";
    snprintf(S.why, sizeof S.why, "%.190s%s%.200s", why, *more ? ": " : "", more);
    return LINK_DOWN;
}

static int send_bytes(const void *p, size_t n) {
    struct iovec v = {(void *)p, n};
    return hipr_link_send(S.link, &v, 1);
}

/* The log's unsent frames (queued launches first). 0, LINK_DOWN or an error. */
static int flush_out(void) {
    if (B.count) {
        int rc = put_batch();
        if (rc) return rc;
    }
    size_t n;
    const uint8_t *p = hipr_wire_output(&S.wire, &n);
    if (!n) return 0;
    if (!S.link || send_bytes(p, n) < 0) return link_down("cannot write to the worker");
    hipr_wire_sent(&S.wire, n);
    return 0;
}

/* A frame outside the log (heartbeat answers, handshakes, GOODBYE). */
static int send_frame(uint16_t opcode, uint32_t id, uint32_t flags, const uint8_t *cbor,
                      size_t cbor_len) {
    uint8_t head[28];
    size_t n = hipr_wire_head(head, opcode, id, flags, cbor_len, 0);
    struct iovec v[2] = {{head, n}, {(void *)cbor, cbor_len}};
    if (!S.link || hipr_link_send(S.link, v, cbor_len ? 2 : 1) < 0)
        return link_down("cannot write to the worker");
    return 0;
}

/* A request straight from the caller's memory: the first frame and DATA frames of
 * chunk_bytes, written with sendmsg from `bulk` itself. */
typedef struct direct {
    uint16_t opcode;
    uint32_t id, flags;
    const uint8_t *cbor;
    size_t cbor_len;
    const uint8_t *bulk;
    size_t bulk_len;
} direct;

static int send_direct(const direct *d) {
    size_t chunk = (size_t)S.chunk_bytes;
    enum { FRAMES = 16 };
    uint8_t heads[FRAMES][28];
    struct iovec v[FRAMES * 3];
    size_t off = 0;
    int first = 1;
    while (first || off < d->bulk_len) {
        int nv = 0;
        for (int k = 0; k < FRAMES && (first || off < d->bulk_len); k++) {
            size_t n = d->bulk_len - off < chunk ? d->bulk_len - off : chunk;
            uint32_t more = off + n < d->bulk_len ? HIPR_F_MORE : 0;
            size_t h;
            if (first) {
                h = hipr_wire_head(heads[k], d->opcode, d->id, d->flags | more, d->cbor_len, n);
                v[nv++] = (struct iovec){heads[k], h};
                if (d->cbor_len) v[nv++] = (struct iovec){(void *)d->cbor, d->cbor_len};
                first = 0;
            } else {
                h = hipr_wire_head(heads[k], OP_DATA, d->id, more, 0, n);
                v[nv++] = (struct iovec){heads[k], h};
            }
            if (n) v[nv++] = (struct iovec){(void *)(d->bulk + off), n};
            off += n;
        }
        if (hipr_link_send(S.link, v, nv) < 0) return link_down("cannot write to the worker");
    }
    return 0;
}

/* --- the wait forecast ---------------------------------------------------------------
 * As the Python sync client's (hipr/client/wait_forecast.py): a synchronize that outlasts
 * the spin (a kernel of milliseconds: cuBLAS's 4096^2 SGEMM takes ~2.7 ms) is otherwise
 * answered into a thread asleep in poll(), and on a virtual machine waking a thread that
 * slept for milliseconds costs tens of µs before the caller runs again (a local CUDA
 * program does not pay it: cudaDeviceScheduleAuto spins through the whole wait where
 * cores are to spare). So learn how long each kind of synchronize takes and poll until
 * a margin (an eighth of the wait, at most FORECAST_MARGIN_MAX) after its expected end,
 * then block as before. A wait expected to last up to FORECAST_SPIN_MAX is polled from
 * its start, as CUDA's default does locally: a core for at most 10 ms + 0.25 ms per wait.
 * A longer one (or any, with HIPR_FORECAST=nap) sleeps until the margin before its
 * expected end (woken at once should the reply come early), as the Python client does:
 * at most 0.5 ms of polling per wait. HIPR_FORECAST=0 turns it off, and it is off where
 * the proxy does not spin (HIPR_SPIN_US=0, or fewer than 4 usable CPUs). Under `lock`. */
#define FORECAST_MARGIN_MAX 250e-6
/* Longer waits are not forecast: a wake-up's tens of µs are nothing beside them. */
#define FORECAST_MAX 0.5
enum { FC_DEVICE, FC_STREAM, FC_EVENT, FC_KINDS };
/* Expected waits up to this long are polled through from the start instead of napped
 * (HIPR_FORECAST=nap: never): on the H200 host a nap cost a 4096^2 matmul ~0.1 ms more than
 * polling through its 2.7 ms wait (docs/gpu-runs/2026-11-26-h200-cuda-proxy-matmul.txt), the
 * work after a wait running slower on a core that slept. */
#define FORECAST_SPIN_MAX 10e-3
static double forecast_expected[FC_KINDS]; /* seconds; 0: nothing learnt */
static int forecast_on, forecast_nap_only;
/* The wait under way (one at a time: the lock is held across it). */
static struct {
    int active;
    double nap_until, poll_until;
} W;

static int forecast_kind(uint16_t opcode) {
    switch (opcode) {
    case OP_DEVICE_SYNCHRONIZE: return FC_DEVICE;
    case OP_STREAM_SYNCHRONIZE: return FC_STREAM;
    case OP_EVENT_SYNCHRONIZE: return FC_EVENT;
    default: return -1;
    }
}

/* Plan the wait for a request of `opcode` sent at `started`. */
static void forecast_plan(uint16_t opcode, double started) {
    int k = forecast_kind(opcode);
    W.active = 0;
    if (!forecast_on || k < 0 || forecast_expected[k] <= 0) return;
    double expected = forecast_expected[k];
    double margin = expected / 8 < FORECAST_MARGIN_MAX ? expected / 8 : FORECAST_MARGIN_MAX;
    W.nap_until = started + expected - margin;
    if (!forecast_nap_only && expected <= FORECAST_SPIN_MAX) W.nap_until = started;
    W.poll_until = started + expected + margin;
    W.active = 1;
}

/* A wait of `opcode` took `seconds` from sending to having its reply. */
static void forecast_record(uint16_t opcode, double seconds) {
    int k = forecast_kind(opcode);
    W.active = 0;
    if (!forecast_on || k < 0) return;
    if (!(seconds > S.spin_s && seconds <= FORECAST_MAX)) {
        /* Caught by the spin, or too long to matter: forget, so that a program whose
         * synchronizes became quick stops napping at once. */
        forecast_expected[k] = 0;
        return;
    }
    double before = forecast_expected[k];
    /* Half the weight on the newest: a step that changed length is followed within a few
     * waits, and one outlier moves the estimate only half way. */
    forecast_expected[k] = before > 0 ? (before + seconds) / 2 : seconds;
}

static long spin_recv(uint8_t *p, size_t room, double until) {
    long n;
    do n = hipr_link_recv_nowait(S.link, p, room);
    while (n == -2 && now_s() < until);
    return n;
}

/* Received bytes into the wire's input (no copy), spinning briefly before blocking as
 * the Python sync client does: a reply that comes within the spin is seen without the
 * kernel waking a sleeping thread. A forecast wait (W) naps, then polls around its
 * expected end, then blocks. */
static int read_more_at_most(int spin, size_t limit) {
    size_t room;
    uint8_t *p = hipr_wire_space(&S.wire, RECV_CHUNK, &room);
    if (!p) return HIPR_OUT_OF_MEMORY;
    if (limit && room > limit) room = limit;
    long n = -2;
    if (spin && S.spin_s > 0) {
        n = spin_recv(p, room, now_s() + S.spin_s);
        while (n == -2 && W.active) {
            double now = now_s();
            if (now < W.nap_until) {
                /* Bytes that come during the nap end it (the plan stays for the next
                 * read, should they not be the reply). */
                int ready = hipr_link_nap(S.link, W.nap_until - now);
                if (ready < 0) return link_down(strerror(errno));
                n = hipr_link_recv_nowait(S.link, p, room);
                continue;
            }
            if (now < W.poll_until) n = spin_recv(p, room, W.poll_until);
            if (n == -2) W.active = 0; /* the forecast missed: block as without it */
        }
    }
    if (n == -2) {
        int ready = hipr_link_wait_readable(S.link, (int)(S.silent_limit_s * 1000));
        if (ready == 0) {
            char why[120];
            snprintf(why, sizeof why, "the worker was silent for %.0f s", S.silent_limit_s);
            return link_down(why);
        }
        n = ready < 0 ? -1 : hipr_link_recv(S.link, p, room);
    }
    if (n <= 0) return link_down(n == 0 ? "the worker closed the connection" : strerror(errno));
    hipr_wire_commit(&S.wire, (size_t)n);
    S.last_rx = now_s();
    return 0;
}

static int read_more(int spin) { return read_more_at_most(spin, 0); }

/* Exactly `n` bytes into `dst`, straight from the link. */
static int read_exact(uint8_t *dst, size_t n) {
    while (n) {
        int ready = hipr_link_wait_readable(S.link, (int)(S.silent_limit_s * 1000));
        if (ready == 0) {
            char why[120];
            snprintf(why, sizeof why, "the worker was silent for %.0f s", S.silent_limit_s);
            return link_down(why);
        }
        long k = ready < 0 ? -1 : hipr_link_recv(S.link, dst, n);
        if (k <= 0) return link_down(k == 0 ? "the worker closed the connection" : strerror(errno));
        dst += k;
        n -= (size_t)k;
    }
    S.last_rx = now_s();
    return 0;
}

static int error_code_of(const uint8_t *cbor, size_t len, char *msg, size_t msg_size) {
    cbor_item_t *map = hipr_cbor_load(cbor, len);
    int code = hipr_error_code(map, msg, msg_size);
    if (map) cbor_decref(&map);
    return code;
}

/* A frame the worker sent on its own (request id 0): heartbeats, a closing session.
 * 0, LINK_DOWN, or HIPR_UNKNOWN when the worker ended the session. */
static int from_worker(const hipr_frame *f) {
    if (f->opcode == OP_PING && !(f->flags & HIPR_F_REPLY))
        return send_frame(OP_PING, 0, HIPR_F_REPLY, NULL, 0);
    if (f->opcode == OP_GOODBYE || (f->flags & HIPR_F_ERROR))
        return lose("the worker ended the session");
    return 0;
}

/* Read frames until the final reply to `id`. A hipError_t, or LINK_DOWN. */
static int await_reply(uint32_t id, void *sink, size_t sink_size, hipr_reply *r) {
    for (;;) {
        hipr_frame f;
        size_t rest = 0;
        int got = sink ? hipr_wire_next_head(&S.wire, &f, DIRECT_RECV, &rest)
                       : hipr_wire_next(&S.wire, &f);
        if (got < 0) return lose(S.wire.error);
        if (got == 0) {
            /* A large reply on its way into the sink: read no further than the next
             * frame's head, so that its bulk goes straight into the sink. */
            size_t buffered = S.wire.in_len - S.wire.in_off - S.wire.in_taken;
            size_t limit = 0;
            if (sink && sink_size - r->sink_len >= DIRECT_RECV && buffered < HIPR_HEADER_SIZE + 4)
                limit = HIPR_HEADER_SIZE + 4 - buffered;
            int rc = read_more_at_most(1, limit);
            if (rc) return rc;
            continue;
        }
        if (got == 2) {
            /* A large bulk part on its way: straight into the sink when it is ours. */
            int ours = f.request_id == id && !(f.flags & HIPR_F_ERROR);
            if (ours && f.bulk_len + rest > sink_size - r->sink_len)
                return lose("a reply carried more bytes than were asked for");
            uint8_t *dst = NULL;
            if (ours) {
                dst = (uint8_t *)sink + r->sink_len;
                memcpy(dst, f.bulk, f.bulk_len);
                r->sink_len += f.bulk_len;
                int rc = read_exact((uint8_t *)sink + r->sink_len, rest);
                if (rc) return rc;
                r->sink_len += rest;
            } else {
                uint8_t scratch[4096];
                while (rest) {
                    size_t n = rest < sizeof scratch ? rest : sizeof scratch;
                    int rc = read_exact(scratch, n);
                    if (rc) return rc;
                    rest -= n;
                }
            }
            hipr_wire_skip_rest(&S.wire);
            if (f.flags & HIPR_F_MORE) continue;
            hipr_wire_ack(&S.wire, f.request_id);
            if (!ours) continue;
            if (f.cbor_len) {
                r->map = hipr_cbor_load(f.cbor, f.cbor_len);
                if (!r->map) return lose("a reply's CBOR part is malformed");
            }
            return HIPR_SUCCESS;
        }
        if (f.request_id == 0) {
            int rc = from_worker(&f);
            if (rc) return rc;
            continue;
        }
        if (!(f.flags & HIPR_F_MORE) && f.opcode != OP_PING) hipr_wire_ack(&S.wire, f.request_id);
        if (f.request_id != id) continue; /* a reply nobody waits for */
        if (f.flags & HIPR_F_ERROR) {
            /* The error map stays with the reply: callers read its details. */
            r->map = hipr_cbor_load(f.cbor, f.cbor_len);
            int code = hipr_error_code(r->map, r->message, sizeof r->message);
            if (S.debug) fprintf(stderr, "hipr proxy: error %d: %s\n", code, r->message);
            return code;
        }
        if (f.bulk_len) {
            if (sink) {
                if (f.bulk_len > sink_size - r->sink_len)
                    return lose("a reply carried more bytes than were asked for");
                memcpy((uint8_t *)sink + r->sink_len, f.bulk, f.bulk_len);
                r->sink_len += f.bulk_len;
            } else {
                uint8_t *p = realloc(r->bulk, r->bulk_len + f.bulk_len);
                if (!p) return HIPR_OUT_OF_MEMORY;
                memcpy(p + r->bulk_len, f.bulk, f.bulk_len);
                r->bulk = p;
                r->bulk_len += f.bulk_len;
            }
        }
        if (f.flags & HIPR_F_MORE) continue;
        if (f.cbor_len) {
            r->map = hipr_cbor_load(f.cbor, f.cbor_len);
            if (!r->map) return lose("a reply's CBOR part is malformed");
        }
        return HIPR_SUCCESS;
    }
}

/* Frame a request (the bulk split into DATA frames of chunk_bytes) into the log. */
static int put_request(uint16_t opcode, uint32_t id, uint32_t flags, const uint8_t *cbor,
                       size_t cbor_len, const uint8_t *bulk, size_t bulk_len) {
    size_t chunk = (size_t)S.chunk_bytes;
    size_t first = bulk_len < chunk ? bulk_len : chunk;
    uint32_t more = first < bulk_len ? HIPR_F_MORE : 0;
    if (hipr_wire_put(&S.wire, opcode, id, flags | more, cbor, cbor_len, bulk, first))
        return HIPR_OUT_OF_MEMORY;
    size_t off = first;
    while (off < bulk_len) {
        size_t n = bulk_len - off < chunk ? bulk_len - off : chunk;
        uint32_t fl = off + n < bulk_len ? HIPR_F_MORE : 0;
        if (hipr_wire_put(&S.wire, OP_DATA, id, fl, NULL, 0, bulk + off, n))
            return HIPR_OUT_OF_MEMORY;
        off += n;
    }
    return HIPR_SUCCESS;
}

/* The queued launches as one frame (LAUNCH_KERNEL for one, LAUNCH_KERNELS for more). */
static int put_batch(void) { return put_batch_as(0, NULL); }

/* put_batch; with `synchronize` (protocol 1.3) the frame also stands for the
 * DEVICE_SYNCHRONIZE after the launches: it asks for a reply, whose id goes to `id_out`. */
static int put_batch_as(int synchronize, uint32_t *id_out) {
    /* Under `lock`, as B is. */
    static uint8_t map[HIPR_LAUNCH_CBOR_ROOM(BATCH_BYTES, BATCH_MAX)];
    int count = B.count;
    B.count = 0; /* put_request below must not come back here */
    size_t len = hipr_launch_cbor(map, sizeof map, &B.config, B.data, B.lens, (size_t)count,
                                  synchronize);
    B.used = 0;
    if (!len) return HIPR_INVALID_VALUE; /* no launch queued: a caller's bug */
    uint32_t id = hipr_wire_take_id(&S.wire);
    int rc = put_request(count == 1 ? OP_LAUNCH_KERNEL : OP_LAUNCH_KERNELS, id,
                         synchronize ? 0 : HIPR_F_NO_REPLY, map, len, NULL, 0);
    if (id_out) *id_out = id;
    return rc;
}

/* The id of the next request. Queued launches are framed first: requests run in the
 * order they were made, and the worker takes ids in increasing order (a lower one is a
 * replay to it). */
static int take_id(uint32_t *id) {
    if (B.count) {
        int rc = put_batch();
        if (rc) return rc;
    }
    *id = hipr_wire_take_id(&S.wire);
    return HIPR_SUCCESS;
}

static int encode_args(hipr_map *args, uint8_t **cbor, size_t *len) {
    *cbor = NULL;
    *len = 0;
    if (!args) return HIPR_SUCCESS;
    int rc = hipr_map_encode(args, cbor, len) == 0 ? HIPR_SUCCESS : HIPR_OUT_OF_MEMORY;
    hipr_map_free(args);
    return rc;
}

/* --- data links (protocol 1.4) ----------------------------------------------------------
 * An upload of at least HIPR_STRIPE_MIN_BYTES (MEMCPY_HTOD with `striped`, no bulk) has its
 * bytes sent as DATA chunks over K further connections of the session at once, one sender
 * thread each (sendmsg straight from the caller's memory), so that neither side's single
 * socket thread bounds it. The request itself goes on the main link through the resend
 * log as any other, first; the caller awaits its reply while the senders send the chunks
 * and then watch their links. A data link survives a RESUME of the main link; one that
 * fails before the reply (a send, or the worker closing it) is closed and every chunk it
 * carried goes again on a freshly opened one (or on another live one). The senders touch
 * only D, under D.mu; the caller starts and ends a job with `lock` held, so at most one
 * runs, and no sender uses the caller's memory once it ended.
 *
 * A download of as many bytes (MEMCPY_DTOH with `striped`) is a job too: the worker
 * writes its chunks (DATA, flags REPLY) on its data links, and each slot's thread reads
 * its link into the caller's sink while the caller awaits the reply on the main link,
 * then every chunk. A download that fails in any way (the worker's error, a link that
 * ended, chunks missing) is asked again unstriped on the main link, its data links
 * closed (chunks of it may be on their way there); they open anew on the next copy.
 * The links of slots that have none open at once, each by its slot's thread (the
 * session's first alone: a worker that refuses data links is asked once). */
#define DL_MAX 16
#define DL_DEFAULT 4
#define STRIPE_MIN_DEFAULT (16.0 * 1024 * 1024)
/* Opening a replacement for a data link that failed mid-upload: at most this many tries
 * (within HIPR_RECONNECT_TIMEOUT). */
#define DL_REOPEN_ATTEMPTS 3
/* Chunks a sender writes with one sendmsg. */
#define DL_BATCH 8
/* How often a sender watching its link looks for chunks a failed link left. */
#define DL_WATCH_TICK_MS 50

enum { CLS_WAITING, CLS_BUSY, CLS_DONE };

/* What a data link is opened with (copied from S, under `lock`, at each upload). */
typedef struct dl_params {
    char url[sizeof S.url];
    char session_id[sizeof S.session_id];
    char resume_token[sizeof S.resume_token];
    double open_s, send_s, reconnect_s;
    int attempts, debug;
} dl_params;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    hipr_link *link[DL_MAX]; /* slot k's data link, or NULL */
    int thread[DL_MAX];      /* slot k's sender runs */
    int live;                /* slots with a link */
    dl_params p;
    /* The job: chunk j of request `id` is bytes [j*chunk, ...) of `bulk`; class c is the
     * chunks j = c (mod classes), sent by one sender at a time from next[c] on. */
    int active;
    uint32_t id;
    const uint8_t *bulk;
    size_t len, chunk, nchunks;
    int classes;
    int rank[DL_MAX]; /* slot k's own class, -1 for none */
    size_t next[DL_MAX];
    int state[DL_MAX];
    int sent_by[DL_MAX];  /* the slot whose link carried class c, -1 for none */
    int refused;          /* the worker refused a data link for good: none this session */
    int replaced[DL_MAX]; /* slot k's links replaced in this job (DL_REOPEN_ATTEMPTS most) */
    int sending;          /* senders at work on a class */
    int watching;         /* senders watching their link (or replacing it, or reading it) */
    int wake[2];          /* a pipe: readable once the job ended, until the next */
    /* A download job (MEMCPY_DTOH with `striped`): chunk j of request `id` lands at
     * sink + j*chunk, read by slot k's thread from its link; have[j]: 0 not seen, 1
     * arriving, 2 landed. */
    int download;
    uint8_t *sink;
    uint8_t *have;
    size_t landed;
    int rx_lost;          /* data links that ended (or sent a frame not a chunk) in the job */
    uint64_t rx_at;       /* when bytes of the job last arrived (now_ns) */
    /* Opening: slot k's thread opens its link (dl_prepare waits for every one). */
    int open_asked[DL_MAX];
    int opening;
} D = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .work = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER,
       .wake = {-1, -1}};

/* `cbor` (a map, or nothing) with `striped: true` added (malloc'd): 0, or -1 when the map
 * is not one this can extend (the upload then goes unstriped). */
static int striped_args(const uint8_t *cbor, size_t len, uint8_t **out, size_t *out_len) {
    static const uint8_t pair[] = {0x67, 's', 't', 'r', 'i', 'p', 'e', 'd', 0xf5};
    uint64_t count = 0;
    size_t head = 0;
    if (len) {
        uint8_t b = cbor[0];
        if (b >= 0xa0 && b <= 0xb7) {
            count = b & 0x1f;
            head = 1;
        } else if (b == 0xb8 && len >= 2) {
            count = cbor[1];
            head = 2;
        } else if (b == 0xb9 && len >= 3) {
            count = (uint64_t)cbor[1] << 8 | cbor[2];
            head = 3;
        } else {
            return -1;
        }
    }
    uint8_t new_head[9];
    size_t h = hipr_cbor_head(new_head, 5, count + 1);
    size_t n = h + (len - head) + sizeof pair;
    uint8_t *p = malloc(n);
    if (!p) return -1;
    memcpy(p, new_head, h);
    if (len > head) memcpy(p + h, cbor + head, len - head);
    memcpy(p + h + (len - head), pair, sizeof pair);
    *out = p;
    *out_len = n;
    return 0;
}

/* DATA_LINK on the new link `l` and the worker's answer: 0 (attached), 1 (refused: `err`
 * says why; for the rest of the session unless it was a quota, which a data link that
 * just closed may still count against) or -1 (the link failed). */
static int dl_handshake(hipr_link *l, const dl_params *p, char *err, size_t err_size) {
    hipr_map m;
    hipr_map_init(&m, 2);
    hipr_map_str(&m, "session_id", p->session_id, strlen(p->session_id));
    hipr_map_str(&m, "resume_token", p->resume_token, strlen(p->resume_token));
    uint8_t *cbor = NULL;
    size_t len = 0;
    int enc = hipr_map_encode(&m, &cbor, &len);
    hipr_map_free(&m);
    if (enc != 0) {
        free(cbor);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    uint8_t head[28];
    size_t h = hipr_wire_head(head, OP_DATA_LINK, 0, 0, len, 0);
    struct iovec v[2] = {{head, h}, {cbor, len}};
    int sent = hipr_link_send(l, v, 2);
    explicit_bzero(cbor, len);
    free(cbor);
    if (sent < 0) {
        snprintf(err, err_size, "cannot write to the worker: %s", strerror(errno));
        return -1;
    }
    hipr_wire w;
    hipr_wire_init(&w, 1 << 20);
    double deadline = now_s() + p->open_s;
    int rc = -1;
    for (;;) {
        hipr_frame f;
        int got = hipr_wire_next(&w, &f);
        if (got < 0) {
            snprintf(err, err_size, "%s", w.error);
            break;
        }
        if (got == 1) {
            if (f.opcode == OP_PING || f.request_id != 0) continue;
            if (f.flags & HIPR_F_ERROR) {
                char msg[400], kind[32] = "";
                cbor_item_t *map = hipr_cbor_load(f.cbor, f.cbor_len);
                hipr_error_code(map, msg, sizeof msg);
                if (map && hipr_cbor_text(map, "kind", kind, sizeof kind) != 0) kind[0] = '\0';
                if (map) cbor_decref(&map);
                snprintf(err, err_size, "the worker refused a data link: %s", msg);
                rc = 1;
                if (strcmp(kind, "quota") != 0) __atomic_store_n(&D.refused, 1, __ATOMIC_RELAXED);
            } else if (f.opcode == OP_DATA_LINK && (f.flags & HIPR_F_REPLY)) {
                rc = 0;
            } else {
                snprintf(err, err_size, "unexpected answer to DATA_LINK (opcode 0x%04x)",
                         (unsigned)f.opcode);
            }
            break;
        }
        double left = deadline - now_s();
        int ready = left > 0 ? hipr_link_wait_readable(l, (int)(left * 1000) + 1) : 0;
        if (ready <= 0) {
            snprintf(err, err_size, "no answer to DATA_LINK within %g s", p->open_s);
            break;
        }
        size_t room;
        uint8_t *in = hipr_wire_space(&w, 4096, &room);
        if (!in) {
            snprintf(err, err_size, "out of memory");
            break;
        }
        long n = hipr_link_recv(l, in, room);
        if (n <= 0) {
            snprintf(err, err_size, "the worker closed the data link");
            break;
        }
        hipr_wire_commit(&w, (size_t)n);
    }
    hipr_wire_free(&w);
    return rc;
}

/* A new data link of the session, or NULL with `err` saying why. */
static hipr_link *dl_open(const dl_params *p, double timeout_s, char *err, size_t err_size) {
    hipr_link *l = hipr_link_open(p->url, timeout_s, err, err_size);
    if (!l) return NULL;
    hipr_link_set_send_timeout(l, p->send_s);
    dl_params q = *p;
    q.open_s = timeout_s;
    int rc = dl_handshake(l, &q, err, err_size);
    explicit_bzero(q.resume_token, sizeof q.resume_token);
    if (rc == 0) return l;
    hipr_link_close(l);
    return NULL;
}

/* A replacement for a data link that failed mid-upload: a few tries within the
 * reconnect timeout. */
static hipr_link *dl_reopen(const dl_params *p, int slot) {
    double deadline = now_s() + p->reconnect_s;
    double delay = 0.05;
    char err[700] = "";
    for (int attempt = 0; attempt < p->attempts; attempt++) {
        double left = deadline - now_s();
        if (left <= 0) break;
        hipr_link *l = dl_open(p, left < p->open_s ? left : p->open_s, err, sizeof err);
        if (l) {
            if (p->debug) fprintf(stderr, "hipr proxy: data link %d reopened\n", slot);
            return l;
        }
        double wait = delay < deadline - now_s() ? delay : deadline - now_s();
        if (wait > 0) {
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        delay *= 2;
    }
    if (p->debug) fprintf(stderr, "hipr proxy: data link %d cannot reopen: %s\n", slot, err);
    return NULL;
}

/* Chunks j, j+stride, ... (at most DL_BATCH, below `end`) on `l` with one sendmsg: the
 * next chunk after them, or 0 when the link failed. */
static size_t dl_send_batch(hipr_link *l, uint32_t id, const uint8_t *bulk, size_t len,
                            size_t chunk, size_t j, size_t stride, size_t end) {
    uint8_t heads[DL_BATCH][28], args[DL_BATCH][HIPR_CHUNK_ARGS_MAX];
    struct iovec v[DL_BATCH * 3];
    int nv = 0;
    for (int b = 0; b < DL_BATCH && j < end; b++, j += stride) {
        size_t off = j * chunk;
        size_t n = len - off < chunk ? len - off : chunk;
        size_t a = hipr_chunk_args(args[b], off);
        size_t h = hipr_wire_head(heads[b], OP_DATA, id, 0, a, n);
        v[nv++] = (struct iovec){heads[b], h};
        v[nv++] = (struct iovec){args[b], a};
        v[nv++] = (struct iovec){(void *)(bulk + off), n};
    }
    return hipr_link_send(l, v, nv) < 0 ? 0 : j;
}

/* Under D.mu: the classes slot k's link carried in this job go again from their first
 * chunk (bytes written before a link failed may be lost with it; the worker takes a
 * chunk sent again once). */
static void dl_revert(int k) {
    for (int c = 0; c < D.classes; c++) {
        if (D.sent_by[c] == k && D.state[c] == CLS_DONE) {
            D.state[c] = CLS_WAITING;
            D.next[c] = (size_t)c;
            D.sent_by[c] = -1;
        }
    }
}

/* Under D.mu: slot k's link failed: closed, and replaced when it carried chunks of the
 * job under way (`needed`). D.mu is released meanwhile; the caller counts this thread
 * as sending or watching throughout, so the slot is not opened by anyone else. */
static void dl_replace(int k, int needed) {
    hipr_link *l = D.link[k];
    D.link[k] = NULL;
    D.live--;
    /* Bounded: a worker that takes no chunk (its request never came: the main link went
     * down unseen) must not keep a slot reopening; the caller then resumes the session. */
    if (D.replaced[k]++ >= DL_REOPEN_ATTEMPTS) needed = 0;
    dl_params p = D.p;
    pthread_mutex_unlock(&D.mu);
    if (p.debug) fprintf(stderr, "hipr proxy: data link %d failed\n", k);
    hipr_link_close(l);
    hipr_link *fresh = needed ? dl_reopen(&p, k) : NULL;
    explicit_bzero(p.resume_token, sizeof p.resume_token);
    pthread_mutex_lock(&D.mu);
    if (fresh) {
        D.link[k] = fresh;
        D.live++;
    }
}

/* Under D.mu: a class for slot k's sender (its own first), marked busy; -1 for none. */
static int dl_pick(int k) {
    if (!D.active || !D.link[k]) return -1;
    int c = D.rank[k];
    if (c < 0 || c >= D.classes || D.state[c] != CLS_WAITING) {
        for (c = 0; c < D.classes && D.state[c] != CLS_WAITING; c++) {
        }
        if (c == D.classes) return -1;
    }
    D.state[c] = CLS_BUSY;
    D.sending++;
    return c;
}

/* Under D.mu (released while sending): class c's chunks from slot k's link, a failed
 * link replaced (and what it carried sent again). 1 once every chunk went out (or the
 * job ended), 0 when the slot lost its link. */
static int dl_run_class(int k, int c) {
    for (;;) {
        hipr_link *l = D.link[k];
        uint32_t id = D.id;
        const uint8_t *bulk = D.bulk;
        size_t len = D.len, chunk = D.chunk, end = D.nchunks, stride = (size_t)D.classes;
        size_t j = D.next[c];
        pthread_mutex_unlock(&D.mu);
        while (j < end && __atomic_load_n(&D.active, __ATOMIC_RELAXED) &&
               (j = dl_send_batch(l, id, bulk, len, chunk, j, stride, end)) != 0) {
        }
        pthread_mutex_lock(&D.mu);
        if (j >= end || !D.active) {
            D.next[c] = j;
            D.sent_by[c] = k;
            return 1;
        }
        D.next[c] = (size_t)c;
        dl_revert(k);
        dl_replace(k, 1);
        if (!D.link[k]) return 0;
    }
}

/* Under D.mu (released while waiting): slot k's link, whose chunks went out, watched
 * until the job ends (the worker replied): one that fails meanwhile (a cut route loses
 * what it had taken) is replaced and its chunks sent again. */
static void dl_watch(int k) {
    hipr_link *l = D.link[k];
    int wake = D.wake[0];
    D.watching++;
    pthread_mutex_unlock(&D.mu);
    /* A tick: a class a failed slot could not send again may be waiting for this one. */
    int rc = hipr_link_wait_readable_or(l, wake, DL_WATCH_TICK_MS);
    pthread_mutex_lock(&D.mu);
    if ((rc == 1 || rc < 0) && D.link[k] == l) {
        /* The worker sends nothing on a data link: anything readable is its end. */
        int carried = 0;
        for (int c = 0; c < D.classes; c++) carried |= D.sent_by[c] == k;
        if (D.active) dl_revert(k);
        dl_replace(k, D.active && carried);
        pthread_cond_broadcast(&D.work); /* another slot may take the chunks */
    }
    D.watching--;
    pthread_cond_broadcast(&D.done);
}

enum { RX_HEAD, RX_ARGS, RX_BULK, RX_DRAIN };

/* Under D.mu (released while reading): slot k's link read for the download job under
 * way until it ends. Each frame must be a chunk (DATA, flags REPLY, {offset}, bytes): one
 * of this request (its offset a multiple of the chunk size, inside the copy, its length
 * the chunk's, not seen before) is received straight into the sink; one of an earlier
 * request (a striped download that was asked again unstriped) is read and dropped.
 * Anything else ends the link (closed; the caller then asks again unstriped), as does a
 * frame cut short by the job's end (the link would be out of step). */
static void dl_receive(int k) {
    hipr_link *l = D.link[k];
    int wake = D.wake[0];
    uint32_t id = D.id;
    uint8_t *sink = D.sink;
    size_t len = D.len, chunk = D.chunk;
    int debug = D.p.debug;
    D.watching++;
    pthread_mutex_unlock(&D.mu);
    uint8_t head[HIPR_HEADER_SIZE + 4 + HIPR_CHUNK_ARGS_MAX];
    uint8_t scratch[16384];
    int phase = RX_HEAD;
    size_t got = 0, need = HIPR_HEADER_SIZE + 4, j = 0;
    uint64_t bulk = 0;
    uint32_t rid = 0;
    const char *why = NULL;
    while (!why && __atomic_load_n(&D.active, __ATOMIC_RELAXED)) {
        uint8_t *p = phase == RX_BULK ? sink + j * chunk + got
                     : phase == RX_DRAIN ? scratch
                                         : head + got;
        size_t room = need - got;
        if (phase == RX_DRAIN && room > sizeof scratch) room = sizeof scratch;
        long n = room ? hipr_link_recv_nowait(l, p, room) : 0;
        if (room && n == -2) {
            /* Woken (2) once the job ended: the loop's test then ends it here. */
            if (hipr_link_wait_readable_or(l, wake, 1000) < 0) why = "cannot poll it";
            continue;
        }
        if (room && n <= 0) {
            why = n == 0 ? "the worker closed it" : "a read failed";
            break;
        }
        got += (size_t)n;
        __atomic_store_n(&D.rx_at, now_ns(), __ATOMIC_RELAXED);
        if (got < need) continue;
        if (phase == RX_HEAD) {
            size_t args;
            if (hipr_chunk_head(head, HIPR_F_REPLY, &rid, &args, &bulk)) {
                why = "it carried a frame that is not a chunk";
                break;
            }
            phase = RX_ARGS;
            need = HIPR_HEADER_SIZE + 4 + args;
        } else if (phase == RX_ARGS) {
            uint64_t off;
            size_t at = HIPR_HEADER_SIZE + 4;
            if (hipr_chunk_offset(head + at, need - at, &off)) {
                why = "a chunk's args are not {offset}";
                break;
            }
            if (rid == id) {
                if (off % chunk || off >= len || bulk != (len - off < chunk ? len - off : chunk)) {
                    why = "a chunk lies outside the copy";
                    break;
                }
                j = (size_t)(off / chunk);
                pthread_mutex_lock(&D.mu);
                int seen = D.have[j];
                D.have[j] = 1;
                pthread_mutex_unlock(&D.mu);
                if (seen) {
                    why = "a chunk came twice";
                    break;
                }
                phase = RX_BULK;
            } else if (rid != 0 && rid < id && bulk <= chunk) {
                phase = RX_DRAIN; /* a chunk of a download asked again unstriped */
            } else {
                why = "a chunk of no copy under way";
                break;
            }
            got = 0;
            need = (size_t)bulk;
        } else {
            if (phase == RX_BULK) {
                pthread_mutex_lock(&D.mu);
                D.have[j] = 2;
                D.landed++;
                pthread_cond_broadcast(&D.done);
                pthread_mutex_unlock(&D.mu);
            }
            phase = RX_HEAD;
            got = 0;
            need = HIPR_HEADER_SIZE + 4;
        }
    }
    if (!why && (phase != RX_HEAD || got)) why = "the copy ended inside a frame";
    pthread_mutex_lock(&D.mu);
    if (why) {
        if (D.active) D.rx_lost++;
        if (D.link[k] == l) {
            D.link[k] = NULL;
            D.live--;
        }
        pthread_mutex_unlock(&D.mu);
        if (debug) fprintf(stderr, "hipr proxy: data link %d closed: %s\n", k, why);
        hipr_link_close(l);
        pthread_mutex_lock(&D.mu);
    }
    D.watching--;
    pthread_cond_broadcast(&D.done);
}

/* Under D.mu: slot k's link opened, as dl_prepare asked (it waits for every one). */
static void dl_open_slot(int k) {
    D.open_asked[k] = 0;
    dl_params p = D.p;
    pthread_mutex_unlock(&D.mu);
    char err[700];
    hipr_link *l = dl_open(&p, p.open_s, err, sizeof err);
    explicit_bzero(p.resume_token, sizeof p.resume_token);
    if (p.debug) {
        if (l) fprintf(stderr, "hipr proxy: data link %d open\n", k);
        else fprintf(stderr, "hipr proxy: data link %d did not open: %s\n", k, err);
    }
    pthread_mutex_lock(&D.mu);
    if (l) {
        D.link[k] = l;
        D.live++;
    }
    D.opening--;
    pthread_cond_broadcast(&D.done);
}

/* Slot k's thread: opens its link when asked; for an upload job sends its class (and
 * any class a failed slot left waiting) and watches its link until the job ends; for a
 * download job reads its link's chunks; until the process ends. */
static void *dl_sender(void *arg) {
    int k = (int)(intptr_t)arg;
    pthread_mutex_lock(&D.mu);
    for (;;) {
        if (D.open_asked[k]) {
            dl_open_slot(k);
            continue;
        }
        if (D.active && D.download) {
            if (D.link[k]) dl_receive(k);
            else pthread_cond_wait(&D.work, &D.mu);
            continue;
        }
        int c = dl_pick(k);
        if (c < 0) {
            if (D.active && D.link[k]) dl_watch(k);
            else pthread_cond_wait(&D.work, &D.mu);
            continue;
        }
        int sent = dl_run_class(k, c);
        D.state[c] = sent ? CLS_DONE : CLS_WAITING;
        D.sending--;
        pthread_cond_broadcast(&D.done);
        if (!sent) pthread_cond_broadcast(&D.work); /* another slot takes the class */
    }
    return NULL;
}

/* Under `lock`: how many data links a copy of `len` bytes of `opcode` (an upload, or a
 * download: MEMCPY_DTOH into a sink) goes over now (0: unstriped). */
static int dl_wanted(uint16_t opcode, size_t len) {
    if ((opcode != OP_MEMCPY_HTOD && opcode != OP_MEMCPY_DTOH) || !len ||
        (double)len < S.stripe_min || !S.link || S.minor < 4 || !S.session_id[0])
        return 0;
    const char *kind = hipr_link_kind(S.link);
    if (strcmp(kind, "tcp") != 0 && strcmp(kind, "unix") != 0) return 0;
    if (__atomic_load_n(&D.refused, __ATOMIC_RELAXED)) return 0;
    uint64_t k = S.data_links < (uint64_t)S.dl_limit ? S.data_links : (uint64_t)S.dl_limit;
    return (int)k;
}

/* Under `lock` and D.mu (released meanwhile): the slots in `ask` open their links, each
 * on its own thread (started here where it does not run yet), at once; returns once
 * every one opened or failed (within the connect timeout). */
static void dl_open_slots(const int *ask, int n) {
    int asked = 0;
    for (int i = 0; i < n; i++) {
        int k = ask[i];
        if (!D.thread[k]) {
            if (hipr_start_quiet_thread_arg(dl_sender, (void *)(intptr_t)k) != 0) continue;
            D.thread[k] = 1;
        }
        D.open_asked[k] = 1;
        D.opening++;
        asked++;
    }
    if (!asked) return;
    pthread_cond_broadcast(&D.work);
    while (D.opening) pthread_cond_wait(&D.done, &D.mu);
}

/* Under `lock`: the data links of slots [0, want) open (ones found dead, or past `want`,
 * closed; ones that do not open are tried again at the next copy), each with its
 * thread. The first link of a session that has none opens alone (a worker that refuses
 * data links is asked once), the others in parallel, each by its slot's thread. How many
 * are open. */
static int dl_prepare(int want) {
    if (D.wake[0] < 0 && pipe2(D.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        D.wake[0] = D.wake[1] = -1;
        return 0;
    }
    pthread_mutex_lock(&D.mu);
    dl_params *p = &D.p;
    snprintf(p->url, sizeof p->url, "%s", S.url);
    snprintf(p->session_id, sizeof p->session_id, "%s", S.session_id);
    memcpy(p->resume_token, S.resume_token, sizeof p->resume_token);
    p->open_s = S.connect_s;
    p->send_s = S.silent_limit_s;
    p->reconnect_s = S.reconnect_s;
    p->attempts = S.reconnect_attempts < DL_REOPEN_ATTEMPTS ? S.reconnect_attempts
                                                            : DL_REOPEN_ATTEMPTS;
    p->debug = S.debug;
    hipr_link *stale[DL_MAX];
    int n_stale = 0;
    for (int k = 0; k < DL_MAX; k++) {
        /* Between copies the worker sends nothing on a data link: anything readable is
         * its end. */
        if (D.link[k] && (k >= want || hipr_link_wait_readable(D.link[k], 0) != 0)) {
            stale[n_stale++] = D.link[k];
            D.link[k] = NULL;
            D.live--;
        }
    }
    pthread_mutex_unlock(&D.mu);
    for (int i = 0; i < n_stale; i++) hipr_link_close(stale[i]);
    int ask[DL_MAX], n = 0;
    for (int k = 0; k < want; k++)
        if (!D.link[k]) ask[n++] = k; /* only this thread (with `lock`) opens a slot now */
    pthread_mutex_lock(&D.mu);
    int first = 0;
    if (n && !D.live) {
        /* The session's first: alone, so that a refusal for good is met once. */
        dl_open_slots(ask, 1);
        first = 1;
    }
    if (!__atomic_load_n(&D.refused, __ATOMIC_RELAXED)) dl_open_slots(ask + first, n - first);
    int live = D.live;
    pthread_mutex_unlock(&D.mu);
    return live;
}

/* Under `lock`: request `id`'s `len` bytes are read from the data links into `sink` as
 * they come (have[]: one byte per chunk, zeroed), until dl_end_job. */
static void dl_start_download(uint32_t id, uint8_t *sink, size_t len, uint8_t *have) {
    pthread_mutex_lock(&D.mu);
    D.id = id;
    D.sink = sink;
    D.have = have;
    D.len = len;
    D.chunk = (size_t)S.chunk_bytes;
    D.nchunks = (len + D.chunk - 1) / D.chunk;
    D.classes = 0;
    D.landed = 0;
    D.rx_lost = 0;
    D.rx_at = now_ns();
    D.download = 1;
    __atomic_store_n(&D.active, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&D.work);
    pthread_mutex_unlock(&D.mu);
}

/* Under `lock`, once the download's reply came: 1 when every chunk landed (waiting for
 * those still on their way), 0 when a data link ended first or none arrived for the
 * silent limit. */
static int dl_await_chunks(void) {
    uint64_t limit = (uint64_t)(S.silent_limit_s * 1e9);
    pthread_mutex_lock(&D.mu);
    while (D.active && D.landed < D.nchunks && !D.rx_lost &&
           now_ns() - __atomic_load_n(&D.rx_at, __ATOMIC_RELAXED) < limit) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&D.done, &D.mu, &until);
    }
    int whole = D.active && D.landed == D.nchunks;
    pthread_mutex_unlock(&D.mu);
    return whole;
}

/* Under `lock`: every data link closed (their threads stay): after a striped download
 * that failed, chunks of it may still be on their way on any of them. */
static void dl_drop_links(void) {
    hipr_link *links[DL_MAX];
    pthread_mutex_lock(&D.mu);
    for (int k = 0; k < DL_MAX; k++) {
        links[k] = D.link[k];
        D.link[k] = NULL;
    }
    D.live = 0;
    pthread_mutex_unlock(&D.mu);
    for (int k = 0; k < DL_MAX; k++) hipr_link_close(links[k]);
}

/* Under `lock`: request `id`'s `len` bytes from `bulk` go as chunks over the open data
 * links, and the links are watched (what a failed one carried sent again), until
 * dl_end_job. */
static void dl_start_job(uint32_t id, const uint8_t *bulk, size_t len) {
    pthread_mutex_lock(&D.mu);
    D.id = id;
    D.bulk = bulk;
    D.len = len;
    D.chunk = (size_t)S.chunk_bytes;
    D.nchunks = (len + D.chunk - 1) / D.chunk;
    int classes = 0;
    for (int k = 0; k < DL_MAX; k++) D.rank[k] = D.link[k] ? classes++ : -1;
    if ((size_t)classes > D.nchunks) classes = (int)D.nchunks;
    D.classes = classes;
    for (int c = 0; c < classes; c++) {
        D.next[c] = (size_t)c;
        D.state[c] = CLS_WAITING;
        D.sent_by[c] = -1;
    }
    memset(D.replaced, 0, sizeof D.replaced);
    D.download = 0;
    __atomic_store_n(&D.active, 1, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&D.work);
    pthread_mutex_unlock(&D.mu);
}

/* Under D.mu: the job under way (if any) ends; returns once no sender uses the caller's
 * memory or a link. How many chunks were never sent. */
static size_t dl_stop(void) {
    if (!D.active) return 0;
    __atomic_store_n(&D.active, 0, __ATOMIC_RELAXED);
    char byte = 1;
    if (write(D.wake[1], &byte, 1) < 0) {
        /* Cannot fail but full, and then the watchers wake anyway. */
    }
    pthread_cond_broadcast(&D.work);
    while (D.sending || D.watching) pthread_cond_wait(&D.done, &D.mu);
    char drain[16];
    while (read(D.wake[0], drain, sizeof drain) > 0) {
    }
    D.bulk = NULL;
    D.sink = D.have = NULL;
    size_t unsent = 0;
    for (int c = 0; c < D.classes; c++)
        if (D.state[c] != CLS_DONE)
            unsent += (D.nchunks - D.next[c] + (size_t)D.classes - 1) / (size_t)D.classes;
    return unsent;
}

/* Under `lock`, once the striped request has its reply (or failed): the senders stop
 * and let go of the caller's memory. */
static void dl_end_job(void) {
    pthread_mutex_lock(&D.mu);
    size_t unsent = dl_stop();
    pthread_mutex_unlock(&D.mu);
    if (unsent && S.debug)
        fprintf(stderr, "hipr proxy: %zu chunks of a striped upload found no data link\n",
                unsent);
}

/* The data links closed (the session is over, or the process ends); `forget` in a forked
 * child: the parent's links and senders are not this process's. Under `lock`. */
static void dl_close_all(int forget) {
    hipr_link *links[DL_MAX];
    pthread_mutex_lock(&D.mu);
    /* The session may be lost in the middle of a striped upload (its RESUME refused). */
    if (!forget) (void)dl_stop();
    for (int k = 0; k < DL_MAX; k++) {
        links[k] = D.link[k];
        D.link[k] = NULL;
        if (forget) D.thread[k] = 0;
    }
    D.live = 0;
    if (forget) {
        /* The pipe is shared with the parent: a wake here must not reach its senders. */
        D.active = D.sending = D.watching = D.refused = D.opening = 0;
        memset(D.open_asked, 0, sizeof D.open_asked);
        for (int i = 0; i < 2; i++) {
            if (D.wake[i] >= 0) close(D.wake[i]);
            D.wake[i] = -1;
        }
    }
    pthread_mutex_unlock(&D.mu);
    for (int k = 0; k < DL_MAX; k++) {
        if (forget) hipr_link_forget(links[k]);
        else hipr_link_close(links[k]);
    }
}

/* Forward: the exchange and flush below. */
static int exchange(uint32_t id, const direct *d, void *sink, size_t sink_size, hipr_reply *r);
static int flush_or_recover(void);

/* An upload striped over the data links, when `want` of them may be used and at least
 * one opens (*striped = 1; a hipError_t), else *striped = 0 and nothing was sent. */
static int striped_call(int want, uint16_t opcode, uint32_t id, uint32_t flags,
                        const uint8_t *cbor, size_t cbor_len, const uint8_t *bulk,
                        size_t bulk_len, void *sink, size_t sink_size, hipr_reply *r,
                        int *striped) {
    *striped = 0;
    int open = dl_prepare(want);
    uint8_t *args;
    size_t args_len;
    if (!open || striped_args(cbor, cbor_len, &args, &args_len)) return HIPR_SUCCESS;
    *striped = 1;
    int rc = put_request(opcode, id, flags, args, args_len, NULL, 0);
    free(args);
    if (rc) return rc;
    if (S.debug)
        fprintf(stderr, "hipr proxy: striped upload of %zu bytes over %d data links\n", bulk_len,
                open);
    /* The request first (the worker then takes the chunks straight into place: it holds
     * only so many chunks of a request it has not seen), then the chunks, while this
     * thread awaits the reply: a main link that drops meanwhile is resumed at once (the
     * worker replays the request and takes the chunks it holds for it) rather than once
     * every chunk went out, which a worker holding all it may would never let happen. */
    rc = flush_or_recover();
    if (rc) return rc;
    dl_start_job(id, bulk, bulk_len);
    rc = exchange(id, NULL, sink, sink_size, r);
    dl_end_job();
    return rc;
}

/* A download (MEMCPY_DTOH into `sink`) striped over the data links, when `want` of them
 * may be used and at least one opens (*striped = 1), else *striped = 0 and nothing was
 * sent. HIPR_SUCCESS once the reply came and every chunk landed in the sink; otherwise
 * (the worker's error, a data link that ended, chunks missing; `why` says which) the
 * caller asks again unstriped: a read changes nothing. */
static int striped_download(int want, uint32_t id, const uint8_t *cbor, size_t cbor_len,
                            void *sink, size_t sink_size, hipr_reply *r, int *striped,
                            const char **why) {
    *striped = 0;
    int open = dl_prepare(want);
    uint8_t *args;
    size_t args_len;
    if (!open || striped_args(cbor, cbor_len, &args, &args_len)) return HIPR_SUCCESS;
    size_t chunk = (size_t)S.chunk_bytes;
    uint8_t *have = calloc((sink_size + chunk - 1) / chunk, 1);
    if (!have) {
        free(args);
        return HIPR_SUCCESS;
    }
    *striped = 1;
    int rc = put_request(OP_MEMCPY_DTOH, id, 0, args, args_len, NULL, 0);
    free(args);
    if (rc) {
        free(have);
        *why = "out of memory";
        return rc;
    }
    if (S.debug)
        fprintf(stderr, "hipr proxy: striped download of %zu bytes over %d data links\n",
                sink_size, open);
    /* The chunks may come before the reply (the worker replies once every one was
     * written to its link): the links are read from now on. */
    dl_start_download(id, sink, sink_size, have);
    rc = exchange(id, NULL, NULL, 0, r);
    int whole = 0;
    if (rc == HIPR_SUCCESS && r->bulk_len == 0) whole = dl_await_chunks();
    dl_end_job();
    free(have);
    if (rc) {
        *why = r->message[0] ? r->message : "the worker's error";
        return rc;
    }
    if (!whole) {
        *why = r->bulk_len ? "the reply carried bytes" : "chunks did not arrive";
        return HIPR_UNKNOWN;
    }
    r->sink_len = sink_size;
    return HIPR_SUCCESS;
}

/* --- reconnecting ---------------------------------------------------------------------- */

static int handshake(uint16_t opcode, hipr_map *m, cbor_item_t **reply, char *err,
                     size_t err_size);
static void accept_handshake(const cbor_item_t *map);

/* The link failed: reconnect and RESUME the session, then send the log again (from
 * the caller's next flush). HIPR_SUCCESS, or the error every call returns from now on.
 * Runs under the lock, so exactly one thread reconnects. */
static int recover(void) {
    if (S.state != S_READY) return S.fail_code ? S.fail_code : HIPR_UNKNOWN;
    drop_link();
    if (S.closing || !S.session_id[0] || S.reconnect_attempts <= 0) return lose(S.why);
    fprintf(stderr, "hipr proxy: lost the link to the worker at %s (%s); reconnecting\n", S.url,
            S.why);
    double deadline = now_s() + S.reconnect_s;
    double delay = 0.05;
    char err[700];
    for (int attempt = 1; attempt <= S.reconnect_attempts; attempt++) {
        double left = deadline - now_s();
        if (left <= 0) break;
        S.link = hipr_link_open(S.url, left < 30 ? left : 30, err, sizeof err);
        if (S.link) {
            hipr_wire_reset_input(&S.wire);
            hipr_map m;
            hipr_map_init(&m, 2);
            hipr_map_str(&m, "session_id", S.session_id, strlen(S.session_id));
            hipr_map_str(&m, "resume_token", S.resume_token, strlen(S.resume_token));
            cbor_item_t *reply = NULL;
            int rc = handshake(OP_RESUME, &m, &reply, err, sizeof err);
            if (rc == HIPR_SUCCESS) {
                uint64_t last = 0;
                hipr_cbor_uint(reply, "last_executed_id", &last);
                accept_handshake(reply);
                cbor_decref(&reply);
                hipr_wire_rewind(&S.wire, (uint32_t)last);
                S.last_rx = now_s();
                S.resumes++;
                fprintf(stderr,
                        "hipr proxy: resumed the session with the worker at %s (attempt %d)\n",
                        S.url, attempt);
                return HIPR_SUCCESS;
            }
            drop_link();
            if (rc != LINK_DOWN) {
                /* The worker answered and refused: the session is gone for good. */
                char why[900];
                snprintf(why, sizeof why, "session %.100s cannot resume: %.700s", S.session_id,
                         err);
                return lose(why);
            }
        }
        double wait = delay < deadline - now_s() ? delay : deadline - now_s();
        if (wait > 0) {
            /* Full jitter: clients cut off together do not come back in lockstep. */
            wait *= 0.5 + 0.5 * ((double)(rand() & 0xffff) / 65536.0);
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        delay = delay * 2 > 5 ? 5 : delay * 2;
    }
    char why[1200];
    snprintf(why, sizeof why,
             "could not reconnect within %d attempts / %g s (last error: %.700s); the session "
             "and its handles are gone",
             S.reconnect_attempts, S.reconnect_s, err);
    return lose(why);
}

static void reset_reply(hipr_reply *r) {
    if (r->map) cbor_decref(&r->map);
    free(r->bulk);
    r->bulk = NULL;
    r->bulk_len = 0;
    r->sink_len = 0; /* a replayed reply comes again from its start */
}

/* Send what waits (and `d`, a request straight from the caller's memory), then wait for
 * the reply to `id`; across dropped links until the session is lost. */
/* Work asked of the devices (each fire-and-forget request, launch, and request that may
 * leave work running once answered is one): its count so far, and per device its value
 * at that device's last work and at its last successful DEVICE_SYNCHRONIZE. While every
 * device's last synchronize came after its last work, nothing runs anywhere in the
 * session and no error can be pending (hipr_idle). Per device, because a synchronize of
 * one device says nothing of another's work queued before it. Under `lock`. */
#define IDLE_DEVICES 64
static uint64_t work_seq;
static uint64_t device_work[IDLE_DEVICES], device_synced[IDLE_DEVICES];
static int untracked_work; /* work on a device past IDLE_DEVICES: never idle again */

/* After use_device: the work goes to the session's device on the worker. */
static void note_work(void) {
    work_seq++;
    int device = S.worker_device;
    if (device >= 0 && device < IDLE_DEVICES) device_work[device] = work_seq;
    else untracked_work = 1;
}

static void note_synced(int device) {
    if (device >= 0 && device < IDLE_DEVICES) device_synced[device] = work_seq;
}

static void forget_work(void) {
    work_seq = 0;
    memset(device_work, 0, sizeof device_work);
    memset(device_synced, 0, sizeof device_synced);
    untracked_work = 0;
}

/* Served by cuda workers (the CUDA front's files name them too). */
#define OP_DEVICE_LIMIT_ 0x0107
#define OP_FUNCTION_ATTRIBUTE_ 0x0509
#define OP_FUNCTION_OCCUPANCY_ 0x050A
#define OP_MODULE_GET_GLOBAL_ 0x050B

/* Requests that leave nothing running on a device once answered. */
static int leaves_no_work(uint16_t opcode) {
    switch (opcode) {
    case OP_DEVICE_COUNT: case OP_SET_DEVICE: case OP_DEVICE_PROPERTIES:
    case OP_DEVICE_SYNCHRONIZE: case OP_MEM_GET_INFO: case OP_DEVICE_LIMIT_:
    case OP_MALLOC: case OP_MEMCPY_DTOH: case OP_STREAM_CREATE: case OP_STREAM_SYNCHRONIZE:
    case OP_STREAM_QUERY: case OP_EVENT_CREATE: case OP_EVENT_SYNCHRONIZE: case OP_EVENT_QUERY:
    case OP_EVENT_ELAPSED_TIME: case OP_MODULE_LOAD: case OP_MODULE_GET_FUNCTION:
    case OP_MODULE_BUILTIN: case OP_FUNCTION_PARAMS: case OP_FUNCTION_ATTRIBUTE_:
    case OP_FUNCTION_OCCUPANCY_: case OP_MODULE_GET_GLOBAL_: case OP_BARRIER: case OP_PING:
        return 1;
    default:
        return 0;
    }
}

int hipr_idle(int device) {
    (void)device; /* a stream's or event's device is not always the caller's: ask all */
    pthread_mutex_lock(&lock);
    int idle = S.state == S_READY && !untracked_work;
    for (int d = 0; idle && d < IDLE_DEVICES; d++)
        if (device_work[d] > device_synced[d]) idle = 0;
    pthread_mutex_unlock(&lock);
    return idle;
}

static __thread unsigned tl_round_trips;

unsigned hipr_round_trips(void) { return tl_round_trips; }

static int exchange(uint32_t id, const direct *d, void *sink, size_t sink_size, hipr_reply *r) {
    tl_round_trips++;
    for (;;) {
        int rc = flush_out();
        if (rc == 0 && d) rc = send_direct(d);
        if (rc == 0) rc = await_reply(id, sink, sink_size, r);
        if (rc != LINK_DOWN) return rc;
        rc = recover();
        if (rc) return rc;
        reset_reply(r);
    }
}

/* Flush; a dropped link is recovered and the log sent again. */
static int flush_or_recover(void) {
    for (;;) {
        int rc = flush_out();
        if (rc != LINK_DOWN) return rc;
        rc = recover();
        if (rc) return rc;
    }
}

/* With the lock held and the session ready. */
static int call_locked(uint16_t opcode, uint32_t flags, const uint8_t *cbor, size_t cbor_len,
                       const void *bulk, size_t bulk_len, void *sink, size_t sink_size,
                       hipr_reply *r) {
    uint32_t id;
    int rc = take_id(&id);
    if (rc) return rc;
    int download = opcode == OP_MEMCPY_DTOH && sink && !bulk_len;
    int links = dl_wanted(opcode, download ? sink_size : bulk_len);
    if (links > 0 && download) {
        int striped;
        const char *why = "";
        rc = striped_download(links, id, cbor, cbor_len, sink, sink_size, r, &striped, &why);
        if (!striped || rc == HIPR_SUCCESS || S.state != S_READY) return rc;
        /* Asked again unstriped (a read changes nothing), the data links closed: chunks
         * of this one may still be on their way on any of them. */
        if (S.debug)
            fprintf(stderr, "hipr proxy: striped download failed (%s); asked again unstriped\n",
                    why);
        dl_drop_links();
        reset_reply(r);
        memset(r->message, 0, sizeof r->message);
        rc = take_id(&id);
        if (rc) return rc;
    } else if (links > 0) {
        int striped;
        rc = striped_call(links, opcode, id, flags, cbor, cbor_len, bulk, bulk_len, sink,
                          sink_size, r, &striped);
        if (striped) return rc;
    }
    if (bulk_len >= DIRECT_BYTES) {
        direct d = {opcode, id, flags, cbor, cbor_len, bulk, bulk_len};
        return exchange(id, &d, sink, sink_size, r);
    }
    rc = put_request(opcode, id, flags, cbor, cbor_len, bulk, bulk_len);
    if (rc) return rc;
    return exchange(id, NULL, sink, sink_size, r);
}

static int simple_call(uint16_t opcode, hipr_map *m) {
    uint8_t *cbor = NULL;
    size_t len = 0;
    int rc = m ? encode_args(m, &cbor, &len) : HIPR_SUCCESS;
    if (rc) return rc;
    hipr_reply r;
    memset(&r, 0, sizeof r);
    rc = call_locked(opcode, 0, cbor, len, NULL, 0, NULL, 0, &r);
    free(cbor);
    hipr_reply_free(&r);
    return rc;
}

static int use_device(int device) {
    if (device < 0 || device == S.worker_device) return HIPR_SUCCESS;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "device", (uint64_t)device);
    int rc = simple_call(OP_SET_DEVICE, &m);
    if (rc == HIPR_SUCCESS) S.worker_device = device;
    return rc;
}

/* After fire-and-forget work: send when enough waits, and let the worker catch up when
 * the resend log grows past LOG_LIMIT (its BARRIER reply acknowledges everything). */
static int after_queued(void) {
    size_t n;
    hipr_wire_output(&S.wire, &n);
    int rc = n >= COALESCE_BYTES ? flush_or_recover() : HIPR_SUCCESS;
    if (rc == HIPR_SUCCESS && hipr_wire_logged_bytes(&S.wire) > LOG_LIMIT)
        rc = simple_call(OP_BARRIER, NULL);
    return rc;
}

/* --- connecting ---------------------------------------------------------------------- */

static void read_token(char *buf, size_t size) {
    buf[0] = '\0';
    const char *t = getenv("HIPR_TOKEN");
    if (t && *t) {
        snprintf(buf, size, "%s", t);
        return;
    }
    const char *path = getenv("HIPR_TOKEN_FILE");
    if (!path || !*path) return;
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "hipr proxy: cannot read HIPR_TOKEN_FILE %s: %s\n", path, strerror(errno));
        return;
    }
    size_t n = fread(buf, 1, size - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
}

static void *keeper(void *arg);

/* HELLO or RESUME (request id 0) on the new link and the worker's answer: HIPR_SUCCESS
 * and the reply map, LINK_DOWN (the link failed: try again), or the worker's refusal. */
static int handshake(uint16_t opcode, hipr_map *m, cbor_item_t **reply, char *err,
                     size_t err_size) {
    uint8_t *cbor;
    size_t len;
    if (encode_args(m, &cbor, &len)) {
        snprintf(err, err_size, "out of memory");
        return HIPR_OUT_OF_MEMORY;
    }
    int rc = send_frame(opcode, 0, 0, cbor, len);
    explicit_bzero(cbor, len);
    free(cbor);
    if (rc) {
        snprintf(err, err_size, "%s", S.why);
        return LINK_DOWN;
    }
    for (;;) {
        hipr_frame f;
        int got = hipr_wire_next(&S.wire, &f);
        if (got < 0) {
            snprintf(err, err_size, "%s", S.wire.error);
            return HIPR_NO_DEVICE;
        }
        if (got == 0) {
            if (read_more(0)) {
                snprintf(err, err_size, "%s during the handshake", S.why);
                return LINK_DOWN;
            }
            continue;
        }
        if (f.request_id != 0 || (f.opcode != opcode && f.opcode != 0)) {
            if (f.opcode == OP_PING && !(f.flags & HIPR_F_REPLY) &&
                send_frame(OP_PING, 0, HIPR_F_REPLY, NULL, 0)) {
                snprintf(err, err_size, "%s", S.why);
                return LINK_DOWN;
            }
            continue; /* a heartbeat that crossed the handshake */
        }
        if (f.flags & HIPR_F_ERROR) {
            char msg[400];
            int code = error_code_of(f.cbor, f.cbor_len, msg, sizeof msg);
            snprintf(err, err_size, "the worker refused %s: %s",
                     opcode == OP_HELLO ? "HELLO" : "RESUME", msg);
            return code == LINK_DOWN ? HIPR_UNKNOWN : code;
        }
        cbor_item_t *map = hipr_cbor_load(f.cbor, f.cbor_len);
        uint64_t proto = 0;
        if (!map || hipr_cbor_uint(map, "protocol", &proto) || (proto >> 8) != 1) {
            if (map) cbor_decref(&map);
            snprintf(err, err_size, "unexpected handshake reply (protocol major must be 1)");
            return HIPR_NO_DEVICE;
        }
        *reply = map;
        return HIPR_SUCCESS;
    }
}

static void accept_handshake(const cbor_item_t *map) {
    uint64_t proto = 0, chunk = 0, max_frame = 0;
    double hb = S.heartbeat_s;
    hipr_cbor_uint(map, "protocol", &proto);
    S.minor = (int)(proto & 0xff);
    if (hipr_cbor_uint(map, "chunk_bytes", &chunk) == 0 && chunk >= 4096) S.chunk_bytes = chunk;
    if (hipr_cbor_uint(map, "max_frame_bytes", &max_frame) == 0 && max_frame > S.chunk_bytes)
        S.wire.max_payload = max_frame + 64 * 1024;
    if (hipr_cbor_float(map, "heartbeat_interval", &hb) == 0 && hb > 0) S.heartbeat_s = hb;
    uint64_t links = 0;
    S.data_links = hipr_cbor_uint(map, "data_links", &links) == 0 ? links : 0;
    /* The worker pings every heartbeat_interval: three missed are a dead link. */
    S.silent_limit_s = 3 * S.heartbeat_s < 2 ? 2 : 3 * S.heartbeat_s;
    if (S.link) hipr_link_set_send_timeout(S.link, S.silent_limit_s);
    /* RESUME's answer repeats the session id and may leave the token out: kept. */
    char text[sizeof S.resume_token];
    if (hipr_cbor_text(map, "session_id", text, sizeof S.session_id) == 0)
        memcpy(S.session_id, text, sizeof S.session_id);
    if (hipr_cbor_text(map, "resume_token", text, sizeof text) == 0 && text[0])
        memcpy(S.resume_token, text, sizeof S.resume_token);
}

static int hello(char *err, size_t err_size) {
    char token[4096];
    read_token(token, sizeof token);
    hipr_map m;
    hipr_map_init(&m, token[0] ? 2 : 1);
    hipr_map_str(&m, "client", "hipr-proxy/0.2", strlen("hipr-proxy/0.2"));
    if (token[0]) hipr_map_str(&m, "token", token, strlen(token));
    explicit_bzero(token, sizeof token);
    cbor_item_t *map = NULL;
    int rc = handshake(OP_HELLO, &m, &map, err, err_size);
    if (rc == LINK_DOWN) return HIPR_NO_DEVICE;
    if (rc) return rc;
    accept_handshake(map);
    if (hipr_cbor_text(map, "backend", S.backend, sizeof S.backend) != 0) S.backend[0] = '\0';
    cbor_decref(&map);
    return HIPR_SUCCESS;
}

/* Usable CPUs (affinity, and a cgroup v2 CPU quota), as hipr/cpus.py counts them. */
static int usable_cpus(void) {
    cpu_set_t set;
    int count = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    FILE *fp = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (fp) {
        char quota[32] = "";
        long period = 100000;
        if (fscanf(fp, "%31s %ld", quota, &period) >= 1 && strcmp(quota, "max") != 0 &&
            period > 0) {
            long q = atol(quota);
            int cpus = (int)((q + period - 1) / period);
            if (cpus >= 1 && cpus < count) count = cpus;
        }
        fclose(fp);
    }
    return count < 1 ? 1 : count;
}

static double env_number(const char *name, double fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    double d = strtod(v, &end);
    return end != v && d >= 0 ? d : fallback;
}

static int connect_locked(void) {
    const char *url = getenv("HIPR_URL");
    const char *debug = getenv("HIPR_PROXY_DEBUG");
    S.debug = debug && *debug && strcmp(debug, "0") != 0;
    snprintf(S.url, sizeof S.url, "%s", url && *url ? url : DEFAULT_URL);
    double timeout = env_number("HIPR_CONNECT_TIMEOUT", 5.0);
    if (timeout <= 0) timeout = 5.0;
    /* As the Python sync client: spin ~200 us for a reply where cores are to spare
     * (hipr/cpus.py's auto_spin_wait); HIPR_SPIN_US sets it (0: block at once). */
    int cpus = usable_cpus();
    S.spin_s = env_number("HIPR_SPIN_US", cpus >= 4 ? 200.0 : 0.0) * 1e-6;
    {
        const char *f = getenv("HIPR_FORECAST");
        forecast_on = S.spin_s > 0 && !(f && strcmp(f, "0") == 0);
        forecast_nap_only = f && strcmp(f, "nap") == 0;
    }
    marks_init();
    S.reconnect_s = env_number("HIPR_RECONNECT_TIMEOUT", 60.0);
    S.reconnect_attempts = S.reconnect_s > 0 ? (int)env_number("HIPR_RECONNECT_ATTEMPTS", 10) : 0;
    S.connect_s = timeout;
    /* Data links only where cores are to spare: on 2 cores a striped copy moved 1.5 GB/s
     * against one link's 3.4 (its threads compete with the program and each other). */
    double links = env_number("HIPR_DATA_LINKS", cpus >= 4 ? DL_DEFAULT : 0);
    S.dl_limit = links > DL_MAX ? DL_MAX : (int)links;
    S.stripe_min = env_number("HIPR_STRIPE_MIN_BYTES", STRIPE_MIN_DEFAULT);
    if (S.stripe_min < 1) S.stripe_min = 1;
    S.data_links = 0;
    if (!S.wire_ready) {
        hipr_wire_init(&S.wire, DEFAULT_MAX_PAYLOAD);
        S.wire_ready = 1;
    }
    hipr_wire_reset(&S.wire);
    S.wire.max_payload = DEFAULT_MAX_PAYLOAD;
    S.chunk_bytes = 1 << 20;
    S.heartbeat_s = 5.0;
    S.silent_limit_s = 15.0;
    S.worker_device = 0;
    forget_work(); /* a new session (a forked child's) has asked nothing yet */
    S.session_id[0] = S.resume_token[0] = '\0';
    S.closing = 0;
    char err[1000];
    int code = HIPR_NO_DEVICE;
    S.link = hipr_link_open(S.url, timeout, err, sizeof err);
    if (S.link) {
        S.last_rx = now_s();
        code = hello(err, sizeof err);
    }
    if (code != HIPR_SUCCESS) {
        fprintf(stderr, "hipr proxy: no worker answered at %s: %s; HIP calls return errors\n",
                S.url, err);
        drop_link();
        S.state = S_FAILED;
        S.fail_code = code;
        return code;
    }
    S.state = S_READY;
    if (!S.keeper_running && hipr_start_quiet_thread(keeper) == 0) S.keeper_running = 1;
    return HIPR_SUCCESS;
}

/* This process's id, kept by the constructor and the fork handler: getpid() is a system
 * call (glibc caches it no more), and ready_locked runs on every call. */
static pid_t self_pid;

/* With the lock held: the session, connected on first use (and anew in a forked child). */
static int ready_locked(void) {
    if (S.owner != self_pid) {
        /* A forked child: the parent's link and session belong to the parent. Its
         * handles are not valid here; the child opens its own session. */
        hipr_link_forget(S.link);
        S.link = NULL;
        dl_close_all(1);
        S.state = S_IDLE;
        S.keeper_running = 0;
        S.owner = self_pid;
        B.count = 0; /* the parent's launches */
        B.used = 0;
        if (S.wire_ready) hipr_wire_reset(&S.wire);
    }
    if (S.state == S_READY) return HIPR_SUCCESS;
    if (S.state == S_FAILED || S.state == S_LOST) return S.fail_code;
    return connect_locked();
}

const char *hipr_backend(void) {
    pthread_mutex_lock(&lock);
    int rc = ready_locked();
    pthread_mutex_unlock(&lock);
    /* Written once per session, before any caller can read it. */
    return rc == HIPR_SUCCESS ? S.backend : "";
}

int hipr_ensure(void) {
    pthread_mutex_lock(&lock);
    int rc = ready_locked();
    pthread_mutex_unlock(&lock);
    return rc;
}

int hipr_worker_minor(void) {
    pthread_mutex_lock(&lock);
    int minor = ready_locked() == HIPR_SUCCESS ? S.minor : -1;
    pthread_mutex_unlock(&lock);
    return minor;
}

unsigned hipr_resumes(void) {
    pthread_mutex_lock(&lock);
    unsigned n = S.resumes;
    pthread_mutex_unlock(&lock);
    return n;
}

int hipr_call(int device, uint16_t opcode, hipr_map *args, const void *bulk, size_t bulk_len,
              void *sink, size_t sink_size, hipr_reply *r) {
    uint64_t reached =
        opcode == OP_DEVICE_SYNCHRONIZE && __atomic_load_n(&M.on, __ATOMIC_RELAXED) ? now_ns() : 0;
    memset(r, 0, sizeof *r);
    uint8_t *cbor;
    size_t len;
    int rc = encode_args(args, &cbor, &len);
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    rc = ready_locked();
    if (rc == HIPR_SUCCESS) rc = use_device(device);
    if (rc == HIPR_SUCCESS) {
        if (!leaves_no_work(opcode)) note_work();
        double started = now_s();
        forecast_plan(opcode, started);
        if (opcode == OP_DEVICE_SYNCHRONIZE && B.count && S.minor >= 3 && !len && !bulk_len) {
            /* The fuse point: the log's tail is launches of one configuration (anything
             * else framed them already), so they and this synchronize go as one request
             * (protocol 1.3's `synchronize`), one request for the worker to run instead
             * of two. The worker replies after the wait, as DEVICE_SYNCHRONIZE does. */
            uint32_t id;
            rc = put_batch_as(1, &id);
            if (rc == HIPR_SUCCESS) {
                marks_note(reached);
                rc = exchange(id, NULL, NULL, 0, r);
            }
        } else
            rc = call_locked(opcode, 0, cbor, len, bulk, bulk_len, sink, sink_size, r);
        if (rc == HIPR_SUCCESS) forecast_record(opcode, now_s() - started);
        W.active = 0;
        /* The lock was held throughout: no other thread's work went out meanwhile. */
        if (rc == HIPR_SUCCESS && opcode == OP_DEVICE_SYNCHRONIZE) note_synced(S.worker_device);
    } else if (S.state != S_READY)
        set_message(r, "no session with the worker at %.400s", S.url);
    pthread_mutex_unlock(&lock);
    free(cbor);
    return rc;
}

int hipr_notify(int device, uint16_t opcode, hipr_map *args, const void *bulk, size_t bulk_len) {
    uint8_t *cbor;
    size_t len;
    int rc = encode_args(args, &cbor, &len);
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    rc = ready_locked();
    if (rc == HIPR_SUCCESS) rc = use_device(device);
    note_work();
    if (rc == HIPR_SUCCESS && bulk_len >= DIRECT_BYTES) {
        /* Too large to copy into the log: sent from the caller's buffer, and waited for
         * (the buffer is the caller's again when this returns). */
        hipr_reply r;
        memset(&r, 0, sizeof r);
        rc = call_locked(opcode, 0, cbor, len, bulk, bulk_len, NULL, 0, &r);
        hipr_reply_free(&r);
    } else if (rc == HIPR_SUCCESS) {
        uint32_t id;
        rc = take_id(&id);
        if (rc == HIPR_SUCCESS)
            rc = put_request(opcode, id, HIPR_F_NO_REPLY, cbor, len, bulk, bulk_len);
        if (rc == HIPR_SUCCESS) rc = after_queued();
    }
    pthread_mutex_unlock(&lock);
    free(cbor);
    return rc;
}

void hipr_map_launch_config(hipr_map *m, const hipr_launch_config *c) {
    hipr_map_u64(m, "function", c->function);
    hipr_map_u64_list(m, "grid", c->grid, 3);
    hipr_map_u64_list(m, "block", c->block, 3);
    hipr_map_u64(m, "shared_mem", c->shared_mem);
    if (c->stream) hipr_map_u64(m, "stream", c->stream);
    hipr_map_u64_list(m, "ptrs", c->ptrs, c->n_ptrs);
}

int hipr_launch(int device, const hipr_launch_config *config, const void *args, size_t len) {
    if (len > 4096 || config->n_ptrs > 256) return HIPR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int rc = ready_locked();
    if (rc == HIPR_SUCCESS) rc = use_device(device);
    note_work();
    if (rc == HIPR_SUCCESS) {
        int same = B.count && B.count < BATCH_MAX && B.used + len <= BATCH_BYTES &&
                   memcmp(&B.config, config, offsetof(hipr_launch_config, ptrs)) == 0 &&
                   memcmp(B.config.ptrs, config->ptrs, config->n_ptrs * sizeof *config->ptrs) == 0;
        if (!same && B.count) rc = put_batch();
        if (rc == HIPR_SUCCESS) {
            if (!B.count) {
                /* Copied whole: the unused tail of ptrs stays zero, so configs compare. */
                memset(&B.config, 0, sizeof B.config);
                memcpy(&B.config, config, offsetof(hipr_launch_config, ptrs));
                memcpy(B.config.ptrs, config->ptrs, config->n_ptrs * sizeof *config->ptrs);
            }
            if (len) memcpy(B.data + B.used, args, len);
            B.used += len;
            B.lens[B.count++] = (uint16_t)len;
            /* A worker before protocol 1.1 takes launches one frame each. */
            if (S.minor < 1) rc = put_batch();
            /* A long run (PyTorch's ops one after another): its first launches go now, so
             * the worker's time per launch overlaps the program's own instead of adding to
             * it after the synchronize. */
            else if (B.count >= BATCH_EARLY && (rc = put_batch()) == HIPR_SUCCESS)
                rc = flush_or_recover();
        }
        if (rc == HIPR_SUCCESS) rc = after_queued();
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* --- heartbeats, idle flushes, fork, exit ---------------------------------------------- */

/* Answers the worker's PINGs while the program makes no calls (the worker drops a
 * silent link after heartbeat_timeout), takes a link silent for too long for dead and
 * resumes the session, and sends queued fire-and-forget frames that waited a whole
 * tick, so queued work starts even if no sync point comes soon. */
static void *keeper(void *arg) {
    (void)arg;
    pid_t me = getpid();
    size_t waiting = 0;
    for (;;) {
        double tick = S.heartbeat_s / 4 < 0.05 ? S.heartbeat_s / 4 : 0.05;
        if (tick < 0.01) tick = 0.01;
        struct timespec ts = {0, (long)(tick * 1e9)};
        nanosleep(&ts, NULL);
        if (pthread_mutex_trylock(&lock) != 0) continue;
        if (S.owner != me || S.state != S_READY) {
            S.keeper_running = S.owner == me ? 0 : S.keeper_running;
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        size_t unsent;
        hipr_wire_output(&S.wire, &unsent);
        size_t queued = unsent + B.used + (size_t)B.count;
        int rc = 0;
        if (queued && queued == waiting) rc = flush_out();
        while (rc == 0 && S.state == S_READY && hipr_link_wait_readable(S.link, 0) == 1) {
            rc = read_more(0);
            hipr_frame f;
            int got;
            while (rc == 0 && (got = hipr_wire_next(&S.wire, &f)) == 1) {
                if (f.request_id == 0) rc = from_worker(&f);
                else if (!(f.flags & HIPR_F_MORE) && f.opcode != OP_PING)
                    hipr_wire_ack(&S.wire, f.request_id);
            }
            if (rc == 0 && got < 0) rc = lose(S.wire.error);
        }
        if (rc == 0 && S.state == S_READY && now_s() - S.last_rx > S.silent_limit_s) {
            char why[120];
            snprintf(why, sizeof why, "the worker was silent for %.0f s", S.silent_limit_s);
            rc = link_down(why);
        }
        if (rc == LINK_DOWN && recover() == HIPR_SUCCESS) rc = flush_or_recover();
        hipr_wire_output(&S.wire, &unsent);
        waiting = unsent + B.used + (size_t)B.count;
        pthread_mutex_unlock(&lock);
    }
}

/* Each front registers a few (8 in libamdhip64 today): room for growth, and a
 * registration past it is a build-time mistake that must not pass silently. */
#define MAX_GUARDS 32
struct guard {
    pthread_mutex_t *lock;
    void (*child)(void);
};
static struct guard guards[MAX_GUARDS];
static int n_guards;

void hipr_fork_guard(pthread_mutex_t *m, void (*child)(void)) {
    /* Called from the fronts' constructors, before any thread of the program exists. */
    if (n_guards < MAX_GUARDS) {
        guards[n_guards++] = (struct guard){m, child};
        return;
    }
    /* A lock not taken around fork() may be held by another thread in the child: say so
     * rather than leave a child that can deadlock without a word. */
    fputs("hipr proxy: too many fork guards (raise MAX_GUARDS in client.c); a fork() may "
          "deadlock the child\n",
          stderr);
}

static void before_fork(void) {
    for (int i = 0; i < n_guards; i++) pthread_mutex_lock(guards[i].lock);
    pthread_mutex_lock(&lock);
    pthread_mutex_lock(&D.mu); /* no sender holds it in the child */
}

static void after_fork_parent(void) {
    pthread_mutex_unlock(&D.mu);
    pthread_mutex_unlock(&lock);
    for (int i = n_guards - 1; i >= 0; i--) pthread_mutex_unlock(guards[i].lock);
}

static void after_fork_child(void) {
    /* The child gets its own session on its first call (ready_locked): handles of the
     * parent's session are not valid there. */
    self_pid = getpid();
    marks_forget(1);
    hipr_transport_after_fork_child();
    /* The parent's senders do not exist here: their waits on the conditions are gone. */
    pthread_mutex_unlock(&D.mu);
    pthread_cond_init(&D.work, NULL);
    pthread_cond_init(&D.done, NULL);
    pthread_mutex_unlock(&lock);
    for (int i = n_guards - 1; i >= 0; i--) {
        if (guards[i].child) guards[i].child();
        pthread_mutex_unlock(guards[i].lock);
    }
}

/* Before the fronts' constructors (which register their locks here). */
__attribute__((constructor(101))) static void hipr_client_init(void) {
    S.owner = self_pid = getpid();
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* Queued fire-and-forget frames go out, then GOODBYE (not waited for) so that the
 * worker frees the session now rather than after its resume grace. */
__attribute__((destructor)) static void hipr_client_fini(void) {
    pthread_mutex_lock(&lock);
    if (S.owner == getpid()) dl_close_all(0);
    if (S.state == S_READY && S.owner == getpid()) {
        S.closing = 1;
        uint32_t id;
        if (take_id(&id) == HIPR_SUCCESS && flush_out() == 0)
            (void)send_frame(OP_GOODBYE, id, HIPR_F_NO_REPLY, NULL, 0);
        drop_link();
        S.state = S_LOST;
        S.fail_code = HIPR_UNKNOWN;
    }
    if (S.wire_ready) hipr_wire_free(&S.wire);
    marks_write();
    pthread_mutex_unlock(&lock);
}
