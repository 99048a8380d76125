/* HIPR_PROXY_TRACE: each driver call made through a cuGetProcAddress pointer printed with
 * its result (cuda_trace.c). */
#ifndef HIPR_CUDA_TRACE_H
#define HIPR_CUDA_TRACE_H

/* 1 when HIPR_PROXY_TRACE is set (and not "0"). */
int hipr_cu_trace_enabled(void);
/* The entry point `fn` wrapped so that each call prints `name` and its result; `fn`
 * itself where wrapping is not possible. */
void *hipr_cu_trace_wrap(const char *name, void *fn);

#endif
