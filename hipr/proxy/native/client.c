/* The proxy's session with the worker; see client.h. The protocol state lives in the
 * sans-I/O hipr_wire; this file adds the socket, the lock, heartbeats and fork. */
#define _GNU_SOURCE
#include "client.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "opcodes.h"
#include "transport.h"
#include "wire.h"

#define DEFAULT_URL "tcp://127.0.0.1:18515"
/* Before HELLO tells the worker's limits. */
#define DEFAULT_MAX_PAYLOAD ((uint64_t)64 * 1024 * 1024 + 64 * 1024)
/* Fire-and-forget frames are sent once this many bytes wait (HIP Remote used 64 KiB). */
#define COALESCE_BYTES (64 * 1024)
/* While a large request is being framed, bytes are written out past this much. */
#define FLUSH_BYTES (4 * 1024 * 1024)
#define RECV_CHUNK (256 * 1024)

enum state { S_IDLE, S_READY, S_FAILED, S_LOST };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    enum state state;
    int fail_code;
    int fd;
    pid_t owner;
    hipr_wire wire;
    int wire_ready;
    uint64_t chunk_bytes;
    int worker_device;
    double heartbeat_s;
    int keeper_running;
    uint8_t *rbuf;
    char url[1024];
    char backend[64];
    int minor; /* the worker's protocol minor version */
    int debug; /* HIPR_PROXY_DEBUG: error replies' messages on stderr */
} S = {.state = S_IDLE, .fd = -1};

/* Launches of one configuration waiting to go out as one frame. */
#define BATCH_MAX 1024
#define BATCH_BYTES (60 * 1024)
static struct {
    int count;
    hipr_launch_config config;
    uint8_t data[BATCH_BYTES];
    size_t used;
    uint16_t lens[BATCH_MAX];
} B;

static int put_batch(void);

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
    if (S.fd >= 0) close(S.fd);
    S.fd = -1;
}

static int lose(const char *why) {
    if (S.state == S_READY)
        fprintf(stderr,
                "hipr proxy: lost the link to the worker at %s (%s); HIP calls now return "
                "hipErrorUnknown\n",
                S.url, why);
    drop_link();
    S.state = S_LOST;
    S.fail_code = HIPR_UNKNOWN;
    return HIPR_UNKNOWN;
}

static int flush_out(void) {
    if (B.count && put_batch() != HIPR_SUCCESS) return -1;
    size_t n;
    const uint8_t *p = hipr_wire_output(&S.wire, &n);
    if (!n) return 0;
    if (hipr_transport_send_all(S.fd, p, n) < 0) return -1;
    hipr_wire_sent(&S.wire, n);
    return 0;
}

static int read_more(void) {
    long n = hipr_transport_recv(S.fd, S.rbuf, RECV_CHUNK);
    if (n <= 0) return -1;
    return hipr_wire_feed(&S.wire, S.rbuf, (size_t)n) == HIPR_WIRE_OK ? 0 : -1;
}

static int error_code_of(const uint8_t *cbor, size_t len, char *msg, size_t msg_size) {
    cbor_item_t *map = hipr_cbor_load(cbor, len);
    int code = hipr_error_code(map, msg, msg_size);
    if (map) cbor_decref(&map);
    return code;
}

/* A frame the worker sent on its own (request id 0): heartbeats, a closing session.
 * Returns 0, or -1 when the session is over. */
static int from_worker(const hipr_frame *f) {
    if (f->opcode == OP_PING && !(f->flags & HIPR_F_REPLY)) {
        if (hipr_wire_put(&S.wire, OP_PING, 0, HIPR_F_REPLY, NULL, 0, NULL, 0)) return -1;
        return flush_out();
    }
    if (f->opcode == OP_GOODBYE || (f->flags & HIPR_F_ERROR)) return -1;
    return 0;
}

