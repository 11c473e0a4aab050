/* FNV-1a, 64 bits: a fingerprint of byte strings that every rank computes
 * alike (tensor lists, options), compared to detect disagreement. Not a
 * defence against a forger: authenticated content uses SHA-256. */
#ifndef DISTRO_COMMON_FNV_H
#define DISTRO_COMMON_FNV_H

#include <stddef.h>
#include <stdint.h>

#define DISTRO__FNV1A_INIT 0xcbf29ce484222325ULL

static inline uint64_t distro__fnv1a(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = (const uint8_t *)data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

#endif
