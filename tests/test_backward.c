/* The gradient-ready exchange (options.overlap = DISTRO_OVERLAP_BACKWARD):
 *  - on the same gradients its parameters are the blocking step's after
 *    every step, bit for bit, on every rank, whatever is marked ready
 *    before the step (all tensors, backward's order; some; none), with a
 *    different thread count, and its bytes are the blocking step's plus
 *    the buckets' headers;
 *  - ranks that mark in different orders, and a payload corrupted in
 *    transit, fail the step on every rank with nothing applied (or drop the
 *    peer, with drop_invalid_peers, alike on every rank), and the next step
 *    runs;
 *  - what it refuses: an unknown or twice-marked tensor, a step with
 *    another lr than the marks', a load between a mark and its step, wire
 *    version 1, and (not an error) marks without BACKWARD do nothing.
 * The blocking step itself is checked against the float64 reference in
 * test_reference_step.c; here the reference is that step. Inputs are fresh
 * each run; a failure prints DISTRO_TEST_SEED to replay. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <distro/distro.h>

#include "testutil.h"
/* tests/CMakeLists.txt compiles only testutil.c next to each suite. */
#include "demo_ref.c"
#include "corrupt_comm.h"

#include "overlap_fixture.h"

#define STEPS 6
#define MAXW 3

/* What each step marks before distro_optim_step. */
typedef enum { MARK_ALL_REVERSED, MARK_SOME, MARK_NONE, MARK_ORDER_BY_RANK } marks;

typedef struct {
  distro_options opt;
  int world, threads;
  uint64_t seed;
  marks mark;
  int corrupt_rank, corrupt_step; /* >= 0: damage that rank's payloads at that step */
  /* out */
  float *snap[STEPS][MAXW][NT]; /* parameters after each step (NULL: the step failed) */
  distro_status st[STEPS][MAXW];
  char err[STEPS][MAXW][512];
  distro_step_stats stats[STEPS][MAXW];
} run;

static float lr_of(const run *x, int s) { return (x->opt.update == DISTRO_UPDATE_SIGN ? 0.01f : 2e-3f) * (1 + 0.3f * s); }

/* Which tensors rank r marks at step s, in order; returns how many. */
static int mark_list(const run *x, int s, int r, int *out) {
  int n = 0;
  switch (x->mark) {
    case MARK_ALL_REVERSED:
      for (int t = NT - 1; t >= 0; t--) out[n++] = t;
      break;
    case MARK_SOME: /* alternate steps: the last half, then none */
      if (s % 2 == 0)
        for (int t = NT - 1; t >= NT / 2; t--) out[n++] = t;
      break;
    case MARK_NONE:
      break;
    case MARK_ORDER_BY_RANK: /* step 2 only: rank 0 backward's order, the others forward */
      for (int t = 0; t < NT; t++) out[n++] = s == 2 && r == 0 ? NT - 1 - t : t;
      break;
  }
  return n;
}

