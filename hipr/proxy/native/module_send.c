/* Code objects sent once per tenant (docs/protocol.md, MODULE_LOAD, protocol 1.2): the
 * CUDA runtime of a framework loads tens of MB of fat binaries at every process start,
 * and the worker keeps what a tenant's earlier sessions sent, by SHA-256. The hash is
 * OpenSSL's (libcrypto is linked for tls:// already). */
#include "module_send.h"

#include <openssl/evp.h>
#include <string.h>

#include "opcodes.h"

#define SHA256_BYTES 32
/* The protocol minor version whose workers take MODULE_LOAD by sha256. */
#define HASH_LOADS_SINCE_MINOR 2

/* 1 when the reply is {held: false}: the worker does not hold the image. */
static int not_held(const hipr_reply *r) {
    cbor_item_t *held = r->map ? hipr_cbor_get(r->map, "held") : NULL;
    return held && cbor_is_bool(held) && !cbor_get_bool(held);
}

static int load(int device, const uint8_t *digest, const void *image, size_t size,
                uint64_t *module, hipr_reply *r) {
    hipr_map *args = NULL, m;
    if (digest) {
        hipr_map_init(&m, 1);
        hipr_map_bytes(&m, "sha256", digest, SHA256_BYTES);
        args = &m;
    }
    int rc = hipr_call(device, OP_MODULE_LOAD, args, image, size, NULL, 0, r);
    if (rc == HIPR_SUCCESS && !(image == NULL && not_held(r)) &&
        (hipr_cbor_uint(r->map, "module", module) || !*module))
        rc = HIPR_UNKNOWN;
    return rc;
}

int hipr_module_load(int device, const void *image, size_t size, uint64_t *module,
                     hipr_reply *reply) {
    uint8_t digest[SHA256_BYTES];
    unsigned digest_len = 0;
    *module = 0;
    if (size < HIPR_HASH_OFFER_MIN_BYTES || hipr_worker_minor() < HASH_LOADS_SINCE_MINOR ||
        !EVP_Digest(image, size, digest, &digest_len, EVP_sha256(), NULL) ||
        digest_len != SHA256_BYTES)
        return load(device, NULL, image, size, module, reply);
    int rc = load(device, digest, NULL, 0, module, reply);
    if (rc != HIPR_SUCCESS || *module) return rc;
    /* {held: false}: this tenant's store has it not (or no more); the bytes follow, with
     * their hash, so that the next process start finds them. */
    hipr_reply_free(reply);
    return load(device, digest, image, size, module, reply);
}
