/* A communicator that wraps another and, while armed, flips one byte in the
 * middle of rank `corrupt_rank`'s slot after each payload exchange: a
 * payload damaged in transit. With corrupt_self 0 the corrupt rank's own
 * copy stays intact (damage on the other links only). Exchanges under 200
 * bytes (the first step's signature round, the drop agreement) pass
 * untouched.
 * A duplicate (the optimizer's background exchanges, options.overlap) wraps
 * a duplicate of the inner comm and follows the original's settings.
 * Header-only: the test files that use it include it once. */
#ifndef DISTRO_TESTS_CORRUPT_COMM_H
#define DISTRO_TESTS_CORRUPT_COMM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

typedef struct tu_corrupting {
  distro_comm *inner;
  int corrupt_rank, corrupt_self, armed;
  const struct tu_corrupting *cfg; /* a duplicate: the original's settings */
} tu_corrupting;

static const tu_corrupting *tu_corrupt_cfg(const tu_corrupting *k) { return k->cfg ? k->cfg : k; }
static int tu_corrupt_hits(const tu_corrupting *k, int self) {
  k = tu_corrupt_cfg(k);
  return k->armed && k->corrupt_rank >= 0 && (k->corrupt_self || self != k->corrupt_rank);
}
static distro_status tu_corrupt_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  tu_corrupting *k = c->impl;
  distro_status st = k->inner->ops->allgather(k->inner, send, bytes, recv);
  if (st == DISTRO_OK && bytes >= 200 && tu_corrupt_hits(k, c->rank))
    ((uint8_t *)recv)[(size_t)tu_corrupt_cfg(k)->corrupt_rank * bytes + bytes / 2] ^= 0x10;
  return st;
}
static distro_status tu_corrupt_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                           size_t *sizes) {
  const tu_corrupting *w = c->impl;
  distro_status st = w->inner->ops->allgatherv(w->inner, send, bytes, recv, slot, sizes);
  if (st != DISTRO_OK || !tu_corrupt_hits(w, c->rank)) return st;
  const tu_corrupting *k = tu_corrupt_cfg(w);
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
static distro_status tu_corrupt_dup(distro_comm *c, distro_comm **out);
static void tu_corrupt_destroy(distro_comm *c) {
  tu_corrupting *k = c->impl;
  distro_comm_free(k->inner);
  free(k);
}
static const distro__comm_ops tu_corrupt_ops = {"corrupting", tu_corrupt_allgather, tu_corrupt_allgatherv,
                                                tu_corrupt_allreduce, tu_corrupt_barrier, NULL, 0, tu_corrupt_dup};
static const distro__comm_ops tu_corrupt_dup_ops = {"corrupting", tu_corrupt_allgather, tu_corrupt_allgatherv,
                                                    tu_corrupt_allreduce, tu_corrupt_barrier, tu_corrupt_destroy, 0,
                                                    NULL};
static distro_status tu_corrupt_dup(distro_comm *c, distro_comm **out) {
  tu_corrupting *k = c->impl;
  distro_comm *inner = NULL;
  distro_status st = k->inner->ops->dup(k->inner, &inner);
  if (st != DISTRO_OK) return st;
  tu_corrupting *d = calloc(1, sizeof *d);
  distro_comm *w = calloc(1, sizeof *w);
  if (!d || !w) { /* a test machine out of memory: give up loudly */
    free(d);
    free(w);
    distro_comm_free(inner);
    return DISTRO_ERR_NOMEM;
  }
  d->inner = inner;
  d->cfg = tu_corrupt_cfg(k);
  *w = (distro_comm){.ops = &tu_corrupt_dup_ops, .rank = c->rank, .size = c->size, .impl = d};
  *out = w;
  return DISTRO_OK;
}

/* *out becomes the wrapper of k->inner (same rank and size). */
static inline void tu_corrupting_wrap(tu_corrupting *k, distro_comm *out) {
  *out = (distro_comm){.ops = &tu_corrupt_ops, .rank = k->inner->rank, .size = k->inner->size, .impl = k};
}

#endif
