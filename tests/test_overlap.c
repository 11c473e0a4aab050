/* The overlapped DeMo step (options.overlap):
 *  - STALE: on the same gradients it applies exactly what the blocking step
 *    applies, one call later (bit for bit, with a different thread count,
 *    while the caller runs its own all-reduce on the same comm), and the
 *    flush applies the last one; with gradients computed at the stale
 *    parameters it matches the float64 reference (tests/support/demo_ref.c)
 *    applied one step late; the first step moves nothing;
 *  - a failed background exchange (non-finite gradient, corrupted payload,
 *    stopped peer) is reported by the next call on every rank, and nothing
 *    of it is applied anywhere; with LOOKAHEAD the failing call leaves the
 *    agreed parameters (the provisional step itself: test_lookahead.c);
 *  - saves and loads: test_overlap_save.c;
 *  - what it refuses: AdamW, bad values, ranks that disagree, DiLoCo, a comm
 *    that cannot be duplicated.
 * Inputs are fresh each run; a failure prints DISTRO_TEST_SEED to replay. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <math.h>
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

/* Same gradients: the overlapped run's parameters after call s+1 are the
 * blocking run's after step s, bit for bit, on every rank; after call 1
 * they are the initial ones; the flush gives the blocking run's last. The
 * overlapped ranks use 2 OpenMP threads and the blocking ones 1, and the
 * overlapped ones all-reduce on their comm after every step. */
Test(overlap, one_step_lag_of_the_blocking_step, .timeout = 120) {
  const uint64_t seed = tu_seed();
  const int steps = 5;
  for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++)
    for (int world = 1; world <= 3; world++) {
      const mode *md = &modes[mi];
      const uint64_t s0 = mix(seed, mi * 8 + (uint64_t)world);
      dr_run b, v;
      setup(&b, mode_opts(md, 0), world, steps, 1, s0);
      setup(&v, mode_opts(md, DISTRO_OVERLAP_STALE), world, steps, 2, s0);
      v.flush = 1;
      v.comm_check = 1;
      run_ok(&b, md->label, seed);
      run_ok(&v, md->label, seed);
      for (int r = 0; r < world; r++) {
        for (int t = 0; t < NT; t++) {
          cr_assert(same(dr_snap(&v, 0, r, t), v.init[t], t),
                    "%s world %d rank %d: the first overlapped step moved '%s' (DISTRO_TEST_SEED=%llu)", md->label,
                    world, r, names[t], (unsigned long long)seed);
          for (int s = 1; s < steps; s++)
            cr_assert(same(dr_snap(&v, s, r, t), dr_snap(&b, s - 1, r, t), t),
                      "%s world %d rank %d '%s': overlapped call %d differs from blocking step %d "
                      "(DISTRO_TEST_SEED=%llu)",
                      md->label, world, r, names[t], s + 1, s, (unsigned long long)seed);
          cr_assert(same(v.final[r * NT + t], dr_snap(&b, steps - 1, r, t), t),
                    "%s world %d rank %d '%s': after the flush the parameters differ from the blocking run's "
                    "(DISTRO_TEST_SEED=%llu)",
                    md->label, world, r, names[t], (unsigned long long)seed);
          cr_assert(same(v.final[r * NT + t], v.final[t], t), "%s world %d: rank %d differs from rank 0",
                    md->label, world, r);
        }
        /* Stats: each call reports the exchange it completed. */
        const distro_step_stats *v0 = &v.stats[r];
        cr_assert(v0->bytes_sent == 0 && v0->bytes_received == 0 && v0->step == 0,
                  "%s: first overlapped call reports %llu/%llu bytes, step %lld", md->label,
                  (unsigned long long)v0->bytes_sent, (unsigned long long)v0->bytes_received, (long long)v0->step);
        for (int s = 1; s <= steps; s++) {
          const distro_step_stats *vs = s < steps ? &v.stats[(size_t)s * world + r] : &v.flush_stats[r];
          const distro_step_stats *bs = &b.stats[(size_t)(s - 1) * world + r];
          cr_assert(vs->bytes_sent == bs->bytes_sent && vs->bytes_received == bs->bytes_received,
                    "%s world %d rank %d call %d: %llu/%llu bytes, the blocking step %d moved %llu/%llu", md->label,
                    world, r, s + 1, (unsigned long long)vs->bytes_sent, (unsigned long long)vs->bytes_received, s,
                    (unsigned long long)bs->bytes_sent, (unsigned long long)bs->bytes_received);
          cr_assert_eq(vs->step, s, "%s: stats.step %lld after call %d", md->label, (long long)vs->step, s + 1);
          cr_assert(vs->seconds_exchange_bg > 0, "%s: no background exchange time at call %d", md->label, s + 1);
        }
      }
      dr_run_free(&b);
      dr_run_free(&v);
    }
}

