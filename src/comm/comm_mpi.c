/* MPI communicator: wraps a private duplicate of the caller's MPI_Comm, so
 * our collectives never interleave with the caller's traffic and our error
 * handler does not change theirs.
 *
 * Every collective is a non-blocking MPI call completed by wait_req. With a
 * timeout (distro_comm_set_timeout) it is polled until the deadline and
 * runs on private copies of the buffers: on a timeout those copies are
 * leaked on purpose, since MPI cannot cancel a collective and may still
 * read or write them after we return. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <distro/mpi.h>

#include "comm/comm_internal.h"
#include "common/clock.h"
#include "common/error.h"

typedef struct {
  MPI_Comm comm;
  /* Largest element count passed to one MPI call. MPI counts are int, so
   * this is INT_MAX; tests lower it to exercise the large-size paths. */
  size_t max_count;
} mpi_impl;

static distro_status mpi_fail(int rc, const char *call) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
  return distro__fail(DISTRO_ERR_COMM, "%s failed: %s (MPI error %d)", call,
                      len ? msg : "unknown error", rc);
}

static double now_s(void) { return distro__now(); }

/* Completes one request: MPI_Wait, or with a timeout MPI_Test until the
 * deadline `end` (shared by the requests of one collective). A timeout
 * marks the comm broken. */
static distro_status wait_req(distro_comm *c, MPI_Request *r, const char *name, double end) {
  if (c->timeout_s <= 0 && !c->poll) {
    const int rc = MPI_Wait(r, MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? DISTRO_OK : mpi_fail(rc, name);
  }
  /* Polled (a timeout, or a helper thread that must not spin in MPI_Wait
   * beside the caller's compute): each MPI_Test also progresses the
   * transfer, so the naps stay short. */
  double nap = 20e-6;
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, name);
    if (done) return DISTRO_OK;
    if (c->timeout_s > 0 && now_s() >= end) {
      c->broken = 1;
      return distro__fail(DISTRO_ERR_TIMEOUT,
                          "%s on rank %d did not complete within %.3g s (a peer stopped?); the communicator is "
                          "unusable, abort the job (MPI_Abort)",
                          name, c->rank, c->timeout_s);
    }
    struct timespec ts = {0, (long)(nap * 1e9)};
    nanosleep(&ts, NULL);
    /* Up to 1 ms beside the caller's compute; 50 us once the caller only
     * waits for this collective (each poll advances it a round). */
    const double cap = atomic_load_explicit(&c->hurry, memory_order_relaxed) ? 50e-6 : 1e-3;
    nap = 2 * nap < cap ? 2 * nap : cap;
  }
}

static double deadline(const distro_comm *c) { return c->timeout_s > 0 ? now_s() + c->timeout_s : 0; }

static distro_status check_broken(const distro_comm *c, const char *name) {
  if (!c->broken) return DISTRO_OK;
  return distro__fail(DISTRO_ERR_TIMEOUT, "%s: the communicator timed out earlier and is unusable; abort the job",
                      name);
}

/* With a timeout, a private copy of n bytes of the caller's buffer `user`
 * (see the top); without one, `user` itself. NULL only when out of memory. */
static void *stage(const distro_comm *c, const void *user, size_t n, int copy_in) {
  if (c->timeout_s <= 0) return (void *)(uintptr_t)(user ? user : "");
  void *p = malloc(n ? n : 1);
  if (p && copy_in && user && n) memcpy(p, user, n);
  return p;
}
static void unstage(const distro_comm *c, void *copy, distro_status st) {
  if (c->timeout_s > 0 && st != DISTRO_ERR_TIMEOUT) free(copy);
}

#define MPI_TRY(call, name)                    \
  do {                                         \
    int rc_ = (call);                          \
    if (rc_ != MPI_SUCCESS) {                  \
      st = mpi_fail(rc_, name);                \
      goto fail;                               \
    }                                          \
  } while (0)

/* Builds a datatype of exactly `bytes` bytes (extent too), for sizes whose
 * byte count does not fit in an int: `q` blocks of `blk` bytes followed by
 * `rem` bytes. With extent == bytes, rank r's block lands at r*bytes. */
