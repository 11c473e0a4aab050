/* One authenticated learner must not wreck a Decoupled DiLoCo job (issue
 * 30). A syncer on a thread, three honest learners and one hostile learner
 * on threads, all built from the library: the hostile one trains like the
 * others but a report hook (distro__learner_set_report_hook) rewrites
 * every report it sends, as an attacker holding a valid key would:
 *
 *   grad100   outer gradient -100 delta
 *   neg20     theta <- -20 theta
 *   noise     theta + 1000 N(0, 1)
 *   huge      finite +-3e38 values (mean merge)
 *   tokens    2^53 tokens claimed in 1 step, delta negated (token merge)
 *   freeride  delta 0 with 2^53 tokens (token merge)
 *   nan       NaN and Inf values
 *
 * Problem: f(theta) = 1/2 |theta - 1|^2 per learner (256 parameters, two
 * tensors, P = 2), SGD inside. Every scenario runs the job with the robust
 * settings (trimmed mean, quorum 3, the default bounds) and asserts that
 * the global copy's loss and each honest learner's own loss stay within a
 * bound that the honest-only run meets with a wide margin, that no honest
 * learner failed a step, and that the syncer's log names the hostile
 * learner (id 3) within the first 10 merges. The same scenarios with the
 * defences off (the arithmetic before them: robust none,
 * no bounds, no caps, no quarantine) are checked to do damage, so each
 * scenario fails on the code before the defences. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DISTRO_WITH_SYNC
#include "sync/learner_state.h"
#include "sync/sync_internal.h"
#include "attacks.h" /* python-free-examples/decoupled: the attacks, shared with gpt-train-hostile */
#include "sync_harness.h"

enum { NP = 256, HOSTILE = 3, NL = 4 };
/* Honest steps and late merges each run waits for (see scenario). */
#define STEPS_LATE 400
#define MERGES_LATE 20
/* Loss bound of the global copy and the honest learners: the initial loss
 * is ~0.5; the honest-only run ends near 3e-13 (asserted below 1e-7). */
#define LOSS_BOUND 1e-6

typedef attack_kind attack;
#define A_NONE ATTACK_NONE
#define A_GRAD100 ATTACK_GRAD100
#define A_NEG20 ATTACK_NEG20
#define A_NOISE ATTACK_NOISE
#define A_HUGE ATTACK_HUGE
#define A_TOKENS ATTACK_TOKENS
#define A_FREERIDE ATTACK_FREERIDE
#define A_NAN ATTACK_NAN

/* ------------------------------------------------------------ learners */

typedef struct {
  const char *ep;
  int id;
  float theta[NP];
  attack_state hk;
  int hooked;
  atomic_int stop, started;
  distro_status start_st, step_st;
  long steps;
  char err[300];
  pthread_t th;
} learner;

static void *learner_main(void *arg) {
  learner *L = arg;
  for (int i = 0; i < NP; i++) L->theta[i] = (float)(0.1 * sin(0.7 * i));
  distro_learner_options o = distro_learner_options_default();
  o.syncer = L->ep;
  o.learner_id = L->id;
  o.heartbeat_s = 0.1;
  o.timeout_s = 1.0;
  o.join_timeout_s = 15;
  o.tokens_per_step = 64; /* declared at HELLO (the hostile one too: then claims more) */
  distro_learner *l = NULL;
  distro_status st = distro_learner_create(&o, &l);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "w", L->theta, NP - NP / 4, 0);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "b", L->theta + NP - NP / 4, NP / 4, 0);
  if (st == DISTRO_OK && L->hooked) distro__learner_set_report_hook(l, attack_rewrite, &L->hk);
  if (st == DISTRO_OK) st = distro_learner_start(l);
  L->start_st = st;
  atomic_store(&L->started, 1);
  if (st != DISTRO_OK) snprintf(L->err, sizeof L->err, "%s", distro_last_error());
  L->step_st = DISTRO_OK;
  for (long t = 0; st == DISTRO_OK && !atomic_load(&L->stop); t++) {
    for (int i = 0; i < NP; i++) L->theta[i] -= 0.05f * (L->theta[i] - 1.0f);
    sh_sleep(0.002);
    const distro_status s = distro_learner_step(l, 64, NULL);
    if (s != DISTRO_OK && L->step_st == DISTRO_OK) {
      L->step_st = s;
      snprintf(L->err, sizeof L->err, "%s", distro_last_error());
    }
    L->steps = t + 1;
  }
  distro_learner_free(l);
  return NULL;
}

