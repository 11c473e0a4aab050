/* distro: communicators. A communicator connects the ranks of one job; the
 * optimizer only needs all-gather and all-reduce from it. */
#ifndef DISTRO_COMM_H
#define DISTRO_COMM_H

#include <stddef.h>
#include <distro/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct distro_comm distro_comm;

/* In-process ranks: fills comms[0..world-1], one per rank. Each comm must be
 * used by exactly one thread (its rank); collectives block until every rank
 * of the group has called them. Free each with distro_comm_free. */
DISTRO_API distro_status distro_comm_local_group(int world, distro_comm **comms);

/* Convenience: creates a local group, runs fn(comm, rank, arg) on `world`
 * threads and joins them. Returns the first non-OK status any fn returned
 * (by rank order), or DISTRO_ERR_NOMEM/DISTRO_ERR_INVALID if threads could
 * not be started. */
typedef distro_status (*distro_rank_fn)(distro_comm *comm, int rank, void *arg);
DISTRO_API distro_status distro_comm_run_local(int world, distro_rank_fn fn, void *arg);

DISTRO_API int  distro_comm_rank(const distro_comm *c);  /* -1 for NULL */
DISTRO_API int  distro_comm_size(const distro_comm *c);  /* -1 for NULL */
DISTRO_API void distro_comm_free(distro_comm *c);        /* accepts NULL */

/* Collectives (blocking; every rank must call with the same `bytes`/`count`).
 * recv receives size*bytes, rank r's data at offset r*bytes. */
DISTRO_API distro_status distro_comm_allgather(distro_comm *c, const void *send, size_t bytes, void *recv);
/* Element-wise float sum; the result is bit-identical on every rank. */
DISTRO_API distro_status distro_comm_allreduce_sum(distro_comm *c, float *buf, size_t count);
DISTRO_API distro_status distro_comm_barrier(distro_comm *c);

/* Optional collective timeout (seconds, > 0; 0 restores the default of
 * waiting as long as it takes). A collective that has not completed within
 * it on this rank returns DISTRO_ERR_TIMEOUT instead of hanging on a peer
 * that stopped, and the communicator is then broken: every later
 * collective on it fails at once with DISTRO_ERR_TIMEOUT. The job is meant
 * to be aborted then (a rank cannot tell which peers completed the call).
 * Set the same value on every rank. Limits:
 *  - in-process ranks: the timeout covers the wait for the other ranks to
 *    arrive; a timeout there aborts the whole group, so the late rank fails
 *    too when it arrives. Once all ranks have arrived the call completes.
 *  - MPI: the collective runs as a non-blocking MPI call polled until the
 *    deadline (a little CPU while waiting, copies through private buffers).
 *    MPI cannot cancel a collective: it stays pending, owns private copies
 *    of the buffers (leaked on purpose, so MPI never touches the caller's
 *    memory afterwards), and MPI_Finalize may then hang; call MPI_Abort.
 *  - NCCL: not supported (DISTRO_ERR_UNSUPPORTED).
 * Not thread-safe with a collective running on the same comm. */
DISTRO_API distro_status distro_comm_set_timeout(distro_comm *c, double seconds);

#ifdef __cplusplus
}
#endif
#endif
