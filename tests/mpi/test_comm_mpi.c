/* MPI communicator checks, run as `mpirun -np 3 test_comm_mpi`.
 *
 * A plain program rather than Criterion: Criterion forks every test, which
 * does not mix with MPI. Each entry of `checks` runs on every rank; a check
 * passes only if it passed on all ranks. Rank 0 prints one line per check
 * and a final "N passed, N failed"; the exit status is non-zero on failure.
 * To add a check, write a function with the check_fn signature and append
 * it to the table. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <distro/comm.h>
#include <distro/mpi.h>

#include "comm/comm_internal.h"
#include <distro/optim.h>
#include <distro/diloco.h>

#include "testutil.h"

/* Internal test hook from src/comm/comm_mpi.c: lowers the per-call element
 * limit so the paths for sizes above INT_MAX run on small buffers. */
void distro__comm_mpi_set_max_count(distro_comm *c, size_t max_count);

typedef struct {
  distro_comm *comm; /* distro_comm_mpi(MPI_COMM_WORLD) */
  int rank, size;
  uint64_t seed; /* same on every rank */
} check_ctx;

/* Returns 0 when the check passed on this rank. */
typedef int (*check_fn)(check_ctx *t);

static int failf(check_ctx *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  [rank %d] ", t->rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

/* ---- checks ------------------------------------------------------------- */

static int check_rank_size(check_ctx *t) {
  int r, s;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  if (distro_comm_rank(t->comm) != r || distro_comm_size(t->comm) != s)
    return failf(t, "rank/size %d/%d, MPI says %d/%d", distro_comm_rank(t->comm),
                 distro_comm_size(t->comm), r, s);
  return 0;
}

static int check_invalid_args(check_ctx *t) {
  distro_comm *c = NULL;
  if (distro_comm_mpi(MPI_COMM_WORLD, NULL) != DISTRO_ERR_INVALID)
    return failf(t, "NULL out accepted");
  if (distro_comm_mpi(MPI_COMM_NULL, &c) != DISTRO_ERR_INVALID || c)
    return failf(t, "MPI_COMM_NULL accepted");
  if (!distro_last_error()[0]) return failf(t, "no error message");
  return 0;
}

static unsigned char pattern(int rank, size_t n, size_t i) {
  return (unsigned char)(rank * 37 + n * 11 + i * 7 + (i >> 8));
}

static int gather_sizes(check_ctx *t, const size_t *sizes, int count) {
  for (int k = 0; k < count; k++) {
    size_t n = sizes[k], total = n * (size_t)t->size;
    unsigned char *send = malloc(n ? n : 1), *recv = malloc(total + 1);
    if (!send || !recv) return failf(t, "out of memory");
    for (size_t i = 0; i < n; i++) send[i] = pattern(t->rank, n, i);
    recv[total] = 0xAB;
    distro_status st = distro_comm_allgather(t->comm, send, n, recv);
    int bad = st != DISTRO_OK ? failf(t, "allgather %zu bytes: %s", n, distro_last_error()) : 0;
    for (int r = 0; !bad && r < t->size; r++)
      for (size_t i = 0; !bad && i < n; i++)
        if (recv[(size_t)r * n + i] != pattern(r, n, i))
          bad = failf(t, "allgather %zu bytes: wrong byte %zu from rank %d", n, i, r);
    if (!bad && recv[total] != 0xAB) bad = failf(t, "allgather %zu bytes: overran recv", n);
    free(send);
    free(recv);
    /* Every rank must run the same collectives, so agree before going on. */
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) return 1;
  }
  return 0;
}

static int check_allgather(check_ctx *t) {
  static const size_t sizes[] = {0, 1, 3, 64, 1000, 65537, 1 << 20};
  return gather_sizes(t, sizes, (int)(sizeof sizes / sizeof sizes[0]));
}

/* Sizes above the per-call limit go through the derived byte type. */
static int check_allgather_large_path(check_ctx *t) {
  static const size_t sizes[] = {0, 1, 6, 7, 8, 13, 14, 15, 1000, 4099};
  distro__comm_mpi_set_max_count(t->comm, 7);
  int bad = gather_sizes(t, sizes, (int)(sizeof sizes / sizeof sizes[0]));
  distro__comm_mpi_set_max_count(t->comm, INT_MAX);
  return bad;
}

