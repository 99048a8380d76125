/* What the proxy's C test programs share: a count of failures, the two ways to add to it
 * and the verdict. A program that uses CHECK defines NAME_OF(e), the name of a non-zero
 * result, first. */
#ifndef HIPR_TEST_CHECK_H
#define HIPR_TEST_CHECK_H

#include <stdio.h>

static int failures;

/* A call that must return 0 (hipSuccess, CUDA_SUCCESS). */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        long e_ = (long)(call);                                                            \
        if (e_ != 0) {                                                                     \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, NAME_OF(e_));  \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

#define EXPECT(cond)                                                                       \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);            \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

/* main's last word: the count on stderr and 1 when a check failed, else "ok" and 0. */
static inline int verdict(void) {
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    puts("ok");
    return 0;
}

#endif
