/* A launch's `extra` array, shared by the HIP and the CUDA front. */
#ifndef HIPR_LAUNCH_EXTRA_H
#define HIPR_LAUNCH_EXTRA_H

#include <stddef.h>

/* The packed argument buffer `extra` names: pairs of (BUFFER_POINTER, p) and
 * (BUFFER_SIZE, &size) up to `end`. Both APIs number the two keys 1 and 2; only the end
 * marker differs (HIP_LAUNCH_PARAM_END is 3, CU_LAUNCH_PARAM_END is 0). 0 with *args and
 * *len set; -1 for an unknown key, a missing size, a null buffer with a size, a size over
 * `max` or more than 32 pairs. */
int hipr_launch_extra(void **extra, const void *end, size_t max, const void **args, size_t *len);

#endif