static distro_status make_bytes_type(size_t bytes, size_t blk, MPI_Datatype *out) {
  distro_status st = DISTRO_OK;
  MPI_Datatype block = MPI_DATATYPE_NULL, body = MPI_DATATYPE_NULL, raw = MPI_DATATYPE_NULL,
               whole = MPI_DATATYPE_NULL;
  size_t q = bytes / blk, rem = bytes % blk;
  if (q > (size_t)INT_MAX)
    DISTRO_FAIL(DISTRO_ERR_COMM, "MPI allgather: %zu bytes is too large", bytes);
  MPI_TRY(MPI_Type_contiguous((int)blk, MPI_BYTE, &block), "MPI_Type_contiguous");
  MPI_TRY(MPI_Type_contiguous((int)q, block, &body), "MPI_Type_contiguous");
  if (rem) {
    int lens[2] = {1, (int)rem};
    MPI_Aint disp[2] = {0, (MPI_Aint)(q * blk)};
    MPI_Datatype types[2] = {body, MPI_BYTE};
    MPI_TRY(MPI_Type_create_struct(2, lens, disp, types, &raw), "MPI_Type_create_struct");
  } else {
    MPI_TRY(MPI_Type_dup(body, &raw), "MPI_Type_dup");
  }
  /* Pin the extent to `bytes`: no alignment padding may shift later ranks. */
  MPI_TRY(MPI_Type_create_resized(raw, 0, (MPI_Aint)bytes, &whole), "MPI_Type_create_resized");
  MPI_TRY(MPI_Type_commit(&whole), "MPI_Type_commit");
  *out = whole;
  whole = MPI_DATATYPE_NULL;

fail:
  if (whole != MPI_DATATYPE_NULL) MPI_Type_free(&whole);
  if (raw != MPI_DATATYPE_NULL) MPI_Type_free(&raw);
  if (body != MPI_DATATYPE_NULL) MPI_Type_free(&body);
  if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);
  return st;
}

static distro_status mpi_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  distro_status st = check_broken(c, "MPI allgather");
  mpi_impl *m = c->impl;
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Request r;
  const double end = deadline(c);
  if (st != DISTRO_OK) return st;
  void *s_in = stage(c, send, bytes, 1), *s_out = stage(c, recv, bytes * (size_t)c->size, 0);
  if (!s_in || !s_out) DISTRO_FAIL(DISTRO_ERR_NOMEM, "MPI allgather: out of memory");
  if (bytes <= m->max_count) {
    MPI_TRY(MPI_Iallgather(s_in, (int)bytes, MPI_BYTE, s_out, (int)bytes, MPI_BYTE, m->comm, &r), "MPI_Iallgather");
  } else {
    /* Too many bytes for an int count: send one element of a derived type. */
    DISTRO_CHECK(make_bytes_type(bytes, m->max_count, &t));
    MPI_TRY(MPI_Iallgather(s_in, 1, t, s_out, 1, t, m->comm, &r), "MPI_Iallgather");
  }
  DISTRO_CHECK(wait_req(c, &r, "MPI_Iallgather", end));
  if (s_out != recv) memcpy(recv, s_out, bytes * (size_t)c->size);

fail:
  if (t != MPI_DATATYPE_NULL && st != DISTRO_ERR_TIMEOUT) MPI_Type_free(&t);
  if (s_in) unstage(c, s_in, st);
  if (s_out) unstage(c, s_out, st);
  return st;
}

/* Sizes first (one small all-gather), then the payloads themselves. */
static distro_status mpi_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                    size_t *sizes) {
  distro_status st = check_broken(c, "MPI allgatherv");
  mpi_impl *m = c->impl;
  const int W = c->size;
  const double end = deadline(c);
  MPI_Request r;
  if (st != DISTRO_OK) return st;
  uint64_t my_bytes = bytes, *all = malloc(sizeof(uint64_t) * (size_t)W);
  int *counts = malloc(sizeof(int) * 2 * (size_t)W);
  uint64_t *mine = stage(c, &my_bytes, 8, 1), *gathered = all ? stage(c, all, 8 * (size_t)W, 0) : NULL;
  void *s_in = stage(c, send, bytes, 1), *s_out = stage(c, recv, (size_t)W * slot, 0);
  if (!mine || !all || !gathered || !counts || !s_in || !s_out)
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "MPI allgatherv: out of memory");
  MPI_TRY(MPI_Iallgather(mine, 1, MPI_UINT64_T, gathered, 1, MPI_UINT64_T, m->comm, &r), "MPI_Iallgather");
  DISTRO_CHECK(wait_req(c, &r, "MPI_Iallgather", end));
  if (gathered != all) memcpy(all, gathered, sizeof(uint64_t) * (size_t)W);
  for (int r2 = 0; r2 < W; r2++) {
    if (all[r2] > slot)
      DISTRO_FAIL(DISTRO_ERR_COMM, "MPI allgatherv: rank %d sent %llu bytes, more than the %zu-byte slot", r2,
                  (unsigned long long)all[r2], slot);
    sizes[r2] = (size_t)all[r2];
  }
  if ((size_t)W * slot <= m->max_count) {
    int *displs = counts + W;
    for (int r2 = 0; r2 < W; r2++) {
      counts[r2] = (int)all[r2];
      displs[r2] = (int)((size_t)r2 * slot);
    }
    MPI_TRY(MPI_Iallgatherv(s_in, (int)bytes, MPI_BYTE, s_out, counts, displs, MPI_BYTE, m->comm, &r),
            "MPI_Iallgatherv");
    DISTRO_CHECK(wait_req(c, &r, "MPI_Iallgatherv", end));
  } else {
    /* Displacements would overflow an int: one broadcast per rank, chunked. */
    for (int r2 = 0; r2 < W; r2++) {
      char *dst = (char *)s_out + (size_t)r2 * slot;
      if (r2 == c->rank && bytes) memcpy(dst, s_in, bytes);
      for (size_t off = 0; off < sizes[r2]; off += m->max_count) {
        size_t n = sizes[r2] - off < m->max_count ? sizes[r2] - off : m->max_count;
        MPI_TRY(MPI_Ibcast(dst + off, (int)n, MPI_BYTE, r2, m->comm, &r), "MPI_Ibcast");
        DISTRO_CHECK(wait_req(c, &r, "MPI_Ibcast", end));
      }
    }
  }
  if (s_out != recv)
    for (int r2 = 0; r2 < W; r2++) memcpy((char *)recv + (size_t)r2 * slot, (char *)s_out + (size_t)r2 * slot, sizes[r2]);
