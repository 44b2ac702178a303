/*
 * sha256: FIPS 180-4 SHA-256, the checksum the Hugging Face hub gives for LFS files (their git-lfs oid,
 * sent as X-Linked-Etag). Streaming (init, update, final) and over a whole file.
 */
#ifndef WAFER_PULL_SHA256_H
#define WAFER_PULL_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
    uint32_t h[8];
    uint64_t n_bytes;  /* message bytes so far */
    uint8_t block[64]; /* pending bytes of the current block */
    size_t n_block;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
/* Writes the digest as 64 lowercase hex digits and a NUL into hex[65]. s must be re-initialized after. */
void sha256_final_hex(struct sha256 *s, char hex[65]);

/* Digest of a whole file into hex[65]. on_progress (may be NULL) is called with the bytes hashed so far
 * after each chunk. 0, or ERR_IO with a message in err. */
int sha256_file(const char *path, char hex[65], void (*on_progress)(void *ctx, int64_t done), void *ctx,
                char *err);

#endif
