/* hipr_launch_wait (hipr/backends/native/launch_wait.c) against fake entry points, built
 * with ASan and UBSan by tests/backends/test_launch_wait.py: each outcome, the launch's
 * arguments as passed, the polling of every stream, and the bad calls it refuses. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h" /* tests/proxy/c: EXPECT and the verdict */
#include "launch_wait.h"

enum { NOT_READY = 600 };

/* What the fake runtime saw and will answer. */
static struct {
    int launch_result;
    int launches;
    void *function, *stream, **extra;
    unsigned dims[6], shared_mem;
    int busy_polls[MAX_WAIT_STREAMS + 1]; /* "not ready" answers left, per stream index */
    int fail_stream;                  /* index whose query fails, or -1 */
    int queries;
    void *streams[MAX_WAIT_STREAMS + 1]; /* the launch's, then the others */
} fake;

static int fake_launch(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared_mem, void *stream,
                       void **params, void **extra)
{
    fake.launches++;
    fake.function = function;
    unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    memcpy(fake.dims, dims, sizeof dims);
    fake.shared_mem = shared_mem;
    fake.stream = stream;
    fake.extra = extra;
    EXPECT(params == NULL);
    return fake.launch_result;
}

static int index_of(void *stream)
{
    for (int i = 0; i <= MAX_WAIT_STREAMS; i++)
        if (fake.streams[i] == stream)
            return i;
    return -1;
}

static int fake_query(void *stream)
{
    fake.queries++;
    int i = index_of(stream);
    EXPECT(i >= 0);
    if (i < 0)
        return 1;
    if (i == fake.fail_stream)
        return 700;
    if (fake.busy_polls[i] > 0) {
        fake.busy_polls[i]--;
        return NOT_READY;
    }
    return 0;
}

static char stream_cookies[MAX_WAIT_STREAMS + 1];

/* What hipr_launch_many's launches carried: each one's bytes (copied, as a runtime does
 * before the launch returns), its size and its `extra` markers; the results to give. */
static struct {
    int launches;
    unsigned char bytes[8][16];
    size_t sizes[8];
    void *keys[8][3];
    int results[8];
} many;

static int many_launch(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared_mem, void *stream,
                       void **params, void **extra)
{
    int i = many.launches++;
    EXPECT(i < 8 && function == (void *)0x99 && stream == &stream_cookies[0]);
    EXPECT(gx == 1 && gy == 2 && gz == 3 && bx == 64 && by == 1 && bz == 1 && shared_mem == 16);
    EXPECT(params == NULL && extra != NULL);
    if (i >= 8)
        return 1;
    size_t size = *(size_t *)extra[3];
    many.sizes[i] = size;
    memcpy(many.bytes[i], extra[1], size < 16 ? size : 16);
    many.keys[i][0] = extra[0];
    many.keys[i][1] = extra[2];
    many.keys[i][2] = extra[4];
    return many.results[i];
}

/* A call over `count` streams in all: the launch's and count - 1 others. */
static void reset(struct hipr_launch_wait *call, unsigned count)
{
    memset(&fake, 0, sizeof fake);
    fake.fail_stream = -1;
    memset(call, 0, sizeof *call);
    call->launch = fake_launch;
    call->query = fake_query;
    call->function = (void *)0x1234;
    unsigned dims[6] = {2, 3, 4, 32, 2, 1};
    memcpy(call->dims, dims, sizeof dims);
    call->shared_mem = 48;
    call->stream_count = count - 1;
    fake.streams[0] = call->launch_stream = &stream_cookies[0];
    for (unsigned i = 1; i < count; i++)
        fake.streams[i] = call->streams[i - 1] = &stream_cookies[i];
    call->spin_ns = 1000000000; /* a second: never reached when the fake says done */
    call->not_ready = NOT_READY;
    call->reply_fd = -1;
}

/* The bytes waiting on `fd` (non-blocking), at most `size`; 0 when none. */
static long pending(int fd, char *buf, size_t size)
{
    ssize_t got = recv(fd, buf, size, MSG_DONTWAIT);
    return got < 0 ? 0 : (long)got;
}

