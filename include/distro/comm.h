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

#ifdef __cplusplus
}
#endif
#endif
