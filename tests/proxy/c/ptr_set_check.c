/* hipr_ptr_set against a plain array as the reference: random adds, removes and looks
 * over a pool of pointers (held, removed, never added), with growth and the rehash that
 * drops removed slots. Prints "ok <adds> <removes> <looks>"; exits 1 at the first
 * disagreement. Run under ASan/UBSan by tests/proxy/test_native_c.py. */
#include <stdio.h>
#include <stdlib.h>

#include "ptr_set.h"

#define POOL 3000

static unsigned long long state = 88172645463325252ULL;
static unsigned next_random(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (unsigned)(state >> 11);
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200000;
    static char pool[POOL][16]; /* distinct 16-byte-aligned-ish addresses, as handles */
    static int held[POOL];
    hipr_ptr_set set = {0};
    long adds = 0, removes = 0, looks = 0;
    if (hipr_ptr_set_has(&set, pool[0])) return puts("empty set holds a pointer"), 1;
    hipr_ptr_set_remove(&set, pool[0]); /* nothing to remove: no effect */
    for (long r = 0; r < rounds; r++) {
        unsigned i = next_random() % POOL, what = next_random() % 4;
        /* Phases: mostly adds, then mostly removes, so the set grows and empties. */
        int growing = (r / 20000) % 2 == 0;
        if (what == 0 || (what == 1 && growing)) {
            if (hipr_ptr_set_add(&set, pool[i])) return puts("out of memory"), 1;
            held[i] = 1;
            adds++;
        } else if (what == 1 || what == 2) {
            hipr_ptr_set_remove(&set, pool[i]);
            held[i] = 0;
            removes++;
        } else {
            looks++;
        }
        if (hipr_ptr_set_has(&set, pool[i]) != held[i]) {
            printf("round %ld: pointer %u is %sheld but the set says otherwise\n", r, i,
                   held[i] ? "" : "not ");
            return 1;
        }
    }
    size_t live = 0;
    for (unsigned i = 0; i < POOL; i++) {
        if (hipr_ptr_set_has(&set, pool[i]) != held[i]) return puts("final look disagrees"), 1;
        live += (size_t)held[i];
    }
    if (set.live != live) return puts("live count is off"), 1;
    if (hipr_ptr_set_has(&set, NULL)) return puts("NULL is never held"), 1;
    hipr_ptr_set_free(&set);
    if (hipr_ptr_set_has(&set, pool[0]) || set.capacity) return puts("freed set not empty"), 1;
    printf("ok %ld %ld %ld\n", adds, removes, looks);
    return 0;
}
