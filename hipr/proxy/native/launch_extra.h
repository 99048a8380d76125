/* A launch's arguments, shared by the HIP and the CUDA front: the `extra` array, and the
 * parameter layout that packs `kernelParams`. */
#ifndef HIPR_LAUNCH_EXTRA_H
#define HIPR_LAUNCH_EXTRA_H

#include <stddef.h>
#include <stdint.h>

/* The packed argument buffer `extra` names: pairs of (BUFFER_POINTER, p) and
 * (BUFFER_SIZE, &size) up to `end`. Both APIs number the two keys 1 and 2; only the end
 * marker differs (HIP_LAUNCH_PARAM_END is 3, CU_LAUNCH_PARAM_END is 0). 0 with *args and
 * *len set; -1 for an unknown key, a missing size, a null buffer with a size, a size over
 * `max` or more than 32 pairs. */
int hipr_launch_extra(void **extra, const void *end, size_t max, const void **args, size_t *len);

#define HIPR_MAX_PARAMS 256
#define HIPR_MAX_ARGS_BYTES 4096

/* A kernel's parameter layout as the worker reports it (FUNCTION_PARAMS): where each
 * parameter sits in the argument buffer, and which are device pointers. */
typedef struct {
    int known; /* 0: not asked yet; 1: known; -1: the worker cannot tell */
    size_t n_params, args_size;
    uint32_t offsets[HIPR_MAX_PARAMS], sizes[HIPR_MAX_PARAMS];
    uint8_t is_pointer[HIPR_MAX_PARAMS];
} hipr_param_layout;

/* Ask the worker (on `device`) for function `function`'s layout into *out: out->known is
 * 1, or -1 where the worker cannot tell or its answer does not hold together (a
 * parameter past HIPR_MAX_ARGS_BYTES, an empty one, a pointer index past the list). */
void hipr_param_layout_fetch(int device, uint64_t function, hipr_param_layout *out);

/* `params` (a pointer per parameter, HIP's and CUDA's kernelParams) packed by a known
 * layout into `buf` (HIPR_MAX_ARGS_BYTES); -1 for a missing parameter pointer. */
int hipr_param_layout_pack(const hipr_param_layout *layout, void **params, uint8_t *buf,
                           size_t *len);

#endif
