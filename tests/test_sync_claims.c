/* Honest token weights (issue 30): a learner's claimed tokens and steps are
 * held to what the syncer can check. A syncer on a thread and quadratic
 * learners on threads, built from the library; the dishonest one rewrites
 * its claims with a report hook (distro__learner_set_report_hook), and
 * where it must also lie in its heartbeats, raises the step counter they
 * carry after every step.
 *
 *   (a) a learner that declares N tokens per step at HELLO and claims
 *       1000 N per step is cut to N per step (CLIP) or refused (REFUSE),
 *       counted and named in the log;
 *   (b) a second HELLO for the same learner id with another tokens per
 *       step is refused, with a clear error, and changes nothing;
 *   (c) a learner claiming 1000 x its steps, with a step counter that
 *       agrees, is cut to what the elapsed time allows at its own step time;
 *   (d) honest learners (different token rates and step times) are never
 *       cut or refused, so their weights are the token rule's as before.
 *
 * Each of (a) to (c) fails on the code before this change (tokens per step
 * fixed by the first report, steps held only to the heartbeat counter);
 * (d) guards against the checks touching honest learners. The window the
 * steps bound counts from is checked on its own at the end. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include "sync/learner_state.h"
#include "sync/bounds.h"
#include "sync_harness.h"

enum { NP = 256, LOG_LINES = 4096 };

/* ------------------------------------------------------------ the log */

static struct {
  pthread_mutex_t mu;
  int n;
  char line[LOG_LINES][320];
} book = {PTHREAD_MUTEX_INITIALIZER, 0, {{0}}};

static void log_line(void *ctx, const char *line) {
  (void)ctx;
  pthread_mutex_lock(&book.mu);
  if (book.n < LOG_LINES) snprintf(book.line[book.n++], sizeof book.line[0], "%s", line);
  pthread_mutex_unlock(&book.mu);
}

/* The first logged line holding all of a, b and c (NULL: none). */
static const char *logged(const char *a, const char *b, const char *c) {
  const char *hit = NULL;
  pthread_mutex_lock(&book.mu);
  for (int i = 0; i < book.n && !hit; i++)
    if (strstr(book.line[i], a) && (!b || strstr(book.line[i], b)) && (!c || strstr(book.line[i], c)))
      hit = book.line[i];
  pthread_mutex_unlock(&book.mu);
  return hit;
}

/* A claim of learner id was cut or refused (the weight cap, which may
 * touch an honest learner whose report covers more steps than the others',
 * logs "weight share" instead). */
static const char *claim_cut(int id) {
  char who[64];
  snprintf(who, sizeof who, "learner %d fragment ", id);
  return logged(who, ": claims ", NULL);
}

/* ------------------------------------------------------------ learners */

/* How a learner lies: its reports claim tok_mult x its tokens and
 * step_mult x its steps; with lie_counter its heartbeats carry step_mult x
 * its step counter. */
typedef struct {
  uint64_t tok_mult, step_mult;
  int lie_counter;
} lie;

static void inflate(void *ctx, int p, float *delta, const float *base, int64_t n, uint64_t *tokens,
                    uint64_t *steps) {
  const lie *x = ctx;
  (void)p, (void)delta, (void)base, (void)n;
  *tokens *= x->tok_mult;
  *steps *= x->step_mult;
}

static void install_hook(sh_learner *L) { distro__learner_set_report_hook(L->l, inflate, L->ctx); }

static void lie_counter(sh_learner *L) {
  const lie *x = L->ctx;
  pthread_mutex_lock(&L->l->mu);
  L->l->hb_steps = L->l->tstep * (int64_t)x->step_mult;
  pthread_mutex_unlock(&L->l->mu);
}

/* A quadratic learner declaring `declared` tokens per step, processing
 * `tokens` per step, a step every step_ms; a liar when x is given. */
static void lrn_init(sh_learner *L, const char *endpoint, int id, uint64_t declared, uint64_t tokens, double step_ms,
                     lie *x) {
  sh_learner_init(L, endpoint, id, NP, 1.0, step_ms);
  L->lr = 0.05;
  L->declared = declared;
  L->tokens_per_step = tokens;
  if (x) {
    L->ctx = x;
    L->before_start = install_hook;
    if (x->lie_counter) L->after_step = lie_counter;
  }
}

