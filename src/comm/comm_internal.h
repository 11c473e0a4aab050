/* Internal: a communicator is a rank, a size and a table of collectives. */
#ifndef DISTRO_COMM_INTERNAL_H
#define DISTRO_COMM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <distro/comm.h>

typedef struct distro__comm_ops {
  const char *name; /* "local", "mpi", "nccl" */
  distro_status (*allgather)(distro_comm *c, const void *send, size_t bytes, void *recv);
  /* Variable sizes: rank r's `bytes` (<= slot, the same on every rank)
   * land at recv + r*slot and sizes[r] = its byte count. */
  distro_status (*allgatherv)(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                              size_t *sizes);
  /* Must leave bit-identical results on every rank. */
  distro_status (*allreduce_sum)(distro_comm *c, float *buf, size_t count);
  distro_status (*barrier)(distro_comm *c);
  void (*destroy)(distro_comm *c);
  int timeouts; /* 1: honours distro_comm.timeout_s (distro_comm_set_timeout) */
  /* Collective: a new communicator over the same ranks whose collectives
   * never meet c's, for a helper thread (the optimizer's background
   * exchanges). NULL: not supported. */
  distro_status (*dup)(distro_comm *c, distro_comm **out);
} distro__comm_ops;

struct distro_comm {
  const distro__comm_ops *ops;
  int rank, size;
  void *impl;
  double timeout_s; /* 0: collectives wait as long as it takes */
  int broken;       /* a collective timed out: every later one fails at once */
  int no_timeout;   /* this comm cannot bound its waits although its backend
                       can (custom: no set_timeout callback) */
  int poll;         /* MPI: wait by polling with short sleeps, never spinning in
                       MPI_Wait (a helper thread beside the caller's compute) */
  atomic_int hurry; /* set by the thread that owns a polled comm while it waits
                       for the helper's collectives: no compute of its own runs
                       then, so the polls nap briefly (see distro__comm_hurry) */
  int gatherv_pads; /* allgatherv moves `slot` bytes per rank whatever `bytes`
                       is, after an all-gather of the 8-byte sizes (NCCL): the
                       step statistics count what crosses */
};

/* c->ops->dup with the checks every caller needs; the new comm inherits
 * c's timeout. DISTRO_ERR_UNSUPPORTED where the backend has no dup. */
distro_status distro__comm_dup(distro_comm *c, distro_comm **out);

/* Around a wait for collectives that a helper thread runs on c. */
static inline void distro__comm_hurry(distro_comm *c, int on) {
  atomic_store_explicit(&c->hurry, on, memory_order_relaxed);
}

#endif