/* Every rank generates every rank's input from the shared seed, so each can
 * compute the float64 reference; results are then compared across ranks. */
static int reduce_sizes(check_ctx *t, const size_t *sizes, int count) {
  int bad = 0;
  for (int k = 0; k < count && !bad; k++) {
    size_t n = sizes[k];
    float *in = malloc((n ? n : 1) * (size_t)t->size * sizeof *in);
    float *buf = malloc((n ? n : 1) * sizeof *buf);
    float *all = malloc((n ? n : 1) * (size_t)t->size * sizeof *all);
    if (!in || !buf || !all) return failf(t, "out of memory");
    for (int r = 0; r < t->size; r++) {
      tu_rng rng = {t->seed ^ (0x9e37ull * (uint64_t)(r + 1)) ^ n};
      tu_fill_normal(&rng, in + (size_t)r * n, n, 1.0f + (float)r);
    }
    memcpy(buf, in + (size_t)t->rank * n, n * sizeof *buf);
    distro_status st = distro_comm_allreduce_sum(t->comm, buf, n);
    if (st != DISTRO_OK) bad = failf(t, "allreduce %zu: %s", n, distro_last_error());
    for (size_t i = 0; !bad && i < n; i++) {
      double exact = 0, mag = 0;
      for (int r = 0; r < t->size; r++) {
        exact += in[(size_t)r * n + i];
        mag += fabs(in[(size_t)r * n + i]);
      }
      if (!(fabs((double)buf[i] - exact) <= t->size * 6e-8 * mag + 1e-30))
        bad = failf(t, "allreduce %zu: element %zu is %.9g, float64 sum %.17g (seed %llu)", n, i,
                    buf[i], exact, (unsigned long long)t->seed);
    }
    /* Every rank must run the same collectives, so agree before going on. */
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    /* Compare the bits across ranks with plain MPI, independent of distro. */
    if (!bad && n <= (size_t)INT_MAX / sizeof(float)) {
      MPI_Allgather(buf, (int)(n * sizeof *buf), MPI_BYTE, all, (int)(n * sizeof *buf), MPI_BYTE,
                    MPI_COMM_WORLD);
      for (int r = 1; r < t->size && !bad; r++)
        if (memcmp(all, all + (size_t)r * n, n * sizeof *all) != 0)
          bad = failf(t, "allreduce %zu: rank %d's result differs from rank 0's", n, r);
    }
    free(in);
    free(buf);
    free(all);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  return bad;
}

static int check_allreduce(check_ctx *t) {
  static const size_t sizes[] = {0, 1, 2, 3, 100, 1023, 100003, 1 << 20};
  return reduce_sizes(t, sizes, (int)(sizeof sizes / sizeof sizes[0]));
}

/* Counts above the per-call limit are reduced in chunks. */
static int check_allreduce_chunked(check_ctx *t) {
  static const size_t sizes[] = {0, 1, 6, 7, 8, 20, 21, 1001};
  distro__comm_mpi_set_max_count(t->comm, 7);
  int bad = reduce_sizes(t, sizes, (int)(sizeof sizes / sizeof sizes[0]));
  distro__comm_mpi_set_max_count(t->comm, INT_MAX);
  return bad;
}

/* Rank 0 arrives late; nobody may leave the barrier before it arrives. */
static int check_barrier(check_ctx *t) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (t->rank == 0) {
    struct timespec d = {0, 300 * 1000 * 1000};
    nanosleep(&d, NULL);
  }
  distro_status st = distro_comm_barrier(t->comm);
  double waited = MPI_Wtime() - t0;
  if (st != DISTRO_OK) return failf(t, "barrier: %s", distro_last_error());
  if (waited < 0.2) return failf(t, "left the barrier after %.3f s, before rank 0 arrived", waited);
  for (int i = 0; i < 100; i++)
    if (distro_comm_barrier(t->comm) != DISTRO_OK) return failf(t, "barrier %d failed", i);
  return 0;
}

