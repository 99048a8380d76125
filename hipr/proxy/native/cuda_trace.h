/* HIPR_PROXY_TRACE: each driver call made through a cuGetProcAddress pointer printed with
 * its result (cuda_trace.c). */
#ifndef HIPR_CUDA_TRACE_H
#define HIPR_CUDA_TRACE_H

#include <stddef.h>

/* 1 when HIPR_PROXY_TRACE is set (and not "0"); "2" also prints each traced call's six
 * integer argument registers and the 8 bytes each that is a pointer points at after it. */
int hipr_cu_trace_enabled(void);
/* The entry point `fn` wrapped so that each call prints `name` and its result; `fn`
 * itself where wrapping is not possible. */
void *hipr_cu_trace_wrap(const char *name, void *fn);
/* A copy of the `n` slots of a private export table whose slots from `first` on are
 * wrapped, each named "<tag>[index]"; `table` itself where wrapping is not possible. */
const void *hipr_cu_trace_table(const char *tag, const void *table, size_t n, size_t first);

#endif