/* Gradients computed at the parameters the rank holds (one step stale):
 * g = noise + 0.5 p. The library's change over call s+1 must be the float64
 * reference's update of step s (fed the same gradients), within its
 * tolerance model. */
static float **stale_noise; /* [(s * world + r) * NT + t]: the noise part, kept apart */

static void stale_grad(const dr_run *x, int s, int r, int t, const float *p, float *g) {
  const float *noise = stale_noise[((size_t)s * x->world + r) * x->nt + t];
  for (int64_t e = 0; e < numel(t); e++) g[e] = noise[e] + 0.5f * p[e];
}

static void stale_reference(const char *label, distro_options o, int wmin, int wmax, int steps) {
  const uint64_t seed = tu_seed();
  long checked = 0, loose = 0, ambiguous = 0, tainted = 0;
  for (int world = wmin; world <= wmax; world++) {
    dr_run v;
    setup(&v, o, world, steps, 0, mix(seed, 100 + (uint64_t)world));
    v.grad_fn = stale_grad;
    v.flush = 1;
    const size_t cells = (size_t)steps * world * NT;
    stale_noise = calloc(cells, sizeof *stale_noise);
    cr_assert_not_null(stale_noise);
    for (size_t i = 0; i < cells; i++) {
      stale_noise[i] = malloc(sizeof(float) * (size_t)numel((int)(i % NT)));
      cr_assert_not_null(stale_noise[i]);
      memcpy(stale_noise[i], v.grads[i], sizeof(float) * (size_t)numel((int)(i % NT)));
    }
    run_ok(&v, label, seed);
    dr_config cfg = {o.algorithm, o.update, o.values, o.beta1, o.beta2, o.eps, o.weight_decay, o.compression_decay,
                     o.chunk, o.topk};
    dr_model *m = dr_create(&cfg, world, NT, ndims, shapes);
    cr_assert_not_null(m);
    const float *gp[DR_MAX_WORLD * NT];
    for (int s = 0; s < steps; s++) {
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          gp[r * NT + t] = v.grads[((size_t)s * world + r) * NT + t];
          /* The gradient was taken at the parameters the rank held before
           * call s+1: those with the aggregates of steps < s applied. */
          const float *at = s == 0 ? v.init[t] : dr_snap(&v, s - 1, r, t);
          const float *g = gp[r * NT + t], *noise = stale_noise[((size_t)s * world + r) * NT + t];
          for (int64_t e = 0; e < numel(t); e++)
            cr_assert(g[e] == noise[e] + 0.5f * at[e], "%s: gradient of step %d not taken at the stale parameters",
                      label, s + 1);
        }
      dr_step(m, v.lrs[s], gp);
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          const float *p0 = dr_snap(&v, s, r, t), *p1 = s + 1 < steps ? dr_snap(&v, s + 1, r, t) : v.final[r * NT + t];
          if (s == 0) cr_assert(same(p0, v.init[t], t), "%s: call 1 moved '%s'", label, names[t]);
          dr_cmp c;
          dr_compare(m, t, p0, p1, &c);
          checked += c.checked;
          loose += c.loose;
          ambiguous += c.ambiguous;
          tainted += c.tainted;
          cr_assert_eq(c.mismatches, 0,
                       "%s world %d rank %d '%s': the update of step %d applied by call %d: %ld elements off the "
                       "reference, first [%ld] got %.9g want %.9g (tol %.3g) (DISTRO_TEST_SEED=%llu)",
                       label, world, r, names[t], s + 1, s + 2, c.mismatches, c.first, c.got, c.want, c.tol,
                       (unsigned long long)seed);
        }
    }
    dr_free(m);
    for (size_t i = 0; i < cells; i++) free(stale_noise[i]);
    free(stale_noise);
    stale_noise = NULL;
    dr_run_free(&v);
  }
  const long all = checked + loose + ambiguous + tainted;
  fprintf(stderr, "[overlap] %s: %ld elements checked, %ld loose, %ld sign-ambiguous, %ld tainted, seed %llu\n",
          label, checked, loose, ambiguous, tainted, (unsigned long long)seed);
  cr_assert_gt(checked, all / 2, "%s: only %ld of %ld elements compared strictly", label, checked, all);
}

