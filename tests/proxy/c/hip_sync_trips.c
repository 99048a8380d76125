/* Which of the HIP proxy's synchronizing calls wait for the worker, counted with the core's
 * hipr_round_trips() (requests this thread sent and waited for); built and run under
 * ASan/UBSan by tests/proxy/test_hip_sync_trips.py. As the CUDA front: a synchronize or
 * query with nothing asked of any device since the last device synchronize is answered
 * without the network; a stream or event handle only once the worker has answered for it
 * (a handle it does not know is never answered here), and never after it was destroyed;
 * an error keeps the next synchronize remote. Prints "ok" when every check holds. */
#include <stdint.h>
#include <stdio.h>

typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;

hipError_t hipSetDevice(int);
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemset(void *, int, size_t);
hipError_t hipMemcpy(void *, const void *, size_t, int);
hipError_t hipDeviceSynchronize(void);
hipError_t hipStreamCreate(hipStream_t *);
hipError_t hipStreamDestroy(hipStream_t);
hipError_t hipStreamSynchronize(hipStream_t);
hipError_t hipStreamQuery(hipStream_t);
hipError_t hipEventCreate(hipEvent_t *);
hipError_t hipEventDestroy(hipEvent_t);
hipError_t hipEventRecord(hipEvent_t, hipStream_t);
hipError_t hipEventSynchronize(hipEvent_t);
hipError_t hipEventQuery(hipEvent_t);
const char *hipGetErrorName(hipError_t);
unsigned hipr_round_trips(void);

#define NAME_OF(e) hipGetErrorName((hipError_t)(e))
#include "check.h"

static unsigned mark;

/* Round trips since the last call. */
static unsigned trips(void) {
    unsigned now = hipr_round_trips(), n = now - mark;
    mark = now;
    return n;
}