/* A second comm on the same MPI communicator is independent and freeable. */
static int check_second_comm(check_ctx *t) {
  distro_comm *c2 = NULL;
  if (distro_comm_mpi(MPI_COMM_WORLD, &c2) != DISTRO_OK)
    return failf(t, "second comm: %s", distro_last_error());
  float f = 1.0f;
  distro_status st = distro_comm_allreduce_sum(c2, &f, 1);
  distro_comm_free(c2);
  if (st != DISTRO_OK || f != (float)t->size) return failf(t, "second comm allreduce gave %g", f);
  return 0;
}

/* ---- the optimizer over MPI ------------------------------------------------ */

#define OPT_STEPS 4
static const int64_t opt_shapes[3][2] = {{96, 128}, {100, 1}, {67, 64}};
static const int opt_ndims[3] = {2, 1, 2};
static size_t opt_numel(int i) { return (size_t)(opt_shapes[i][0] * opt_shapes[i][1]); }
static size_t opt_total(void) { return opt_numel(0) + opt_numel(1) + opt_numel(2); }

typedef struct {
  distro_options opt;
  uint64_t seed;
  float *out; /* size * opt_total(): final parameters of every rank */
  int sparse;  /* DiLoCo runs: sparse outer gradients (SparseLoCo) */
} opt_run;

/* The same run (same initial parameters, rank-specific gradients) through
 * any communicator; writes this rank's final parameters to out[rank]. */
static distro_status opt_rank(distro_comm *comm, int rank, void *arg) {
  opt_run *run = arg;
  float *p = malloc(opt_total() * sizeof *p), *g = malloc(opt_total() * sizeof *g);
  distro_optim *o = NULL;
  distro_status st = distro_optim_create(&run->opt, comm, &o);
  tu_rng init = {run->seed};
  tu_fill_normal(&init, p, opt_total(), 1.0f);
  size_t off = 0;
  for (int i = 0; i < 3 && st == DISTRO_OK; off += opt_numel(i), i++) {
    char name[8];
    snprintf(name, sizeof name, "t%d", i);
    st = distro_optim_add_param(o, name, p + off, g + off, opt_ndims[i], opt_shapes[i]);
  }
  for (int s = 0; s < OPT_STEPS && st == DISTRO_OK; s++) {
    tu_rng r = {run->seed ^ (uint64_t)(1000 * s + rank + 1)};
    tu_fill_normal(&r, g, opt_total(), 1.0f);
    st = distro_optim_step(o, 0.01f * (float)(s + 1), NULL);
    if (st == DISTRO_OK && run->opt.overlap) {
      /* The trainer's pattern: its own all-reduce on the same comm while
       * the exchange runs on the optimizer's helper thread. */
      float v[2] = {(float)rank, 1.0f};
      st = distro_comm_allreduce_sum(comm, v, 2);
      if (st == DISTRO_OK && (v[0] != (float)(comm->size * (comm->size - 1) / 2) || v[1] != (float)comm->size))
        st = DISTRO_ERR_COMM;
    }
  }
  if (st == DISTRO_OK) st = distro_optim_flush(o, NULL);
  if (st == DISTRO_OK) memcpy(run->out + (size_t)rank * opt_total(), p, opt_total() * sizeof *p);
  distro_optim_free(o);
  free(p);
  free(g);
  return st;
}

/* MPI ranks end bit-identical, and equal to in-process ranks given the same
 * inputs. */
static int check_optimizer(check_ctx *t, distro_options opt) {
  const size_t n = opt_total();
  opt_run mpi = {opt, t->seed, calloc((size_t)t->size * n, sizeof(float)), 0};
  int bad = 0;
  if (opt_rank(t->comm, t->rank, &mpi) != DISTRO_OK) bad = failf(t, "MPI run: %s", distro_last_error());
  float *mine = malloc(n * sizeof(float));
  memcpy(mine, mpi.out + (size_t)t->rank * n, n * sizeof(float));
  MPI_Allgather(mine, (int)n, MPI_FLOAT, mpi.out, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
  for (int r = 1; r < t->size && !bad; r++)
    if (memcmp(mpi.out, mpi.out + (size_t)r * n, n * sizeof(float)))
      bad = failf(t, "rank %d parameters differ from rank 0's", r);
  if (!bad && t->rank == 0) {
    opt_run local = {opt, t->seed, calloc((size_t)t->size * n, sizeof(float)), 0};
    if (distro_comm_run_local(t->size, opt_rank, &local) != DISTRO_OK)
      bad = failf(t, "in-process run: %s", distro_last_error());
    else if (memcmp(local.out, mpi.out, n * sizeof(float)))
      bad = failf(t, "in-process ranks and MPI ranks end with different parameters");
    free(local.out);
  }
  free(mine);
  free(mpi.out);
  return bad;
}

static int check_optimizer_demo(check_ctx *t) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 8;
  return check_optimizer(t, o);
}

