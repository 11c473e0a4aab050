/* Shared by the SparseLoCo outer-loop suites (tests/test_sparseloco_*.c,
 * except the codec suite): M learners x R ranks of four test tensors run
 * through the public API on threads, with an outer comm that records learner
 * 0's view of every exchange and corrupts one. The including suite defines
 * _POSIX_C_SOURCE 200809L (mkdtemp) before any header. Functions are static
 * inline so a suite that uses only some of them does not warn. */
#ifndef DISTRO_TESTS_SPARSELOCO_UTIL_H
#define DISTRO_TESTS_SPARSELOCO_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "compress/outer_sparse.h"
#include "optim/diloco_internal.h"
#include "testutil.h"
#include "wire_ref.h"

/* ---- runs of M learners x R ranks ----------------------------------------------- */

#define MAXL 3
#define MAXR 2
#define MAXSYNC 8
#define NT 4
static const int ndims[NT] = {2, 1, 2, 1};
static const int64_t shapes[NT][2] = {{64, 48}, {100, 1}, {33, 7}, {600, 1}};
static const char *const tnames[NT] = {"w0", "b1", "w2", "b3"};
#define TOTAL (64 * 48 + 100 + 33 * 7 + 600)
static inline int64_t tnumel(int i) { return shapes[i][0] * shapes[i][1]; }
static inline int64_t toff(int i) {
  int64_t o = 0;
  for (int k = 0; k < i; k++) o += tnumel(k);
  return o;
}
#define SGD_EPS 1e30f /* AdamW with beta1 0, no decay, eps 1e30 and lr eta*1e30 is SGD */

typedef struct run {
  int M, R, steps;
  distro_options inner;
  distro_diloco_options dl;
  float lr;
  uint64_t seed;
  int progress; /* 1: progress thread */
  /* save after step save_after, or resume from it */
  int save_after, resume;
  char dir[64];
  float *saved[MAXL][MAXR];
  /* corruption: the n-th payload exchange (1-based) */
  int corrupt_at, corrupt_nan, nan_step, nan_learner;
  /* captured by learner 0, rank 0 at each sync */
  int nsync;
  uint8_t *payload[MAXSYNC]; /* M slots of `slot` bytes */
  size_t sizes[MAXSYNC][MAXL], slot;
  /* captured per learner (rank 0) after each step */
  float *glob[MAXL][MAXSYNC + 1], *ef[MAXL][MAXSYNC + 1];
  int ef_snap; /* 1: snapshot global and e after each sync step */
  /* outputs */
  float *out[MAXL][MAXR];
  distro_status st[MAXL][MAXR][64];
  float *before_bad[MAXL], *after_bad[MAXL], *ef_before_bad[MAXL], *ef_after_bad[MAXL];
  char err[MAXL][MAXR][300];
  distro_status sync_st[MAXL][MAXR];
  distro_diloco_stats last[MAXL][MAXR];
  uint64_t sent_sum[MAXL][MAXR];
} run;

static inline void run_init(run *x, int M, int R, int steps) {
  memset(x, 0, sizeof *x);
  x->M = M;
  x->R = R;
  x->steps = steps;
  x->inner = distro_options_default(DISTRO_ALG_ADAMW);
  x->inner.beta1 = 0.0f;
  x->inner.weight_decay = 0.0f;
  x->inner.eps = SGD_EPS;
  x->lr = 0.02f * SGD_EPS;
  x->dl = distro_diloco_options_sparseloco();
  x->dl.H = 3;
  x->dl.sparse_chunk = 16;
  x->dl.density = 0.05f;
  x->dl.ef_beta = 0.9f;
  x->dl.outer_lr = 0.8f;
  x->seed = tu_seed();
  x->nan_learner = -1;
}

/* A fresh run with x's settings (nothing it captured). */
static inline void run_like(run *dst, const run *x) {
  run_init(dst, x->M, x->R, x->steps);
  dst->inner = x->inner;
  dst->dl = x->dl;
  dst->lr = x->lr;
  dst->seed = x->seed;
  dst->progress = x->progress;
}

static inline void run_free(run *x) {
  for (int s = 0; s < MAXSYNC; s++) free(x->payload[s]);
  for (int m = 0; m < MAXL; m++) {
    for (int r = 0; r < MAXR; r++) {
      free(x->out[m][r]);
      free(x->saved[m][r]);
    }
    for (int s = 0; s <= MAXSYNC; s++) {
      free(x->glob[m][s]);
      free(x->ef[m][s]);
    }
    free(x->before_bad[m]);
    free(x->after_bad[m]);
    free(x->ef_before_bad[m]);
    free(x->ef_after_bad[m]);
  }
}

