/* Code objects sent once per tenant: MODULE_LOAD by content hash (protocol 1.2). */
#ifndef HIPR_MODULE_SEND_H
#define HIPR_MODULE_SEND_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* Code objects smaller than this go as they are: their hash and a second round trip
 * would cost more than the bytes. */
#define HIPR_HASH_OFFER_MIN_BYTES 4096

/* MODULE_LOAD of `image` (`size` bytes) on `device`: one of at least
 * HIPR_HASH_OFFER_MIN_BYTES, to a worker of protocol 1.2 or later, is first named by its
 * SHA-256 alone, and its bytes follow only when the worker answers that it does not hold
 * it for this tenant. The module's handle goes to *module. Returns a hipError_t (`reply`
 * holds the worker's message on error; free it with hipr_reply_free either way). */
int hipr_module_load(int device, const void *image, size_t size, uint64_t *module,
                     hipr_reply *reply);

#endif
