/* Look-ahead overlap (options.overlap = DISTRO_OVERLAP_LOOKAHEAD):
 *  - the agreed parameters are the stale overlap's, bit for bit: after a
 *    flush the parameters equal the STALE run's on every rank, and after
 *    every call each element sits at the STALE run's value or exactly one
 *    provisional step (1.0 lr for sign; for DisTrO-AdamW min(1, 0.75 g)
 *    times the rectified step grown by g, the growth from the spread of
 *    the aggregate applied in the same call, which the float64 reference
 *    counts) away from it;
 *  - the provisional step's direction is the sign of the rank's whole
 *    momentum of that step (what it sent plus what it kept), checked
 *    against the float64 reference (tests/support/demo_ref.c) wherever that
 *    sign is not decided by rounding;
 *  - it differs between ranks (each steps along its own momentum) and is
 *    gone after the flush.
 * Inputs are fresh each run; a failure prints DISTRO_TEST_SEED to replay. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "testutil.h"
/* tests/CMakeLists.txt compiles only testutil.c next to each suite. */
#include "demo_ref.c"
#include "optim/optim_internal.h"
#include "optim/step_rule.h"

#include "overlap_fixture.h"

/* The provisional step of the call standing in for step t (1-based), when
 * the aggregate applied in that call grew the step by g (the reference's
 * dr_spread_scale of its spread; 1: none): a fraction of
 * the update's own step (src/optim/step_rule.h, DISTRO__AHEAD_*), computed
 * as the library does in float; DisTrO-AdamW's step size itself is checked
 * against the float64 reference by test_reference_step. */
static float ahead(const distro_options *o, const double *lrs, int64_t t, double g) {
  const float lr = (float)lrs[t - 1];
  if (o->update == DISTRO_UPDATE_SIGN) return 1.0f * lr;
  const double want = dr_adamw_step(o->beta2, t);
  const double got = distro__adamw_step_scale(o->beta2, t);
  cr_assert(fabs(got - want) <= 1e-12 * want, "step %lld: DisTrO-AdamW step %.17g lr, reference %.17g lr",
            (long long)t, got, want);
  /* rounded as the library rounds its step and its fraction: each once, to
   * float; the fraction is 0.75 of the step unless it is grown, and rises
   * with the growth g to the whole grown step */
  const float frac = (float)(0.75 * g < 1.0 ? 0.75 * g : 1.0);
  return frac * (float)(got * dr_warmup_of(lrs, t, t) * g * (double)lr);
}

/* Every size the provisional step for step t may take, given the
 * reference after the step before (the aggregate that call applies): one
 * per distinct count the reference allows (a tainted sampled tile leaves a
 * range). Returns how many, in out[0..max). */
#define MAX_SIZES 4096
static int ahead_sizes(const distro_options *o, const double *lrs, int64_t t, const dr_model *m, float *out) {
  int64_t lo, hi, picks;
  dr_spread_counts(m, &lo, &hi, &picks);
  int n = 0;
  for (int64_t d = lo; d <= hi && n < MAX_SIZES; d++) {
    const float a = ahead(o, lrs, t, dr_spread_scale(m, picks && d ? (double)d / (double)picks : 1.0));
    if (n == 0 || out[n - 1] != a) out[n++] = a;
  }
  cr_assert(hi - lo < MAX_SIZES, "the reference leaves %lld distinct counts open", (long long)(hi - lo + 1));
  return n;
}

static dr_model *reference_of(const distro_options *o, int world) {
  dr_config cfg = {o->algorithm, o->update, o->values, o->beta1, o->beta2, o->eps, o->weight_decay,
                   o->compression_decay, o->chunk, o->topk};
  dr_model *m = dr_create(&cfg, world, NT, ndims, shapes);
  cr_assert_not_null(m);
  return m;
}

/* Steps the reference with step s's gradients of run x. */
static void reference_step(dr_model *m, const dr_run *x, int s) {
  const float *gp[DR_MAX_WORLD * NT];
  for (int r = 0; r < x->world; r++)
    for (int t = 0; t < NT; t++) gp[r * NT + t] = x->grads[((size_t)s * x->world + r) * NT + t];
  dr_step(m, x->lrs[s], gp);
}

/* Per element of call s: -1, 0 or +1 with la = agreed - a * sign, or 2 if la
 * is none of the three. */
