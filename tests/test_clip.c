/* options.clip_norm: each tensor's gradient clipped by its own norm to
 * clip_norm * sqrt(its usual share of the squared norm), inside the step.
 *  - With clip_norm the step is the step without it on gradients the caller
 *    clipped in place by the rule, which this file computes itself in
 *    float64, bit for bit: DeMo sign, DisTrO-AdamW blocking and look-ahead,
 *    the AdamW baseline, at 1 and 2 ranks. The gradients are multiples of
 *    1/64, so every sum of squares is exact in any order and the
 *    reference's scales are exactly the library's.
 *  - The shares in the saved state and distro_optim_grad_norm are the
 *    reference's; the caller's gradient buffers are not written.
 *  - A save and load resume the shares; a state saved without a clip loads
 *    with fresh ones; lying shares are refused as corrupt.
 *  - A non-finite gradient is refused and leaves the shares; bad options
 *    are refused by name; a version 3 options struct still works.
 * The BACKWARD mode with a clip is the blocking step bit for bit
 * (test_backward.c). Inputs are fresh each run; a failure prints
 * DISTRO_TEST_SEED to replay. */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <distro/distro.h>
#include "testutil.h"
#include "state_file.h"

#define NT 3
#define STEPS 7
#define MAXW 2
static const char *const names[NT] = {"w", "b", "e"};
static const int ndims[NT] = {2, 1, 3};
static const int64_t sh_w[] = {96, 64}, sh_b[] = {100}, sh_e[] = {3, 40, 20};
static const int64_t *const shapes[NT] = {sh_w, sh_b, sh_e};
static const int64_t numels[NT] = {96 * 64, 100, 3 * 40 * 20};
#define TOTAL (96 * 64 + 100 + 3 * 40 * 20)

static float lr_at(int s) { return s < 3 ? 0.003f * (float)(s + 1) : 0.01f; }

/* Rank r's gradient of tensor t at step s: k / 64, k uniform in [-64 a,
 * 64 a], with an amplitude a that moves from step to step (so the shares
 * move and some tensors are clipped, some not). */
static void gradient(uint64_t seed, int s, int r, int t, float *g) {
  tu_rng rg = {seed * 1000003u + (uint64_t)(s * 64 + r * 8 + t)};
  const int a = 1 << (int)(tu_next(&rg) % 4); /* 1, 2, 4, 8 */
  for (int64_t i = 0; i < numels[t]; i++) g[i] = (float)((int64_t)(tu_next(&rg) % (uint64_t)(128 * a + 1)) - 64 * a) / 64.0f;
}

/* The rule, in float64: the reference's shares and this step's scales. */
typedef struct {
  double share[NT], ss[NT];
} ref_clip;

static void ref_init(ref_clip *c) {
  for (int t = 0; t < NT; t++) c->share[t] = (double)numels[t] / (double)TOTAL;
}

/* Clips g in place (the caller's clip), returns how many tensors it scaled. */
static int ref_clip_step(ref_clip *c, float clip, float *g[NT]) {
  int scaled = 0;
  for (int t = 0; t < NT; t++) {
    double ss = 0;
    for (int64_t i = 0; i < numels[t]; i++) ss += (double)g[t][i] * (double)g[t][i];
    c->ss[t] = ss;
    const double budget = (double)clip * sqrt(c->share[t]), norm = sqrt(ss);
    if (norm > budget) {
      const float k = (float)(budget / norm);
      for (int64_t i = 0; i < numels[t]; i++) g[t][i] *= k;
      scaled++;
    }
  }
  return scaled;
}

static double ref_commit(ref_clip *c) {
  double tot = 0;
  for (int t = 0; t < NT; t++) tot += c->ss[t];
  if (tot > 0)
    for (int t = 0; t < NT; t++) c->share[t] = 0.9 * c->share[t] + 0.1 * c->ss[t] / tot;
  return sqrt(tot);
}

typedef struct {
  distro_options opt;
  int world, caller_clips; /* caller_clips: the reference clips, the optimizer does not */
  float clip;
  uint64_t seed;
  /* out */
  float *params[MAXW][NT];
  double norm[MAXW][STEPS];   /* distro_optim_grad_norm (library clip) or the reference's */
  double share[MAXW][NT];     /* the reference's shares at the end */
  int scaled;                 /* tensors the reference scaled, over the run (rank 0) */
  int grads_untouched;
  char err[MAXW][512];
} run;