static inline void grad_fill(uint64_t seed, int m, int r, int s, float *g) {
  tu_rng rng = {seed * 1000003ULL + (uint64_t)m * 7919ULL + (uint64_t)r * 104729ULL + (uint64_t)s * 15485863ULL + 1};
  tu_fill_normal(&rng, g, TOTAL, 1.0f);
}
static inline void init_fill(uint64_t seed, float *p) {
  tu_rng rng = {seed ^ 0x5eedULL};
  tu_fill_normal(&rng, p, TOTAL, 1.0f);
}

/* The outer comm of one rank: records learner 0's view of every exchange,
 * and corrupts the corrupt_at-th one (a flipped byte, or a NaN value
 * behind a recomputed CRC) in learner 1's slot. */
typedef struct {
  distro_comm *inner;
  run *x;
  int learner, rank, exchanges;
} hook;

static inline distro_status hook_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  hook *k = c->impl;
  return k->inner->ops->allgather(k->inner, send, bytes, recv);
}
static inline distro_status hook_allgatherv(distro_comm *c, const void *send, size_t bytes, void *recv, size_t slot,
                                            size_t *sizes) {
  hook *k = c->impl;
  run *x = k->x;
  distro_status st = k->inner->ops->allgatherv(k->inner, send, bytes, recv, slot, sizes);
  if (st != DISTRO_OK) return st;
  k->exchanges++;
  if (k->exchanges == x->corrupt_at && x->M > 1) {
    uint8_t *b = (uint8_t *)recv + slot;
    if (x->corrupt_nan) { /* F32 values: the first value of section 0 */
      const size_t at = DISTRO__SPARSE_HEADER + (size_t)(NT + 1) * DISTRO__SPARSE_DESC +
                        rd32(b + DISTRO__SPARSE_HEADER + 4);
      const float nan = NAN;
      memcpy(b + at, &nan, 4);
      wr32(b + sizes[1] - 4, ref_crc32c(b, sizes[1] - 4));
    } else {
      b[sizes[1] / 2] ^= 0x08;
    }
  }
  if (k->learner == 0 && k->rank == 0 && x->nsync < MAXSYNC) {
    const int s = x->nsync++;
    x->slot = slot;
    x->payload[s] = malloc(slot * (size_t)x->M);
    memcpy(x->payload[s], recv, slot * (size_t)x->M);
    for (int m = 0; m < x->M; m++) x->sizes[s][m] = sizes[m];
  }
  return st;
}
static inline distro_status hook_allreduce(distro_comm *c, float *b, size_t n) {
  hook *k = c->impl;
  return k->inner->ops->allreduce_sum(k->inner, b, n);
}
static inline distro_status hook_barrier(distro_comm *c) {
  hook *k = c->impl;
  return k->inner->ops->barrier(k->inner);
}
static const distro__comm_ops hook_ops = {.name = "hook",
                                          .allgather = hook_allgather,
                                          .allgatherv = hook_allgatherv,
                                          .allreduce_sum = hook_allreduce,
                                          .barrier = hook_barrier};

typedef struct {
  run *x;
  int m, r;
  distro_comm *inner, *outer;
} targ;

static inline void global_snapshot(distro_diloco *d, float *dst) {
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_diloco_get_global(d, tnames[i], dst + toff(i), tnumel(i)), DISTRO_OK, "%s", distro_last_error());
}

static inline float *ef_snapshot(const distro_diloco *d) { /* P = 1: fragment 0 holds the tensors in order */
  float *e = malloc(sizeof(float) * TOTAL);
  memcpy(e, d->ef[0], sizeof(float) * TOTAL);
  return e;
}