fail:
  if (mine) unstage(c, mine, st);
  if (gathered) unstage(c, gathered, st);
  if (s_in) unstage(c, s_in, st);
  if (s_out) unstage(c, s_out, st);
  free(all);
  free(counts);
  return st;
}

/* Not MPI_Allreduce: the standard only recommends, and does not require,
 * that every rank gets the same bits, and its algorithms add in an order of
 * their own. Here rank r sums elements [r*n/W, (r+1)*n/W) over ranks
 * 0..W-1 in rank order (an all-to-all brings it every rank's copy of that
 * slice), then an all-gather spreads the sums: every rank gets the same bits,
 * the very bits the in-process communicator gives, and each rank moves the
 * 2(W-1)/W of the buffer a ring all-reduce would. */
static size_t slice_lo(size_t n, int r, int world) {
  return (n / (size_t)world) * (size_t)r + (n % (size_t)world) * (size_t)r / (size_t)world;
}

static distro_status mpi_allreduce_sum(distro_comm *c, float *buf, size_t count) {
  distro_status st = check_broken(c, "MPI allreduce");
  mpi_impl *m = c->impl;
  const int W = c->size, me = c->rank;
  const double end = deadline(c);
  MPI_Request rq;
  if (st != DISTRO_OK) return st;
  int *scount = malloc(sizeof(int) * 4 * (size_t)W);
  float *recv = NULL, *work = NULL;
  if (!scount) return distro__fail(DISTRO_ERR_NOMEM, "MPI allreduce: out of memory");
  int *sdispl = scount + W, *rcount = scount + 2 * W, *rdispl = scount + 3 * W;
  /* Chunks small enough that every int count and displacement fits. */
  const size_t chunk = m->max_count / 2 > 0 ? m->max_count / 2 : 1;
  size_t slice_max = chunk / (size_t)W + 1;
  recv = malloc(sizeof(float) * slice_max * (size_t)W);
  work = stage(c, buf, sizeof(float) * count, 1);
  if (!recv || !work) DISTRO_FAIL(DISTRO_ERR_NOMEM, "MPI allreduce: out of memory");
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = count - off < chunk ? count - off : chunk;
    float *p = work + off;
    const size_t lo = slice_lo(n, me, W), len = slice_lo(n, me + 1, W) - lo;
    for (int r = 0; r < W; r++) {
      size_t rlo = slice_lo(n, r, W);
      scount[r] = (int)(slice_lo(n, r + 1, W) - rlo);
      sdispl[r] = (int)rlo;
      rcount[r] = (int)len;
      rdispl[r] = (int)(len * (size_t)r);
    }
    MPI_TRY(MPI_Ialltoallv(p, scount, sdispl, MPI_FLOAT, recv, rcount, rdispl, MPI_FLOAT, m->comm, &rq),
            "MPI_Ialltoallv");
    DISTRO_CHECK(wait_req(c, &rq, "MPI_Ialltoallv", end));
    float *sum = p + lo; /* our own slice of buf is free to overwrite now */
    memcpy(sum, recv, len * sizeof(float));
    for (int r = 1; r < W; r++)
      for (size_t i = 0; i < len; i++) sum[i] += recv[(size_t)r * len + i];
    MPI_TRY(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, scount, sdispl, MPI_FLOAT, m->comm, &rq),
            "MPI_Iallgatherv");
    DISTRO_CHECK(wait_req(c, &rq, "MPI_Iallgatherv", end));
  }
  if (work != buf) memcpy(buf, work, sizeof(float) * count);
fail:
  if (st != DISTRO_ERR_TIMEOUT) free(recv); /* MPI may still write a timed-out call's */
  if (work) unstage(c, work, st);
  free(scount);
  return st;
}