static distro_status rank_fn(distro_comm *comm, int r, void *arg) {
  run *x = arg;
  float *p[NT], *g[NT], *keep[NT];
  distro_optim *o = NULL;
  ref_clip c;
  ref_init(&c);
  distro_options opt = x->opt;
  opt.clip_norm = x->caller_clips ? 0.0f : x->clip;
  distro_status st = distro_optim_create(&opt, comm, &o);
  for (int t = 0; t < NT; t++) {
    p[t] = malloc(sizeof(float) * (size_t)numels[t]);
    g[t] = malloc(sizeof(float) * (size_t)numels[t]);
    keep[t] = malloc(sizeof(float) * (size_t)numels[t]);
    tu_rng rp = {x->seed + 99u + (uint64_t)t}; /* the same start on every rank */
    tu_fill_normal(&rp, p[t], (size_t)numels[t], 0.5f);
    if (st == DISTRO_OK) st = distro_optim_add_param(o, names[t], p[t], g[t], ndims[t], shapes[t]);
  }
  int untouched = 1;
  for (int s = 0; s < STEPS && st == DISTRO_OK; s++) {
    for (int t = 0; t < NT; t++) gradient(x->seed, s, r, t, g[t]);
    if (x->caller_clips) {
      const int n = ref_clip_step(&c, x->clip, g);
      if (r == 0) x->scaled += n;
    } else {
      for (int t = 0; t < NT; t++) memcpy(keep[t], g[t], sizeof(float) * (size_t)numels[t]);
    }
    st = distro_optim_step(o, lr_at(s), NULL);
    if (st != DISTRO_OK) break;
    if (x->caller_clips) {
      x->norm[r][s] = ref_commit(&c);
    } else {
      for (int t = 0; t < NT; t++) untouched &= !memcmp(keep[t], g[t], sizeof(float) * (size_t)numels[t]);
      st = distro_optim_grad_norm(o, &x->norm[r][s]);
    }
  }
  if (st == DISTRO_OK) st = distro_optim_flush(o, NULL);
  if (st != DISTRO_OK) snprintf(x->err[r], 512, "%s", distro_last_error());
  if (r == 0) x->grads_untouched = untouched;
  for (int t = 0; t < NT; t++) {
    x->params[r][t] = p[t];
    x->share[r][t] = c.share[t];
    free(g[t]);
    free(keep[t]);
  }
  distro_optim_free(o);
  return st;
}

static run *exec(distro_options opt, int world, int caller_clips, float clip, uint64_t seed) {
  run *x = calloc(1, sizeof *x);
  cr_assert(x);
  x->opt = opt;
  x->world = world;
  x->caller_clips = caller_clips;
  x->clip = clip;
  x->seed = seed;
  const distro_status st = distro_comm_run_local(world, rank_fn, x);
  cr_assert_eq(st, DISTRO_OK, "world %d, caller clips %d: %s / %s (DISTRO_TEST_SEED=%llu)", world, caller_clips,
               x->err[0], x->err[world - 1], (unsigned long long)seed);
  return x;
}

static void release(run *x) {
  for (int r = 0; r < MAXW; r++)
    for (int t = 0; t < NT; t++) free(x->params[r][t]);
  free(x);
}

static distro_options with(distro_algorithm alg, distro_update u, int overlap) {
  distro_options o = distro_options_default(alg);
  o.update = u;
  o.topk = 8;
  o.overlap = overlap;
  return o;
}