static distro_status lrn_start(sh_learner *L) {
  cr_assert_eq(sh_learner_run(L), 0);
  return sh_learner_wait_start(L, 20);
}

static void lrn_stop(sh_learner *L) {
  sh_learner_join(L);
  free(L->theta);
  L->theta = NULL;
}

/* ------------------------------------------------------------ a job */

static sh_syncer h;
static char ep[300];

static void job_options(distro_syncer_options *o) {
  sh_init(&h, ep, sizeof ep);
  sh_options(o, ep, 2);
  o->quorum = 2;
  o->merge = DISTRO_MERGE_TOKENS;
  o->log = log_line;
  pthread_mutex_lock(&book.mu);
  book.n = 0;
  pthread_mutex_unlock(&book.mu);
}

/* Learners 0.. n-1 (learner 0 seeds first), until `merges` merges or 60 s;
 * then the syncer's per-learner stats. */
static void run_job(const distro_syncer_options *o, sh_learner *L, int n, int merges, distro_syncer_learner_stats *ls) {
  cr_assert_eq(sh_start(&h, o), DISTRO_OK, "%s", distro_last_error());
  for (int i = 0; i < n; i++)
    cr_assert_eq(lrn_start(&L[i]), DISTRO_OK, "learner %d did not join: %s", i, L[i].start_error);
  const int got = sh_wait_merges(&h, merges, 60);
  for (int i = 0; i < n; i++) lrn_stop(&L[i]);
  for (int i = 0; i < n; i++) cr_assert_eq(distro_syncer_get_learner_stats(h.s, i, &ls[i]), DISTRO_OK);
  sh_stop(&h);
  cr_assert_geq(got, merges, "the job made %d of %d merges", got, merges);
  for (int i = 0; i < n; i++)
    cr_log_info("learner %d: reports %llu merged %llu clipped %llu refused %llu capped %llu quarantines %llu "
                "tokens/step %g share %.3f (max %.3f)",
                i, (unsigned long long)ls[i].reports, (unsigned long long)ls[i].merged,
                (unsigned long long)ls[i].clipped, (unsigned long long)ls[i].refused,
                (unsigned long long)ls[i].capped, (unsigned long long)ls[i].quarantines, ls[i].tokens_per_step,
                ls[i].weight_share, ls[i].weight_share_max);
}

/* (a) 1000 x the declared tokens per step. */
static void declared_rate(int refuse) {
  distro_syncer_options o;
  job_options(&o);
  o.quarantine_after = 0; /* every report of learner 3 reaches the check */
  if (refuse) o.out_of_bound = DISTRO_SYNC_BOUND_REFUSE;
  sh_learner L[4];
  lie x = {1000, 1, 0};
  for (int i = 0; i < 4; i++) lrn_init(&L[i], ep, i, 64, 64, 2, i == 3 ? &x : NULL);
  distro_syncer_learner_stats ls[4];
  run_job(&o, L, 4, 20, ls);
  cr_assert_eq(ls[3].tokens_per_step, 64, "learner 3's tokens per step are %g, not the 64 it declared",
               ls[3].tokens_per_step);
  const char *line = logged("learner 3 fragment", "its declared 64 tokens per step allow",
                            refuse ? "; tokens refused" : "; tokens capped");
  cr_assert(line, "no log line names learner 3's token claim");
  cr_log_info("%s", line);
  if (refuse) {
    cr_assert_geq(ls[3].refused, 1, "learner 3's reports refused: %llu", (unsigned long long)ls[3].refused);
    cr_assert_eq(ls[3].merged, 0, "a refused report was merged (%llu)", (unsigned long long)ls[3].merged);
  } else {
    cr_assert_geq(ls[3].capped, 1, "learner 3's claims cut: %llu", (unsigned long long)ls[3].capped);
    cr_assert_geq(ls[3].merged, 1, "learner 3's cut reports are merged (%llu)", (unsigned long long)ls[3].merged);
  }
  for (int i = 0; i < 3; i++) cr_assert_null(claim_cut(i), "an honest claim was cut: %s", claim_cut(i));
}

Test(sync_claims, tokens_beyond_the_declared_rate_are_cut_and_named) { declared_rate(0); }
Test(sync_claims, tokens_beyond_the_declared_rate_are_refused_in_refuse_mode) { declared_rate(1); }

