/* Each stream's device: a stream belongs to the device that was current on the thread
 * that created it (HIP's rule), which hipStreamGetDevice and hipGetStreamDeviceId report
 * whatever the calling thread's current device is now. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "client.h"
#include "modules.h"

struct entry {
    hipStream_t stream;
    int device;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *entries;
static size_t n_entries, cap_entries;

static void forget_all(void) {
    /* A forked child's session has none of the parent's streams. */
    free(entries);
    entries = NULL;
    n_entries = cap_entries = 0;
}

__attribute__((constructor(102))) static void stream_devices_init(void) {
    hipr_fork_guard(&lock, forget_all);
}

void hipr_stream_note(hipStream_t stream, int device) {
    if (!stream) return;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_entries; i++)
        if (entries[i].stream == stream) {
            /* A handle the worker hands out again after a destroy. */
            entries[i].device = device;
            pthread_mutex_unlock(&lock);
            return;
        }
    if (n_entries == cap_entries) {
        size_t cap = cap_entries ? cap_entries * 2 : 64;
        struct entry *more = realloc(entries, cap * sizeof *more);
        if (!more) {
            /* Without room the stream is reported as unknown: a clear error, not a
             * wrong device. */
            pthread_mutex_unlock(&lock);
            return;
        }
        entries = more;
        cap_entries = cap;
    }
    entries[n_entries++] = (struct entry){stream, device};
    pthread_mutex_unlock(&lock);
}

void hipr_stream_forget(hipStream_t stream) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_entries; i++)
        if (entries[i].stream == stream) {
            entries[i] = entries[--n_entries];
            break;
        }
    pthread_mutex_unlock(&lock);
}

int hipr_stream_device(hipStream_t stream, int *device) {
    if (!stream) {
        *device = hipr_front_device(); /* the null stream: the current device's */
        return 0;
    }
    int found = -1;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_entries && found < 0; i++)
        if (entries[i].stream == stream) found = entries[i].device;
    pthread_mutex_unlock(&lock);
    if (found < 0) return -1;
    *device = found;
    return 0;
}
