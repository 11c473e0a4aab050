/* Liveness under faults and rogue clients (issue 15): while two honest
 * learners merge at quorum 2,
 *  - a rogue HELLO that takes learner 0's id, and
 *  - learner 1 SIGKILLed and restarted at once under the same id
 * each leave a round waiting for a report that never comes; merges must go
 * on within the round bound (before: none for the rest of the run). Also:
 *  - a rogue first HELLO with a bogus layout that never seeds does not lock
 *    honest learners out (before: they failed with DISTRO_ERR_SHAPE), and an
 *    operator-given signature refuses it outright;
 *  - a job whose rounds cannot complete is reported: the syncer abandons
 *    rounds and logs "no merge for", the learners count no_merge_s and log it. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef DISTRO_WITH_SYNC
#include <zmq.h>

#include "sync/syncer_state.h"
#include "sync_harness.h"
#include "sync_proc.h"
#include "sync_rogue.h"

/* Lines a log function collected (syncer and learners), for the checks. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];
static size_t log_len;
static void log_line(void *ctx, const char *line) {
  (void)ctx;
  pthread_mutex_lock(&log_mu);
  const size_t n = strlen(line);
  if (log_len + n + 2 < sizeof log_text) {
    memcpy(log_text + log_len, line, n);
    log_len += n;
    log_text[log_len++] = '\n';
    log_text[log_len] = 0;
  }
  pthread_mutex_unlock(&log_mu);
}
static int logged(const char *needle) {
  pthread_mutex_lock(&log_mu);
  const int hit = strstr(log_text, needle) != NULL;
  pthread_mutex_unlock(&log_mu);
  return hit;
}

/* A syncer on a thread: 2 fragments, quorum 2, logging to log_text;
 * `tweak` may change the options first. */
static void start(sh_syncer *h, char *ep, size_t n, distro_syncer_options *o, void (*tweak)(distro_syncer_options *)) {
  sh_init(h, ep, n);
  sh_options(o, ep, 2);
  o->quorum = 2;
  o->log = log_line;
  if (tweak) tweak(o);
  cr_assert_eq(sh_start(h, o), DISTRO_OK, "%s", distro_last_error());
}

/* Merges recorded in [t0, t1] and the longest time without one there. */
static int merges_between(sh_syncer *h, double t0, double t1, double *gap) {
  int n = 0;
  double last = t0;
  *gap = 0;
  pthread_mutex_lock(&h->mu);
  for (int k = 0; k < h->nm; k++) {
    if (h->t_merge[k] < t0 || h->t_merge[k] > t1) continue;
    if (h->t_merge[k] - last > *gap) *gap = h->t_merge[k] - last;
    last = h->t_merge[k];
    n++;
  }
  pthread_mutex_unlock(&h->mu);
  if (t1 - last > *gap) *gap = t1 - last;
  return n;
}

/* Three round bounds (2 timeout_s each) after t0: merges must go on. */
static void expect_merges_after(sh_syncer *h, double t0, double timeout_s, const char *what) {
  const double window = 3 * 2 * timeout_s;
  sh_sleep(t0 + window - sh_now());
  double gap;
  const int n = merges_between(h, t0, t0 + window, &gap);
  cr_log_info("after %s: %d merges in %.0f s, longest gap %.2f s", what, n, window, gap);
  cr_assert_geq(n, 20, "merges stopped after %s (%d in %.0f s, longest gap %.2f s)", what, n, window, gap);
}

static const int64_t harness_layout[2] = {192, 64}; /* sh_learner with n = 256 */

