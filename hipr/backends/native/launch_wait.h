/* The native launch-and-wait's call structure and outcomes (see launch_wait.c); the
 * Python side (hipr/backends/_launch_wait.py) packs and reads it at these offsets. */
#ifndef HIPR_LAUNCH_WAIT_H
#define HIPR_LAUNCH_WAIT_H

#include <stdint.h>

typedef int (*launch_fn)(void *function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                         unsigned block_x, unsigned block_y, unsigned block_z,
                         unsigned shared_mem, void *stream, void **params, void **extra);
typedef int (*query_fn)(void *stream);

enum { MAX_WAIT_STREAMS = 64, MAX_REPLY_BYTES = 64 };

/* Raised with every change of the structure below: a library built from older sources
 * (an editable install not rebuilt) is then refused rather than misread. */
#define HIPR_LAUNCH_WAIT_ABI 4

/* One call's inputs and outputs. Fixed fields first and the other streams last, so
 * that the caller of the usual launch (one stream) fills its inputs with one store. */
struct hipr_launch_wait {
    /* in, set once */
    launch_fn launch;  /* 0 */
    query_fn query;    /* 8 */
    /* in, each call */
    void *function;        /* 16 */
    uint32_t dims[6];      /* 24: grid x, y, z, block x, y, z */
    uint32_t shared_mem;   /* 48 */
    uint32_t stream_count; /* 52: streams[] in use, besides launch_stream (0 to MAX) */
    void **extra;          /* 56: {BUFFER_POINTER, &args, BUFFER_SIZE, &size, END} */
    int64_t spin_ns;       /* 64: how long to poll for the end before giving up */
    int32_t not_ready;     /* 72: the runtime's "not ready" result of a query */
    int32_t reply_fd;      /* 76: where to send `reply` once done; -1: nowhere */
    uint32_t reply_size;   /* 80: bytes of `reply` (at most MAX_REPLY_BYTES) */
    uint32_t reserved;     /* 84 */
    void *launch_stream;   /* 88: takes the launch; polled first */
    /* out */
    int32_t launch_result; /* 96: the launch's own result */
    int32_t query_result;  /* 100: the last query's result (0, not_ready or an error) */
    int64_t polled_ns;     /* 104: from the launch's return to the answer */
    int64_t reply_sent;    /* 112: bytes of `reply` the socket took; -errno; 0 unsent */
    /* in */
    unsigned char reply[MAX_REPLY_BYTES]; /* 120 */
    void *streams[MAX_WAIT_STREAMS];      /* 184: the other streams that must be idle */
};

enum {
    HIPR_LW_DONE = 0,          /* launched, and every stream idle */
    HIPR_LW_RUNNING = 1,       /* launched, still running when spin_ns ran out */
    HIPR_LW_LAUNCH_FAILED = 2, /* not launched: launch_result says why */
    HIPR_LW_QUERY_FAILED = 3,  /* launched; a query failed (a faulted kernel) */
    HIPR_LW_BAD_CALL = 4       /* a count out of range, or null entry points */
};

/* Launch on launch_stream, then poll it and every other stream until all are idle, a
 * query fails or spin_ns pass; when all are idle and reply_fd is set, send the reply
 * (without waiting). One of the HIPR_LW_* outcomes. */
int hipr_launch_wait(struct hipr_launch_wait *call);

/* A run of launches of one kernel in one configuration on one stream, each with argument
 * bytes of its own (a LAUNCH_KERNELS batch: PyTorch's ops one after another), made in one
 * call so that each costs the runtime's launch and nothing of the interpreter's. */
struct hipr_launch_many {
    launch_fn launch;          /* 0 */
    void *function;            /* 8 */
    uint32_t dims[6];          /* 16: grid x, y, z, block x, y, z */
    uint32_t shared_mem;       /* 40 */
    uint32_t count;            /* 44: launches */
    void *stream;              /* 48 */
    const unsigned char *args; /* 56: each launch's argument bytes, one after another */
    const uint32_t *sizes;     /* 64: `count` sizes, in order */
    int32_t *results;          /* 72: out: each launch's own result */
    void *extra_keys[3];       /* 80: the runtime's BUFFER_POINTER, BUFFER_SIZE, END */
};

/* Each launch in turn, each with an `extra` array of its own over its slice of `args`; a
 * launch the runtime refuses stops none of the others. The number refused, or -1 for a
 * bad call (no launch, or bytes or results missing), when nothing is launched. */
int hipr_launch_many(struct hipr_launch_many *call);

/* HIPR_LAUNCH_WAIT_ABI of the sources this library was built from. */
int hipr_launch_wait_abi(void);

#endif