static double loss(const float *x) {
  double s = 0;
  for (int i = 0; i < NP; i++) s += 0.5 * ((double)x[i] - 1.0) * ((double)x[i] - 1.0);
  return s / NP;
}

/* ------------------------------------------------------------ the log */

typedef struct {
  pthread_mutex_t mu;
  sh_syncer *h;
  int named_at;  /* merges seen when a line first named the hostile learner (-1: never) */
  char first[400];
} logbook;

static void log_line(void *ctx, const char *line) {
  logbook *b = ctx;
  char needle[32];
  snprintf(needle, sizeof needle, "learner %d ", HOSTILE);
  char needle2[32];
  snprintf(needle2, sizeof needle2, "learner=%d ", HOSTILE);
  pthread_mutex_lock(&b->mu);
  if (b->named_at < 0 && (strstr(line, needle) || strstr(line, needle2)) &&
      (strstr(line, "clipped") || strstr(line, "refused") || strstr(line, "capped") || strstr(line, "quarantined") ||
       strstr(line, "reason=payload"))) {
    b->named_at = b->h->nm;
    snprintf(b->first, sizeof b->first, "%s", line);
  }
  pthread_mutex_unlock(&b->mu);
}

/* ------------------------------------------------------------ a scenario */

typedef struct {
  double global_loss, honest_loss; /* honest_loss: the worst honest learner's own */
  int honest_failed;               /* an honest learner's step failed (non-finite parameters) */
  char why[300];
  int named_at, merges;
  int late_merges; /* merges after the honest learners' STEPS_LATE-th step (< MERGES_LATE: the job stalled) */
  distro_syncer_learner_stats hs;
  distro_syncer_stats ss;
} outcome;

static outcome scenario(attack a, int defended, int refuse) {
  static sh_syncer h;
  static logbook book;
  static learner L[NL];
  outcome out;
  memset(&out, 0, sizeof out);
  memset(&book, 0, sizeof book);
  pthread_mutex_init(&book.mu, NULL);
  book.h = &h;
  book.named_at = -1;
  char ep[300];
  sh_init(&h, ep, sizeof ep);
  distro_syncer_options o;
  sh_options(&o, ep, 2);
  o.quorum = 3;
  /* The token attacks against the token merge; +-3e38 against the mean
   * (the radial merge's norm overflows and the syncer drops the merge:
   * before the defences that stalls every merge holding the report). */
  o.merge = a == A_TOKENS || a == A_FREERIDE ? DISTRO_MERGE_TOKENS
            : a == A_HUGE                    ? DISTRO_MERGE_MEAN
                                             : DISTRO_MERGE_RADIAL_TOKENS;
  o.outer_lr = 1.0f;
  o.outer_momentum = 0.0f;
  o.log = log_line;
  o.log_ctx = &book;
  if (defended) {
    o.robust = DISTRO_SYNC_ROBUST_TRIMMED; /* f = 1 of quorum 3; the bounds keep their defaults */
    if (refuse) o.out_of_bound = DISTRO_SYNC_BOUND_REFUSE;
  } else {
    o.robust = DISTRO_SYNC_ROBUST_NONE;
    o.clip_multiple = 0;
    o.report_max_rel = 0;
    o.step_max_rel = 0;
    o.weight_cap = 0;
    o.quarantine_after = 0;
  }
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  const int n = a == A_NONE ? NL - 1 : NL;
  for (int i = 0; i < n; i++) {
    memset(&L[i], 0, sizeof L[i]);
    L[i].ep = ep;
    L[i].id = i;
    L[i].hooked = i == HOSTILE;
    L[i].hk.kind = a;
    L[i].hk.rng = 12345;
    cr_assert_eq(pthread_create(&L[i].th, NULL, learner_main, &L[i]), 0);
    if (i == 0) /* learner 0 seeds; the others join from it */
      for (double t0 = sh_now(); !atomic_load(&L[0].started) && sh_now() - t0 < 15;) sh_sleep(0.01);
  }
  /* Runs until the job made MERGES_LATE merges after every honest learner
   * made STEPS_LATE steps (not a time: a loaded machine only makes it
   * longer), or until the time limit. */
  int nm_mid = -1;
  for (double t0 = sh_now(); sh_now() - t0 < (defended ? 90.0 : 30.0);) {
    long least = -1;
    for (int i = 0; i < 3; i++)
      if (least < 0 || L[i].steps < least) least = L[i].steps;
    pthread_mutex_lock(&h.mu);
    const int nm = h.nm;
    pthread_mutex_unlock(&h.mu);
    if (nm_mid < 0 && least >= STEPS_LATE) nm_mid = nm;
    out.late_merges = nm_mid < 0 ? 0 : nm - nm_mid;
    if (least >= STEPS_LATE && out.late_merges >= MERGES_LATE) break;
    int gone = 0;
    for (int i = 0; i < 3; i++) gone |= L[i].start_st != DISTRO_OK && atomic_load(&L[i].started);
    if (gone) break;
    sh_sleep(0.01);
  }
  for (int i = 0; i < n; i++) atomic_store(&L[i].stop, 1);
  for (int i = 0; i < n; i++) pthread_join(L[i].th, NULL);
  float g[NP];
  cr_assert_eq(distro_syncer_get_global(h.s, g, NP, NULL, 0), DISTRO_OK, "%s", distro_last_error());
  distro_syncer_get_learner_stats(h.s, HOSTILE, &out.hs);
  distro_syncer_get_stats(h.s, &out.ss);
  out.global_loss = loss(g);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(L[i].start_st, DISTRO_OK, "honest learner %d did not join: %s", i, L[i].err);
    const double li = loss(L[i].theta);
    if (!(li <= out.honest_loss)) out.honest_loss = li; /* NaN sticks */
    if (L[i].step_st != DISTRO_OK && !out.honest_failed) {
      out.honest_failed = 1;
      snprintf(out.why, sizeof out.why, "learner %d: %s", i, L[i].err);
    }
  }
  pthread_mutex_lock(&book.mu);
  out.named_at = book.named_at;
  out.merges = h.nm;
  pthread_mutex_unlock(&book.mu);
  cr_log_info("%-8s %s: global loss %.3g, worst honest loss %.3g%s%s, merges %d (late %d), named at merge %d (%s); "
              "learner 3: "
              "clipped %llu refused %llu capped %llu quarantines %llu share max %.3f; steps not applied %llu",
              attack_name(a), defended ? "defended" : "undefended", out.global_loss, out.honest_loss,
              out.honest_failed ? ", an honest learner failed: " : "", out.why, out.merges, out.late_merges, out.named_at,
              book.first,
              (unsigned long long)out.hs.clipped, (unsigned long long)out.hs.refused,
              (unsigned long long)out.hs.capped, (unsigned long long)out.hs.quarantines, out.hs.weight_share_max,
              (unsigned long long)out.ss.steps_skipped);
  sh_stop(&h);
  return out;
}