static distro_options ref_opts(distro_update u, distro_values val) {
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.update = u;
  o.values = val;
  o.chunk = 64;
  o.topk = 32;
  o.overlap = DISTRO_OVERLAP_STALE;
  return o;
}

Test(overlap, stale_update_matches_float64_reference_sign, .timeout = 120) {
  stale_reference("sign/f32", ref_opts(DISTRO_UPDATE_SIGN, DISTRO_VALUES_F32), 1, 3, 4);
}

Test(overlap, stale_update_matches_float64_reference_adamw, .timeout = 120) {
  stale_reference("adamw-update/f32", ref_opts(DISTRO_UPDATE_ADAMW, DISTRO_VALUES_F32), 1, 3, 4);
  stale_reference("adamw-update/bf16", ref_opts(DISTRO_UPDATE_ADAMW, DISTRO_VALUES_BF16), 2, 2, 3);
}

/* ---- failures: a scripted run, every call's status recorded ---------------- */

#define FX_CALLS 8
#define FX_WORLD 3

typedef struct {
  distro_options opt;
  int world, ncalls;
  uint64_t seed;
  int gidx[FX_CALLS]; /* the gradient (and lr) each call uses */
  int nan_rank, nan_call;      /* a NaN in that rank's gradient at that call (0-based), or -1 */
  int corrupt_rank, arm_call;  /* >= 0: before call arm_call flush and arm; disarm after disarm_call */
  int disarm_call, flush_after_arm; /* flush_after_arm: flush right after the armed call */
  int stop_rank, stop_after;   /* that rank leaves after this many calls */
  double timeout;
  /* out */
  distro_status st[FX_CALLS][FX_WORLD], flush_st[FX_WORLD], armed_flush_st[FX_WORLD];
  char msg[FX_CALLS][FX_WORLD][512], flush_msg[FX_WORLD][512];
  distro_step_stats armed_flush_stats[FX_WORLD];
  float *snap[FX_CALLS][FX_WORLD], *final[FX_WORLD];
} fx;

static void fx_grad(const fx *f, int g, int r, float *out) {
  tu_rng rng = {mix(f->seed, (uint64_t)(1000 * g + r + 1))};
  tu_fill_normal(&rng, out, (size_t)total(), 1.0f);
}

static float fx_lr(int g) { return 0.01f * (1.0f + 0.2f * (float)g); }

static distro_status fx_rank(distro_comm *comm, int rank, void *arg) {
  fx *f = arg;
  const int64_t n = total();
  float *p = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
  tu_corrupting k = {.inner = comm, .corrupt_rank = f->corrupt_rank, .corrupt_self = 1};
  distro_comm wrapped;
  tu_corrupting_wrap(&k, &wrapped);
  distro_optim *o = NULL;
  if (f->timeout > 0) distro_comm_set_timeout(comm, f->timeout);
  distro_status st = distro_optim_create(&f->opt, f->corrupt_rank >= 0 ? &wrapped : comm, &o);
  tu_rng init = {f->seed};
  tu_fill_normal(&init, p, (size_t)n, 1.0f);
  for (int t = 0, off = 0; t < NT && st == DISTRO_OK; off += (int)numel(t), t++)
    st = distro_optim_add_param(o, names[t], p + off, g + off, ndims[t], shapes[t]);
  if (st != DISTRO_OK) goto out;
  for (int c = 0; c < f->ncalls; c++) {
    if (rank == f->stop_rank && c == f->stop_after) goto out;
    if (f->corrupt_rank >= 0 && c == f->arm_call) {
      distro_optim_flush(o, NULL);
      k.armed = 1; /* no exchange in flight: the helper cannot be reading it */
    }
    fx_grad(f, f->gidx[c], rank, g);
    if (rank == f->nan_rank && c == f->nan_call) g[n / 2] = NAN;
    f->st[c][rank] = distro_optim_step(o, fx_lr(f->gidx[c]), NULL);
    if (f->st[c][rank] != DISTRO_OK) keep(f->msg[c][rank], distro_last_error());
    if (f->corrupt_rank >= 0 && c == f->arm_call && f->flush_after_arm) {
      f->armed_flush_st[rank] = distro_optim_flush(o, &f->armed_flush_stats[rank]);
      if (f->armed_flush_st[rank] != DISTRO_OK) keep(f->flush_msg[rank], distro_last_error());
    }
    if (c == f->disarm_call) k.armed = 0; /* after a call that waited for the armed exchange */
    memcpy(f->snap[c][rank], p, sizeof(float) * (size_t)n);
  }
  f->flush_st[rank] = distro_optim_flush(o, NULL);
  if (f->flush_st[rank] != DISTRO_OK) keep(f->flush_msg[rank], distro_last_error());
  memcpy(f->final[rank], p, sizeof(float) * (size_t)n);
out:
  distro_optim_free(o);
  free(p);
  free(g);
  return st;
}