/* (b) A later HELLO for the same id with another tokens per step. */
Test(sync_claims, a_hello_with_other_tokens_per_step_is_refused) {
  distro_syncer_options o;
  job_options(&o);
  o.quorum = 1;
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  sh_learner A;
  lrn_init(&A, ep, 0, 64, 64, 2, NULL);
  cr_assert_eq(lrn_start(&A), DISTRO_OK, "%s", A.start_error);
  cr_assert_geq(sh_wait_merges(&h, 3, 30), 3);
  lrn_stop(&A); /* says goodbye */
  /* The same id, another rate: refused at its HELLO. */
  sh_learner B;
  lrn_init(&B, ep, 0, 128, 128, 2, NULL);
  const double t0 = sh_now();
  const distro_status bs = lrn_start(&B);
  const double took = sh_now() - t0;
  cr_assert_eq(bs, DISTRO_ERR_INVALID, "a learner declaring 128 tokens per step joined as id 0 (%d: %s)", (int)bs,
               B.start_error);
  cr_assert(strstr(B.start_error, "declares 128 tokens per step") && strstr(B.start_error, "fixed 64"), "%s",
            B.start_error);
  cr_assert_lt(took, 10.0, "the refusal took %.1f s (not a timeout)", took);
  lrn_stop(&B);
  cr_assert(logged("reject learner=0 type=HELLO reason=refused", "declares 128 tokens per step", NULL),
            "the refused hello is not in the syncer's log");
  distro_syncer_learner_stats ls;
  cr_assert_eq(distro_syncer_get_learner_stats(h.s, 0, &ls), DISTRO_OK);
  cr_assert_eq(ls.tokens_per_step, 64, "the refused hello changed the id's tokens per step to %g",
               ls.tokens_per_step);
  cr_assert_eq(ls.alive, 0, "the refused hello made learner 0 alive");
  /* The same rate again: joins. */
  sh_learner C;
  lrn_init(&C, ep, 0, 64, 64, 2, NULL);
  cr_assert_eq(lrn_start(&C), DISTRO_OK, "%s", C.start_error);
  const int m0 = sh_merges(&h);
  cr_assert_geq(sh_wait_merges(&h, m0 + 3, 30), m0 + 3, "no merges after the rejoin");
  lrn_stop(&C);
  sh_stop(&h);
}

/* (c) 1000 x the steps (and tokens, at the declared rate), with a step
 * counter that says the same: only the elapsed time catches it. */
Test(sync_claims, steps_beyond_the_elapsed_time_are_cut) {
  distro_syncer_options o;
  job_options(&o);
  o.quarantine_after = 0;
  sh_learner L[4];
  lie x = {1000, 1000, 1};
  for (int i = 0; i < 4; i++) lrn_init(&L[i], ep, i, 64, 64, 2, i == 3 ? &x : NULL);
  distro_syncer_learner_stats ls[4];
  run_job(&o, L, 4, 20, ls);
  const char *line = logged("learner 3 fragment", "its elapsed time (at its fastest claimed step time) allows",
                            "; steps capped");
  cr_assert(line, "no log line cuts learner 3's steps by the elapsed time");
  cr_log_info("%s", line);
  cr_assert_geq(ls[3].capped, 1, "learner 3's claims cut: %llu", (unsigned long long)ls[3].capped);
  for (int i = 0; i < 3; i++) cr_assert_null(claim_cut(i), "an honest claim was cut: %s", claim_cut(i));
}

/* (d) Honest learners with different token rates and step times, a
 * minimum step time below theirs: never cut, refused or quarantined. */
Test(sync_claims, honest_learners_are_never_cut) {
  distro_syncer_options o;
  job_options(&o);
  o.min_step_s = 2e-4;
  sh_learner L[3];
  lrn_init(&L[0], ep, 0, 64, 64, 1, NULL);
  lrn_init(&L[1], ep, 1, 256, 200, 4, NULL); /* declares more than it uses */
  lrn_init(&L[2], ep, 2, 0, 96, 8, NULL);    /* declares nothing: its first report fixes its rate */
  distro_syncer_learner_stats ls[3];
  run_job(&o, L, 3, 40, ls);
  for (int i = 0; i < 3; i++) {
    cr_assert_null(claim_cut(i), "an honest claim was cut: %s", claim_cut(i));
    cr_assert_eq(ls[i].refused + ls[i].quarantines, 0, "honest learner %d: refused %llu quarantines %llu", i,
                 (unsigned long long)ls[i].refused, (unsigned long long)ls[i].quarantines);
    cr_assert_geq(ls[i].merged, 1, "learner %d's reports merged: %llu", i, (unsigned long long)ls[i].merged);
    cr_assert_gt(ls[i].weight_share_max, 0, "learner %d never weighed in", i);
  }
  cr_assert_eq(ls[0].tokens_per_step, 64);
  cr_assert_eq(ls[1].tokens_per_step, 256);
  cr_assert_float_eq(ls[2].tokens_per_step, 96, 1e-9, "%g", ls[2].tokens_per_step);
}