static inline void *rank_main(void *arg) {
  targ *a = arg;
  run *x = a->x;
  const int m = a->m, r = a->r;
  hook k = {a->outer, x, m, r, 0};
  distro_comm wrapped = {.ops = &hook_ops, .rank = a->outer->rank, .size = a->outer->size, .impl = &k};
  float *p = malloc(sizeof(float) * TOTAL), *g = calloc(TOTAL, sizeof(float));
  distro_optim *o = NULL;
  distro_diloco *d = NULL;
  char path[128];
  distro_diloco_options dlo = x->dl;
  dlo.progress_thread = x->progress;
  distro_status st = distro_optim_create(&x->inner, a->inner, &o);
  init_fill(x->seed, p);
  for (int i = 0; i < NT && st == DISTRO_OK; i++)
    st = distro_optim_add_param(o, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]);
  if (st == DISTRO_OK) st = distro_diloco_create(&dlo, o, &wrapped, &d);
  int start = 0;
  if (st == DISTRO_OK && x->resume) {
    snprintf(path, sizeof path, "%s/inner-%d-%d.bin", x->dir, m, r);
    st = distro_optim_load(o, path);
    snprintf(path, sizeof path, "%s/outer-%d-%d.bin", x->dir, m, r);
    if (st == DISTRO_OK) st = distro_diloco_load(d, path);
    memcpy(p, x->saved[m][r], sizeof(float) * TOTAL);
    start = x->save_after;
  }
  cr_assert_eq(st, DISTRO_OK, "setup: %s", distro_last_error());
  int syncs = 0;
  for (int s = start; s < x->steps; s++) {
    grad_fill(x->seed, m, r, s, g);
    if (s + 1 == x->nan_step && m == x->nan_learner) p[7] = NAN;
    const int bad_next = x->corrupt_at > 0 && syncs + 1 == x->corrupt_at && (s + 1) % x->dl.H == 0;
    if ((bad_next || (s + 1 == x->nan_step && x->nan_learner >= 0)) && r == 0) {
      x->before_bad[m] = malloc(sizeof(float) * TOTAL);
      global_snapshot(d, x->before_bad[m]);
      x->ef_before_bad[m] = ef_snapshot(d);
    }
    distro_diloco_stats ds;
    st = distro_diloco_step(d, x->lr, 64, &ds);
    x->st[m][r][s] = st;
    x->sent_sum[m][r] += ds.outer_bytes_sent;
    x->last[m][r] = ds;
    if (st != DISTRO_OK && !x->err[m][r][0]) snprintf(x->err[m][r], sizeof x->err[m][r], "step %d: %s", s + 1, distro_last_error());
    if (ds.fragment_sent >= 0) syncs++;
    if (x->before_bad[m] && !x->after_bad[m] && ds.fragment_sent >= 0 && r == 0) {
      x->after_bad[m] = malloc(sizeof(float) * TOTAL);
      global_snapshot(d, x->after_bad[m]);
      x->ef_after_bad[m] = ef_snapshot(d);
    }
    if (x->ef_snap && r == 0 && ds.fragment_sent >= 0 && syncs <= MAXSYNC) {
      x->glob[m][syncs] = malloc(sizeof(float) * TOTAL);
      global_snapshot(d, x->glob[m][syncs]);
      x->ef[m][syncs] = ef_snapshot(d);
    }
    if (s + 1 == x->save_after && !x->resume) {
      snprintf(path, sizeof path, "%s/inner-%d-%d.bin", x->dir, m, r);
      cr_assert_eq(distro_optim_save(o, path), DISTRO_OK, "%s", distro_last_error());
      snprintf(path, sizeof path, "%s/outer-%d-%d.bin", x->dir, m, r);
      cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK, "%s", distro_last_error());
      x->saved[m][r] = malloc(sizeof(float) * TOTAL);
      memcpy(x->saved[m][r], p, sizeof(float) * TOTAL);
    }
  }
  x->sync_st[m][r] = distro_diloco_sync_all(d, NULL);
  if (x->sync_st[m][r] != DISTRO_OK && !x->err[m][r][0])
    snprintf(x->err[m][r], sizeof x->err[m][r], "sync_all: %s", distro_last_error());
  x->out[m][r] = malloc(sizeof(float) * TOTAL);
  memcpy(x->out[m][r], p, sizeof(float) * TOTAL);
  distro_diloco_free(d);
  distro_optim_free(o);
  free(p);
  free(g);
  return NULL;
}

static inline void run_exec(run *x) {
  distro_comm *inner[MAXL][MAXR], *outer[MAXR][MAXL];
  pthread_t th[MAXL][MAXR];
  targ args[MAXL][MAXR];
  for (int m = 0; m < x->M; m++) cr_assert_eq(distro_comm_local_group(x->R, inner[m]), DISTRO_OK);
  for (int r = 0; r < x->R; r++) cr_assert_eq(distro_comm_local_group(x->M, outer[r]), DISTRO_OK);
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      args[m][r] = (targ){x, m, r, inner[m][r], outer[r][m]};
      cr_assert_eq(pthread_create(&th[m][r], NULL, rank_main, &args[m][r]), 0);
    }
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) pthread_join(th[m][r], NULL);
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      distro_comm_free(inner[m][r]);
      distro_comm_free(outer[r][m]);
    }
}

static inline void expect_ok(const run *x, const char *what) {
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      cr_assert_eq(x->err[m][r][0], 0, "%s: learner %d rank %d: %s (DISTRO_TEST_SEED=%llu)", what, m, r, x->err[m][r],
                   (unsigned long long)x->seed);
    }
}

static inline void expect_identical(const run *x, const run *y, const char *what) {
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++)
      cr_assert_eq(memcmp(x->out[m][r], y->out[m][r], sizeof(float) * TOTAL), 0,
                   "%s: learner %d rank %d differs (DISTRO_TEST_SEED=%llu)", what, m, r, (unsigned long long)x->seed);
}

#endif