/* `call` returns `want` (0: hipSuccess) after `n` round trips. */
#define TRIPS(call, want, n)                                                               \
    do {                                                                                   \
        trips();                                                                           \
        hipError_t r_ = (call);                                                            \
        unsigned t_ = trips();                                                             \
        if ((want) >= 0 ? r_ != (want) : r_ == 0) {                                        \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, NAME_OF(r_));  \
            failures++;                                                                    \
        }                                                                                  \
        if (t_ != (n)) {                                                                   \
            fprintf(stderr, "%s:%d: %s made %u round trips, expected %u\n", __FILE__,      \
                    __LINE__, #call, t_, (unsigned)(n));                                   \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

#define ANY_ERROR (-1)

int main(void) {
    CHECK(hipSetDevice(0));
    void *p = NULL;
    CHECK(hipMalloc(&p, 4096));
    if (failures) return 1;

    /* Work, then the device's synchronize goes to the worker; the next ones do not. */
    TRIPS(hipMemset(p, 1, 4096), 0, 0);
    TRIPS(hipDeviceSynchronize(), 0, 1);
    TRIPS(hipDeviceSynchronize(), 0, 0);
    TRIPS(hipStreamSynchronize(NULL), 0, 0);
    TRIPS(hipStreamQuery(NULL), 0, 0);

    /* A copy back leaves nothing running: still idle. */
    unsigned char back[16] = {0};
    TRIPS(hipMemcpy(back, p, sizeof back, 2), 0, 1);
    EXPECT(back[0] == 1 && back[15] == 1);
    TRIPS(hipDeviceSynchronize(), 0, 0);

    /* A stream: asked of the worker once (the front keeps no table of handles), then here. */
    hipStream_t s = NULL;
    TRIPS(hipStreamCreate(&s), 0, 1);
    TRIPS(hipStreamSynchronize(s), 0, 1);
    TRIPS(hipStreamSynchronize(s), 0, 0);
    TRIPS(hipStreamQuery(s), 0, 0);
    /* A handle the worker never gave is never answered here. */
    hipStream_t bogus = (hipStream_t)(uintptr_t)0x7fff1234;
    TRIPS(hipStreamSynchronize(bogus), ANY_ERROR, 1);
    TRIPS(hipStreamQuery(bogus), ANY_ERROR, 1);

    /* Events: a record is work; the device's synchronize makes every event done. */
    hipEvent_t e = NULL;
    TRIPS(hipEventCreate(&e), 0, 1);
    TRIPS(hipEventQuery(e), 0, 1);
    TRIPS(hipEventSynchronize(e), 0, 0);
    TRIPS(hipEventRecord(e, s), 0, 0);
    trips();
    hipError_t q = hipEventQuery(e); /* hipSuccess or hipErrorNotReady: both remote */
    EXPECT(trips() == 1 && (q == 0 || q == 600));
    TRIPS(hipEventSynchronize(e), 0, 1);
    TRIPS(hipStreamSynchronize(s), 0, 1);
    TRIPS(hipDeviceSynchronize(), 0, 1);
    TRIPS(hipEventQuery(e), 0, 0);
    TRIPS(hipEventSynchronize(e), 0, 0);
    TRIPS(hipStreamQuery(s), 0, 0);

    /* A destroyed handle is forgotten: after the next device synchronize its synchronize
     * still goes to the worker, which refuses it. */
    TRIPS(hipEventDestroy(e), 0, 0);
    TRIPS(hipStreamDestroy(s), 0, 0);
    TRIPS(hipDeviceSynchronize(), 0, 1);
    TRIPS(hipStreamSynchronize(s), ANY_ERROR, 1);
    TRIPS(hipEventSynchronize(e), ANY_ERROR, 1);
    TRIPS(hipEventQuery(e), ANY_ERROR, 1);

    /* A failed fire-and-forget request: its error comes with the next synchronize, and
     * the one after that goes to the worker too (a failure never makes the device idle). */
    CHECK(hipFree(p));
    TRIPS(hipMemset(p, 2, 4096), 0, 0);
    TRIPS(hipDeviceSynchronize(), ANY_ERROR, 1);
    TRIPS(hipDeviceSynchronize(), 0, 1);
    TRIPS(hipStreamSynchronize(NULL), 0, 0);

    /* Once a thread has selected another device, a stream may belong to a device other
     * than the caller's: known handles go to the worker again; the device's own
     * synchronize and its null stream still need not. (The test's worker has 2 devices.) */
    hipStream_t s2 = NULL;
    TRIPS(hipStreamCreate(&s2), 0, 1);
    TRIPS(hipStreamSynchronize(s2), 0, 1);
    TRIPS(hipStreamSynchronize(s2), 0, 0);
    CHECK(hipSetDevice(1));
    CHECK(hipSetDevice(0));
    TRIPS(hipDeviceSynchronize(), 0, 0);
    TRIPS(hipStreamSynchronize(NULL), 0, 0);
    TRIPS(hipStreamSynchronize(s2), 0, 1);
    TRIPS(hipStreamQuery(s2), 0, 1);
    CHECK(hipStreamDestroy(s2));
    CHECK(hipDeviceSynchronize());

    /* Work queued on device 1, then device 0 synchronized: that says nothing of device 1,
     * so no synchronize is answered locally until device 1's own has come back. */
    void *q1 = NULL;
    CHECK(hipSetDevice(1));
    CHECK(hipMalloc(&q1, 4096));
    TRIPS(hipMemset(q1, 3, 4096), 0, 0);
    CHECK(hipSetDevice(0));
    TRIPS(hipDeviceSynchronize(), 0, 2); /* and the switch to device 0 */
    TRIPS(hipDeviceSynchronize(), 0, 1);
    TRIPS(hipStreamSynchronize(NULL), 0, 1);
    CHECK(hipSetDevice(1));
    TRIPS(hipDeviceSynchronize(), 0, 2); /* and the switch to device 1 */
    TRIPS(hipDeviceSynchronize(), 0, 0);
    CHECK(hipSetDevice(0));
    TRIPS(hipDeviceSynchronize(), 0, 0);
    CHECK(hipSetDevice(1));
    CHECK(hipFree(q1));
    CHECK(hipDeviceSynchronize());
    CHECK(hipSetDevice(0));

    if (failures) return 1;
    puts("ok");
    return 0;
}
