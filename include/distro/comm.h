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

/* ---- Custom communicators ------------------------------------------------
 * Any transport (torch.distributed, a peer-to-peer layer, a job's own
 * sockets) can carry the optimizers: the caller supplies its rank, the
 * world size and callbacks, and gets a distro_comm that every optimizer
 * (DeMo sign, DisTrO-AdamW, the AdamW baseline, DiLoCo, SparseLoCo, the
 * overlap modes) runs over.
 *
 * Callbacks return 0 on success and anything else on failure; they may
 * write a message (NUL-terminated, at most DISTRO_COMM_ERR_MAX bytes with
 * the NUL) into `err`, which distro_last_error() then quotes. They are
 * called only from the thread that runs the collective (the caller's, or
 * the optimizer's helper thread on a duplicate, options.overlap).
 *
 * Agreement on failure. Every collective on such a comm is the callback's
 * collective followed by a verdict round: a 16-byte all-gather (through
 * the same `allgatherv` callback) of each rank's sequence number and
 * whether its callback failed. So a callback that fails on one rank only,
 * after taking part in the transport's collective, makes the collective
 * fail with DISTRO_ERR_COMM on every rank, and the optimizers' rule (on
 * failure nothing changes, on any rank) holds; a rank that has run a
 * different number of collectives is detected too. The comm stays usable
 * after a failure every rank agreed on. A failure in the verdict round
 * itself, or a rank out of step, breaks the comm: later collectives fail at
 * once with DISTRO_ERR_COMM. A rank whose callback fails WITHOUT taking
 * part in the transport's collective leaves its peers waiting inside
 * theirs: only the transport's own timeout ends that wait, so give the
 * comm one (`set_timeout` below, distro_comm_set_timeout) or use a
 * transport that fails every rank when one leaves.
 *
 * Callbacks must not call distro functions on the same comm, must not
 * longjmp or throw through the library, and must bound their own waits
 * when a timeout was set. */
#define DISTRO_COMM_CALLBACKS_VERSION 1
#define DISTRO_COMM_ERR_MAX 256

typedef struct distro_comm_callbacks {
  int version;  /* DISTRO_COMM_CALLBACKS_VERSION */
  int rank;     /* this rank, 0 <= rank < world */
  int world;    /* number of ranks, >= 1 */
  void *ctx;    /* passed to every callback */
  /* Required. All-gather of variable-size byte payloads: this rank's
   * `bytes` bytes at `send` (bytes <= slot; `slot` is the same on every
   * rank) land on every rank at recv + r*slot for rank r, and sizes[r]
   * receives rank r's byte count. The bytes past sizes[r] in a slot are
   * unspecified. */
  int (*allgatherv)(void *ctx, const void *send, size_t bytes, void *recv, size_t slot, size_t *sizes,
                    char *err);
  /* Optional. Element-wise float sum of `count` floats in place; the
   * result must be bit-identical on every rank. NULL: the library gathers
   * every rank's buffer with `allgatherv` and sums in rank order (the
   * in-process communicator's order), at world * count * 4 bytes of
   * memory. */
  int (*allreduce_sum)(void *ctx, float *buf, size_t count, char *err);
  /* Optional. NULL: a barrier is the verdict round alone. */
  int (*barrier)(void *ctx, char *err);
  /* Optional. Bound every later collective's wait to `seconds` (0: no
   * bound), as distro_comm_set_timeout documents; NULL: the comm has no
   * timeout (distro_comm_set_timeout fails with DISTRO_ERR_UNSUPPORTED). */
  int (*set_timeout)(void *ctx, double seconds, char *err);
  /* Optional, collective. A new context over the same ranks whose
   * collectives never meet this one's (the optimizer's background
   * exchanges, options.overlap, run on it from a helper thread while the
   * caller may use the original). NULL: overlap fails with
   * DISTRO_ERR_UNSUPPORTED on every rank. The duplicate shares every
   * callback and gets its own `destroy` call. */
  int (*dup)(void *ctx, void **new_ctx, char *err);
  /* Optional. Called once by distro_comm_free (also for duplicates). */
  void (*destroy)(void *ctx);
} distro_comm_callbacks;

/* A communicator over the caller's callbacks (copied; `cb->ctx` is
 * borrowed and must outlive the comm). Not collective. */
DISTRO_API distro_status distro_comm_from_callbacks(const distro_comm_callbacks *cb, distro_comm **out);

#ifdef __cplusplus
}
#endif
#endif