static int check_optimizer_distro_adamw(check_ctx *t) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.update = DISTRO_UPDATE_ADAMW;
  o.values = DISTRO_VALUES_BF16;
  return check_optimizer(t, o);
}

static int check_optimizer_adamw(check_ctx *t) { return check_optimizer(t, distro_options_default(DISTRO_ALG_ADAMW)); }

/* Overlap (a helper thread per rank doing MPI beside the caller's MPI
 * calls): ranks bit-identical, equal to in-process ranks, and equal to the
 * blocking step on the same gradients once flushed. */
static int check_optimizer_overlap(check_ctx *t, distro_update u) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 8;
  o.update = u;
  o.overlap = 1;
  int bad = check_optimizer(t, o);
  const size_t n = opt_total();
  opt_run ov = {o, t->seed, calloc((size_t)t->size * n, sizeof(float)), 0};
  o.overlap = 0;
  opt_run bl = {o, t->seed, calloc((size_t)t->size * n, sizeof(float)), 0};
  if (!bad && opt_rank(t->comm, t->rank, &ov) != DISTRO_OK) bad = failf(t, "overlapped run: %s", distro_last_error());
  if (!bad && opt_rank(t->comm, t->rank, &bl) != DISTRO_OK) bad = failf(t, "blocking run: %s", distro_last_error());
  if (!bad && memcmp(ov.out + (size_t)t->rank * n, bl.out + (size_t)t->rank * n, n * sizeof(float)))
    bad = failf(t, "the flushed overlapped run differs from the blocking run");
  free(ov.out);
  free(bl.out);
  return bad;
}
static int check_optimizer_overlap_sign(check_ctx *t) { return check_optimizer_overlap(t, DISTRO_UPDATE_SIGN); }
static int check_optimizer_overlap_adamw(check_ctx *t) { return check_optimizer_overlap(t, DISTRO_UPDATE_ADAMW); }

/* Overlap with a timeout on the caller's comm: the last rank stops after
 * its first step; the others' third step reports the timeout of the
 * background exchange instead of hanging. */
static int check_overlap_timeout(check_ctx *t) {
  distro_comm *c = NULL;
  int bad = 0;
  if (distro_comm_mpi(MPI_COMM_WORLD, &c) != DISTRO_OK) return failf(t, "distro_comm_mpi: %s", distro_last_error());
  distro_comm_set_timeout(c, 0.3);
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.topk = 8;
  o.overlap = 1;
  float p[64 * 64], g[64 * 64];
  tu_rng r = {t->seed ^ (uint64_t)(9 + t->rank)};
  tu_fill_normal(&r, p, 64 * 64, 1.0f);
  tu_fill_normal(&r, g, 64 * 64, 1.0f);
  const int64_t sh[] = {64, 64};
  distro_optim *opt = NULL;
  distro_status st = distro_optim_create(&o, c, &opt);
  if (st == DISTRO_OK) st = distro_optim_add_param(opt, "w", p, g, 2, sh);
  if (st == DISTRO_OK) st = distro_optim_step(opt, 0.01f, NULL);
  if (st != DISTRO_OK) bad = failf(t, "first step: %s", distro_last_error());
  const int stopped = t->size - 1;
  if (!bad && t->rank != stopped) {
    st = distro_optim_step(opt, 0.01f, NULL); /* exchange 1 completes: everyone started it */
    if (st != DISTRO_OK) bad = failf(t, "second step: %s", distro_last_error());
    st = bad ? st : distro_optim_step(opt, 0.01f, NULL);
    if (!bad && st != DISTRO_ERR_TIMEOUT) bad = failf(t, "third step: %s, want a timeout", distro_status_string(st));
    if (!bad && distro_optim_step(opt, 0.01f, NULL) != DISTRO_ERR_TIMEOUT) bad = failf(t, "a broken exchange was used again");
  }
  if (t->rank == stopped) { /* its helper finished exchange 1; it leaves */
    if (distro_optim_flush(opt, NULL) != DISTRO_OK) bad = failf(t, "flush: %s", distro_last_error());
  }
  distro_optim_free(opt); /* the pending collectives are left to MPI */
  distro_comm_free(c);
  return bad;
}