static distro_status rank_fn(distro_comm *comm, int r, void *arg) {
  run *x = arg;
  distro_status st = DISTRO_OK;
  tu_corrupting k = {.inner = comm, .corrupt_rank = x->corrupt_rank, .corrupt_self = 1};
  distro_comm wrapped;
  tu_corrupting_wrap(&k, &wrapped);
  omp_set_num_threads(x->threads);
  float *p[NT], *g[NT];
  for (int t = 0; t < NT; t++) {
    p[t] = malloc(sizeof(float) * (size_t)numel(t));
    g[t] = malloc(sizeof(float) * (size_t)numel(t));
    tu_rng ri = {mix(x->seed, 1000 + (uint64_t)t)}; /* the same start on every rank */
    tu_fill_normal(&ri, p[t], (size_t)numel(t), 0.5f);
  }
  distro_optim *o = NULL;
  st = distro_optim_create(&x->opt, &wrapped, &o);
  for (int t = 0; t < NT && st == DISTRO_OK; t++) st = distro_optim_add_param(o, names[t], p[t], g[t], ndims[t], shapes[t]);
  for (int s = 0; s < STEPS && st == DISTRO_OK; s++) {
    for (int t = 0; t < NT; t++) {
      tu_rng rg = {mix(x->seed, (uint64_t)(s * 64 + r * 8 + t) + 7)}; /* each rank its own */
      tu_fill_normal(&rg, g[t], (size_t)numel(t), 1.0f);
    }
    k.armed = s == x->corrupt_step;
    int list[NT];
    const int n = mark_list(x, s, r, list);
    distro_status ms = DISTRO_OK;
    for (int i = 0; i < n && ms == DISTRO_OK; i++) ms = distro_optim_grad_ready(o, names[list[i]], lr_of(x, s));
    if (ms != DISTRO_OK) {
      snprintf(x->err[s][r], 512, "grad_ready: %s", distro_last_error());
      st = ms;
      break;
    }
    x->st[s][r] = distro_optim_step(o, lr_of(x, s), &x->stats[s][r]);
    if (x->st[s][r] != DISTRO_OK) snprintf(x->err[s][r], 512, "%s", distro_last_error());
    for (int t = 0; t < NT; t++) {
      x->snap[s][r][t] = malloc(sizeof(float) * (size_t)numel(t));
      memcpy(x->snap[s][r][t], p[t], sizeof(float) * (size_t)numel(t));
    }
  }
  distro_optim_free(o);
  for (int t = 0; t < NT; t++) {
    free(p[t]);
    free(g[t]);
  }
  return st;
}

static void exec(run *x) {
  distro_status st = distro_comm_run_local(x->world, rank_fn, x);
  cr_assert_eq(st, DISTRO_OK, "world %d: %s / %s (DISTRO_TEST_SEED=%llu)", x->world, x->err[0][0],
               x->err[0][x->world - 1], (unsigned long long)x->seed);
}

static void release(run *x) {
  for (int s = 0; s < STEPS; s++)
    for (int r = 0; r < MAXW; r++)
      for (int t = 0; t < NT; t++) free(x->snap[s][r][t]);
}

static run *new_run(distro_options opt, int world, int threads, uint64_t seed, marks m) {
  run *x = calloc(1, sizeof *x);
  cr_assert(x);
  x->opt = opt;
  x->world = world;
  x->threads = threads;
  x->seed = seed;
  x->mark = m;
  x->corrupt_rank = x->corrupt_step = -1;
  return x;
}

Test(backward, the_blocking_step_bit_for_bit, .timeout = 180) {
  const uint64_t seed = tu_seed();
  const marks kinds[] = {MARK_ALL_REVERSED, MARK_SOME, MARK_NONE};
  for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
    if (modes[mi].wire == 1) continue; /* refused: below */
    for (int world = 1; world <= MAXW; world++) {
      const uint64_t s0 = mix(seed, mi * 8 + (uint64_t)world);
      run *b = new_run(mode_opts(&modes[mi], DISTRO_OVERLAP_OFF), world, 1, s0, MARK_ALL_REVERSED);
      exec(b);
      for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
        run *v = new_run(mode_opts(&modes[mi], DISTRO_OVERLAP_BACKWARD), world, 2, s0, kinds[ki]);
        exec(v);
        for (int s = 0; s < STEPS; s++)
          for (int r = 0; r < world; r++) {
            cr_assert_eq(v->st[s][r], DISTRO_OK, "%s world %d marks %zu step %d rank %d: %s", modes[mi].label, world,
                         ki, s + 1, r, v->err[s][r]);
            for (int t = 0; t < NT; t++)
              cr_assert(same(v->snap[s][r][t], b->snap[s][r][t], t),
                        "%s world %d marks %zu rank %d '%s': step %d differs from the blocking step "
                        "(DISTRO_TEST_SEED=%llu)",
                        modes[mi].label, world, ki, r, names[t], s + 1, (unsigned long long)seed);
            /* Bytes: the blocking payload plus a header per bucket. */
            const double ratio = (double)v->stats[s][r].bytes_sent / (double)b->stats[s][r].bytes_sent;
            cr_assert(ratio >= 1.0 && ratio <= 1.25, "%s world %d step %d: %llu bytes sent, blocking %llu",
                      modes[mi].label, world, s + 1, (unsigned long long)v->stats[s][r].bytes_sent,
                      (unsigned long long)b->stats[s][r].bytes_sent);
            cr_assert_eq(v->stats[s][r].step, s + 1);
            /* The compress and encode done in grad_ready count as the step's. */
            cr_assert(v->stats[s][r].seconds_topk > 0, "%s world %d marks %zu step %d: no selection time reported",
                      modes[mi].label, world, ki, s + 1);
          }
        release(v);
        free(v);
      }
      release(b);
      free(b);
    }
  }
}