Test(sync_liveness, rogue_hello_for_a_live_id_merges_continue) {
  static sh_syncer h;
  char ep[300];
  distro_syncer_options o;
  start(&h, ep, sizeof ep, &o, NULL);
  sh_learner a, b;
  sh_learner_init(&a, ep, 0, 256, 1.0, 5);
  sh_learner_init(&b, ep, 1, 256, 0.5, 5);
  cr_assert_eq(sh_learner_run(&a), 0);
  cr_assert_eq(sh_learner_run(&b), 0);
  cr_assert_geq(sh_wait_merges(&h, 10, 20), 10, "the honest job merges (%s / %s)", a.start_error, b.start_error);
  /* The rogue says hello as learner 0 (its layout is public) and goes quiet. */
  void *ctx = zmq_ctx_new(), *r = sr_dealer(ctx, ep);
  const double t0 = sh_now();
  cr_assert_eq(sr_hello(r, 0, h.s->L.signature, 1, harness_layout, 2, "tcp://127.0.0.1:1"), 0);
  expect_merges_after(&h, t0, o.timeout_s, "a rogue HELLO for learner 0");
  cr_assert_geq(a.last.rejoins, 1, "learner 0 said hello again to take its id back");
  zmq_close(r);
  zmq_ctx_term(ctx);
  sh_learner_join(&a);
  sh_learner_join(&b);
  sh_stop(&h);
}

Test(sync_liveness, learner_killed_and_restarted_at_once_merges_continue) {
  static sh_syncer h;
  char ep[300];
  distro_syncer_options o;
  start(&h, ep, sizeof ep, &o, NULL);
  sh_learner a;
  sh_learner_init(&a, ep, 0, 256, 1.0, 5);
  cr_assert_eq(sh_learner_run(&a), 0);
  for (double t0 = sh_now(); atomic_load(&a.done) < 5 && sh_now() - t0 < 20;) sh_sleep(0.02);
  static sp_proc p1, p2;
  sp_spawn_learner(&p1, ep, 1, 100000, 5, 0.2, NULL, 0);
  cr_assert_geq(sh_wait_merges(&h, 10, 20), 10, "the honest job merges");
  /* SIGKILL and restart under the same id before the syncer notices. */
  const double t0 = sh_now();
  kill(p1.pid, SIGKILL);
  sp_reap(&p1);
  sp_spawn_learner(&p2, ep, 1, 100000, 5, 0.2, NULL, 0);
  expect_merges_after(&h, t0, o.timeout_s, "a kill and an immediate restart");
  cr_assert_eq(p2.joined_source, 1, "the restarted learner joined from a peer (source %d)", p2.joined_source);
  kill(p2.pid, SIGTERM);
  sp_reap(&p2);
  sp_free(&p1);
  sp_free(&p2);
  sh_learner_join(&a);
  sh_stop(&h);
}

/* A rogue's first HELLO proposes a bogus layout and never seeds. */
static uint64_t pinned;
static void quorum1_pinned(distro_syncer_options *o) {
  o->quorum = 1;
  o->signature = pinned;
}

static void rogue_first_hello(uint64_t signature, int expect_error) {
  static sh_syncer h;
  char ep[300];
  distro_syncer_options o;
  pinned = signature;
  start(&h, ep, sizeof ep, &o, quorum1_pinned);
  void *ctx = zmq_ctx_new(), *r = sr_dealer(ctx, ep);
  const int64_t bogus[2] = {1000, 1000};
  cr_assert_eq(sr_hello(r, 9, 0x1234, 0, bogus, 2, "tcp://127.0.0.1:1"), 0);
  /* What the syncer answered the rogue: WELCOME(seed), or an ERROR. */
  const int answer = sr_first_reply(r, 5);
  if (expect_error)
    cr_assert_eq(answer, 100 + DISTRO_SYNC_E_SIGNATURE, "rogue HELLO against a pinned signature: answer %d", answer);
  else
    cr_assert_eq(answer, DISTRO__SY_WELCOME, "rogue HELLO to a fresh syncer: answer %d", answer);
  sh_learner a;
  sh_learner_init(&a, ep, 0, 256, 1.0, 5);
  cr_assert_eq(sh_learner_run(&a), 0);
  sh_wait_merges(&h, 3, 15);
  cr_assert_eq(a.start_status, DISTRO_OK, "the honest learner could not join: %s", a.start_error);
  cr_assert_geq(sh_merges(&h), 3, "the honest learner's job merges");
  distro_syncer_stats st;
  distro_syncer_get_stats(h.s, &st);
  cr_assert_eq(st.numel, 256, "the job's layout is the honest learner's (%lld parameters)", (long long)st.numel);
  zmq_close(r);
  zmq_ctx_term(ctx);
  sh_learner_join(&a);
  sh_stop(&h);
}