static int provisional_sign(float la, float agreed, float a) {
  if (la == agreed) return 0;
  if (la == agreed - a) return 1;
  if (la == agreed + a) return -1;
  return 2;
}

/* The size call s of run la took: the one of sizes[0..n) that puts every
 * element of every rank at the stale run's value or one step from it, or
 * NAN if none does. */
static float size_taken(const dr_run *st, const dr_run *la, int s, const float *sizes, int n) {
  for (int j = 0; j < n; j++) {
    int fits = 1;
    for (int r = 0; r < la->world && fits; r++)
      for (int t = 0; t < NT && fits; t++) {
        const float *pl = dr_snap(la, s, r, t), *ps = dr_snap(st, s, r, t);
        for (int64_t e = 0; e < numel(t) && fits; e++) fits = provisional_sign(pl[e], ps[e], sizes[j]) != 2;
      }
    if (fits) return sizes[j];
  }
  return NAN;
}

Test(lookahead, agreed_parameters_are_the_stale_steps, .timeout = 120) {
  const uint64_t seed = tu_seed();
  const int steps = 7; /* DisTrO-AdamW's rectified step is 0 for steps 1-4 (beta2 0.95) */
  for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++)
    for (int world = 1; world <= 3; world++) {
      const mode *md = &modes[mi];
      const uint64_t s0 = mix(seed, mi * 8 + (uint64_t)world);
      dr_run st, la;
      setup(&st, mode_opts(md, DISTRO_OVERLAP_STALE), world, steps, 1, s0);
      setup(&la, mode_opts(md, DISTRO_OVERLAP_LOOKAHEAD), world, steps, 2, s0);
      st.flush = la.flush = 1;
      run_ok(&st, md->label, seed);
      run_ok(&la, md->label, seed);
      long moved = 0, all = 0, ranks_differ = 0, grown = 0;
      dr_model *m = reference_of(&la.opt, world);
      float sizes[MAX_SIZES];
      for (int s = 0; s < steps; s++) {
        /* the call applies step s's aggregate, which the reference has */
        const int n = ahead_sizes(&la.opt, la.lrs, s + 1, m, sizes);
        const float found = size_taken(&st, &la, s, sizes, n), a = isnan(found) ? sizes[0] : found;
        grown += a != ahead(&la.opt, la.lrs, s + 1, 1.0);
        reference_step(m, &la, s);
        for (int r = 0; r < world; r++)
          for (int t = 0; t < NT; t++) {
            const float *pl = dr_snap(&la, s, r, t), *ps = dr_snap(&st, s, r, t);
            for (int64_t e = 0; e < numel(t); e++) {
              const int sg = provisional_sign(pl[e], ps[e], a);
              cr_assert(sg != 2,
                        "%s world %d rank %d '%s'[%lld] call %d: %.9g is neither the agreed %.9g nor one "
                        "provisional step (%.9g) from it (DISTRO_TEST_SEED=%llu)",
                        md->label, world, r, names[t], (long long)e, s + 1, pl[e], ps[e], a,
                        (unsigned long long)seed);
              moved += sg != 0;
              all += a != 0.0f; /* a rectified step of 0 moves nothing (checked above: sg is 0 then) */
            }
            if (r > 0 && !same(pl, dr_snap(&la, s, 0, t), t)) ranks_differ++;
          }
      }
      dr_free(m);
      /* Three ranks picking 8 of a tile's 64 coefficients each spread past
       * 2 (a run where none did would check nothing of the growth). */
      if (world == 3 && md->update == DISTRO_UPDATE_ADAMW)
        cr_assert_gt(grown, 0, "%s world 3: no provisional step grew with the spread", md->label);
      /* A step along each rank's own momentum moves most elements. */
      cr_assert_gt(all, 0, "%s world %d: no call took a provisional step of nonzero size", md->label, world);
      cr_assert_gt(moved, all / 2, "%s world %d: only %ld of %ld elements took a provisional step", md->label, world,
                   moved, all);
      if (world > 1) cr_assert_gt(ranks_differ, 0, "%s world %d: every rank took the same provisional step", md->label, world);
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          cr_assert(same(la.final[r * NT + t], st.final[r * NT + t], t),
                    "%s world %d rank %d '%s': after the flush the parameters are not the stale run's "
                    "(DISTRO_TEST_SEED=%llu)",
                    md->label, world, r, names[t], (unsigned long long)seed);
          cr_assert(same(la.final[r * NT + t], la.final[t], t), "%s world %d: rank %d differs from rank 0 after the flush",
                    md->label, world, r);
        }
      dr_run_free(&st);
      dr_run_free(&la);
    }
}