/* options.clip_norm: a marked tensor is clipped when it is marked, the
 * others at the step, by the same rule as the blocking step's: still that
 * step bit for bit. Gradients are N(0, 1), their tensors' norms 1 to 110
 * against budgets of 20 sqrt(share), so most tensors are clipped. */
Test(backward, with_a_clip_the_blocking_step_bit_for_bit, .timeout = 120) {
  const uint64_t seed = tu_seed();
  const marks kinds[] = {MARK_ALL_REVERSED, MARK_SOME};
  const int mi[] = {0, 2};
  for (int k = 0; k < 2; k++) {
    distro_options bo = mode_opts(&modes[mi[k]], DISTRO_OVERLAP_OFF), vo = mode_opts(&modes[mi[k]], DISTRO_OVERLAP_BACKWARD);
    bo.clip_norm = vo.clip_norm = 20.0f;
    const int world = 3;
    run *b = new_run(bo, world, 1, seed, MARK_ALL_REVERSED), *u = new_run(mode_opts(&modes[mi[k]], DISTRO_OVERLAP_OFF), world, 1, seed, MARK_ALL_REVERSED);
    exec(b);
    exec(u);
    int clipped = 0;
    for (int t = 0; t < NT; t++) clipped += !same(b->snap[STEPS - 1][0][t], u->snap[STEPS - 1][0][t], t);
    cr_assert(clipped > 0, "%s: the clip changed nothing", modes[mi[k]].label);
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
      run *v = new_run(vo, world, 2, seed, kinds[ki]);
      exec(v);
      for (int s = 0; s < STEPS; s++)
        for (int r = 0; r < world; r++) {
          cr_assert_eq(v->st[s][r], DISTRO_OK, "%s step %d rank %d: %s", modes[mi[k]].label, s + 1, r, v->err[s][r]);
          for (int t = 0; t < NT; t++)
            cr_assert(same(v->snap[s][r][t], b->snap[s][r][t], t),
                      "%s marks %zu rank %d '%s': step %d with a clip differs from the blocking step's "
                      "(DISTRO_TEST_SEED=%llu)",
                      modes[mi[k]].label, ki, r, names[t], s + 1, (unsigned long long)seed);
        }
      release(v);
      free(v);
    }
    release(b);
    release(u);
    free(b);
    free(u);
  }
}

/* Step 3 (index 2): rank 0 marks in backward's order, the others forward.
 * Every rank fails that step, nothing moves, and step 4 runs. */