/* ---- DiLoCo across MPI learners ------------------------------------------------ */

#define DLC_STEPS 9

/* One learner per rank (its inner comm is a local group of one); the outer
 * comm is `comm`. Writes this learner's final parameters to out[rank]. */
static distro_status dlc_rank(distro_comm *comm, int rank, void *arg) {
  opt_run *run = arg;
  const size_t n = opt_total();
  float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
  distro_comm *inner[1] = {NULL};
  distro_optim *o = NULL;
  distro_diloco *d = NULL;
  distro_status st = distro_comm_local_group(1, inner);
  if (st == DISTRO_OK) st = distro_optim_create(&run->opt, inner[0], &o);
  tu_rng init = {run->seed};
  tu_fill_normal(&init, p, n, 1.0f);
  size_t off = 0;
  for (int i = 0; i < 3 && st == DISTRO_OK; off += opt_numel(i), i++) {
    char name[8];
    snprintf(name, sizeof name, "t%d", i);
    st = distro_optim_add_param(o, name, p + off, g + off, opt_ndims[i], opt_shapes[i]);
  }
  distro_diloco_options dlo = distro_diloco_options_default();
  dlo.H = 4;
  dlo.fragments = 2;
  dlo.overlap = 1;
  dlo.alpha = 0.5f;
  dlo.codec = DISTRO_OUTER_INT4;
  dlo.merge = DISTRO_MERGE_RADIAL_TOKENS;
  if (run->sparse) { /* 2-bit top-k of the tile DCTs of e: variable-size payloads */
    dlo.compressor = DISTRO_OUTER_SPARSE;
    dlo.sparse_chunk = 16;
    dlo.sparse_dct = 1;
    dlo.density = 0.05f;
    dlo.outer_momentum = 0.0f;
  }
  if (st == DISTRO_OK) st = distro_diloco_create(&dlo, o, comm, &d);
  for (int s = 0; s < DLC_STEPS && st == DISTRO_OK; s++) {
    tu_rng r = {run->seed ^ (uint64_t)(1000 * s + rank + 1)};
    tu_fill_normal(&r, g, n, 1.0f);
    st = distro_diloco_step(d, 1e-3f, 100 + (uint64_t)rank, NULL);
  }
  if (st == DISTRO_OK) st = distro_diloco_sync_all(d, NULL);
  if (st == DISTRO_OK) memcpy(run->out + (size_t)rank * n, p, n * sizeof *p);
  distro_diloco_free(d);
  distro_optim_free(o);
  distro_comm_free(inner[0]);
  free(p);
  free(g);
  return st;
}

/* MPI learners end bit-identical (after sync_all), and equal to in-process
 * learners given the same inputs. */