Test(clip, the_step_on_gradients_the_caller_clipped_bit_for_bit, .timeout = 120) {
  const uint64_t seed = tu_seed();
  const struct {
    const char *label;
    distro_options opt;
  } cases[] = {
      {"DeMo sign", with(DISTRO_ALG_DEMO, DISTRO_UPDATE_SIGN, DISTRO_OVERLAP_OFF)},
      {"DisTrO-AdamW", with(DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_OVERLAP_OFF)},
      {"DisTrO-AdamW look-ahead", with(DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_OVERLAP_LOOKAHEAD)},
      {"AdamW all-reduce", with(DISTRO_ALG_ADAMW, DISTRO_UPDATE_SIGN, DISTRO_OVERLAP_OFF)},
  };
  /* The gradients' norms run about 4 to 300: this clips some steps' tensors. */
  const float clip = 60.0f;
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
    for (int world = 1; world <= MAXW; world++) {
      run *lib = exec(cases[k].opt, world, 0, clip, seed), *ref = exec(cases[k].opt, world, 1, clip, seed);
      cr_assert(ref->scaled > 0 && ref->scaled < STEPS * NT, "%s: the reference scaled %d of %d tensor-steps",
                cases[k].label, ref->scaled, STEPS * NT);
      cr_assert(lib->grads_untouched, "%s: the step wrote the caller's gradient", cases[k].label);
      for (int r = 0; r < world; r++) {
        for (int t = 0; t < NT; t++)
          cr_assert(!memcmp(lib->params[r][t], ref->params[r][t], sizeof(float) * (size_t)numels[t]),
                    "%s, %d rank(s), rank %d '%s': the clipped step differs from the step on the caller's clipped "
                    "gradients (DISTRO_TEST_SEED=%llu)",
                    cases[k].label, world, r, names[t], (unsigned long long)seed);
        for (int s = 0; s < STEPS; s++)
          cr_assert(fabs(lib->norm[r][s] - ref->norm[r][s]) <= 1e-12 * ref->norm[r][s],
                    "%s rank %d step %d: grad norm %.17g, reference %.17g", cases[k].label, r, s + 1,
                    lib->norm[r][s], ref->norm[r][s]);
      }
      release(lib);
      release(ref);
    }
}

/* ---- one rank, for the state file ---------------------------------------- */

typedef struct {
  distro_comm *comm;
  distro_optim *o;
  float *p[NT], *g[NT];
} model;

static model *model_new(distro_options opt) {
  model *m = calloc(1, sizeof *m);
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  m->comm = c[0];
  cr_assert_eq(distro_optim_create(&opt, m->comm, &m->o), DISTRO_OK, "%s", distro_last_error());
  for (int t = 0; t < NT; t++) {
    m->p[t] = calloc((size_t)numels[t], sizeof(float));
    m->g[t] = calloc((size_t)numels[t], sizeof(float));
    cr_assert_eq(distro_optim_add_param(m->o, names[t], m->p[t], m->g[t], ndims[t], shapes[t]), DISTRO_OK);
  }
  return m;
}

static void model_free(model *m) {
  distro_optim_free(m->o);
  distro_comm_free(m->comm);
  for (int t = 0; t < NT; t++) {
    free(m->p[t]);
    free(m->g[t]);
  }
  free(m);
}

static void steps(model *m, uint64_t seed, int from, int to) {
  for (int s = from; s < to; s++) {
    for (int t = 0; t < NT; t++) gradient(seed, s, 0, t, m->g[t]);
    cr_assert_eq(distro_optim_step(m->o, lr_at(s), NULL), DISTRO_OK, "%s", distro_last_error());
  }
}

static int same(const model *a, const model *b) {
  for (int t = 0; t < NT; t++)
    if (memcmp(a->p[t], b->p[t], sizeof(float) * (size_t)numels[t])) return 0;
  return 1;
}

static char path[256];

#define CLIP_RECORD (8 + 4 + 24 + 8 + 20 + 4 + 8) /* magic .. step, warm-up, pending, spread */