Test(sync_liveness, rogue_first_hello_does_not_lock_honest_learners_out) {
  rogue_first_hello(0, 0);
  cr_assert(logged("did not seed"), "the rogue's layout was dropped");
}

Test(sync_liveness, pinned_signature_refuses_a_rogue_first_hello) {
  /* The harness learner's signature, as distro_learner_signature gives it. */
  float w[192], b[64];
  distro_learner_options lo = distro_learner_options_default();
  lo.syncer = "ipc:///tmp/unused.ipc";
  distro_learner *l = NULL;
  cr_assert_eq(distro_learner_create(&lo, &l), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_learner_signature(l), 0);
  cr_assert_eq(distro_learner_add_tensor(l, "w", w, 192, 0), DISTRO_OK);
  cr_assert_eq(distro_learner_add_tensor(l, "b", b, 64, 0), DISTRO_OK);
  const uint64_t sig = distro_learner_signature(l);
  distro_learner_free(l);
  cr_assert_neq(sig, 0);
  rogue_first_hello(sig, 1);
}

/* Learner 1 is a client that joins and heartbeats "ready" but never
 * reports: with quorum 2 no round can complete. */
static void short_timeout(distro_syncer_options *o) { o->timeout_s = 0.5; }

Test(sync_liveness, rounds_that_cannot_complete_are_abandoned_and_reported) {
  static sh_syncer h;
  char ep[300];
  distro_syncer_options o;
  start(&h, ep, sizeof ep, &o, short_timeout);
  static sh_learner a;
  sh_learner_init(&a, ep, 0, 256, 1.0, 5);
  a.log = log_line;
  cr_assert_eq(sh_learner_run(&a), 0);
  for (double t0 = sh_now(); atomic_load(&a.done) < 5 && sh_now() - t0 < 20;) sh_sleep(0.02);
  cr_assert_gt(atomic_load(&a.done), 0, "%s", a.start_error);
  void *ctx = zmq_ctx_new(), *r = sr_dealer(ctx, ep);
  sr_hello(r, 1, h.s->L.signature, 1, harness_layout, 2, "tcp://127.0.0.1:1");
  const int before = sh_merges(&h);
  for (double t0 = sh_now(); sh_now() - t0 < 7;) {
    sr_heartbeat(r, 1, 1);
    sr_drain(r);
    sh_sleep(0.05);
  }
  distro_syncer_stats st;
  distro_syncer_get_stats(h.s, &st);
  distro_learner_stats ls;
  distro_learner_get_stats(a.l, &ls);
  cr_log_info("silent reporter: %d merges, %llu rounds abandoned, syncer %.1f s and learner %.1f s without a merge",
              sh_merges(&h) - before, (unsigned long long)st.abandoned, st.no_merge_s, ls.no_merge_s);
  cr_assert_geq(st.abandoned, 2, "rounds that cannot reach their quorum are closed");
  cr_assert_leq(sh_merges(&h) - before, 1, "no quorum of 2 was possible");
  cr_assert_gt(st.no_merge_s, 2.0, "the syncer counts the time without a merge");
  cr_assert_gt(ls.no_merge_s, 2.0, "the learner counts the time without a merge");
  cr_assert(logged("abandoned after"), "the syncer logs the abandoned rounds");
  cr_assert(logged("no merge for"), "the syncer logs the stall");
  cr_assert(logged("learner 0: no merge for"), "the learner logs the stall");
  zmq_close(r);
  zmq_ctx_term(ctx);
  sh_learner_join(&a);
  sh_stop(&h);
}
#else
Test(sync_liveness, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
