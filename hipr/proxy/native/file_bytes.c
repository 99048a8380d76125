/* A whole file read into memory (file_bytes.h). */
#include "file_bytes.h"

#include <stdio.h>
#include <stdlib.h>

hipr_file_status hipr_read_file(const char *path, uint8_t **out, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return HIPR_FILE_NOT_FOUND;
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    hipr_file_status status = HIPR_FILE_OK;
    for (;;) {
        if (n + 1 >= cap) {
            cap = cap ? cap * 2 : 1 << 16;
            uint8_t *more = realloc(buf, cap);
            if (!more) {
                status = HIPR_FILE_NO_MEMORY;
                break;
            }
            buf = more;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, fp);
        n += k;
        if (k == 0) break;
    }
    if (status == HIPR_FILE_OK && ferror(fp)) status = HIPR_FILE_READ_ERROR;
    fclose(fp);
    if (status != HIPR_FILE_OK) {
        free(buf);
        return status;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HIPR_FILE_OK;
}
