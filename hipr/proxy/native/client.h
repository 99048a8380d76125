/* The proxy's one session with the worker: the link (tcp, unix, tls, ssh; see
 * transport.h), HELLO, requests and replies, fire-and-forget coalescing, heartbeats,
 * reconnection with RESUME (every request runs exactly once across dropped links), fork
 * handling. Thread-safe: one mutex around the session; a call waits for its reply with
 * it held. Exported (under the private version HIPR_PRIVATE) so that libhiprtc.so (and
 * other fronts built on this core) share libamdhip64.so's session. Every function
 * returns a hipError_t value (0 success); none aborts the process. */
#ifndef HIPR_CLIENT_H
#define HIPR_CLIENT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cborx.h"

#define HIPR_EXPORT __attribute__((visibility("default")))

/* hipError_t values the core itself returns. */
#define HIPR_SUCCESS 0
#define HIPR_INVALID_VALUE 1
#define HIPR_OUT_OF_MEMORY 2
#define HIPR_NO_DEVICE 100
#define HIPR_NOT_SUPPORTED 801
#define HIPR_UNKNOWN 999

/* Not tied to the calling thread's current device (device facts, compiles). */
#define HIPR_ANY_DEVICE (-1)

typedef struct hipr_reply {
    cbor_item_t *map; /* the reply's CBOR map, or NULL; owned, see hipr_reply_free */
    /* Bulk bytes when the call gave no sink. */
    uint8_t *bulk;
    size_t bulk_len;
    /* Bytes written into the caller's sink. */
    size_t sink_len;
    /* For an error reply, `map` is the error map {code, kind, message, details?}, and this
     * its message (or the core's own). */
    char message[512];
} hipr_reply;

/* A request that waits for its reply. `args` may be NULL (no CBOR part); it is freed
 * here. `device`: the thread's current device, made the session's current one first;
 * HIPR_ANY_DEVICE for none. `bulk` of 1 MiB or more is sent straight from the caller's
 * memory (it must stay valid until this returns, which it does). Reply bulk goes to
 * `sink` (at most sink_size bytes, large replies read straight into it; more is a
 * protocol error) or, without a sink, to reply->bulk. A dropped link is resumed inside
 * the call. Returns a hipError_t; `reply` is always to be freed with hipr_reply_free. */
HIPR_EXPORT int hipr_call(int device, uint16_t opcode, hipr_map *args, const void *bulk,
                          size_t bulk_len, void *sink, size_t sink_size, hipr_reply *reply);
/* Fire-and-forget: queued and sent with the next synchronising call (or when the queue
 * fills, or by the heartbeat thread when idle); its error is reported by a later call.
 * The bytes are copied: the caller may reuse `bulk` at once. Bulk of 1 MiB or more is
 * instead sent from the caller's memory as a request that waits for its reply, whose
 * error (or an earlier fire-and-forget error the worker reports with it) is returned
 * here. */
HIPR_EXPORT int hipr_notify(int device, uint16_t opcode, hipr_map *args, const void *bulk,
                            size_t bulk_len);
HIPR_EXPORT void hipr_reply_free(hipr_reply *reply);

/* A launch's configuration: launches of equal configurations queued one after another go
 * to the worker as one LAUNCH_KERNELS frame (protocol 1.1), else as LAUNCH_KERNEL. */
typedef struct hipr_launch_config {
    uint64_t function, shared_mem, stream; /* stream 0: the null stream */
    uint64_t grid[3], block[3];
    size_t n_ptrs;
    uint64_t ptrs[256];
} hipr_launch_config;

/* `config`'s fields as LAUNCH_KERNEL and GRAPH_ADD_KERNEL name them (the stream when not
 * 0), added to `m`. */
void hipr_map_launch_config(hipr_map *m, const hipr_launch_config *config);
/* Fire-and-forget launch of `args` (at most 4096 bytes) with `config`. */
HIPR_EXPORT int hipr_launch(int device, const hipr_launch_config *config, const void *args,
                            size_t args_len);
/* The worker's backend as HELLO named it ("cuda", "hip", "emulator"); "" without a session. */
HIPR_EXPORT const char *hipr_backend(void);
/* Connects if needed; HIPR_SUCCESS or the error every call returns without a worker. */
HIPR_EXPORT int hipr_ensure(void);
/* The protocol minor version of the worker's HELLO reply (connecting if needed); -1
 * without a session. Private to the library that holds the session. */
int hipr_worker_minor(void);
/* How many times this process's session was resumed after its link dropped (tests and
 * diagnostics). */
HIPR_EXPORT unsigned hipr_resumes(void);
/* 1 when a DEVICE_SYNCHRONIZE of `device` succeeded and no work was asked of any device
 * since (no fire-and-forget request, launch, or request that may leave work running):
 * a synchronize now would wait for nothing and report no error, so a front may answer it
 * without the network. */
HIPR_EXPORT int hipr_idle(int device);
/* How many requests the calling thread has sent and waited for a reply to (each one
 * network round trip; fire-and-forget work queued meanwhile rides along with it), for
 * the CUDA front's trace. */
HIPR_EXPORT unsigned hipr_round_trips(void);
/* Prints `what` on stderr once per distinct pointer (unsupported calls name themselves). */
HIPR_EXPORT void hipr_warn_once(const char *what, int *flag);
/* A lock of a front that may be held while the session's is taken: fork takes it first
 * (so a child never inherits it held), and `child`, if given, runs in the child. */
HIPR_EXPORT void hipr_fork_guard(pthread_mutex_t *m, void (*child)(void));

#endif