Test(backward, ranks_marking_in_different_orders_fail_together, .timeout = 60) {
  const uint64_t seed = tu_seed();
  run *v = new_run(mode_opts(&modes[2], DISTRO_OVERLAP_BACKWARD), 3, 1, seed, MARK_ORDER_BY_RANK);
  exec(v);
  for (int r = 0; r < 3; r++) {
    cr_assert_eq(v->st[1][r], DISTRO_OK, "rank %d step 2: %s", r, v->err[1][r]);
    cr_assert_eq(v->st[2][r], DISTRO_ERR_PAYLOAD, "rank %d step 3: %s (DISTRO_TEST_SEED=%llu)", r, v->err[2][r],
                 (unsigned long long)seed);
    cr_assert(strstr(v->err[2][r], "order"), "rank %d: the error does not say why: %s", r, v->err[2][r]);
    cr_assert_eq(v->st[3][r], DISTRO_OK, "rank %d step 4 after the failure: %s", r, v->err[3][r]);
    for (int t = 0; t < NT; t++) {
      cr_assert(same(v->snap[2][r][t], v->snap[1][r][t], t), "rank %d '%s': the failed step moved it", r, names[t]);
      cr_assert(!same(v->snap[3][r][t], v->snap[2][r][t], t) || numel(t) == 1, "rank %d '%s': step 4 did not move it",
                r, names[t]);
      cr_assert(same(v->snap[3][r][t], v->snap[3][0][t], t), "rank %d differs from rank 0 after step 4", r);
    }
  }
  release(v);
  free(v);
}

Test(backward, corrupted_bucket_fails_or_drops_alike, .timeout = 60) {
  const uint64_t seed = tu_seed();
  for (int drop = 0; drop <= 1; drop++) {
    distro_options o = mode_opts(&modes[2], DISTRO_OVERLAP_BACKWARD);
    o.drop_invalid_peers = drop;
    run *v = new_run(o, 3, 1, seed, MARK_ALL_REVERSED);
    v->corrupt_rank = 1;
    v->corrupt_step = 2;
    exec(v);
    for (int r = 0; r < 3; r++) {
      if (!drop) {
        cr_assert_eq(v->st[2][r], DISTRO_ERR_PAYLOAD, "rank %d: %s (DISTRO_TEST_SEED=%llu)", r, v->err[2][r],
                     (unsigned long long)seed);
        for (int t = 0; t < NT; t++)
          cr_assert(same(v->snap[2][r][t], v->snap[1][r][t], t), "rank %d '%s': the failed step moved it", r,
                    names[t]);
      } else {
        cr_assert_eq(v->st[2][r], DISTRO_OK, "rank %d: %s", r, v->err[2][r]);
        cr_assert(v->stats[2][r].peers_dropped == 1 && v->stats[2][r].peers_dropped_mask == 2,
                  "rank %d dropped %d peers (mask %llx), want rank 1", r, v->stats[2][r].peers_dropped,
                  (unsigned long long)v->stats[2][r].peers_dropped_mask);
        for (int t = 0; t < NT; t++) cr_assert(same(v->snap[2][r][t], v->snap[2][0][t], t), "rank %d differs", r);
      }
      cr_assert_eq(v->st[3][r], DISTRO_OK, "rank %d step 4: %s", r, v->err[3][r]);
    }
    release(v);
    free(v);
  }
}