static void fx_init(fx *f, distro_options opt, int world, int ncalls, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->opt = opt;
  f->world = world;
  f->ncalls = ncalls;
  f->seed = seed;
  f->nan_rank = f->corrupt_rank = f->stop_rank = -1;
  f->disarm_call = -1;
  for (int c = 0; c < FX_CALLS; c++) f->gidx[c] = c;
  for (int c = 0; c < FX_CALLS; c++)
    for (int r = 0; r < FX_WORLD; r++) f->snap[c][r] = calloc((size_t)total(), sizeof(float));
  for (int r = 0; r < FX_WORLD; r++) f->final[r] = calloc((size_t)total(), sizeof(float));
}

static void fx_free(fx *f) {
  for (int c = 0; c < FX_CALLS; c++)
    for (int r = 0; r < FX_WORLD; r++) free(f->snap[c][r]);
  for (int r = 0; r < FX_WORLD; r++) free(f->final[r]);
}

static int same_all(const float *a, const float *b) { return !memcmp(a, b, sizeof(float) * (size_t)total()); }

/* The blocking run on the gradients of the calls whose steps were applied
 * must end with the overlapped run's parameters, bit for bit. */
static void expect_blocking_equivalent(const fx *f, const int *applied, int napplied, uint64_t seed) {
  fx b;
  distro_options o = f->opt;
  o.overlap = 0;
  fx_init(&b, o, f->world, napplied, f->seed);
  for (int c = 0; c < napplied; c++) b.gidx[c] = applied[c];
  cr_assert_eq(distro_comm_run_local(f->world, fx_rank, &b), DISTRO_OK, "blocking run: %s", distro_last_error());
  for (int r = 0; r < f->world; r++) {
    cr_assert(same_all(f->final[r], b.final[r]),
              "rank %d: the overlapped run after its failure differs from the blocking run on the applied steps "
              "(DISTRO_TEST_SEED=%llu)",
              r, (unsigned long long)seed);
    cr_assert(same_all(f->final[r], f->final[0]), "rank %d differs from rank 0", r);
  }
  fx_free(&b);
}

/* The same scripted run with look-ahead: every call has the same status,
 * the failing call leaves every rank at the agreed parameters (the stale
 * run's at that call, bit for bit: the provisional step is dropped), and
 * the flush ends where the stale run ends. */