/* The window the steps bound counts from, on a syncer that is not running:
 * its join, then the learner's last report before the version a report is
 * based on was sent to it. */
Test(sync_claims, the_steps_window_starts_at_the_report_before_the_applied_version) {
  distro_syncer *s = calloc(1, sizeof *s);
  sy_learner *l = calloc(1, sizeof *l);
  cr_assert(s && l);
  s->opt = distro_syncer_options_default();
  s->opt.timeout_s = 2.0;
  s->opt.H = 24; /* slack 2H + 8 = 56 steps */
  pthread_mutex_init(&s->mu, NULL);
  s->L.P = 1;
  s->initialized = 1;
  s->learners[5] = l;
  char why[300];
  distro__syncer_hello_claims(s, l, 1, 0, 64, 100.0); /* a fresh process declaring 64 */
  cr_assert_eq(l->tokens_per_step, 64);
  cr_assert_eq(distro__syncer_hello_tokens(s, 5, 64, why, sizeof why), 0);
  cr_assert_eq(distro__syncer_hello_tokens(s, 5, 0, why, sizeof why), 0, "a hello declaring nothing");
  cr_assert_eq(distro__syncer_hello_tokens(s, 5, 65, why, sizeof why), -1);
  cr_assert(strstr(why, "declares 65 tokens per step") && strstr(why, "fixed 64"), "%s", why);
  l->hb_steps = 50;
  l->step_min = 0.01; /* its fastest step: 0.0025 s with the slack */
  double by_time, b = distro__syncer_steps_bound(s, l, 0, 0, 101.0, &by_time);
  cr_assert_float_eq(b, 50 + 56, 1e-9, "from the join, by the counter: %g", b);
  cr_assert_float_eq(by_time, (101.0 - 100.0 + 2.0) / 0.0025 + 56, 1e-6, "%g", by_time);
  distro__syncer_fragment_sent(s, l, 0, 1); /* version 1 after that report */
  l->hb_steps = 1000000;                    /* a counter that runs away */
  b = distro__syncer_steps_bound(s, l, 0, 1, 101.5, &by_time);
  cr_assert_float_eq(b, (101.5 - 101.0 + 2.0) / 0.0025 + 56, 1e-6, "from the report before version 1: %g", b);
  cr_assert_float_eq(by_time, b, 1e-9);
  l->hb_steps = 200;
  b = distro__syncer_steps_bound(s, l, 0, 1, 101.6, &by_time);
  cr_assert_float_eq(b, 200 - 50 + 56, 1e-9, "the counter since that report: %g", b);
  b = distro__syncer_steps_bound(s, l, 0, 7, 101.7, &by_time); /* a version never sent to it: its join */
  cr_assert_float_eq(b, 200 + 56, 1e-9, "%g", b);
  s->opt.min_step_s = 0.1; /* slower than its own claim: the floor */
  b = distro__syncer_steps_bound(s, l, 0, 7, 101.7, &by_time);
  cr_assert_float_eq(b, (101.7 - 100.0 + 2.0) / 0.1 + 56, 1e-6, "%g", b);
  /* Rejoined with its state on a syncer that never saw it join: no time bound. */
  sy_learner *r = calloc(1, sizeof *r);
  s->learners[6] = r;
  s->opt.min_step_s = 0;
  distro__syncer_hello_claims(s, r, 1, 1, 0, 200.0);
  r->hb_steps = 10;
  r->step_min = 0.01;
  b = distro__syncer_steps_bound(s, r, 0, 3, 200.1, &by_time);
  cr_assert(isinf(by_time), "%g", by_time);
  cr_assert_float_eq(b, 10 + 56, 1e-9, "%g", b);
  free(r->win);
  free(r);
  free(l->win);
  free(l);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
#else
Test(sync_claims, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
