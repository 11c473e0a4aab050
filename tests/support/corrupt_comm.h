/* A communicator that wraps another and, while armed, flips one byte in the
 * middle of rank `corrupt_rank`'s slot after each payload exchange: a
 * payload damaged in transit. With corrupt_self 0 the corrupt rank's own
 * copy stays intact (damage on the other links only). Exchanges under 200
 * bytes (the first step's signature round, the drop agreement) pass
 * untouched. With forge_scale > 0 it instead rewrites the first tensor's
 * DisTrO-AdamW step scale in corrupt_rank's wire v2 payload (ntensors
 * tensors) and reseals its CRC: a valid payload with a forged scale.
 * Header-only: the test files that use it include it once. */
#ifndef DISTRO_TESTS_CORRUPT_COMM_H
#define DISTRO_TESTS_CORRUPT_COMM_H

#include <stdint.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/crc32c.h"

typedef struct {
  distro_comm *inner;
  int corrupt_rank, corrupt_self, armed;
  float forge_scale;
  int ntensors;
} tu_corrupting;

static int tu_corrupt_hits(const tu_corrupting *k, int self) {
  return k->armed && k->corrupt_rank >= 0 && (k->corrupt_self || self != k->corrupt_rank);
}
static distro_status tu_corrupt_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  tu_corrupting *k = c->impl;
  distro_status st = k->inner->ops->allgather(k->inner, send, bytes, recv);
  if (st == DISTRO_OK && bytes >= 200 && tu_corrupt_hits(k, c->rank))
    ((uint8_t *)recv)[(size_t)k->corrupt_rank * bytes + bytes / 2] ^= 0x10;
  return st;
}
static distro_status tu_corrupt_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                           size_t *sizes) {
  tu_corrupting *k = c->impl;
  distro_status st = k->inner->ops->allgatherv(k->inner, send, bytes, recv, slot, sizes);
  if (st != DISTRO_OK || !tu_corrupt_hits(k, c->rank)) return st;
  uint8_t *b = (uint8_t *)recv + (size_t)k->corrupt_rank * slot;
  const size_t n = sizes[k->corrupt_rank], at = 40 + 40 * (size_t)k->ntensors;
  if (k->forge_scale > 0 && n > at + 8 && (b[7] & 2u)) {
    uint32_t bits;
    memcpy(&bits, &k->forge_scale, 4);
    for (int i = 0; i < 4; i++) b[at + (size_t)i] = (uint8_t)(bits >> (8 * i));
    const uint32_t crc = distro__crc32c(b, n - 4);
    for (int i = 0; i < 4; i++) b[n - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
  } else if (k->forge_scale <= 0) {
    b[n / 2] ^= 0x10;
  }
  return st;
}
static distro_status tu_corrupt_allreduce(distro_comm *c, float *b, size_t n) {
  tu_corrupting *k = c->impl;
  return k->inner->ops->allreduce_sum(k->inner, b, n);
}
static distro_status tu_corrupt_barrier(distro_comm *c) {
  tu_corrupting *k = c->impl;
  return k->inner->ops->barrier(k->inner);
}
static const distro__comm_ops tu_corrupt_ops = {"corrupting", tu_corrupt_allgather, tu_corrupt_allgatherv,
                                                tu_corrupt_allreduce, tu_corrupt_barrier, NULL, 0};

/* *out becomes the wrapper of k->inner (same rank and size). */
static inline void tu_corrupting_wrap(tu_corrupting *k, distro_comm *out) {
  *out = (distro_comm){&tu_corrupt_ops, k->inner->rank, k->inner->size, k, 0, 0};
}

#endif