static void expect_lookahead_twin(const fx *stale, int failing_call, uint64_t seed) {
  fx la = *stale;
  la.opt.overlap = DISTRO_OVERLAP_LOOKAHEAD;
  fx_init(&la, la.opt, stale->world, stale->ncalls, stale->seed);
  memcpy(la.gidx, stale->gidx, sizeof la.gidx);
  la.nan_rank = stale->nan_rank, la.nan_call = stale->nan_call, la.corrupt_rank = stale->corrupt_rank;
  la.arm_call = stale->arm_call, la.disarm_call = stale->disarm_call, la.flush_after_arm = stale->flush_after_arm;
  la.stop_rank = stale->stop_rank, la.stop_after = stale->stop_after, la.timeout = stale->timeout;
  cr_assert_eq(distro_comm_run_local(stale->world, fx_rank, &la), DISTRO_OK, "%s", distro_last_error());
  const int last = stale->stop_rank >= 0 ? stale->stop_after : stale->ncalls;
  for (int r = 0; r < stale->world; r++) {
    const int calls = r == stale->stop_rank ? last : stale->ncalls;
    for (int c = 0; c < calls; c++)
      cr_assert_eq(la.st[c][r], stale->st[c][r], "look-ahead rank %d call %d: %s (%s)", r, c + 1,
                   distro_status_string(la.st[c][r]), la.msg[c][r]);
    if (r == stale->stop_rank) continue;
    cr_assert(same_all(la.snap[failing_call][r], stale->snap[failing_call][r]),
              "look-ahead rank %d: after the failing call the parameters are not the agreed ones (DISTRO_TEST_SEED=%llu)",
              r, (unsigned long long)seed);
    cr_assert(same_all(la.final[r], stale->final[r]), "look-ahead rank %d: the flush ends elsewhere", r);
  }
  fx_free(&la);
}

/* A NaN on rank 1 at call 3: call 3 succeeds everywhere (it only starts the
 * exchange), call 4 fails on every rank with the non-finite error of step
 * 3 and moves nothing; later calls start afresh. Applied: steps 1, 2, 5-7. */
Test(overlap, nonfinite_gradient_fails_the_next_call_everywhere, .timeout = 60) {
  const uint64_t seed = tu_seed();
  for (int u = 0; u < 2; u++) {
    distro_options o = mode_opts(&modes[u ? 2 : 0], DISTRO_OVERLAP_STALE);
    fx f;
    fx_init(&f, o, 3, 7, mix(seed, 300 + (uint64_t)u));
    f.nan_rank = 1;
    f.nan_call = 2;
    cr_assert_eq(distro_comm_run_local(3, fx_rank, &f), DISTRO_OK, "%s", distro_last_error());
    for (int r = 0; r < 3; r++) {
      for (int c = 0; c < 7; c++)
        cr_assert_eq(f.st[c][r], c == 3 ? DISTRO_ERR_NONFINITE : DISTRO_OK, "rank %d call %d: %s (%s)", r, c + 1,
                     distro_status_string(f.st[c][r]), f.msg[c][r]);
      cr_assert(strstr(f.msg[3][r], "step 3") && strstr(f.msg[3][r], "rank 1"), "message: %s", f.msg[3][r]);
      cr_assert(same_all(f.snap[3][r], f.snap[2][r]), "rank %d: the failing call moved parameters", r);
      cr_assert(same_all(f.snap[4][r], f.snap[3][r]), "rank %d: the call after a failure has nothing to apply", r);
      cr_assert_eq(f.flush_st[r], DISTRO_OK);
    }
    const int applied[] = {0, 1, 4, 5, 6};
    expect_blocking_equivalent(&f, applied, 5, seed);
    expect_lookahead_twin(&f, 3, seed);
    fx_free(&f);
  }
}

/* Rank 2's payload damaged on every link (no drop): the next call fails
 * with DISTRO_ERR_PAYLOAD on every rank. With drop_invalid_peers the
 * exchange succeeds without it and the flush that completes it reports
 * the dropped peer. */