static int check_diloco_run(check_ctx *t, int sparse) {
  const size_t n = opt_total();
  opt_run mpi = {distro_options_default(DISTRO_ALG_ADAMW), t->seed, calloc((size_t)t->size * n, sizeof(float)), sparse};
  int bad = 0;
  if (dlc_rank(t->comm, t->rank, &mpi) != DISTRO_OK) bad = failf(t, "MPI DiLoCo run: %s", distro_last_error());
  float *mine = malloc(n * sizeof(float));
  memcpy(mine, mpi.out + (size_t)t->rank * n, n * sizeof(float));
  MPI_Allgather(mine, (int)n, MPI_FLOAT, mpi.out, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
  for (int r = 1; r < t->size && !bad; r++)
    if (memcmp(mpi.out, mpi.out + (size_t)r * n, n * sizeof(float)))
      bad = failf(t, "learner %d parameters differ from learner 0's", r);
  if (!bad && t->rank == 0) {
    opt_run local = {mpi.opt, t->seed, calloc((size_t)t->size * n, sizeof(float)), sparse};
    if (distro_comm_run_local(t->size, dlc_rank, &local) != DISTRO_OK)
      bad = failf(t, "in-process DiLoCo run: %s", distro_last_error());
    else if (memcmp(local.out, mpi.out, (size_t)t->size * n * sizeof(float)))
      bad = failf(t, "in-process learners and MPI learners end with different parameters");
    free(local.out);
  }
  free(mine);
  free(mpi.out);
  return bad;
}
static int check_diloco(check_ctx *t) { return check_diloco_run(t, 0); }
static int check_sparseloco(check_ctx *t) { return check_diloco_run(t, 1); }

/* With a timeout set, collectives that everyone joins give the same bits
 * as without one (they run as non-blocking calls on private copies). */
static int check_timeout_collectives_complete(check_ctx *t) {
  distro_comm *c = NULL;
  int bad = 0;
  if (distro_comm_mpi(MPI_COMM_WORLD, &c) != DISTRO_OK) return failf(t, "distro_comm_mpi: %s", distro_last_error());
  if (distro_comm_set_timeout(c, 30.0) != DISTRO_OK) bad = failf(t, "set_timeout: %s", distro_last_error());
  enum { N = 1000 };
  float a[N], b[N];
  tu_rng r = {t->seed ^ (uint64_t)(77 + t->rank)};
  tu_fill_normal(&r, a, N, 1.0f);
  memcpy(b, a, sizeof a);
  if (!bad && distro_comm_allreduce_sum(c, a, N) != DISTRO_OK) bad = failf(t, "allreduce: %s", distro_last_error());
  if (!bad && distro_comm_allreduce_sum(t->comm, b, N) != DISTRO_OK) bad = failf(t, "allreduce (no timeout)");
  if (!bad && memcmp(a, b, sizeof a)) bad = failf(t, "allreduce with a timeout differs from without");
  unsigned char mine[5], all[5 * 16];
  for (int i = 0; i < 5; i++) mine[i] = pattern(t->rank, 5, (size_t)i);
  if (!bad && t->size <= 16 && distro_comm_allgather(c, mine, 5, all) != DISTRO_OK) bad = failf(t, "allgather");
  for (int q = 0; !bad && q < t->size && t->size <= 16; q++)
    for (int i = 0; i < 5; i++)
      if (all[5 * q + i] != pattern(q, 5, (size_t)i)) bad = failf(t, "allgather with a timeout: wrong byte");
  if (!bad && distro_comm_barrier(c) != DISTRO_OK) bad = failf(t, "barrier: %s", distro_last_error());
  distro_comm_free(c);
  return bad;
}

/* The last rank stops (sleeps) before a barrier: the others get
 * DISTRO_ERR_TIMEOUT instead of hanging, and their comm stays broken. */
static int check_timeout_on_stopped_rank(check_ctx *t) {
  distro_comm *c = NULL;
  int bad = 0;
  if (distro_comm_mpi(MPI_COMM_WORLD, &c) != DISTRO_OK) return failf(t, "distro_comm_mpi: %s", distro_last_error());
  distro_comm_set_timeout(c, 0.3);
  const int stopped = t->size - 1;
  if (t->rank == stopped) {
    struct timespec ts = {1, 500000000};
    nanosleep(&ts, NULL);
  }
  const distro_status st = distro_comm_barrier(c);
  if (t->rank != stopped) {
    if (st != DISTRO_ERR_TIMEOUT) bad = failf(t, "barrier with a stopped peer: %s, want timeout", distro_status_string(st));
    else if (!strstr(distro_last_error(), "did not complete")) bad = failf(t, "message: %s", distro_last_error());
    float x = 1;
    if (!bad && distro_comm_allreduce_sum(c, &x, 1) != DISTRO_ERR_TIMEOUT) bad = failf(t, "a broken comm was used again");
  }
  distro_comm_free(c); /* the pending barrier is left to MPI */
  return bad;
}

static const struct {
  const char *name;
  check_fn fn;
} checks[] = {
    {"rank_size", check_rank_size},
    {"invalid_args", check_invalid_args},
    {"allgather", check_allgather},
    {"allgather_large_path", check_allgather_large_path},
    {"allreduce_bit_identical", check_allreduce},
    {"allreduce_chunked", check_allreduce_chunked},
    {"barrier", check_barrier},
    {"second_comm", check_second_comm},
    {"optimizer_demo_sign", check_optimizer_demo},
    {"optimizer_distro_adamw_bf16", check_optimizer_distro_adamw},
    {"optimizer_adamw_allreduce", check_optimizer_adamw},
    {"optimizer_overlap_sign", check_optimizer_overlap_sign},
    {"optimizer_overlap_distro_adamw", check_optimizer_overlap_adamw},
    {"diloco_learners_mpi_vs_in_process", check_diloco},
    {"sparseloco_learners_mpi_vs_in_process", check_sparseloco},
    {"timeout_collectives_complete", check_timeout_collectives_complete},
    {"timeout_on_stopped_rank", check_timeout_on_stopped_rank},
    {"overlap_timeout_on_stopped_rank", check_overlap_timeout},
};

/* Run as DISTRO_TEST_MPI_THREAD=serialized: without MPI_THREAD_MULTIPLE the
 * first overlapped step fails on every rank with DISTRO_ERR_UNSUPPORTED
 * naming the need, and nothing moves. */
static int check_overlap_needs_thread_multiple(check_ctx *t) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.overlap = 1;
  float p[256], p0[256], g[256];
  for (int i = 0; i < 256; i++) p[i] = p0[i] = g[i] = (float)i;
  const int64_t sh[] = {16, 16};
  distro_optim *opt = NULL;
  int bad = 0;
  distro_status st = distro_optim_create(&o, t->comm, &opt);
  if (st == DISTRO_OK) st = distro_optim_add_param(opt, "w", p, g, 2, sh);
  if (st != DISTRO_OK) bad = failf(t, "set-up: %s", distro_last_error());
  if (!bad && (st = distro_optim_step(opt, 0.1f, NULL)) != DISTRO_ERR_UNSUPPORTED)
    bad = failf(t, "step without MPI_THREAD_MULTIPLE: %s, want unsupported", distro_status_string(st));
  if (!bad && !strstr(distro_last_error(), "MPI_THREAD_MULTIPLE")) bad = failf(t, "message: %s", distro_last_error());
  if (!bad && memcmp(p, p0, sizeof p)) bad = failf(t, "parameters moved");
  distro_optim_free(opt);
  return bad;
}