/* Read frames until the final reply to `id`. */
static int await_reply(uint32_t id, void *sink, size_t sink_size, hipr_reply *r) {
    for (;;) {
        hipr_frame f;
        int got = hipr_wire_next(&S.wire, &f);
        if (got < 0) return lose(S.wire.error);
        if (got == 0) {
            if (read_more() < 0) return lose("the worker closed the connection");
            continue;
        }
        if (f.request_id == 0) {
            if (from_worker(&f) < 0) return lose("the worker ended the session");
            continue;
        }
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

/* Frame a request (the bulk split into DATA frames of chunk_bytes) into the output. */
static int put_request(uint16_t opcode, uint32_t id, uint32_t flags, const uint8_t *cbor,
                       size_t cbor_len, const uint8_t *bulk, size_t bulk_len) {
    size_t chunk = (size_t)S.chunk_bytes;
    size_t first = bulk_len < chunk ? bulk_len : chunk;
    uint32_t more = first < bulk_len ? HIPR_F_MORE : 0;
    if (hipr_wire_put(&S.wire, opcode, id, flags | more, cbor, cbor_len, bulk, first))
        return HIPR_OUT_OF_MEMORY;
    size_t off = first;
    while (off < bulk_len) {
        if (S.wire.out_len >= FLUSH_BYTES && flush_out() < 0)
            return lose("cannot write to the worker");
        size_t n = bulk_len - off < chunk ? bulk_len - off : chunk;
        uint32_t fl = off + n < bulk_len ? HIPR_F_MORE : 0;
        if (hipr_wire_put(&S.wire, OP_DATA, id, fl, NULL, 0, bulk + off, n))
            return HIPR_OUT_OF_MEMORY;
        off += n;
    }
    return HIPR_SUCCESS;
}

/* The queued launches as one frame (LAUNCH_KERNEL for one, LAUNCH_KERNELS for more). */
static int put_batch(void) {
    int count = B.count;
    B.count = 0; /* put_request below must not come back here */
    const hipr_launch_config *c = &B.config;
    hipr_map m;
    hipr_map_init(&m, 7);
    hipr_map_u64(&m, "function", c->function);
    hipr_map_u64_list(&m, "grid", c->grid, 3);
    hipr_map_u64_list(&m, "block", c->block, 3);
    hipr_map_u64(&m, "shared_mem", c->shared_mem);
    if (c->stream) hipr_map_u64(&m, "stream", c->stream);
    hipr_map_u64_list(&m, "ptrs", c->ptrs, c->n_ptrs);
    if (count == 1) {
        hipr_map_bytes(&m, "args", B.data, B.used);
    } else {
        cbor_item_t *list = cbor_new_definite_array((size_t)count);
        size_t off = 0;
        for (int i = 0; list && i < count; i++) {
            cbor_item_t *b = cbor_build_bytestring(B.data + off, B.lens[i]);
            if (!b || !cbor_array_push(list, b)) m.failed = 1;
            if (b) cbor_decref(&b);
            off += B.lens[i];
        }
        if (!list) m.failed = 1;
        else hipr_map_item(&m, "args", list);
    }
    B.used = 0;
    uint8_t *cbor;
    size_t len;
    int rc = hipr_map_encode(&m, &cbor, &len) == 0 ? HIPR_SUCCESS : HIPR_OUT_OF_MEMORY;
    hipr_map_free(&m);
    if (rc) return rc;
    uint32_t id = hipr_wire_take_id(&S.wire);
    rc = put_request(count == 1 ? OP_LAUNCH_KERNEL : OP_LAUNCH_KERNELS, id, HIPR_F_NO_REPLY, cbor,
                     len, NULL, 0);
    free(cbor);
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

/* With the lock held and the session ready. */
static int call_locked(uint16_t opcode, const uint8_t *cbor, size_t cbor_len, const void *bulk,
                       size_t bulk_len, void *sink, size_t sink_size, hipr_reply *r) {
    uint32_t id;
    int rc = take_id(&id);
    if (rc == HIPR_SUCCESS) rc = put_request(opcode, id, 0, cbor, cbor_len, bulk, bulk_len);
    if (rc) return rc;
    if (flush_out() < 0) return lose("cannot write to the worker");
    return await_reply(id, sink, sink_size, r);
}

static int use_device(int device) {
    if (device < 0 || device == S.worker_device) return HIPR_SUCCESS;
    hipr_map m;
    hipr_map_init(&m, 1);
    hipr_map_u64(&m, "device", (uint64_t)device);
    uint8_t *cbor;
    size_t len;
    int rc = encode_args(&m, &cbor, &len);
    if (rc) return rc;
    hipr_reply r;
    memset(&r, 0, sizeof r);
    rc = call_locked(OP_SET_DEVICE, cbor, len, NULL, 0, NULL, 0, &r);
    free(cbor);
    hipr_reply_free(&r);
    if (rc == HIPR_SUCCESS) S.worker_device = device;
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

static int hello(char *err, size_t err_size) {
    char token[4096];
    read_token(token, sizeof token);
    hipr_map m;
    hipr_map_init(&m, token[0] ? 2 : 1);
    hipr_map_str(&m, "client", "hipr-proxy/0.1", strlen("hipr-proxy/0.1"));
    if (token[0]) hipr_map_str(&m, "token", token, strlen(token));
    uint8_t *cbor;
    size_t len;
    if (encode_args(&m, &cbor, &len)) {
        snprintf(err, err_size, "out of memory");
        return HIPR_OUT_OF_MEMORY;
    }
    int rc = hipr_wire_put(&S.wire, OP_HELLO, 0, 0, cbor, len, NULL, 0);
    explicit_bzero(cbor, len);
    free(cbor);
    explicit_bzero(token, sizeof token);
    if (rc || flush_out() < 0) {
        snprintf(err, err_size, "cannot send HELLO: %s", strerror(errno));
        return HIPR_NO_DEVICE;
    }
    for (;;) {
        hipr_frame f;
        int got = hipr_wire_next(&S.wire, &f);
        if (got < 0) {
            snprintf(err, err_size, "%s", S.wire.error);
            return HIPR_NO_DEVICE;
        }
        if (got == 0) {
            if (read_more() < 0) {
                snprintf(err, err_size, "the worker closed the connection during HELLO");
                return HIPR_NO_DEVICE;
            }
            continue;
        }
        if (f.opcode != OP_HELLO || !(f.flags & HIPR_F_REPLY)) continue;
        if (f.flags & HIPR_F_ERROR) {
            char msg[400];
            int code = error_code_of(f.cbor, f.cbor_len, msg, sizeof msg);
            snprintf(err, err_size, "the worker refused HELLO: %s", msg);
            return code;
        }
        cbor_item_t *map = hipr_cbor_load(f.cbor, f.cbor_len);
        uint64_t proto = 0, chunk = 0, max_frame = 0;
        double hb = 5.0;
        if (!map || hipr_cbor_uint(map, "protocol", &proto) || (proto >> 8) != 1) {
            if (map) cbor_decref(&map);
            snprintf(err, err_size, "unexpected HELLO reply (protocol major must be 1)");
            return HIPR_NO_DEVICE;
        }
        if (hipr_cbor_uint(map, "chunk_bytes", &chunk) == 0 && chunk >= 4096) S.chunk_bytes = chunk;
        S.minor = (int)(proto & 0xff);
        if (hipr_cbor_uint(map, "max_frame_bytes", &max_frame) == 0 && max_frame > S.chunk_bytes)
            S.wire.max_payload = max_frame + 64 * 1024;
        if (hipr_cbor_float(map, "heartbeat_interval", &hb) == 0 && hb > 0) S.heartbeat_s = hb;
        if (hipr_cbor_text(map, "backend", S.backend, sizeof S.backend) != 0) S.backend[0] = '\0';
        cbor_decref(&map);
        return HIPR_SUCCESS;
    }
}

static int connect_locked(void) {
    const char *url = getenv("HIPR_URL");
    const char *debug = getenv("HIPR_PROXY_DEBUG");
    S.debug = debug && *debug && strcmp(debug, "0") != 0;
    snprintf(S.url, sizeof S.url, "%s", url && *url ? url : DEFAULT_URL);
    double timeout = 5.0;
    const char *t = getenv("HIPR_CONNECT_TIMEOUT");
    if (t && *t && atof(t) > 0) timeout = atof(t);
    if (!S.rbuf) S.rbuf = malloc(RECV_CHUNK);
    if (!S.wire_ready) {
        hipr_wire_init(&S.wire, DEFAULT_MAX_PAYLOAD);
        S.wire_ready = 1;
    }
    hipr_wire_reset(&S.wire);
    S.wire.max_payload = DEFAULT_MAX_PAYLOAD;
    S.chunk_bytes = 1 << 20;
    S.heartbeat_s = 5.0;
    S.worker_device = 0;
    char err[600];
    int code = HIPR_NO_DEVICE;
    if (!S.rbuf) {
        snprintf(err, sizeof err, "out of memory");
    } else {
        S.fd = hipr_transport_connect(S.url, timeout, err, sizeof err);
        if (S.fd >= 0) code = hello(err, sizeof err);
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
    if (!S.keeper_running) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, keeper, NULL) == 0) S.keeper_running = 1;
        pthread_attr_destroy(&attr);
    }
    return HIPR_SUCCESS;
}

/* With the lock held: the session, connected on first use (and anew in a forked child). */
static int ready_locked(void) {
    if (S.owner != getpid()) {
        /* A forked child: the parent's socket belongs to the parent. */
        if (S.fd >= 0) close(S.fd);
        S.fd = -1;
        S.state = S_IDLE;
        S.keeper_running = 0;
        S.owner = getpid();
        B.count = 0; /* the parent's launches */
        B.used = 0;
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

int hipr_call(int device, uint16_t opcode, hipr_map *args, const void *bulk, size_t bulk_len,
              void *sink, size_t sink_size, hipr_reply *r) {
    memset(r, 0, sizeof *r);
    uint8_t *cbor;
    size_t len;
    int rc = encode_args(args, &cbor, &len);
    if (rc) return rc;
    pthread_mutex_lock(&lock);
    rc = ready_locked();
    if (rc == HIPR_SUCCESS) rc = use_device(device);
    if (rc == HIPR_SUCCESS) rc = call_locked(opcode, cbor, len, bulk, bulk_len, sink, sink_size, r);
    else if (S.state != S_READY)
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
    if (rc == HIPR_SUCCESS) {
        uint32_t id;
        rc = take_id(&id);
        if (rc == HIPR_SUCCESS) rc = put_request(opcode, id, HIPR_F_NO_REPLY, cbor, len, bulk, bulk_len);
        if (rc == HIPR_SUCCESS && S.wire.out_len >= COALESCE_BYTES && flush_out() < 0)
            rc = lose("cannot write to the worker");
    }
    pthread_mutex_unlock(&lock);
    free(cbor);
    return rc;
}

int hipr_launch(int device, const hipr_launch_config *config, const void *args, size_t len) {
    if (len > 4096 || config->n_ptrs > 256) return HIPR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int rc = ready_locked();
    if (rc == HIPR_SUCCESS) rc = use_device(device);
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
        }
        if (rc == HIPR_SUCCESS && S.wire.out_len >= COALESCE_BYTES && flush_out() < 0)
            rc = lose("cannot write to the worker");
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* --- heartbeats, idle flushes, fork, exit ---------------------------------------------- */

/* Answers the worker's PINGs while the program makes no calls (the worker drops a
 * silent link after heartbeat_timeout) and sends queued fire-and-forget frames that
 * waited a whole tick, so queued work starts even if no sync point comes soon. */
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
        size_t queued = S.wire.out_len + B.used + (size_t)B.count;
        if (queued && queued == waiting && flush_out() < 0) lose("cannot write to the worker");
        waiting = S.wire.out_len + B.used + (size_t)B.count;
        while (S.state == S_READY && hipr_transport_wait_readable(S.fd, 0) == 1) {
            if (read_more() < 0) {
                lose("the worker closed the connection");
                break;
            }
            hipr_frame f;
            int got;
            while ((got = hipr_wire_next(&S.wire, &f)) == 1)
                if (f.request_id == 0 && from_worker(&f) < 0) {
                    lose("the worker ended the session");
                    break;
                }
            if (got < 0 && S.state == S_READY) lose(S.wire.error);
        }
        pthread_mutex_unlock(&lock);
    }
}

#define MAX_GUARDS 8
struct guard {
    pthread_mutex_t *lock;
    void (*child)(void);
};
static struct guard guards[MAX_GUARDS];
static int n_guards;

void hipr_fork_guard(pthread_mutex_t *m, void (*child)(void)) {
    /* Called from the fronts' constructors, before any thread of the program exists. */
    if (n_guards < MAX_GUARDS) guards[n_guards++] = (struct guard){m, child};
}

static void before_fork(void) {
    for (int i = 0; i < n_guards; i++) pthread_mutex_lock(guards[i].lock);
    pthread_mutex_lock(&lock);
}

static void after_fork_parent(void) {
    pthread_mutex_unlock(&lock);
    for (int i = n_guards - 1; i >= 0; i--) pthread_mutex_unlock(guards[i].lock);
}

static void after_fork_child(void) {
    /* The child gets its own session on its first call (ready_locked): handles of the
     * parent's session are not valid there. */
    pthread_mutex_unlock(&lock);
    for (int i = n_guards - 1; i >= 0; i--) {
        if (guards[i].child) guards[i].child();
        pthread_mutex_unlock(guards[i].lock);
    }
}

/* Before the fronts' constructors (which register their locks here). */
__attribute__((constructor(101))) static void hipr_client_init(void) {
    S.owner = getpid();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* Queued fire-and-forget frames go out, then GOODBYE (not waited for) so that the
 * worker frees the session now rather than after its resume grace. */
__attribute__((destructor)) static void hipr_client_fini(void) {
    pthread_mutex_lock(&lock);
    if (S.state == S_READY && S.owner == getpid()) {
        int rc = B.count ? put_batch() : HIPR_SUCCESS;
        uint32_t id = hipr_wire_take_id(&S.wire);
        if (rc == HIPR_SUCCESS &&
            hipr_wire_put(&S.wire, OP_GOODBYE, id, HIPR_F_NO_REPLY, NULL, 0, NULL, 0) == 0)
            (void)flush_out();
        drop_link();
        S.state = S_LOST;
        S.fail_code = HIPR_UNKNOWN;
    }
    pthread_mutex_unlock(&lock);
}
