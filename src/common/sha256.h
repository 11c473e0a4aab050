/* Internal: SHA-256 (FIPS 180-4). Used where a peer's data must be checked
 * against a digest from a trusted side (a joining learner verifies the state
 * it pulled from another learner against the syncer's digests), so the
 * check must resist forgery, which a CRC does not. */
#ifndef DISTRO_COMMON_SHA256_H
#define DISTRO_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t bytes;     /* message length so far */
  uint8_t buf[64];
  size_t nbuf;
} distro__sha256_ctx;

void distro__sha256_init(distro__sha256_ctx *c);
void distro__sha256_update(distro__sha256_ctx *c, const void *p, size_t n);
void distro__sha256_final(distro__sha256_ctx *c, uint8_t out[32]);
/* One call: out = SHA-256(p[0..n)). */
void distro__sha256(const void *p, size_t n, uint8_t out[32]);

#endif
