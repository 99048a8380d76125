/* Open addressing with linear probing; removed entries leave a marker so that probes
 * past them still find later entries, and a rehash drops the markers. */
#include "ptr_set.h"

#include <stdint.h>
#include <stdlib.h>

static const char gone_marker;
#define GONE ((const void *)&gone_marker)

static size_t slot_of(const void *p, size_t capacity) {
    /* Allocations are 16-byte aligned: the low bits say nothing; Fibonacci hashing
     * spreads the rest over the table. */
    uint64_t h = ((uint64_t)(uintptr_t)p >> 4) * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(h >> 32) & (capacity - 1);
}

static void place(const void **slots, size_t capacity, const void *p) {
    size_t i = slot_of(p, capacity);
    while (slots[i]) i = (i + 1) & (capacity - 1);
    slots[i] = p;
}

static int resize(hipr_ptr_set *s, size_t capacity) {
    const void **slots = calloc(capacity, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < s->capacity; i++)
        if (s->slots[i] && s->slots[i] != GONE) place(slots, capacity, s->slots[i]);
    free(s->slots);
    s->slots = slots;
    s->capacity = capacity;
    s->used = s->live;
    return 0;
}

int hipr_ptr_set_has(const hipr_ptr_set *s, const void *p) {
    if (!s->capacity || !p) return 0;
    for (size_t i = slot_of(p, s->capacity);; i = (i + 1) & (s->capacity - 1)) {
        if (s->slots[i] == p) return 1;
        if (!s->slots[i]) return 0;
    }
}

int hipr_ptr_set_add(hipr_ptr_set *s, const void *p) {
    if (hipr_ptr_set_has(s, p)) return 0;
    /* At most half full, counting removed slots: probes stay short, and one is free. */
    if ((s->used + 1) * 2 > s->capacity) {
        size_t capacity = s->capacity ? s->capacity : 64;
        while ((s->live + 1) * 2 > capacity) capacity *= 2;
        if (resize(s, capacity)) return -1;
    }
    size_t i = slot_of(p, s->capacity);
    while (s->slots[i] && s->slots[i] != GONE) i = (i + 1) & (s->capacity - 1);
    if (!s->slots[i]) s->used++;
    s->slots[i] = p;
    s->live++;
    return 0;
}

void hipr_ptr_set_remove(hipr_ptr_set *s, const void *p) {
    if (!s->capacity || !p) return;
    for (size_t i = slot_of(p, s->capacity);; i = (i + 1) & (s->capacity - 1)) {
        if (!s->slots[i]) return;
        if (s->slots[i] == p) {
            s->slots[i] = GONE;
            s->live--;
            return;
        }
    }
}

void hipr_ptr_set_free(hipr_ptr_set *s) {
    free(s->slots);
    s->slots = NULL;
    s->capacity = s->live = s->used = 0;
}
