/* A communicator that wraps another and, while armed, flips one byte in the
 * middle of rank `corrupt_rank`'s slot after each payload exchange: a
 * payload damaged in transit. With corrupt_self 0 the corrupt rank's own
 * copy stays intact (damage on the other links only). Exchanges under 200
 * bytes (the first step's signature round, the drop agreement) pass
 * untouched. Header-only: the test files that use it include it once. */
#ifndef DISTRO_TESTS_CORRUPT_COMM_H
#define DISTRO_TESTS_CORRUPT_COMM_H

#include <stdint.h>

#include "comm/comm_internal.h"

typedef struct {
  distro_comm *inner;
  int corrupt_rank, corrupt_self, armed;
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
  if (st == DISTRO_OK && tu_corrupt_hits(k, c->rank))
    ((uint8_t *)recv)[(size_t)k->corrupt_rank * slot + sizes[k->corrupt_rank] / 2] ^= 0x10;
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
