/* A set of live handles (pointers the proxy handed out), so that a call checks one in
 * constant time. A launch checks its kernel and its function: scanning every loaded
 * library's kernels, as before, cost each launch a walk over thousands of nodes in a
 * PyTorch process (libtorch_cuda registers a library per fat binary). Not locked:
 * callers hold the lock that guards the handles themselves. */
#ifndef HIPR_PTR_SET_H
#define HIPR_PTR_SET_H

#include <stddef.h>

typedef struct {
    const void **slots; /* NULL: never used; HIPR_PTR_SET_GONE: removed */
    size_t capacity;    /* a power of two, or 0 before the first add */
    size_t live;        /* pointers held */
    size_t used;        /* slots not NULL: live + removed */
} hipr_ptr_set;

/* 0 once p is held (also when it already was); -1 when memory ran out (nothing held
 * changed). p must not be NULL. */
int hipr_ptr_set_add(hipr_ptr_set *s, const void *p);
/* Whether p is held. */
int hipr_ptr_set_has(const hipr_ptr_set *s, const void *p);
/* p no longer held (nothing when it was not). */
void hipr_ptr_set_remove(hipr_ptr_set *s, const void *p);
/* Everything freed; the set is empty and usable again. */
void hipr_ptr_set_free(hipr_ptr_set *s);

#endif
