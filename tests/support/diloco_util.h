/* Shared by the DiLoCo outer-loop suites (tests/test_diloco_*.c): M learners
 * (each 1 or 2 in-process ranks) of four test tensors run through the public
 * API on threads, with an outer comm wrapper that adds latency and corrupts
 * payloads. The including suite defines _POSIX_C_SOURCE 200809L (nanosleep,
 * clock_gettime, mkdtemp) before any header. Functions are static inline so
 * a suite that uses only some of them does not warn. */
#ifndef DISTRO_TESTS_DILOCO_UTIL_H
#define DISTRO_TESTS_DILOCO_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "common/crc32c.h"
#include "optim/diloco_internal.h"
#include "testutil.h"

#define MAXL 4
#define MAXR 2
#define MAXS 40
#define NT 4
static const int ndims[NT] = {2, 1, 2, 1};
static const int64_t shapes[NT][2] = {{64, 48}, {100, 1}, {33, 7}, {256, 1}};
static const int64_t alt_shape2[2] = {33, 6}; /* smaller: buffers must not overlap */
static inline int64_t tnumel(int i) { return shapes[i][0] * shapes[i][1]; }
static inline int64_t toff(int i) {
  int64_t o = 0;
  for (int k = 0; k < i; k++) o += tnumel(k);
  return o;
}
#define TOTAL (64 * 48 + 100 + 33 * 7 + 256)
static const char *const tnames[NT] = {"w0", "b1", "w2", "b3"};

/* Inner AdamW with beta1 0, no weight decay and eps 1e30 is plain SGD
 * p -= (lr * g) / eps: pass lr = eta * 1e30. */
#define SGD_EPS 1e30f

typedef struct run {
  int M, R, steps;
  distro_options inner;
  distro_diloco_options dl;
  float lr;
  uint64_t seed;
  /* one learner (or one rank of it) differs */
  int alt_learner, alt_rank; /* alt_rank -1: every rank of alt_learner */
  int alt_options, alt_shape, alt_init;
  distro_diloco_options alt_dl;
  uint64_t tokens_base;      /* tokens per step: base * (learner + 1) + rank */
  int plain_tensor;          /* >= 0: DISTRO_DILOCO_PLAIN_MERGE on it */
  int zero_learner, zero_tensor; /* that learner's gradient of that tensor is 0 */
  /* hooks */
  int save_after;
  char dir[64];
  int resume_from;
  float *saved[MAXL][MAXR];
  int corrupt_exchange, corrupt_learner, corrupt_nan; /* n-th payload all-gather (1-based) */
  int nan_step, nan_learner;
  int watch_from, watch_to; /* global copy captured before step watch_from and after watch_to */
  int sync_all;
  int sleep_ms, delay_ms;
  /* outputs */
  float *out[MAXL][MAXR], *pre[MAXL][MAXR], *glob[MAXL][MAXR], *gw0[MAXL][MAXR], *gw1[MAXL][MAXR];
  distro_status st[MAXL][MAXR][MAXS], final_st[MAXL][MAXR];
  distro_diloco_stats stats[MAXL][MAXR][MAXS];
  char err[MAXL][MAXR][300];
  double seconds;
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
  x->lr = 0.01f * SGD_EPS;
  x->dl = distro_diloco_options_default();
  x->seed = tu_seed();
  x->alt_learner = -1;
  x->alt_rank = -1;
  x->plain_tensor = -1;
  x->zero_learner = -1;
  x->nan_learner = -1;
  x->corrupt_learner = -1;
}

