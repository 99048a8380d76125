/* A launch and the wait for its end, in one call with no interpreter between them.
 *
 * The worker's hot path for a launch that asks to be waited for (the tiny op of an
 * unmodified PyTorch program: one kernel, then a synchronize) was the runtime's launch
 * through the Python binding, then a Python loop asking the streams whether the work had
 * ended. Each turn of that loop cost several µs of interpreter time while the kernel
 * itself ended in a few. Here the launch and the polling are one C call made through
 * ctypes (holding the interpreter lock, as the Python poll did: releasing it measured
 * slower, hipr/backends/_launch_wait.py says why). Where the caller allows it (a plain
 * socket with nothing queued ahead, hipr/transports/thread_writes.py), the reply of a
 * launch that ended is sent
 * from here too, the moment the work is seen done.
 *
 * Vendor-neutral: the caller passes the runtime's own launch and query entry points
 * (cuLaunchKernel / hipModuleLaunchKernel have the same shape, as do cuStreamQuery /
 * hipStreamQuery), and fills the launch's `extra` array itself, so this file links
 * against neither vendor's library and is built wherever a C compiler is.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stddef.h>
#include <sys/socket.h>
#include <time.h>

#include "launch_wait.h"

/* The offsets hipr/backends/_launch_wait.py packs and reads. */
_Static_assert(offsetof(struct hipr_launch_wait, function) == 16, "function");
_Static_assert(offsetof(struct hipr_launch_wait, dims) == 24, "dims");
_Static_assert(offsetof(struct hipr_launch_wait, reply_fd) == 76, "reply_fd");
_Static_assert(offsetof(struct hipr_launch_wait, launch_stream) == 88, "launch_stream");
_Static_assert(offsetof(struct hipr_launch_wait, launch_result) == 96, "launch_result");
_Static_assert(offsetof(struct hipr_launch_wait, reply_sent) == 112, "reply_sent");
_Static_assert(offsetof(struct hipr_launch_wait, reply) == 120, "reply");
_Static_assert(offsetof(struct hipr_launch_wait, streams) == 184, "streams");
_Static_assert(sizeof(struct hipr_launch_wait) == 184 + 8 * MAX_WAIT_STREAMS, "size");
_Static_assert(offsetof(struct hipr_launch_many, dims) == 16, "many dims");
_Static_assert(offsetof(struct hipr_launch_many, stream) == 48, "many stream");
_Static_assert(offsetof(struct hipr_launch_many, extra_keys) == 80, "many extra_keys");
_Static_assert(sizeof(struct hipr_launch_many) == 104, "many size");

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The stream of index *next (0: launch_stream, then streams[]) and those after it are
 * idle: 1; 0 at the first busy one (its index kept, so the next pass does not ask the
 * idle ones again); -1 when a query failed. */
static int streams_idle(struct hipr_launch_wait *call, uint32_t *next)
{
    while (*next <= call->stream_count) {
        void *stream = *next == 0 ? call->launch_stream : call->streams[*next - 1];
        int result = call->query(stream);
        call->query_result = result;
        if (result == call->not_ready)
            return 0;
        if (result != 0)
            return -1;
        ++*next;
    }
    return 1;
}

/* The reply, sent without waiting: the bytes the socket took, or -errno. */
static int64_t send_reply(const struct hipr_launch_wait *call)
{
    for (;;) {
        ssize_t sent = send(call->reply_fd, call->reply, call->reply_size,
                            MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent >= 0)
            return (int64_t)sent;
        if (errno != EINTR)
            return -(int64_t)errno;
    }
}

int hipr_launch_wait(struct hipr_launch_wait *call)
{
    if (call == NULL || call->launch == NULL || call->query == NULL ||
        call->stream_count > MAX_WAIT_STREAMS ||
        call->reply_size > MAX_REPLY_BYTES)
        return HIPR_LW_BAD_CALL;
    call->query_result = 0;
    call->polled_ns = 0;
    call->reply_sent = 0;
    call->launch_result = call->launch(call->function, call->dims[0], call->dims[1],
                                       call->dims[2], call->dims[3], call->dims[4],
                                       call->dims[5], call->shared_mem, call->launch_stream,
                                       NULL, call->extra);
    if (call->launch_result != 0)
        return HIPR_LW_LAUNCH_FAILED;
    int64_t start = now_ns();
    uint32_t next = 0;
    for (;;) {
        int idle = streams_idle(call, &next);
        int64_t elapsed = now_ns() - start;
        call->polled_ns = elapsed;
        if (idle > 0) {
            if (call->reply_fd >= 0 && call->reply_size > 0)
                call->reply_sent = send_reply(call);
            return HIPR_LW_DONE;
        }
        if (idle < 0)
            return HIPR_LW_QUERY_FAILED;
        if (elapsed >= call->spin_ns)
            return HIPR_LW_RUNNING;
    }
}

int hipr_launch_many(struct hipr_launch_many *call)
{
    if (call == NULL || call->launch == NULL ||
        (call->count > 0 && (call->args == NULL || call->sizes == NULL || call->results == NULL)))
        return -1;
    int refused = 0;
    size_t offset = 0;
    for (uint32_t i = 0; i < call->count; i++) {
        /* The runtime reads the size through a pointer to a size_t, and copies the
         * bytes before the launch returns: both may live on this stack. */
        size_t size = call->sizes[i];
        void *extra[5] = {call->extra_keys[0], (void *)(uintptr_t)(call->args + offset),
                          call->extra_keys[1], &size, call->extra_keys[2]};
        int result = call->launch(call->function, call->dims[0], call->dims[1], call->dims[2],
                                  call->dims[3], call->dims[4], call->dims[5],
                                  call->shared_mem, call->stream, NULL, extra);
        call->results[i] = result;
        if (result != 0)
            ++refused;
        offset += size;
    }
    return refused;
}

int hipr_launch_wait_abi(void)
{
    return HIPR_LAUNCH_WAIT_ABI;
}