/* One rank, by hand: what is refused, and that a refusal changes nothing. */
static distro_status refusals(distro_comm *comm, int r, void *arg) {
  (void)r;
  const uint64_t seed = *(const uint64_t *)arg;
  distro_options opt = mode_opts(&modes[0], DISTRO_OVERLAP_BACKWARD);
  float *p[NT], *g[NT], *kept[NT];
  tu_rng rng = {seed};
  for (int t = 0; t < NT; t++) {
    p[t] = malloc(sizeof(float) * (size_t)numel(t));
    g[t] = malloc(sizeof(float) * (size_t)numel(t));
    kept[t] = malloc(sizeof(float) * (size_t)numel(t));
    tu_fill_normal(&rng, p[t], (size_t)numel(t), 0.5f);
    tu_fill_normal(&rng, g[t], (size_t)numel(t), 1.0f);
  }
  distro_optim *o = NULL;
  cr_assert_eq(distro_optim_create(&opt, comm, &o), DISTRO_OK);
  for (int t = 0; t < NT; t++) cr_assert_eq(distro_optim_add_param(o, names[t], p[t], g[t], ndims[t], shapes[t]), DISTRO_OK);
  cr_assert_eq(distro_optim_grad_ready(o, "nope", 0.01f), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "nope"), "%s", distro_last_error());
  cr_assert_eq(distro_optim_grad_ready(o, names[0], -1.0f), DISTRO_ERR_INVALID);
  cr_assert_eq(distro_optim_grad_ready(o, names[0], 0.01f), DISTRO_OK); /* first step: nothing yet */
  cr_assert_eq(distro_optim_step(o, 0.01f, NULL), DISTRO_OK);
  /* Marked twice (every bucket has left with lr 0.01). */
  for (int t = NT - 1; t >= 0; t--) cr_assert_eq(distro_optim_grad_ready(o, names[t], 0.01f), DISTRO_OK);
  cr_assert_eq(distro_optim_grad_ready(o, names[NT - 1], 0.01f), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "already"), "%s", distro_last_error());
  /* A load between a mark and its step. */
  char dir[] = "/tmp/distro-backward-XXXXXX", path[512];
  cr_assert(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/state", dir);
  cr_assert_eq(distro_optim_save(o, path), DISTRO_OK);
  cr_assert_eq(distro_optim_load(o, path), DISTRO_ERR_INVALID);
  /* The step with another lr than the marks': refused, nothing moves. */
  for (int t = 0; t < NT; t++) memcpy(kept[t], p[t], sizeof(float) * (size_t)numel(t));
  cr_assert_eq(distro_optim_step(o, 0.02f, NULL), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "lr"), "%s", distro_last_error());
  for (int t = 0; t < NT; t++) cr_assert(same(p[t], kept[t], t), "'%s' moved on a refused step", names[t]);
  distro_step_stats s;
  cr_assert_eq(distro_optim_step(o, 0.01f, &s), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(s.step, 2);
  cr_assert_eq(distro_optim_load(o, path), DISTRO_OK, "%s", distro_last_error()); /* after the step: fine */
  unlink(path);
  rmdir(dir);
  distro_optim_free(o);
  /* Wire version 1 cannot send parts. */
  opt.wire_version = 1;
  opt.values = DISTRO_VALUES_F32;
  cr_assert_eq(distro_optim_create(&opt, comm, &o), DISTRO_ERR_UNSUPPORTED);
  cr_assert(strstr(distro_last_error(), "wire_version"), "%s", distro_last_error());
  /* Without BACKWARD (the AdamW baseline too) a mark only checks the name. */
  distro_options base = distro_options_default(DISTRO_ALG_ADAMW);
  cr_assert_eq(distro_optim_create(&base, comm, &o), DISTRO_OK);
  for (int t = 0; t < NT; t++) cr_assert_eq(distro_optim_add_param(o, names[t], p[t], g[t], ndims[t], shapes[t]), DISTRO_OK);
  cr_assert_eq(distro_optim_step(o, 0.01f, NULL), DISTRO_OK);
  for (int t = 0; t < NT; t++) cr_assert_eq(distro_optim_grad_ready(o, names[t], 0.01f), DISTRO_OK);
  cr_assert_eq(distro_optim_grad_ready(o, names[0], 0.01f), DISTRO_OK); /* nothing is tracked */
  cr_assert_eq(distro_optim_grad_ready(o, "nope", 0.01f), DISTRO_ERR_INVALID);
  distro_optim_free(o);
  for (int t = 0; t < NT; t++) {
    free(p[t]);
    free(g[t]);
    free(kept[t]);
  }
  return DISTRO_OK;
}

Test(backward, refusals_change_nothing, .timeout = 30) {
  uint64_t seed = tu_seed();
  cr_assert_eq(distro_comm_run_local(1, refusals, &seed), DISTRO_OK);
}