static inline void run_free(run *x) {
  for (int m = 0; m < MAXL; m++)
    for (int r = 0; r < MAXR; r++) {
      free(x->out[m][r]);
      free(x->pre[m][r]);
      free(x->glob[m][r]);
      free(x->gw0[m][r]);
      free(x->gw1[m][r]);
      free(x->saved[m][r]);
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

/* ---- an outer comm wrapper: latency and payload corruption ----------------- */

typedef struct {
  distro_comm *inner;
  run *x;
  int payloads; /* payload all-gathers seen */
} hook;

static inline distro_status hook_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
  hook *k = c->impl;
  if (k->x->delay_ms) {
    struct timespec ts = {0, (long)k->x->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
  }
  distro_status st = k->inner->ops->allgather(k->inner, send, bytes, recv);
  if (st != DISTRO_OK || bytes < DISTRO__DLC_HEADER + 4) return st;
  k->payloads++;
  if (k->payloads == k->x->corrupt_exchange) {
    uint8_t *slot = (uint8_t *)recv + (size_t)k->x->corrupt_learner * bytes;
    if (k->x->corrupt_nan) { /* a well-formed payload carrying a NaN (F32 codec) */
      const float nan = NAN;
      memcpy(slot + DISTRO__DLC_HEADER + 4 * 3, &nan, 4);
      const uint32_t crc = distro__crc32c(slot, bytes - 4);
      memcpy(slot + bytes - 4, &crc, 4);
    } else {
      slot[bytes / 2] ^= 0x10;
    }
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
static const distro__comm_ops hook_ops = {
    .name = "hook", .allgather = hook_allgather, .allreduce_sum = hook_allreduce, .barrier = hook_barrier};

/* ---- one rank of one learner -------------------------------------------------- */

typedef struct {
  run *x;
  int m, r;
  distro_comm *inner, *outer;
} targ;

static inline void snapshot_global(distro_diloco *d, float *dst) {
  for (int i = 0; i < NT; i++) {
    distro_status st = distro_diloco_get_global(d, tnames[i], dst + toff(i), tnumel(i));
    if (st != DISTRO_OK) memset(dst + toff(i), 0xff, sizeof(float) * (size_t)tnumel(i));
  }
}

static inline void *rank_main(void *arg) {
  targ *a = arg;
  run *x = a->x;
  const int m = a->m, r = a->r;
  const int alt = m == x->alt_learner && (x->alt_rank < 0 || x->alt_rank == r);
  hook k = {a->outer, x, 0};
  distro_comm wrapped = {.ops = &hook_ops, .rank = a->outer->rank, .size = a->outer->size, .impl = &k};
  float *p = malloc(sizeof(float) * TOTAL), *g = calloc(TOTAL, sizeof(float));
  distro_optim *o = NULL;
  distro_diloco *d = NULL;
  char path[128];
  distro_status st = distro_optim_create(&x->inner, a->inner, &o);
  init_fill(x->seed, p);
  if (alt && x->alt_init) p[5] += 1.0f;
  for (int i = 0; i < NT && st == DISTRO_OK; i++) {
    const int64_t *sh = alt && x->alt_shape && i == 2 ? alt_shape2 : shapes[i];
    st = distro_optim_add_param(o, tnames[i], p + toff(i), g + toff(i), ndims[i], sh);
  }
  distro_diloco_options dlo = alt && x->alt_options ? x->alt_dl : x->dl;
  if (st == DISTRO_OK) st = distro_diloco_create(&dlo, o, &wrapped, &d);
  if (st == DISTRO_OK && x->plain_tensor >= 0)
    st = distro_diloco_set_tensor(d, tnames[x->plain_tensor], -1, DISTRO_DILOCO_PLAIN_MERGE);
  int start = 0;
  if (st == DISTRO_OK && x->resume_from) {
    snprintf(path, sizeof path, "%s/inner-%d-%d.bin", x->dir, m, r);
    st = distro_optim_load(o, path);
    snprintf(path, sizeof path, "%s/outer-%d-%d.bin", x->dir, m, r);
    if (st == DISTRO_OK) st = distro_diloco_load(d, path);
    memcpy(p, x->saved[m][r], sizeof(float) * TOTAL);
    start = x->resume_from;
  }
  if (st != DISTRO_OK) {
    snprintf(x->err[m][r], sizeof x->err[m][r], "setup: %s", distro_last_error());
    x->final_st[m][r] = st;
    goto done;
  }
  x->gw0[m][r] = malloc(sizeof(float) * TOTAL);
  x->gw1[m][r] = malloc(sizeof(float) * TOTAL);
  for (int s = start; s < x->steps; s++) {
    grad_fill(x->seed, m, r, s, g);
    if (m == x->zero_learner) memset(g + toff(x->zero_tensor), 0, sizeof(float) * (size_t)tnumel(x->zero_tensor));
    if (s + 1 == x->nan_step && m == x->nan_learner) p[0] = NAN;
    if (x->sleep_ms) {
      struct timespec ts = {0, (long)x->sleep_ms * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (s + 1 == x->watch_from) snapshot_global(d, x->gw0[m][r]);
    const uint64_t tokens = x->tokens_base * (uint64_t)(m + 1) + (uint64_t)r;
    st = distro_diloco_step(d, x->lr, tokens, &x->stats[m][r][s]);
    x->st[m][r][s] = st;
    if (st != DISTRO_OK && !x->err[m][r][0])
      snprintf(x->err[m][r], sizeof x->err[m][r], "step %d: %s", s + 1, distro_last_error());
    if (s + 1 == x->watch_to) snapshot_global(d, x->gw1[m][r]);
    if (st != DISTRO_OK && !x->stats[m][r][s].inner_done) {
      x->final_st[m][r] = st;
      goto done;
    }
    if (s + 1 == x->save_after) {
      snprintf(path, sizeof path, "%s/inner-%d-%d.bin", x->dir, m, r);
      distro_status s1 = distro_optim_save(o, path);
      snprintf(path, sizeof path, "%s/outer-%d-%d.bin", x->dir, m, r);
      distro_status s2 = distro_diloco_save(d, path);
      cr_assert(s1 == DISTRO_OK && s2 == DISTRO_OK, "save: %s", distro_last_error());
      x->saved[m][r] = malloc(sizeof(float) * TOTAL);
      memcpy(x->saved[m][r], p, sizeof(float) * TOTAL);
    }
  }
  x->pre[m][r] = malloc(sizeof(float) * TOTAL);
  memcpy(x->pre[m][r], p, sizeof(float) * TOTAL);
  if (x->sync_all) {
    st = distro_diloco_sync_all(d, NULL);
    if (st != DISTRO_OK) {
      snprintf(x->err[m][r], sizeof x->err[m][r], "sync_all: %s", distro_last_error());
      x->final_st[m][r] = st;
    } else if (x->sync_all == 2) { /* nothing new since: a second one changes nothing */
      float *again = malloc(sizeof(float) * TOTAL);
      memcpy(again, p, sizeof(float) * TOTAL);
      distro_diloco_stats ss;
      cr_assert_eq(distro_diloco_sync_all(d, &ss), DISTRO_OK, "%s", distro_last_error());
      cr_assert_eq(memcmp(again, p, sizeof(float) * TOTAL), 0, "a second sync_all moved the parameters");
      cr_assert_eq(ss.outer_bytes_sent, 0);
      free(again);
    }
  }
  x->out[m][r] = malloc(sizeof(float) * TOTAL);
  memcpy(x->out[m][r], p, sizeof(float) * TOTAL);
  x->glob[m][r] = malloc(sizeof(float) * TOTAL);
  snapshot_global(d, x->glob[m][r]);
done:
  distro_diloco_free(d);
  distro_optim_free(o);
  free(p);
  free(g);
  return NULL;
}

static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void run_exec(run *x) {
  distro_comm *inner[MAXL][MAXR], *outer[MAXR][MAXL];
  pthread_t th[MAXL][MAXR];
  targ args[MAXL][MAXR];
  for (int m = 0; m < x->M; m++) cr_assert_eq(distro_comm_local_group(x->R, inner[m]), DISTRO_OK);
  for (int r = 0; r < x->R; r++) cr_assert_eq(distro_comm_local_group(x->M, outer[r]), DISTRO_OK);
  double t0 = now();
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      args[m][r] = (targ){x, m, r, inner[m][r], outer[r][m]};
      cr_assert_eq(pthread_create(&th[m][r], NULL, rank_main, &args[m][r]), 0);
    }
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) pthread_join(th[m][r], NULL);
  x->seconds = now() - t0;
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      distro_comm_free(inner[m][r]);
      distro_comm_free(outer[r][m]);
    }
}

static inline void expect_ok(const run *x, const char *what) {
  for (int m = 0; m < x->M; m++)
    for (int r = 0; r < x->R; r++) {
      cr_assert_eq(x->final_st[m][r], DISTRO_OK, "%s: learner %d rank %d: %s (DISTRO_TEST_SEED=%llu)", what, m, r,
                   x->err[m][r], (unsigned long long)x->seed);
      for (int s = x->resume_from; s < x->steps; s++)
        cr_assert_eq(x->st[m][r][s], DISTRO_OK, "%s: learner %d rank %d: %s (DISTRO_TEST_SEED=%llu)", what, m, r,
                     x->err[m][r], (unsigned long long)x->seed);
      cr_assert_not_null(x->out[m][r], "%s: learner %d rank %d did not finish", what, m, r);
    }
}

static inline long first_diff(const float *a, const float *b) {
  for (long i = 0; i < TOTAL; i++)
    if (memcmp(a + i, b + i, sizeof(float))) return i;
  return -1;
}

#endif