int main(void)
{
    struct hipr_launch_wait call;
    void *extra_words[5] = {(void *)1, NULL, (void *)2, NULL, NULL};

    /* Done at once: the launch got its arguments; each stream asked once. */
    reset(&call, 3);
    call.extra = extra_words;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_DONE);
    EXPECT(fake.launches == 1 && fake.function == (void *)0x1234);
    EXPECT(fake.dims[0] == 2 && fake.dims[2] == 4 && fake.dims[3] == 32 && fake.dims[5] == 1);
    EXPECT(fake.shared_mem == 48 && fake.stream == call.launch_stream && fake.extra == extra_words);
    EXPECT(fake.queries == 3 && call.launch_result == 0 && call.query_result == 0);
    EXPECT(call.polled_ns >= 0);

    /* Busy for a while on the second stream: polled until idle; idle streams before it
     * are not asked again. */
    reset(&call, 3);
    fake.busy_polls[1] = 5;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_DONE);
    EXPECT(fake.queries == 1 + 6 + 1);

    /* Never idle within the spin: still running, launched once. */
    reset(&call, 2);
    fake.busy_polls[0] = 1 << 30;
    call.spin_ns = 20000;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_RUNNING);
    EXPECT(fake.launches == 1 && call.query_result == NOT_READY && call.polled_ns >= 20000);

    /* No spin at all: one look. */
    reset(&call, 1);
    fake.busy_polls[0] = 1 << 30;
    call.spin_ns = 0;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_RUNNING && fake.queries == 1);

    /* A refused launch: nothing polled, the runtime's result kept. */
    reset(&call, 2);
    fake.launch_result = 701;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_LAUNCH_FAILED);
    EXPECT(call.launch_result == 701 && fake.queries == 0);

    /* A failed query (a faulted kernel): its result kept. */
    reset(&call, 3);
    fake.fail_stream = 2;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_QUERY_FAILED && call.query_result == 700);

    /* Bad calls: no launch is made. */
    EXPECT(hipr_launch_wait(NULL) == HIPR_LW_BAD_CALL);
    reset(&call, 1);
    call.stream_count = MAX_WAIT_STREAMS + 1;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_BAD_CALL && fake.launches == 0);
    reset(&call, 1);
    call.query = NULL;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_BAD_CALL && fake.launches == 0);

    /* The reply: sent once done, never while running or after a refused launch. */
    int pair[2];
    char got[MAX_REPLY_BYTES + 1];
    EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    reset(&call, 2);
    call.reply_fd = pair[0];
    memcpy(call.reply, "frame-bytes", 11);
    call.reply_size = 11;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_DONE && call.reply_sent == 11);
    EXPECT(pending(pair[1], got, sizeof got) == 11 && memcmp(got, "frame-bytes", 11) == 0);
    fake.busy_polls[0] = 1 << 30;
    call.spin_ns = 0;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_RUNNING && call.reply_sent == 0);
    fake.busy_polls[0] = 0;
    fake.launch_result = 1;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_LAUNCH_FAILED && call.reply_sent == 0);
    EXPECT(pending(pair[1], got, sizeof got) == 0);
    /* The peer gone: the send's -errno, the outcome still DONE. */
    close(pair[1]);
    fake.launch_result = 0;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_DONE && call.reply_sent == -EPIPE);
    close(pair[0]);
    /* A reply larger than the structure holds is a bad call. */
    reset(&call, 1);
    call.reply_size = MAX_REPLY_BYTES + 1;
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_BAD_CALL && fake.launches == 0);

    /* The most streams allowed: the launch's and MAX_WAIT_STREAMS others. */
    reset(&call, MAX_WAIT_STREAMS + 1);
    EXPECT(hipr_launch_wait(&call) == HIPR_LW_DONE && fake.queries == MAX_WAIT_STREAMS + 1);

    /* A run of launches: each its own slice and size, the markers in place; a refused one
     * stops none after it, and the count of refused ones is returned. */
    const unsigned char bytes[] = "aaaabbbbbbbbcc";
    uint32_t sizes[3] = {4, 8, 2};
    int32_t results[3] = {-1, -1, -1};
    struct hipr_launch_many batch = {
        .launch = many_launch, .function = (void *)0x99, .dims = {1, 2, 3, 64, 1, 1},
        .shared_mem = 16, .count = 3, .stream = &stream_cookies[0], .args = bytes,
        .sizes = sizes, .results = results,
        .extra_keys = {(void *)1, (void *)2, (void *)3},
    };
    many.results[1] = 701;
    EXPECT(hipr_launch_many(&batch) == 1 && many.launches == 3);
    EXPECT(results[0] == 0 && results[1] == 701 && results[2] == 0);
    EXPECT(many.sizes[0] == 4 && memcmp(many.bytes[0], "aaaa", 4) == 0);
    EXPECT(many.sizes[1] == 8 && memcmp(many.bytes[1], "bbbbbbbb", 8) == 0);
    EXPECT(many.sizes[2] == 2 && memcmp(many.bytes[2], "cc", 2) == 0);
    EXPECT(many.keys[2][0] == (void *)1 && many.keys[2][1] == (void *)2 &&
           many.keys[2][2] == (void *)3);
    /* None at all; bad calls launch nothing. */
    many.launches = 0;
    batch.count = 0;
    batch.args = NULL;
    EXPECT(hipr_launch_many(&batch) == 0 && many.launches == 0);
    batch.count = 1;
    EXPECT(hipr_launch_many(&batch) == -1 && many.launches == 0);
    batch.args = bytes;
    batch.results = NULL;
    EXPECT(hipr_launch_many(&batch) == -1 && many.launches == 0);
    batch.results = results;
    batch.launch = NULL;
    EXPECT(hipr_launch_many(&batch) == -1 && many.launches == 0);
    EXPECT(hipr_launch_many(NULL) == -1);

    return verdict();
}
