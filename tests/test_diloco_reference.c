/* DiLoCo outer loop, part 1: M learners through the public API against a
 * float64 reference of the whole schedule (inner SGD, fragments, overlap,
 * alpha, Nesterov, the merges), and plain data-parallel at H = 1. Runs that
 * check bit-identity, overlap, save/load and bad payloads are in
 * test_diloco_runs.c; options and state files in test_diloco_api.c. */
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
#include "diloco_util.h"
#include "optim/diloco_internal.h"
#include "optim/fragment.h"
#include "testutil.h"

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
