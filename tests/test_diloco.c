/* DiLoCo outer loop: M learners (each 1 or 2 in-process ranks) through the
 * public API, against a float64 reference of the whole schedule (inner SGD,
 * fragments, overlap, alpha, Nesterov), plain data-parallel at H = 1,
 * merges, bit-identity, the progress thread, save/load, bad payloads and
 * mismatched learners. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, nanosleep */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <distro/distro.h>

#include "comm/comm_internal.h"
#include "common/crc32c.h"
#include "optim/diloco_internal.h"
#include "optim/fragment.h"
#include "testutil.h"

#define MAXL 4
#define MAXR 2
#define MAXS 40
#define NT 4
static const int ndims[NT] = {2, 1, 2, 1};
static const int64_t shapes[NT][2] = {{64, 48}, {100, 1}, {33, 7}, {256, 1}};
static const int64_t alt_shape2[2] = {33, 6}; /* smaller: buffers must not overlap */
static int64_t tnumel(int i) { return shapes[i][0] * shapes[i][1]; }
static int64_t toff(int i) {
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

static void run_init(run *x, int M, int R, int steps) {
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

static void run_free(run *x) {
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

static void grad_fill(uint64_t seed, int m, int r, int s, float *g) {
  tu_rng rng = {seed * 1000003ULL + (uint64_t)m * 7919ULL + (uint64_t)r * 104729ULL + (uint64_t)s * 15485863ULL + 1};
  tu_fill_normal(&rng, g, TOTAL, 1.0f);
}

static void init_fill(uint64_t seed, float *p) {
  tu_rng rng = {seed ^ 0x5eedULL};
  tu_fill_normal(&rng, p, TOTAL, 1.0f);
}

/* ---- an outer comm wrapper: latency and payload corruption ----------------- */

typedef struct {
  distro_comm *inner;
  run *x;
  int payloads; /* payload all-gathers seen */
} hook;

static distro_status hook_allgather(distro_comm *c, const void *send, size_t bytes, void *recv) {
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
static distro_status hook_allreduce(distro_comm *c, float *b, size_t n) {
  hook *k = c->impl;
  return k->inner->ops->allreduce_sum(k->inner, b, n);
}
static distro_status hook_barrier(distro_comm *c) {
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

static void snapshot_global(distro_diloco *d, float *dst) {
  for (int i = 0; i < NT; i++) {
    distro_status st = distro_diloco_get_global(d, tnames[i], dst + toff(i), tnumel(i));
    if (st != DISTRO_OK) memset(dst + toff(i), 0xff, sizeof(float) * (size_t)tnumel(i));
  }
}

static void *rank_main(void *arg) {
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

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_exec(run *x) {
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

static void expect_ok(const run *x, const char *what) {
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

static long first_diff(const float *a, const float *b) {
  for (long i = 0; i < TOTAL; i++)
    if (memcmp(a + i, b + i, sizeof(float))) return i;
  return -1;
}

/* ---- float64 reference of the whole run (inner SGD, R = 1) ------------------ */

typedef struct {
  double th[MAXL][TOTAL]; /* local parameters */
  double glob[TOTAL], mom[TOTAL];
} ref_state;

static int frag_of_elem[TOTAL];

static void ref_fragments(const distro_diloco_options *o) {
  int64_t numel[NT];
  for (int i = 0; i < NT; i++) numel[i] = tnumel(i);
  distro__fragments f;
  cr_assert_eq(distro__fragments_build(&f, o->fragmenting, o->fragments, NT, numel, NULL, o->max_block), DISTRO_OK);
  for (int p = 0; p < f.nfrag; p++)
    for (int q = f.start[p]; q < f.start[p + 1]; q++)
      for (int64_t j = 0; j < f.pieces[q].count; j++) frag_of_elem[toff(f.pieces[q].tensor) + f.pieces[q].offset + j] = p;
  distro__fragments_destroy(&f);
}

/* Merge weights for the reference: mean or tokens^2/steps. */
static void ref_weights(const run *x, int steps_since, double *w) {
  double sum = 0;
  for (int m = 0; m < x->M; m++) {
    const int tk = x->dl.merge == DISTRO_MERGE_TOKENS || x->dl.merge == DISTRO_MERGE_RADIAL_TOKENS;
    const double tokens = (double)(x->tokens_base * (uint64_t)(m + 1)) * steps_since;
    w[m] = tk ? tokens * tokens / steps_since : 1.0;
    sum += w[m];
  }
  for (int m = 0; m < x->M; m++) w[m] = sum > 0 ? w[m] / sum : 1.0 / x->M;
}

/* Merged outer gradient of the elements [lo, hi) of one tensor. */
static void ref_merge_tensor(const run *x, const ref_state *s, const double *w, int tensor, int p, double *out) {
  const int64_t lo = toff(tensor), hi = lo + tnumel(tensor);
  const int radial = (x->dl.merge == DISTRO_MERGE_RADIAL || x->dl.merge == DISTRO_MERGE_RADIAL_TOKENS) &&
                     tensor != x->plain_tensor;
  double nrm[MAXL], R = 0;
  int plain = !radial;
  for (int m = 0; m < x->M && !plain; m++) {
    double a = 0;
    for (int64_t j = lo; j < hi; j++)
      if (frag_of_elem[j] == p) a += (s->glob[j] - s->th[m][j]) * (s->glob[j] - s->th[m][j]);
    nrm[m] = sqrt(a);
    if (nrm[m] == 0) plain = 1;
    R += w[m] * nrm[m];
  }
  double un = 0;
  for (int64_t j = lo; j < hi; j++) {
    if (frag_of_elem[j] != p) continue;
    double v = 0;
    for (int m = 0; m < x->M; m++) v += (plain ? w[m] : w[m] / nrm[m]) * (s->glob[j] - s->th[m][j]);
    out[j] = v;
    un += v * v;
  }
  if (!plain)
    for (int64_t j = lo; j < hi; j++)
      if (frag_of_elem[j] == p) out[j] *= R / sqrt(un);
}

static void ref_apply(const run *x, ref_state *s, int p, double alpha) {
  for (int m = 0; m < x->M; m++)
    for (int j = 0; j < TOTAL; j++)
      if (frag_of_elem[j] == p) s->th[m][j] = alpha * s->th[m][j] + (1 - alpha) * s->glob[j];
}

static void reference(const run *x, ref_state *s) {
  const distro_diloco_options *o = &x->dl;
  static float init[TOTAL], g[TOTAL];
  static double delta[TOTAL];
  ref_fragments(o);
  init_fill(x->seed, init);
  for (int j = 0; j < TOTAL; j++) {
    s->glob[j] = init[j];
    s->mom[j] = 0;
    for (int m = 0; m < x->M; m++) s->th[m][j] = init[j];
  }
  const double eta = (double)x->lr / SGD_EPS;
  int pending = -1, apply_at = 0;
  int last_send[64] = {0};
  for (int t = 1; t <= x->steps; t++) {
    for (int m = 0; m < x->M; m++) {
      grad_fill(x->seed, m, 0, t - 1, g);
      if (m == x->zero_learner) memset(g + toff(x->zero_tensor), 0, sizeof(float) * (size_t)tnumel(x->zero_tensor));
      for (int j = 0; j < TOTAL; j++) s->th[m][j] -= eta * g[j];
    }
    if (pending >= 0 && apply_at == t) {
      ref_apply(x, s, pending, o->alpha);
      pending = -1;
    }
    int p = -1;
    for (int q = 0; q < o->fragments; q++)
      if ((int64_t)q * o->H / o->fragments == t % o->H) p = q;
    if (p < 0) continue;
    double w[MAXL];
    ref_weights(x, t - last_send[p], w);
    last_send[p] = t;
    for (int i = 0; i < NT; i++) ref_merge_tensor(x, s, w, i, p, delta);
    for (int j = 0; j < TOTAL; j++) {
      if (frag_of_elem[j] != p) continue;
      const double mu = o->outer_momentum, lr = o->outer_lr;
      s->mom[j] = mu * s->mom[j] + delta[j];
      s->glob[j] -= lr * (o->nesterov ? delta[j] + mu * s->mom[j] : s->mom[j]);
    }
    pending = p;
    apply_at = t + o->overlap;
    if (o->overlap == 0) {
      ref_apply(x, s, p, o->alpha);
      pending = -1;
    }
  }
}

static void expect_matches_reference(const run *x, const char *what) {
  static ref_state s;
  reference(x, &s);
  for (int m = 0; m < x->M; m++) {
    long bad = tu_first_mismatch(x->out[m][0], s.th[m], TOTAL, 2e-5, 1e-4);
    cr_assert_eq(bad, -1, "%s: learner %d element %ld is %.9g, float64 reference %.12g (DISTRO_TEST_SEED=%llu)", what, m,
                 bad, bad >= 0 ? x->out[m][0][bad] : 0.0, bad >= 0 ? s.th[m][bad] : 0.0, (unsigned long long)x->seed);
    bad = tu_first_mismatch(x->glob[m][0], s.glob, TOTAL, 2e-5, 1e-4);
    cr_assert_eq(bad, -1, "%s: learner %d global element %ld is %.9g, float64 reference %.12g (DISTRO_TEST_SEED=%llu)",
                 what, m, bad, bad >= 0 ? x->glob[m][0][bad] : 0.0, bad >= 0 ? s.glob[bad] : 0.0,
                 (unsigned long long)x->seed);
    cr_assert_eq(first_diff(x->glob[m][0], x->glob[0][0]), -1, "%s: learner %d's global copy differs from learner 0's",
                 what, m);
  }
}

/* ---- tests -------------------------------------------------------------------- */

Test(diloco, outer_nesterov_schedule_matches_float64, .timeout = 60) {
  struct {
    int M, H, P, tau, nest, steps;
    float alpha;
    distro_fragmenting fr;
  } cfg[] = {
      {3, 4, 1, 0, 1, 16, 0.0f, DISTRO_FRAG_BALANCED},
      {3, 6, 3, 1, 1, 18, 0.5f, DISTRO_FRAG_BALANCED},
      {2, 5, 2, 2, 0, 15, 0.25f, DISTRO_FRAG_STRIDED},
      {4, 7, 3, 2, 1, 21, 0.0f, DISTRO_FRAG_SEQUENTIAL},
  };
  for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
    run x;
    run_init(&x, cfg[c].M, 1, cfg[c].steps);
    x.dl.H = cfg[c].H;
    x.dl.fragments = cfg[c].P;
    x.dl.overlap = cfg[c].tau;
    x.dl.alpha = cfg[c].alpha;
    x.dl.nesterov = cfg[c].nest;
    x.dl.fragmenting = cfg[c].fr;
    run_exec(&x);
    char what[64];
    snprintf(what, sizeof what, "config %zu", c);
    expect_ok(&x, what);
    expect_matches_reference(&x, what);
    run_free(&x);
  }
}

/* The outer step alone, many rounds on random inputs, against float64. */
Test(diloco, nesterov_update_float64, .timeout = 30) {
  run x;
  run_init(&x, 2, 1, 30);
  x.dl.H = 1; /* every step is an outer step */
  x.dl.outer_lr = 0.7f;
  x.dl.outer_momentum = 0.9f;
  run_exec(&x);
  expect_ok(&x, "H=1 Nesterov");
  expect_matches_reference(&x, "H=1 Nesterov");
  run_free(&x);
}

/* H = 1, outer lr 1, no momentum: theta <- mean of the learners' locally
 * stepped parameters. With a linear inner step (SGD) that is data-parallel
 * SGD on the mean gradient; equal up to float rounding of the difference. */
typedef struct {
  run *x;
  float *out; /* world x TOTAL */
} dp_arg;

static distro_status dp_rank(distro_comm *comm, int rank, void *arg) {
  dp_arg *a = arg;
  float *p = malloc(sizeof(float) * TOTAL), *g = malloc(sizeof(float) * TOTAL);
  distro_optim *o = NULL;
  distro_status st = distro_optim_create(&a->x->inner, comm, &o);
  init_fill(a->x->seed, p);
  for (int i = 0; i < NT && st == DISTRO_OK; i++)
    st = distro_optim_add_param(o, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]);
  for (int s = 0; s < a->x->steps && st == DISTRO_OK; s++) {
    grad_fill(a->x->seed, rank, 0, s, g);
    st = distro_optim_step(o, a->x->lr, NULL);
  }
  memcpy(a->out + (size_t)rank * TOTAL, p, sizeof(float) * TOTAL);
  distro_optim_free(o);
  free(p);
  free(g);
  return st;
}

Test(diloco, h1_lr1_no_momentum_is_data_parallel, .timeout = 30) {
  run x;
  run_init(&x, 3, 1, 6);
  x.dl.H = 1;
  x.dl.outer_lr = 1.0f;
  x.dl.outer_momentum = 0.0f;
  run_exec(&x);
  expect_ok(&x, "H=1");
  dp_arg a = {&x, malloc(sizeof(float) * TOTAL * 3)};
  cr_assert_eq(distro_comm_run_local(3, dp_rank, &a), DISTRO_OK, "%s", distro_last_error());
  static float init[TOTAL], g[TOTAL];
  static double ref[TOTAL];
  init_fill(x.seed, init);
  for (int j = 0; j < TOTAL; j++) ref[j] = init[j];
  for (int s = 0; s < x.steps; s++)
    for (int m = 0; m < 3; m++) {
      grad_fill(x.seed, m, 0, s, g);
      for (int j = 0; j < TOTAL; j++) ref[j] -= 0.01 * g[j] / 3.0;
    }
  double maxd = 0;
  for (int m = 0; m < 3; m++) {
    cr_assert_eq(first_diff(x.out[m][0], x.out[0][0]), -1, "learners differ");
    for (int j = 0; j < TOTAL; j++) {
      const double dd = fabs((double)x.out[m][0][j] - (double)a.out[j]);
      if (dd > maxd) maxd = dd;
    }
  }
  /* a few ulps of O(1) parameters per step */
  cr_assert_lt(maxd, 3e-6, "DiLoCo(H=1, lr 1, mu 0) vs data-parallel: max |diff| %g (DISTRO_TEST_SEED=%llu)", maxd,
               (unsigned long long)x.seed);
  long bad = tu_first_mismatch(x.out[0][0], ref, TOTAL, 3e-6, 0);
  cr_assert_eq(bad, -1, "vs float64 data-parallel SGD: element %ld", bad);
  bad = tu_first_mismatch(a.out, ref, TOTAL, 3e-6, 0);
  cr_assert_eq(bad, -1, "data-parallel run vs float64: element %ld", bad);
  free(a.out);
  run_free(&x);
}

Test(diloco, merges_match_float64, .timeout = 30) {
  const distro_merge merges[] = {DISTRO_MERGE_MEAN, DISTRO_MERGE_TOKENS, DISTRO_MERGE_RADIAL, DISTRO_MERGE_RADIAL_TOKENS};
  for (int k = 0; k < 4; k++)
    for (int variant = 0; variant < 3; variant++) {
      run x;
      run_init(&x, 3, 1, 8);
      x.dl.H = 4;
      x.dl.fragments = 2;
      x.dl.outer_lr = 1.0f;
      x.dl.outer_momentum = 0.5f;
      x.dl.merge = merges[k];
      x.tokens_base = 1000;
      if (variant == 1) x.plain_tensor = 1;  /* embeddings-style plain average */
      if (variant == 2) { /* a zero-norm learner: plain weighted average */
        x.zero_learner = 2;
        x.zero_tensor = 2;
      }
      run_exec(&x);
      char what[64];
      snprintf(what, sizeof what, "merge %d variant %d", k, variant);
      expect_ok(&x, what);
      expect_matches_reference(&x, what);
      run_free(&x);
    }
}

/* Learners that are data-parallel inside (2 ranks each): ranks stay
 * bit-identical inside a learner, and after sync_all every rank of every
 * learner holds the same bits, equal to the global copy. */
Test(diloco, learners_bit_identical_with_inner_data_parallel, .timeout = 60) {
  for (int c = 0; c < 2; c++) {
    run x;
    run_init(&x, 2, 2, 12);
    if (c == 0) {
      x.inner = distro_options_default(DISTRO_ALG_ADAMW);
      x.lr = 1e-3f;
      x.dl.codec = DISTRO_OUTER_INT4;
      x.dl.merge = DISTRO_MERGE_RADIAL_TOKENS;
    } else {
      x.inner = distro_options_default(DISTRO_ALG_DEMO);
      x.inner.topk = 4;
      x.lr = 1e-3f;
      x.dl.codec = DISTRO_OUTER_FP4;
      x.dl.merge = DISTRO_MERGE_TOKENS;
    }
    x.tokens_base = 100;
    x.dl.H = 4;
    x.dl.fragments = 2;
    x.dl.overlap = 1;
    x.dl.alpha = 0.5f;
    x.dl.progress_thread = c;
    x.sync_all = 2 - c;
    run_exec(&x);
    expect_ok(&x, c ? "demo inside" : "adamw inside");
    for (int m = 0; m < 2; m++) {
      cr_assert_eq(first_diff(x.pre[m][0], x.pre[m][1]), -1, "config %d: ranks of learner %d differ", c, m);
      cr_assert_eq(first_diff(x.glob[m][0], x.glob[m][1]), -1, "config %d: global copies of learner %d differ", c, m);
    }
    cr_assert_neq(first_diff(x.pre[0][0], x.pre[1][0]), -1, "config %d: learners should differ before sync_all", c);
    for (int m = 0; m < 2; m++)
      for (int r = 0; r < 2; r++) {
        cr_assert_eq(first_diff(x.out[m][r], x.out[0][0]), -1, "config %d: after sync_all learner %d rank %d differs", c,
                     m, r);
        cr_assert_eq(first_diff(x.out[m][r], x.glob[m][r]), -1, "config %d: parameters != global copy", c);
      }
    /* the token counts were summed over the learner's ranks: same weights
       in both columns, or the ranks would have diverged above */
    run_free(&x);
  }
}

/* The progress thread gives the same bits as the blocking path, for tau = 0
 * (the overlap machinery with nothing to overlap) and tau > 0; and tau > 0
 * does change the result. Stats: sends every H/P steps, applies tau later. */
Test(diloco, overlap_paths_agree, .timeout = 60) {
  run a[2][2];
  for (int tau = 0; tau < 2; tau++)
    for (int th = 0; th < 2; th++) {
      run *x = &a[tau][th];
      run_init(x, 3, 1, 13);
      x->seed = a[0][0].seed ? a[0][0].seed : x->seed;
      x->dl.H = 6;
      x->dl.fragments = 2;
      x->dl.overlap = tau ? 2 : 0;
      x->dl.alpha = 0.5f;
      x->dl.codec = DISTRO_OUTER_INT8;
      x->dl.merge = DISTRO_MERGE_TOKENS;
      x->tokens_base = 7;
      x->dl.progress_thread = th;
      run_exec(x);
      expect_ok(x, "overlap");
    }
  for (int tau = 0; tau < 2; tau++)
    for (int m = 0; m < 3; m++) {
      cr_assert_eq(first_diff(a[tau][0].out[m][0], a[tau][1].out[m][0]), -1,
                   "tau %d: progress thread and blocking path differ (learner %d)", tau ? 2 : 0, m);
      cr_assert_eq(first_diff(a[tau][0].glob[m][0], a[tau][1].glob[m][0]), -1);
    }
  cr_assert_neq(first_diff(a[0][0].out[0][0], a[1][0].out[0][0]), -1, "tau 2 should differ from tau 0");
  for (int th = 0; th < 2; th++)
    for (int s = 0; s < 13; s++) {
      const distro_diloco_stats *st0 = &a[0][th].stats[1][0][s], *st2 = &a[1][th].stats[1][0][s];
      const int t = s + 1;
      const int due = t % 6 == 0 ? 0 : t % 6 == 3 ? 1 : -1;
      cr_assert_eq(st0->step, t);
      cr_assert_eq(st0->fragment_sent, due, "step %d", t);
      cr_assert_eq(st0->fragment_applied, due, "step %d", t);
      cr_assert_eq(st2->fragment_sent, due, "step %d", t);
      const int due_before = (t - 2) % 6 == 0 && t > 2 ? 0 : (t - 2) % 6 == 3 ? 1 : -1;
      cr_assert_eq(st2->fragment_applied, due_before, "tau 2, step %d: applied %d", t, st2->fragment_applied);
      cr_assert_eq(st0->outer_bytes_sent > 0, due >= 0);
      if (due >= 0) cr_assert_eq(st0->outer_bytes_received, 2 * st0->outer_bytes_sent);
    }
  for (int tau = 0; tau < 2; tau++)
    for (int th = 0; th < 2; th++) run_free(&a[tau][th]);
}

/* Save after step 7 (an exchange started at 6 awaits its application at 8),
 * resume in fresh objects: the rest of the run lands on the same bits. */
Test(diloco, save_load_resumes_bit_identical, .timeout = 60) {
  for (int c = 0; c < 2; c++) {
    run full, tail;
    run_init(&full, c ? 2 : 3, c ? 2 : 1, 14);
    full.inner = distro_options_default(DISTRO_ALG_ADAMW);
    full.lr = 1e-3f;
    full.dl.H = 6;
    full.dl.fragments = 2;
    full.dl.overlap = 2;
    full.dl.alpha = 0.5f;
    full.dl.codec = DISTRO_OUTER_INT4;
    full.dl.merge = DISTRO_MERGE_RADIAL_TOKENS;
    full.dl.progress_thread = 1;
    full.tokens_base = 50;
    snprintf(full.dir, sizeof full.dir, "/tmp/distro_dlc_XXXXXX");
    cr_assert_not_null(mkdtemp(full.dir));
    full.save_after = 7;
    run_exec(&full);
    expect_ok(&full, "full run");
    tail = full;
    memset(tail.out, 0, sizeof tail.out);
    memset(tail.pre, 0, sizeof tail.pre);
    memset(tail.glob, 0, sizeof tail.glob);
    memset(tail.gw0, 0, sizeof tail.gw0);
    memset(tail.gw1, 0, sizeof tail.gw1);
    memset(tail.stats, 0, sizeof tail.stats);
    tail.save_after = 0;
    tail.resume_from = 7;
    run_exec(&tail);
    expect_ok(&tail, "resumed run");
    for (int m = 0; m < full.M; m++)
      for (int r = 0; r < full.R; r++) {
        long dpar = first_diff(full.out[m][r], tail.out[m][r]);
        cr_assert_eq(dpar, -1, "config %d learner %d rank %d: resumed parameters differ at %ld (DISTRO_TEST_SEED=%llu)",
                     c, m, r, dpar, (unsigned long long)full.seed);
        cr_assert_eq(first_diff(full.glob[m][r], tail.glob[m][r]), -1, "resumed global copy differs");
        for (int s = 7; s < 14; s++) {
          cr_assert_eq(tail.stats[m][r][s].step, s + 1);
          cr_assert_eq(tail.stats[m][r][s].fragment_applied, full.stats[m][r][s].fragment_applied);
          cr_assert_eq(tail.stats[m][r][s].total_outer_bytes_sent, full.stats[m][r][s].total_outer_bytes_sent);
        }
      }
    for (int m = 0; m < full.M; m++)
      for (int r = 0; r < full.R; r++) {
        char p[128];
        snprintf(p, sizeof p, "%s/inner-%d-%d.bin", full.dir, m, r);
        unlink(p);
        snprintf(p, sizeof p, "%s/outer-%d-%d.bin", full.dir, m, r);
        unlink(p);
      }
    rmdir(full.dir);
    for (int m = 0; m < MAXL; m++)
      for (int r = 0; r < MAXR; r++) {
        free(tail.out[m][r]);
        free(tail.pre[m][r]);
        free(tail.glob[m][r]);
        free(tail.gw0[m][r]);
        free(tail.gw1[m][r]);
      }
    run_free(&full);
  }
}

/* A corrupt payload (flipped byte), a well-formed payload with a NaN, and a
 * learner whose parameters went NaN: every learner rejects that exchange
 * with DISTRO_ERR_PAYLOAD, the global copy is untouched, and the next
 * exchange works (learners end identical after it). */
Test(diloco, bad_payloads_rejected_global_untouched, .timeout = 60) {
  for (int kind = 0; kind < 4; kind++) {
    run x;
    run_init(&x, 3, 1, kind == 2 ? 6 : 9);
    x.dl.H = 3;
    int bad_step = 6;
    if (kind == 0 || kind == 3) {
      x.corrupt_exchange = 2; /* the exchange at step 6 */
      x.corrupt_learner = 1;
    }
    if (kind == 1) {
      x.corrupt_exchange = 2;
      x.corrupt_learner = 2;
      x.corrupt_nan = 1;
    }
    if (kind == 2) {
      x.nan_step = 6;
      x.nan_learner = 0;
    }
    if (kind == 3) { /* overlap with the progress thread: reported when applied */
      x.dl.H = 4;
      x.dl.overlap = 1;
      x.dl.progress_thread = 1;
      x.steps = 13;
      x.corrupt_exchange = 1; /* sent at 4, applied at 5 */
      bad_step = 5;
    }
    x.watch_from = kind == 3 ? 4 : bad_step;
    x.watch_to = bad_step;
    run_exec(&x);
    for (int m = 0; m < 3; m++) {
      cr_assert_eq(x.final_st[m][0], DISTRO_OK, "kind %d learner %d: %s", kind, m, x.err[m][0]);
      for (int s = 0; s < x.steps; s++) {
        const distro_status want = s + 1 == bad_step ? DISTRO_ERR_PAYLOAD : DISTRO_OK;
        cr_assert_eq(x.st[m][0][s], want, "kind %d learner %d step %d: status %d (%s)", kind, m, s + 1, x.st[m][0][s],
                     x.err[m][0]);
        cr_assert_eq(x.stats[m][0][s].inner_done, 1);
      }
      cr_assert(strstr(x.err[m][0], kind == 0 || kind == 3 ? "checksum" : "not finite") != NULL, "kind %d: %s", kind,
                x.err[m][0]);
      cr_assert_eq(x.stats[m][0][bad_step - 1].fragment_applied, -1);
      cr_assert_eq(first_diff(x.gw0[m][0], x.gw1[m][0]), -1, "kind %d learner %d: the global copy changed", kind, m);
      if (kind != 2) { /* the next exchange was applied: learners identical again */
        cr_assert_eq(first_diff(x.out[m][0], x.out[0][0]), -1, "kind %d: learner %d differs at the end", kind, m);
        cr_assert_neq(first_diff(x.gw0[m][0], x.glob[m][0]), -1, "kind %d: no later exchange was applied", kind);
      }
    }
    run_free(&x);
  }
}

/* Learners that disagree fail together with DISTRO_ERR_SHAPE before any
 * step is taken. */
Test(diloco, mismatched_learners_rejected, .timeout = 60) {
  for (int kind = 0; kind < 5; kind++) {
    run x;
    run_init(&x, 3, kind >= 3 ? 2 : 1, 2);
    x.alt_learner = kind == 0 ? 1 : 2;
    if (kind == 0 || kind == 3) {
      x.alt_options = 1;
      x.alt_dl = x.dl;
      if (kind == 0) x.alt_dl.H = 250;
      else x.alt_dl.codec = DISTRO_OUTER_INT4;
      if (kind == 3) {
        x.alt_learner = 0;
        x.alt_rank = 1; /* one rank of a learner disagrees with its sibling */
      }
    }
    if (kind == 1) x.alt_shape = 1;
    if (kind == 2) x.alt_init = 1;
    if (kind == 4) { /* the learner's ranks start differently */
      x.alt_learner = 1;
      x.alt_rank = 0;
      x.alt_init = 1;
    }
    run_exec(&x);
    for (int m = 0; m < 3; m++)
      for (int r = 0; r < x.R; r++) {
        cr_assert_eq(x.final_st[m][r], DISTRO_ERR_SHAPE, "kind %d learner %d rank %d: status %d (%s)", kind, m, r,
                     x.final_st[m][r], x.err[m][r]);
        cr_assert_eq(x.stats[m][r][0].inner_done, 0);
        cr_assert_eq(x.stats[m][r][0].step, 0);
      }
    run_free(&x);
  }
}

static distro_status try_create(distro_diloco_options o) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  static float p[TOTAL], g[TOTAL];
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_optim_add_param(opt, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]), DISTRO_OK);
  distro_diloco *d = (distro_diloco *)0x1;
  distro_status st = distro_diloco_create(&o, opt, c[0], &d);
  if (st != DISTRO_OK) {
    cr_assert_null(d, "out must be NULL on failure");
    cr_assert_neq(distro_last_error()[0], 0, "no message");
  }
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  return st;
}

Test(diloco, bad_options_rejected) {
  const distro_diloco_options def = distro_diloco_options_default();
  distro_diloco_options o;
#define BAD(field, value)                                                                                      \
  do {                                                                                                         \
    o = def;                                                                                                   \
    o.field = value;                                                                                           \
    cr_assert_eq(try_create(o), DISTRO_ERR_INVALID, #field " = " #value " accepted");                            \
  } while (0)
  BAD(version, 0);
  BAD(H, 0);
  BAD(H, -5);
  BAD(fragments, 0);
  BAD(fragments, 501);
  BAD(overlap, -1);
  BAD(overlap, 500);
  BAD(alpha, -0.1f);
  BAD(alpha, 1.5f);
  BAD(alpha, NAN);
  BAD(outer_lr, NAN);
  BAD(outer_lr, -1.0f);
  BAD(outer_momentum, 1.0f);
  BAD(nesterov, 2);
  BAD(codec, (distro_outer_codec)17);
  BAD(codec_block, 0);
  BAD(merge, (distro_merge)17);
  BAD(fragmenting, (distro_fragmenting)17);
  BAD(max_block, -1);
  BAD(progress_thread, 3);
  /* tau < H/P */
  o = def;
  o.H = 10;
  o.fragments = 3;
  o.overlap = 4;
  cr_assert_eq(try_create(o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "overlap") != NULL, "%s", distro_last_error());
  o.overlap = 3;
  cr_assert_eq(try_create(o), DISTRO_OK);
  /* more fragments than blocks (layers for strided) */
  o = def;
  o.fragments = 5;
  o.fragmenting = DISTRO_FRAG_STRIDED;
  cr_assert_eq(try_create(o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "layers") != NULL, "%s", distro_last_error());
  o.fragmenting = DISTRO_FRAG_BALANCED;
  o.max_block = 1 << 20;
  cr_assert_eq(try_create(o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "blocks") != NULL, "%s", distro_last_error());
  o.max_block = 0;
  cr_assert_eq(try_create(o), DISTRO_OK);
  /* NULLs */
  distro_diloco *d = NULL;
  cr_assert_eq(distro_diloco_create(NULL, NULL, NULL, &d), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_create(&def, NULL, NULL, NULL), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_step(NULL, 0.1f, 0, NULL), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_save(NULL, "x"), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_load(NULL, "x"), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_sync_all(NULL, NULL), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_flush(NULL, NULL), DISTRO_ERR_INVALID);
  distro_diloco_free(NULL);
}

/* Too many fragments for tensors registered after create: every learner
 * fails its first step with DISTRO_ERR_INVALID, nothing stepped. Unknown
 * names in set_tensor, and corrupt state files, are rejected too. */
static distro_status late_rank(distro_comm *outer, int rank, void *arg) {
  (void)rank;
  distro_comm *c[1];
  distro_status *res = arg;
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  distro_diloco *d = NULL;
  distro_diloco_options o = distro_diloco_options_default();
  o.fragments = 3;
  o.fragmenting = DISTRO_FRAG_STRIDED;
  float p[8] = {0}, g[8] = {0};
  const int64_t sh[1] = {4};
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  cr_assert_eq(distro_diloco_create(&o, opt, outer, &d), DISTRO_OK);
  cr_assert_eq(distro_optim_add_param(opt, "a", p, g, 1, sh), DISTRO_OK);
  cr_assert_eq(distro_optim_add_param(opt, "b", p + 4, g + 4, 1, sh), DISTRO_OK);
  cr_assert_eq(distro_diloco_set_tensor(d, "nope", 0, 0), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_set_tensor(d, "a", 0, 4u), DISTRO_ERR_INVALID);
  distro_diloco_stats s;
  res[distro_comm_rank(outer)] = distro_diloco_step(d, 0.1f, 1, &s);
  cr_assert_eq(s.inner_done, 0);
  cr_assert_eq(p[0], 0.0f);
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  return DISTRO_OK;
}

Test(diloco, too_many_fragments_at_first_step) {
  distro_status res[2] = {DISTRO_OK, DISTRO_OK};
  cr_assert_eq(distro_comm_run_local(2, late_rank, res), DISTRO_OK);
  cr_assert_eq(res[0], DISTRO_ERR_INVALID);
  cr_assert_eq(res[1], DISTRO_ERR_INVALID);
}

static distro_status corrupt_file_rank(distro_comm *outer, int rank, void *arg) {
  const char *dir = arg;
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_options io = distro_options_default(DISTRO_ALG_ADAMW);
  distro_optim *opt = NULL;
  distro_diloco *d = NULL, *d2 = NULL;
  distro_diloco_options o = distro_diloco_options_default();
  o.H = 2;
  float *p = calloc(TOTAL, sizeof(float)), *g = calloc(TOTAL, sizeof(float));
  float *before = malloc(sizeof(float) * TOTAL), *after = malloc(sizeof(float) * TOTAL);
  cr_assert_eq(distro_optim_create(&io, c[0], &opt), DISTRO_OK);
  for (int i = 0; i < NT; i++)
    cr_assert_eq(distro_optim_add_param(opt, tnames[i], p + toff(i), g + toff(i), ndims[i], shapes[i]), DISTRO_OK);
  cr_assert_eq(distro_diloco_create(&o, opt, outer, &d), DISTRO_OK);
  for (int s = 0; s < 3; s++) cr_assert_eq(distro_diloco_step(d, 0.01f, 1, NULL), DISTRO_OK, "%s", distro_last_error());
  char path[128];
  snprintf(path, sizeof path, "%s/s%d.bin", dir, rank);
  cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK, "%s", distro_last_error());
  FILE *f = fopen(path, "r+b");
  fseek(f, -100, SEEK_END); /* inside the outer momentum */
  int ch = fgetc(f);
  fseek(f, -100, SEEK_END);
  fputc(ch ^ 1, f);
  fclose(f);
  cr_assert_eq(distro_diloco_get_global(d, "w0", before, tnumel(0)), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d, path), DISTRO_ERR_IO);
  cr_assert(strstr(distro_last_error(), "checksum") != NULL, "%s", distro_last_error());
  cr_assert_eq(distro_diloco_get_global(d, "w0", after, tnumel(0)), DISTRO_OK);
  cr_assert_eq(memcmp(before, after, sizeof(float) * (size_t)tnumel(0)), 0, "a failed load changed the state");
  /* a file from other options */
  distro_diloco_options o2 = o;
  o2.H = 3;
  cr_assert_eq(distro_diloco_create(&o2, opt, outer, &d2), DISTRO_OK);
  cr_assert_eq(distro_diloco_save(d, path), DISTRO_OK);
  cr_assert_eq(distro_diloco_load(d2, path), DISTRO_ERR_SHAPE);
  cr_assert(strstr(distro_last_error(), "H") != NULL, "%s", distro_last_error());
  cr_assert_eq(distro_diloco_get_global(d, "nope", before, 1), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_diloco_get_global(d, "w0", before, 3), DISTRO_ERR_INVALID);
  unlink(path);
  distro_diloco_free(d2);
  distro_diloco_free(d);
  distro_optim_free(opt);
  distro_comm_free(c[0]);
  free(p);
  free(g);
  free(before);
  free(after);
  return DISTRO_OK;
}

Test(diloco, state_file_checks) {
  char dir[] = "/tmp/distro_dlcf_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_eq(distro_comm_run_local(2, corrupt_file_rank, dir), DISTRO_OK);
  rmdir(dir);
}

/* Streaming: P fragments cut the peak bytes of any step ~P-fold at the same
 * total; INT4 payloads are ~7x smaller than F32. */
Test(diloco, streaming_and_codec_bytes, .timeout = 30) {
  uint64_t peak[3], total[3];
  const int P[3] = {1, 4, 4};
  for (int c = 0; c < 3; c++) {
    run x;
    run_init(&x, 2, 1, 16);
    x.dl.H = 8;
    x.dl.fragments = P[c];
    if (c == 2) x.dl.codec = DISTRO_OUTER_INT4;
    run_exec(&x);
    expect_ok(&x, "bytes");
    peak[c] = x.stats[0][0][15].peak_outer_bytes_sent;
    total[c] = x.stats[0][0][15].total_outer_bytes_sent;
    uint64_t sum = 0;
    for (int s = 0; s < 16; s++) sum += x.stats[0][0][s].outer_bytes_sent;
    cr_assert_eq(sum, total[c]);
    run_free(&x);
  }
  cr_assert_geq((double)peak[0] / (double)peak[1], 0.8 * 4, "peak P=1 %llu, P=4 %llu", (unsigned long long)peak[0],
                (unsigned long long)peak[1]);
  cr_assert_lt(fabs((double)total[0] - (double)total[1]) / (double)total[0], 0.03, "same data per H steps");
  cr_assert_geq((double)total[1] / (double)total[2], 6.0, "int4 %llu vs f32 %llu", (unsigned long long)total[2],
                (unsigned long long)total[1]);
}

/* With 200 ms of outer latency and 50 ms of compute per step, the progress
 * thread hides most of each exchange behind the tau = 3 following steps:
 * blocking costs >= 200 (agreement) + 11 x 50 + 2 x 200 ms; with the thread
 * about 200 + 11 x 50 + 2 x 50. */
Test(diloco, progress_thread_hides_latency, .timeout = 60) {
  run x[2];
  for (int th = 0; th < 2; th++) {
    run_init(&x[th], 3, 1, 11);
    if (th) x[th].seed = x[0].seed;
    x[th].dl.H = 4;
    x[th].dl.overlap = 3;
    x[th].dl.progress_thread = th;
    x[th].sleep_ms = 50;
    x[th].delay_ms = 200;
    run_exec(&x[th]);
    expect_ok(&x[th], "latency");
  }
  for (int m = 0; m < 3; m++) cr_assert_eq(first_diff(x[0].out[m][0], x[1].out[m][0]), -1);
  double waited = 0;
  for (int s = 0; s < 11; s++) waited += x[1].stats[0][0][s].seconds_wait;
  cr_log_info("outer latency 200 ms, compute 50 ms/step, tau 3: blocking %.3f s, progress thread %.3f s "
              "(waited %.3f s)", x[0].seconds, x[1].seconds, waited);
  cr_assert_lt(x[1].seconds + 0.2, x[0].seconds, "blocking %.3f s, progress thread %.3f s", x[0].seconds,
               x[1].seconds);
  cr_assert_lt(waited, 0.25, "waited %.3f s for the progress thread", waited);
  run_free(&x[0]);
  run_free(&x[1]);
}