static void defended(attack a) {
  const outcome r = scenario(a, 1, 0);
  cr_assert(!r.honest_failed, "%s: an honest learner failed: %s", attack_name(a), r.why);
  cr_assert_leq(r.global_loss, LOSS_BOUND, "%s: global loss %g", attack_name(a), r.global_loss);
  cr_assert_leq(r.honest_loss, LOSS_BOUND, "%s: an honest learner's loss %g", attack_name(a), r.honest_loss);
  cr_assert_geq(r.late_merges, MERGES_LATE, "%s: the job merges (%d late merges)", attack_name(a), r.late_merges);
  cr_assert(r.named_at >= 0 && r.named_at <= 10, "%s: the syncer's log names learner %d at merge %d", attack_name(a),
            HOSTILE, r.named_at);
}

Test(sync_hostile, honest_only_run_ends_far_below_the_bound) {
  const outcome r = scenario(A_NONE, 1, 0);
  cr_assert(!r.honest_failed, "%s", r.why);
  cr_assert_geq(r.late_merges, MERGES_LATE, "the job merges (%d late merges)", r.late_merges);
  cr_assert_leq(r.global_loss, LOSS_BOUND / 10, "global loss %g", r.global_loss);
  cr_assert_leq(r.honest_loss, LOSS_BOUND / 10, "honest loss %g", r.honest_loss);
  cr_assert_eq(r.ss.clipped + r.ss.refused + r.ss.quarantines + r.ss.steps_skipped, 0,
               "honest learners were held to a bound (clipped %llu refused %llu quarantines %llu skipped %llu)",
               (unsigned long long)r.ss.clipped, (unsigned long long)r.ss.refused,
               (unsigned long long)r.ss.quarantines, (unsigned long long)r.ss.steps_skipped);
}

Test(sync_hostile, outer_gradient_times_minus_100) { defended(A_GRAD100); }
Test(sync_hostile, theta_times_minus_20) { defended(A_NEG20); }
Test(sync_hostile, theta_plus_1000_gaussian) { defended(A_NOISE); }
Test(sync_hostile, finite_values_3e38) { defended(A_HUGE); }
Test(sync_hostile, tokens_2_pow_53_in_one_step_negated) { defended(A_TOKENS); }
Test(sync_hostile, free_rider_zero_delta_2_pow_53_tokens) { defended(A_FREERIDE); }
Test(sync_hostile, nan_and_inf_values_quarantined) {
  defended(A_NAN);
}

