/* The C test harnesses' random numbers: xorshift64, deterministic for a seed. */
#ifndef HIPR_TEST_XORSHIFT_H
#define HIPR_TEST_XORSHIFT_H

#include <stddef.h>
#include <stdint.h>

static uint64_t state;

static inline uint64_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

/* A number below n (0 when n is 0). */
static inline size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

#endif