/* The direction of the provisional step against the float64 reference fed
 * the same gradients: sign of the rank's whole momentum of the step.
 * Elements whose reference value is within rounding of zero, or in a tile
 * whose selection was ever a near-tie (the residual kept from that step
 * then differs), are not compared. */
static void direction_vs_reference(distro_update u, int world, int steps) {
  const uint64_t seed = tu_seed();
  distro_options o = distro_options_default(DISTRO_ALG_DEMO);
  o.update = u;
  o.values = DISTRO_VALUES_F32;
  o.chunk = 64;
  o.topk = 32;
  dr_run st, la;
  o.overlap = DISTRO_OVERLAP_STALE;
  setup(&st, o, world, steps, 0, mix(seed, 700 + (uint64_t)world));
  o.overlap = DISTRO_OVERLAP_LOOKAHEAD;
  setup(&la, o, world, steps, 0, mix(seed, 700 + (uint64_t)world));
  run_ok(&st, "stale", seed);
  run_ok(&la, "look-ahead", seed);
  dr_model *m = reference_of(&o, world);
  long checked = 0, skipped = 0;
  float sizes[MAX_SIZES];
  for (int s = 0; s < steps; s++) {
    /* topk is half the chunk: no spread exceeds 2, so one size */
    cr_assert_eq(ahead_sizes(&o, la.lrs, s + 1, m, sizes), 1);
    const float a = sizes[0];
    reference_step(m, &la, s);
    for (int r = 0; r < world; r++)
      for (int t = 0; t < NT; t++) {
        const float *pl0 = dr_snap(&la, s, r, t), *ps0 = dr_snap(&st, s, r, t);
        if (a == 0.0f) { /* a step whose rectified size is 0: no provisional step either */
          cr_assert(same(pl0, ps0, t), "world %d rank %d '%s' call %d: a provisional step of size 0 moved elements",
                    world, r, names[t], s + 1);
          continue;
        }
        const double *q = dr_last_m_own(m, t, r);
        double qmax = 0;
        for (int64_t e = 0; e < numel(t); e++) qmax = fmax(qmax, fabs(q[e]));
        const float *pl = dr_snap(&la, s, r, t), *ps = dr_snap(&st, s, r, t);
        for (int64_t e = 0; e < numel(t); e++) {
          if (fabs(q[e]) <= 1e-4 * qmax || dr_elem_tainted(m, t, e)) {
            skipped++;
            continue;
          }
          const int want = (q[e] > 0) - (q[e] < 0), got = provisional_sign(pl[e], ps[e], a);
          cr_assert_eq(got, want,
                       "world %d rank %d '%s'[%lld] call %d: provisional step %d, the reference's own momentum %.9g "
                       "(DISTRO_TEST_SEED=%llu)",
                       world, r, names[t], (long long)e, s + 1, got, q[e], (unsigned long long)seed);
          checked++;
        }
      }
  }
  fprintf(stderr, "[lookahead] update %d world %d: %ld elements checked, %ld skipped, seed %llu\n", (int)u, world,
          checked, skipped, (unsigned long long)seed);
  /* DisTrO-AdamW's first normalized gradient is +-1 everywhere, so its
   * tiles tie often, and a tile whose float32 selection may differ from
   * the reference's stays skipped for the run: over 450 fresh seeds the
   * skipped share was 0.9% at the median, 15% at the 95th percentile and
   * 39% at most (requiring three quarters compared failed about 2% of
   * runs). A third compared still fails a skip rule that hides most of
   * the elements. */
  cr_assert_gt(checked, (checked + skipped) / 3, "only %ld of %ld elements compared", checked, checked + skipped);
  dr_free(m);
  dr_run_free(&st);
  dr_run_free(&la);
}

Test(lookahead, direction_matches_float64_reference_sign, .timeout = 120) {
  for (int world = 1; world <= 3; world++) direction_vs_reference(DISTRO_UPDATE_SIGN, world, 3);
}

Test(lookahead, direction_matches_float64_reference_adamw, .timeout = 120) {
  for (int world = 1; world <= 3; world++) direction_vs_reference(DISTRO_UPDATE_ADAMW, world, 6);
}
