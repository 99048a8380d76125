/* A launch request's CBOR map written straight into a buffer (see launch_cbor.c). */
#ifndef HIPR_LAUNCH_CBOR_H
#define HIPR_LAUNCH_CBOR_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* Bytes that always suffice for a map of `count` launches whose arguments take `used`
 * bytes together (the config's 256 pointers at their longest included). */
#define HIPR_LAUNCH_CBOR_ROOM(used, count) (2560 + (used) + 5 * (size_t)(count))

/* LAUNCH_KERNEL's map (`count` 1: "args" is the one byte string) or LAUNCH_KERNELS's
 * (`count` > 1: "args" is a list of `count` byte strings, `lens[i]` bytes each, laid end
 * to end in `args`) for `config`, with "synchronize": true when `synchronize`. The keys
 * and their order are hipr_map_launch_config's, then "args", then "synchronize"; every
 * integer is in its shortest form. Returns the bytes written to `out`, or 0 when `room`
 * is too small or `count` is 0. */
size_t hipr_launch_cbor(uint8_t *out, size_t room, const hipr_launch_config *config,
                        const uint8_t *args, const uint16_t *lens, size_t count, int synchronize);

#endif