int main(int argc, char **argv) {
  /* Overlap needs MPI_THREAD_MULTIPLE; the second registration (tests/mpi.cmake)
   * checks what happens without it. */
  const char *level = getenv("DISTRO_TEST_MPI_THREAD");
  const int serialized = level && !strcmp(level, "serialized");
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
  check_ctx t = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &t.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &t.size);
  unsigned long long seed = t.rank == 0 ? (unsigned long long)tu_seed() : 0;
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  t.seed = seed;
  if (t.rank == 0) printf("test_comm_mpi: %d ranks, seed %llu\n", t.size, seed);

  int passed = 0, failed = 0;
  if (distro_comm_mpi(MPI_COMM_WORLD, &t.comm) != DISTRO_OK) {
    fprintf(stderr, "[rank %d] distro_comm_mpi: %s\n", t.rank, distro_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (!serialized && provided < MPI_THREAD_MULTIPLE && t.rank == 0)
    printf("note: MPI provides no MPI_THREAD_MULTIPLE; the overlap checks expect their refusal\n");
  const size_t nchecks = serialized || provided < MPI_THREAD_MULTIPLE ? 1 : sizeof checks / sizeof checks[0];
  for (size_t i = 0; i < nchecks; i++) {
    const check_fn fn = serialized || provided < MPI_THREAD_MULTIPLE ? check_overlap_needs_thread_multiple : checks[i].fn;
    const char *name = serialized || provided < MPI_THREAD_MULTIPLE ? "overlap_needs_thread_multiple" : checks[i].name;
    int bad = fn(&t) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) failed++;
    else passed++;
    if (t.rank == 0) {
      printf("%s %s\n", bad ? "FAIL" : "ok  ", name);
      fflush(stdout);
    }
  }
  distro_comm_free(t.comm);
  if (t.rank == 0) printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed ? 1 : 0;
}