Test(overlap, corrupted_payload_in_the_background, .timeout = 60) {
  const uint64_t seed = tu_seed();
  fx f;
  fx_init(&f, mode_opts(&modes[0], DISTRO_OVERLAP_STALE), 3, 7, mix(seed, 400));
  f.corrupt_rank = 2;
  f.arm_call = 3;
  f.disarm_call = 4;
  cr_assert_eq(distro_comm_run_local(3, fx_rank, &f), DISTRO_OK, "%s", distro_last_error());
  for (int r = 0; r < 3; r++) {
    for (int c = 0; c < 7; c++)
      cr_assert_eq(f.st[c][r], c == 4 ? DISTRO_ERR_PAYLOAD : DISTRO_OK, "rank %d call %d: %s (%s)", r, c + 1,
                   distro_status_string(f.st[c][r]), f.msg[c][r]);
    cr_assert(strstr(f.msg[4][r], "step 4") && strstr(f.msg[4][r], "rank 2"), "message: %s", f.msg[4][r]);
    cr_assert(same_all(f.snap[4][r], f.snap[3][r]), "rank %d: the failing call moved parameters", r);
  }
  const int applied[] = {0, 1, 2, 5, 6};
  expect_blocking_equivalent(&f, applied, 5, seed);
  expect_lookahead_twin(&f, 4, seed);
  fx_free(&f);

  distro_options o = mode_opts(&modes[0], DISTRO_OVERLAP_LOOKAHEAD);
  o.drop_invalid_peers = 1;
  fx_init(&f, o, 3, 5, mix(seed, 401));
  f.corrupt_rank = 2;
  f.arm_call = 2;
  f.flush_after_arm = 1;
  f.disarm_call = 2;
  cr_assert_eq(distro_comm_run_local(3, fx_rank, &f), DISTRO_OK, "%s", distro_last_error());
  for (int r = 0; r < 3; r++) {
    for (int c = 0; c < 5; c++) cr_assert_eq(f.st[c][r], DISTRO_OK, "rank %d call %d: %s", r, c + 1, f.msg[c][r]);
    cr_assert_eq(f.armed_flush_st[r], DISTRO_OK, "%s", f.flush_msg[r]);
    cr_assert(f.armed_flush_stats[r].peers_dropped == 1 && f.armed_flush_stats[r].peers_dropped_mask == 4u,
              "rank %d: the flush reported %d dropped (mask %llx)", r, f.armed_flush_stats[r].peers_dropped,
              (unsigned long long)f.armed_flush_stats[r].peers_dropped_mask);
    cr_assert(same_all(f.final[r], f.final[0]), "rank %d differs from rank 0", r);
  }
  fx_free(&f);
}

/* Rank 1 leaves after its first call. Rank 0's second call still completes
 * (both ranks started exchange 1), its third reports the timeout of
 * exchange 2 and moves nothing, and the next fails at once. */
