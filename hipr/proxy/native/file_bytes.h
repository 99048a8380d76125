/* A whole file read into memory: the code objects and link inputs that the module and
 * hiprtc front ends take by path (hipModuleLoad, cuModuleLoad, hiprtcLinkAddFile). */
#ifndef HIPR_FILE_BYTES_H
#define HIPR_FILE_BYTES_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    HIPR_FILE_OK = 0,
    HIPR_FILE_NOT_FOUND, /* it could not be opened */
    HIPR_FILE_NO_MEMORY,
    HIPR_FILE_READ_ERROR,
} hipr_file_status;

/* The whole file at `path` in a malloc'd buffer of the caller's to free, NUL-terminated
 * (PTX text needs its NUL; *len does not count it). Nothing to free unless HIPR_FILE_OK. */
hipr_file_status hipr_read_file(const char *path, uint8_t **out, size_t *len);

#endif