Test(clip, shares_are_saved_and_resumed) {
  snprintf(path, sizeof path, "/tmp/distro_clip_%d.bin", (int)getpid());
  const uint64_t seed = tu_seed();
  distro_options d = with(DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_OVERLAP_OFF);
  d.clip_norm = 60.0f;
  model *a = model_new(d), *b = model_new(d);
  steps(a, seed, 0, 4);
  cr_assert_eq(distro_optim_save(a->o, path), DISTRO_OK, "%s", distro_last_error());
  /* The file's shares are the reference's after those steps. */
  ref_clip c;
  ref_init(&c);
  for (int s = 0; s < 4; s++) {
    float *g[NT];
    for (int t = 0; t < NT; t++) {
      g[t] = malloc(sizeof(float) * (size_t)numels[t]);
      gradient(seed, s, 0, t, g[t]);
    }
    ref_clip_step(&c, d.clip_norm, g);
    ref_commit(&c);
    for (int t = 0; t < NT; t++) free(g[t]);
  }
  long n;
  unsigned char *buf = sf_slurp(path, &n);
  uint32_t nshares;
  memcpy(&nshares, buf + CLIP_RECORD, 4);
  cr_assert_eq(nshares, NT);
  for (int t = 0; t < NT; t++) {
    double s;
    memcpy(&s, buf + CLIP_RECORD + 4 + 8 * t, 8);
    cr_assert(fabs(s - c.share[t]) <= 1e-15 * c.share[t], "'%s': saved share %.17g, reference %.17g", names[t], s,
              c.share[t]);
  }
  /* Resumed, the run goes on as the uninterrupted one. */
  for (int t = 0; t < NT; t++) memcpy(b->p[t], a->p[t], sizeof(float) * (size_t)numels[t]);
  cr_assert_eq(distro_optim_load(b->o, path), DISTRO_OK, "%s", distro_last_error());
  double norm;
  cr_assert_eq(distro_optim_grad_norm(b->o, &norm), DISTRO_ERR_INVALID, "a loaded optimizer has no step's norm yet");
  steps(a, seed, 4, STEPS);
  steps(b, seed, 4, STEPS);
  cr_assert(same(a, b), "the run resumed with the saved shares differs (DISTRO_TEST_SEED=%llu)",
            (unsigned long long)seed);
  /* Lying shares (NaN, above 1, a count that is neither 0 nor the tensors')
   * are refused as corrupt, and the refused load changes nothing. */
  char bad[300];
  snprintf(bad, sizeof bad, "%s.bad", path);
  for (int k = 0; k < 3; k++) {
    unsigned char *l = malloc((size_t)n);
    memcpy(l, buf, (size_t)n);
    const double nan = NAN, two = 2.0;
    const uint32_t count = 2;
    if (k == 0) memcpy(l + CLIP_RECORD + 4, &nan, 8);
    if (k == 1) memcpy(l + CLIP_RECORD + 4 + 16, &two, 8);
    if (k == 2) memcpy(l + CLIP_RECORD, &count, 4);
    sf_spill(bad, l, n);
    free(l);
    model *f = model_new(d), *g = model_new(d);
    const distro_status st = distro_optim_load(f->o, bad);
    cr_expect_eq(st, DISTRO_ERR_IO, "lie %d: %s (%s)", k, distro_status_string(st), distro_last_error());
    cr_expect(strstr(distro_last_error(), "corrupt clip"), "lie %d: %s", k, distro_last_error());
    steps(f, seed, 0, 3);
    steps(g, seed, 0, 3);
    cr_assert(same(f, g), "lie %d: the refused load changed the optimizer", k);
    model_free(f);
    model_free(g);
  }
  unlink(bad);
  free(buf);
  /* A state saved without a clip loads into one that clips, with fresh
   * shares: as a clipping run from that state. */
  distro_options plain = d;
  plain.clip_norm = 0.0f;
  model *u = model_new(plain), *v = model_new(d), *w = model_new(d);
  steps(u, seed, 0, 3);
  cr_assert_eq(distro_optim_save(u->o, path), DISTRO_OK, "%s", distro_last_error());
  buf = sf_slurp(path, &n);
  memcpy(&nshares, buf + CLIP_RECORD, 4);
  cr_assert_eq(nshares, 0, "a state without a clip holds %u shares", nshares);
  free(buf);
  cr_assert_eq(distro_optim_load(v->o, path), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_optim_load(w->o, path), DISTRO_OK, "%s", distro_last_error());
  steps(v, seed, 3, 6);
  steps(w, seed, 3, 6);
  cr_assert(same(v, w));
  unlink(path);
  model_free(a);
  model_free(b);
  model_free(u);
  model_free(v);
  model_free(w);
}