Test(overlap, stopped_peer_times_out, .timeout = 60) {
  const uint64_t seed = tu_seed();
  fx f;
  fx_init(&f, mode_opts(&modes[0], DISTRO_OVERLAP_STALE), 2, 4, mix(seed, 500));
  f.stop_rank = 1;
  f.stop_after = 1;
  f.timeout = 0.3;
  cr_assert_eq(distro_comm_run_local(2, fx_rank, &f), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(f.st[0][0], DISTRO_OK, "%s", f.msg[0][0]);
  cr_assert_eq(f.st[1][0], DISTRO_OK, "%s", f.msg[1][0]);
  cr_assert_eq(f.st[2][0], DISTRO_ERR_TIMEOUT, "call 3: %s (%s)", distro_status_string(f.st[2][0]), f.msg[2][0]);
  cr_assert(strstr(f.msg[2][0], "step 2") != NULL, "%s", f.msg[2][0]);
  cr_assert(same_all(f.snap[2][0], f.snap[1][0]), "the call that timed out moved parameters");
  cr_assert_eq(f.st[3][0], DISTRO_ERR_TIMEOUT, "call 4: %s", distro_status_string(f.st[3][0]));
  cr_assert(strstr(f.msg[3][0], "earlier background exchange timed out") != NULL, "%s", f.msg[3][0]);
  cr_assert_eq(f.flush_st[0], DISTRO_OK, "nothing is in flight after a failure: %s", f.flush_msg[0]);
  expect_lookahead_twin(&f, 2, seed);
  fx_free(&f);
}

/* ---- what it refuses ---------------------------------------------------------- */

/* A comm that forwards to another but cannot be duplicated. */
static distro_status fw_allgather(distro_comm *c, const void *s, size_t n, void *r) {
  distro_comm *in = c->impl;
  return in->ops->allgather(in, s, n, r);
}
static distro_status fw_allgatherv(distro_comm *c, const void *s, size_t n, void *r, size_t slot, size_t *sizes) {
  distro_comm *in = c->impl;
  return in->ops->allgatherv(in, s, n, r, slot, sizes);
}
static distro_status fw_allreduce(distro_comm *c, float *b, size_t n) {
  distro_comm *in = c->impl;
  return in->ops->allreduce_sum(in, b, n);
}
static distro_status fw_barrier(distro_comm *c) {
  distro_comm *in = c->impl;
  return in->ops->barrier(in);
}
static const distro__comm_ops fw_ops = {.name = "forwarding", .allgather = fw_allgather, .allgatherv = fw_allgatherv,
                                        .allreduce_sum = fw_allreduce, .barrier = fw_barrier};

typedef struct {
  int differ;      /* rank 1 does not overlap */
  int no_dup;      /* the comm cannot be duplicated */
  distro_status st[2];
  char msg[2][512];
  float moved[2];  /* largest parameter change: nothing may move */
} rf_case;

static distro_status rf_rank(distro_comm *comm, int rank, void *arg) {
  rf_case *k = arg;
  distro_comm fw = {.ops = &fw_ops, .rank = comm->rank, .size = comm->size, .impl = comm};
  distro_options o = mode_opts(&modes[0], !(k->differ && rank == 1));
  float p[64], p0[64], g[64];
  for (int i = 0; i < 64; i++) p[i] = p0[i] = g[i] = (float)(i + 1);
  const int64_t sh[] = {8, 8};
  distro_optim *opt = NULL;
  distro_status st = distro_optim_create(&o, k->no_dup ? &fw : comm, &opt);
  if (st == DISTRO_OK) st = distro_optim_add_param(opt, "w", p, g, 2, sh);
  if (st == DISTRO_OK) {
    k->st[rank] = distro_optim_step(opt, 0.1f, NULL);
    keep(k->msg[rank], distro_last_error());
    distro_optim_flush(opt, NULL);
  }
  for (int i = 0; i < 64; i++) k->moved[rank] = fmaxf(k->moved[rank], fabsf(p[i] - p0[i]));
  distro_optim_free(opt);
  return st;
}

Test(overlap, refusals) {
  distro_comm *c = NULL;
  distro_optim *o = NULL;
  cr_assert_eq(distro_comm_local_group(1, &c), DISTRO_OK);
  distro_options bad = distro_options_default(DISTRO_ALG_DEMO);
  bad.overlap = 4;
  cr_assert_eq(distro_optim_create(&bad, c, &o), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "overlap") != NULL, "%s", distro_last_error());
  cr_assert_null(o);
  distro_options adam = distro_options_default(DISTRO_ALG_ADAMW);
  adam.overlap = 1;
  cr_assert_eq(distro_optim_create(&adam, c, &o), DISTRO_ERR_UNSUPPORTED, "%s", distro_last_error());
  cr_assert_null(o);
  /* DiLoCo reads the parameters after each inner step. */
  distro_options ov = mode_opts(&modes[0], DISTRO_OVERLAP_LOOKAHEAD);
  cr_assert_eq(distro_optim_create(&ov, c, &o), DISTRO_OK);
  float p[4] = {0}, g[4] = {0};
  const int64_t sh[] = {4};
  cr_assert_eq(distro_optim_add_param(o, "w", p, g, 1, sh), DISTRO_OK);
  distro_diloco_options dopt = distro_diloco_options_default();
  distro_diloco *d = NULL;
  cr_assert_eq(distro_diloco_create(&dopt, o, c, &d), DISTRO_ERR_UNSUPPORTED, "%s", distro_last_error());
  cr_assert(strstr(distro_last_error(), "overlap") != NULL, "%s", distro_last_error());
  cr_assert_null(d);
  distro_optim_free(o);
  distro_comm_free(c);

  /* Ranks that disagree: the first step fails on both, nothing moves. */
  rf_case k = {.differ = 1};
  cr_assert_neq(distro_comm_run_local(2, rf_rank, &k), DISTRO_ERR_NOMEM);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(k.st[r], DISTRO_ERR_SHAPE, "rank %d: %s (%s)", r, distro_status_string(k.st[r]), k.msg[r]);
    cr_assert(strstr(k.msg[r], "overlap") != NULL, "%s", k.msg[r]);
    cr_assert_eq(k.moved[r], 0.0f);
  }
  /* A comm without a duplicate: DISTRO_ERR_UNSUPPORTED on both. */
  rf_case n = {.no_dup = 1};
  cr_assert_neq(distro_comm_run_local(2, rf_rank, &n), DISTRO_ERR_NOMEM);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(n.st[r], DISTRO_ERR_UNSUPPORTED, "rank %d: %s (%s)", r, distro_status_string(n.st[r]), n.msg[r]);
    cr_assert(strstr(n.msg[r], "forwarding") != NULL, "%s", n.msg[r]);
    cr_assert_eq(n.moved[r], 0.0f);
  }
}