/* out_of_bound REFUSE: the out-of-bound reports are left out (counted
 * per learner), without clipping, and the job is as safe. */
Test(sync_hostile, refuse_mode_leaves_out_of_bound_reports_out) {
  const outcome r = scenario(A_GRAD100, 1, 1);
  cr_assert(!r.honest_failed, "%s", r.why);
  cr_assert_leq(r.global_loss, LOSS_BOUND, "global loss %g", r.global_loss);
  cr_assert_leq(r.honest_loss, LOSS_BOUND, "honest loss %g", r.honest_loss);
  cr_assert_geq(r.late_merges, MERGES_LATE, "the job merges (%d late merges)", r.late_merges);
  cr_assert_geq(r.hs.refused, 1, "learner 3's reports refused: %llu", (unsigned long long)r.hs.refused);
  cr_assert_eq(r.hs.clipped, 0, "nothing clipped in refuse mode (%llu)", (unsigned long long)r.hs.clipped);
  cr_assert(r.named_at >= 0 && r.named_at <= 10, "named at merge %d", r.named_at);
}

/* The harness bites: without the defences (the arithmetic before them)
 * every attack but NaN/Inf (refused before, too) breaks the bound. */
Test(sync_hostile, undefended_attacks_break_the_bound) {
  const attack as[] = {A_GRAD100, A_NEG20, A_NOISE, A_HUGE, A_TOKENS, A_FREERIDE};
  for (size_t k = 0; k < sizeof as / sizeof *as; k++) {
    const outcome r = scenario(as[k], 0, 0);
    cr_assert(r.honest_failed || !(r.global_loss <= LOSS_BOUND) || !(r.honest_loss <= LOSS_BOUND) ||
                  r.late_merges < MERGES_LATE,
              "%s did no damage without the defences (global %g, honest %g, %d late merges)", attack_name(as[k]),
              r.global_loss, r.honest_loss, r.late_merges);
  }
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The trimmed mean against a float64 reference on fresh random reports,
 * and its guarantee: with f hostile reports (huge, tiny, or in between)
 * every element lies within the honest reports' range. */
Test(sync_hostile, trimmed_mean_matches_float64_and_stays_in_the_honest_range) {
  distro__sy_layout L;
  const int64_t numel[2] = {300, 77};
  const unsigned flags[2] = {0, 0};
  cr_assert_eq(distro__sy_layout_build(&L, 2, numel, flags, 42, 2, DISTRO_FRAG_SEQUENTIAL, 0, DISTRO_OUTER_F32, 64),
               DISTRO_OK, "%s", distro_last_error());
  uint64_t rng = (uint64_t)time(NULL) * 2654435761u + 1;
  for (int p = 0; p < 2; p++)
    for (int n = 3; n <= 9; n++)
      for (int f = 1; 2 * f + 1 <= n; f++) {
        const int64_t m = L.frags.numel[p];
        float *d[9], *out = malloc(sizeof(float) * (size_t)m);
        for (int r = 0; r < n; r++) {
          d[r] = malloc(sizeof(float) * (size_t)m);
          for (int64_t j = 0; j < m; j++) d[r][j] = (float)attack_gauss(&rng);
        }
        /* The first f reports are hostile. */
        for (int r = 0; r < f; r++)
          for (int64_t j = 0; j < m; j++) d[r][j] = r % 2 ? -3e38f : (float)(1e6 * attack_gauss(&rng));
        distro__sy_trimmed_mean(&L, p, n, f, (const float *const *)d, out);
        for (int64_t j = 0; j < m; j++) {
          double v[9], lo = INFINITY, hi = -INFINITY, sum = 0;
          for (int r = 0; r < n; r++) v[r] = d[r][j];
          for (int r = f; r < n; r++) lo = fmin(lo, v[r]), hi = fmax(hi, v[r]);
          qsort(v, (size_t)n, sizeof *v, cmp_double);
          for (int r = f; r < n - f; r++) sum += v[r];
          const double ref = sum / (n - 2 * f);
          cr_assert_leq(fabs(out[j] - ref), 1e-6 * (1 + fabs(ref)), "p %d n %d f %d element %lld: %g vs %g", p, n, f,
                        (long long)j, (double)out[j], ref);
          cr_assert(out[j] >= (float)lo && out[j] <= (float)hi, "n %d f %d: %g outside the honest [%g, %g]", n, f,
                    (double)out[j], lo, hi);
        }
        for (int r = 0; r < n; r++) free(d[r]);
        free(out);
      }
  distro__sy_layout_destroy(&L);
}

/* Bit for bit what the rule says, whichever path computes it (the sorting
 * networks up to 32 reports, the insertion sort beyond): per element the
 * kept values summed in float64 in ascending order from +0, over n - 2f,
 * rounded to float; the same bits for every order of the reports. Inputs
 * full of ties, signed zeros and extremes. */
Test(sync_hostile, trimmed_mean_is_bit_exact_and_order_free) {
  static const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, 1e-30f, -1e-30f, 3e38f, -3e38f, 7.0f, 0.1f, -0.1f};
  const int np = (int)(sizeof pool / sizeof *pool);
  distro__sy_layout L;
  const int64_t numel[1] = {70001}; /* several blocks of the fast paths, and ragged ends */
  const unsigned flags[1] = {0};
  cr_assert_eq(distro__sy_layout_build(&L, 1, numel, flags, 7, 1, DISTRO_FRAG_SEQUENTIAL, 0, DISTRO_OUTER_F32, 64),
               DISTRO_OK, "%s", distro_last_error());
  const int64_t m = L.frags.numel[0];
  uint64_t rng = (uint64_t)time(NULL) * 2654435761u + 3;
  float *out = malloc(sizeof(float) * (size_t)m), *out2 = malloc(sizeof(float) * (size_t)m);
  static const int ns[] = {3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 32, 33};
  for (unsigned ni = 0; ni < sizeof ns / sizeof *ns; ni++)
    for (int n = ns[ni], f = 1; 2 * f + 1 <= n; f += 1 + n / 8) {
      float *d[33], *perm[33];
      for (int r = 0; r < n; r++) {
        d[r] = malloc(sizeof(float) * (size_t)m);
        for (int64_t j = 0; j < m; j++) {
          rng = rng * 6364136223846793005ull + 1442695040888963407ull;
          const int k = (int)((rng >> 33) % (uint64_t)(np + 1));
          d[r][j] = k < np ? pool[k] : (float)attack_gauss(&rng); /* ties most of the time */
        }
      }
      distro__sy_trimmed_mean(&L, 0, n, f, (const float *const *)d, out);
      for (int r = 0; r < n; r++) perm[r] = d[n - 1 - r]; /* reversed */
      distro__sy_trimmed_mean(&L, 0, n, f, (const float *const *)perm, out2);
      for (int64_t j = 0; j < m; j++) {
        double v[33], sum = 0;
        for (int r = 0; r < n; r++) v[r] = d[r][j];
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        for (int r = f; r < n - f; r++) sum += v[r];
        const float ref = (float)(sum / (n - 2 * f));
        cr_assert(memcmp(&out[j], &ref, sizeof ref) == 0, "n %d f %d element %lld: %a, the rule gives %a", n, f,
                  (long long)j, (double)out[j], (double)ref);
        cr_assert(memcmp(&out2[j], &ref, sizeof ref) == 0, "n %d f %d element %lld: reports reversed give %a, not %a",
                  n, f, (long long)j, (double)out2[j], (double)ref);
      }
      for (int r = 0; r < n; r++) free(d[r]);
    }
  free(out);
  free(out2);
  distro__sy_layout_destroy(&L);
}

Test(sync_hostile, robust_rule_that_would_degenerate_is_refused) {
  distro_syncer_options o = distro_syncer_options_default();
  o.endpoint = "ipc:///tmp/distro-hostile-never-bound.ipc";
  distro_syncer *s = NULL;
  o.robust = DISTRO_SYNC_ROBUST_TRIMMED;
  o.quorum = 2; /* f would be 0 */
  cr_assert_eq(distro_syncer_create(&o, &s), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "quorum"), "%s", distro_last_error());
  o.quorum = 4;
  o.robust_f = 2; /* needs 5 */
  cr_assert_eq(distro_syncer_create(&o, &s), DISTRO_ERR_INVALID);
  cr_assert(strstr(distro_last_error(), "2f + 1"), "%s", distro_last_error());
  o.robust = DISTRO_SYNC_ROBUST_MEDIAN;
  o.robust_f = 0;
  o.quorum = 2;
  cr_assert_eq(distro_syncer_create(&o, &s), DISTRO_ERR_INVALID);
  cr_assert_null(s);
}
#else
Test(sync_hostile, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