/* A NaN in the gradient: the step is refused and the shares stay, so the
 * run goes on as one that never saw that gradient. */
Test(clip, a_refused_step_leaves_the_shares) {
  const uint64_t seed = tu_seed();
  distro_options d = with(DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_OVERLAP_OFF);
  d.clip_norm = 60.0f;
  model *a = model_new(d), *b = model_new(d);
  steps(a, seed, 0, 3);
  steps(b, seed, 0, 3);
  for (int t = 0; t < NT; t++) gradient(seed, 9, 0, t, b->g[t]);
  b->g[1][7] = NAN;
  cr_assert_eq(distro_optim_step(b->o, lr_at(3), NULL), DISTRO_ERR_NONFINITE, "%s", distro_last_error());
  double na, nb;
  cr_assert_eq(distro_optim_grad_norm(a->o, &na), DISTRO_OK);
  cr_assert_eq(distro_optim_grad_norm(b->o, &nb), DISTRO_OK);
  cr_assert(na == nb, "the refused step changed the reported norm (%g, %g)", na, nb);
  steps(a, seed, 3, 6);
  steps(b, seed, 3, 6);
  cr_assert(same(a, b), "the refused step changed the clip (DISTRO_TEST_SEED=%llu)", (unsigned long long)seed);
  model_free(a);
  model_free(b);
}

/* The version 3 struct ended before clip_norm. */
typedef struct {
  int version;
  distro_algorithm algorithm;
  float lr, beta1, beta2, eps, weight_decay, compression_decay;
  int chunk, topk;
  distro_update update;
  distro_values values;
  int wire_version, drop_invalid_peers, threads;
  float clip_median_multiple;
  int overlap;
} options_v3;

Test(clip, options) {
  distro_comm *c[1];
  cr_assert_eq(distro_comm_local_group(1, c), DISTRO_OK);
  distro_optim *o = NULL;
  const float bad[] = {-1.0f, NAN, INFINITY};
  for (int k = 0; k < 3; k++) {
    distro_options d = distro_options_default(DISTRO_ALG_DEMO);
    d.clip_norm = bad[k];
    cr_assert_eq(distro_optim_create(&d, c[0], &o), DISTRO_ERR_INVALID, "clip_norm %g accepted", (double)bad[k]);
    cr_assert(strstr(distro_last_error(), "clip_norm"), "%s", distro_last_error());
    cr_assert_null(o);
  }
  cr_assert_eq(distro_options_default(DISTRO_ALG_DEMO).clip_norm, 0.0f);
  /* Without a clip the step does not measure the norm; before a step there is none. */
  distro_options d = distro_options_default(DISTRO_ALG_DEMO);
  double norm;
  cr_assert_eq(distro_optim_create(&d, c[0], &o), DISTRO_OK);
  cr_assert_eq(distro_optim_grad_norm(o, &norm), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "clip_norm"), "%s", distro_last_error());
  distro_optim_free(o);
  d.clip_norm = 1.0f;
  cr_assert_eq(distro_optim_create(&d, c[0], &o), DISTRO_OK);
  cr_assert_eq(distro_optim_grad_norm(o, &norm), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "no step"), "%s", distro_last_error());
  distro_optim_free(o);
  /* A version 3 struct, followed in memory by what would be a negative
   * clip_norm: read no further than its end. */
  struct {
    options_v3 v3;
    float after;
  } old;
  distro_options cur = distro_options_default(DISTRO_ALG_DEMO);
  cr_assert_eq(sizeof old.v3, offsetof(distro_options, clip_norm));
  memcpy(&old.v3, &cur, sizeof old.v3);
  old.v3.version = 3;
  old.after = -5.0f;
  cr_assert_eq(distro_optim_create((const distro_options *)(const void *)&old.v3, c[0], &o), DISTRO_OK, "%s",
               distro_last_error());
  cr_assert_eq(distro_optim_grad_norm(o, &norm), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "clip_norm is 0"), "a version 3 struct clips: %s", distro_last_error());
  distro_optim_free(o);
  cur.version = 2;
  cr_assert_eq(distro_optim_create(&cur, c[0], &o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "version"), "%s", distro_last_error());
  distro_comm_free(c[0]);
}