static distro_status mpi_barrier(distro_comm *c) {
  distro_status st = check_broken(c, "MPI barrier");
  mpi_impl *m = c->impl;
  MPI_Request r;
  if (st != DISTRO_OK) return st;
  const double end = deadline(c);
  MPI_TRY(MPI_Ibarrier(m->comm, &r), "MPI_Ibarrier");
  st = wait_req(c, &r, "MPI_Ibarrier", end);
fail:
  return st;
}

static const char *thread_level_name(int level) {
  return level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
         : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
         : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                          : "MPI_THREAD_MULTIPLE";
}

/* The duplicate runs on a helper thread while the caller keeps using MPI
 * (its own collectives, evaluation), so MPI must allow calls from several
 * threads at once. */
static distro_status mpi_dup(distro_comm *c, distro_comm **out) {
  mpi_impl *m = c->impl;
  int level = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&level) != MPI_SUCCESS || level < MPI_THREAD_MULTIPLE)
    return distro__fail(DISTRO_ERR_UNSUPPORTED,
                        "a background exchange (options.overlap) calls MPI from a helper thread while the caller "
                        "may call MPI too: initialize MPI with MPI_Init_thread and MPI_THREAD_MULTIPLE (this process "
                        "has %s)",
                        thread_level_name(level));
  distro_status st = distro_comm_mpi(m->comm, out);
  if (st == DISTRO_OK) {
    ((mpi_impl *)(*out)->impl)->max_count = m->max_count;
    (*out)->poll = 1;
  }
  return st;
}

static void mpi_destroy(distro_comm *c) {
  mpi_impl *m = c->impl;
  if (!m) return;
  int finalized = 1;
  /* After MPI_Finalize no MPI call but a few queries is allowed. */
  /* A broken comm has a collective pending forever; leave it alone. */
  if (!c->broken && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized && m->comm != MPI_COMM_NULL)
    MPI_Comm_free(&m->comm);
  free(m);
  c->impl = NULL;
}

static const distro__comm_ops mpi_ops = {
    .name = "mpi",
    .allgather = mpi_allgather,
    .allgatherv = mpi_allgatherv,
    .allreduce_sum = mpi_allreduce_sum,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
    .timeouts = 1,
    .dup = mpi_dup,
};

/* Test hook (internal): lower the per-call element limit of one comm so the
 * derived-type and chunked paths run on small buffers. */
void distro__comm_mpi_set_max_count(distro_comm *c, size_t max_count);
void distro__comm_mpi_set_max_count(distro_comm *c, size_t max_count) {
  if (c && c->ops == &mpi_ops && max_count >= 1 && max_count <= (size_t)INT_MAX)
    ((mpi_impl *)c->impl)->max_count = max_count;
}

distro_status distro_comm_mpi(MPI_Comm mpi, distro_comm **out) {
  distro_status st = DISTRO_OK;
  distro_comm *c = NULL;
  mpi_impl *m = NULL;
  int init = 0, fin = 0, rank = 0, size = 0;
  if (!out) DISTRO_FAIL(DISTRO_ERR_INVALID, "distro_comm_mpi: out is NULL");
  if (MPI_Initialized(&init) != MPI_SUCCESS || !init)
    DISTRO_FAIL(DISTRO_ERR_INVALID, "distro_comm_mpi: MPI is not initialized");
  if (MPI_Finalized(&fin) != MPI_SUCCESS || fin)
    DISTRO_FAIL(DISTRO_ERR_INVALID, "distro_comm_mpi: MPI is already finalized");
  if (mpi == MPI_COMM_NULL) DISTRO_FAIL(DISTRO_ERR_INVALID, "distro_comm_mpi: MPI_COMM_NULL");

  c = calloc(1, sizeof *c);
  m = calloc(1, sizeof *m);
  if (!c || !m) DISTRO_FAIL(DISTRO_ERR_NOMEM, "distro_comm_mpi: out of memory");
  m->comm = MPI_COMM_NULL;
  m->max_count = (size_t)INT_MAX;
  /* Collective over `mpi`: every rank of it must call distro_comm_mpi. */
  MPI_TRY(MPI_Comm_dup(mpi, &m->comm), "MPI_Comm_dup");
  /* Failures come back as codes we turn into DISTRO_ERR_COMM, not aborts. */
  MPI_TRY(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_TRY(MPI_Comm_rank(m->comm, &rank), "MPI_Comm_rank");
  MPI_TRY(MPI_Comm_size(m->comm, &size), "MPI_Comm_size");
  *c = (distro_comm){.ops = &mpi_ops, .rank = rank, .size = size, .impl = m};
  *out = c;
  return DISTRO_OK;

fail:
  if (m && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  free(m);
  free(c);
  return st;
}
