#include "launch_extra.h"

#include <string.h>

int hipr_launch_extra(void **extra, const void *end, size_t max, const void **args, size_t *len) {
    const void *p = NULL;
    size_t size = 0;
    int have_size = 0;
    for (size_t i = 0; extra[i] != end; i += 2) {
        if (i >= 64) return -1;
        if (extra[i] == (void *)0x01) p = extra[i + 1];
        else if (extra[i] == (void *)0x02 && extra[i + 1]) {
            memcpy(&size, extra[i + 1], sizeof size);
            have_size = 1;
        } else return -1;
    }
    if (!have_size || (size && !p) || size > max) return -1;
    *args = p;
    *len = size;
    return 0;
}
