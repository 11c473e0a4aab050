/* Syncer + learner processes on loopback (ipc endpoints in a temp dir):
 *  - SIGKILL one of four learners mid-run: the survivors keep their step
 *    rate (within 10%) and merges continue at quorum with three live
 *    learners; restarted, it joins through a peer and its parameters equal
 *    the global fragments at the versions it received;
 *  - kill and restart the syncer (in-process, and as a SIGKILLed
 *    distro-syncer process): it reloads its checkpoint, learners rejoin and
 *    upload newer fragments, no fragment version goes backwards and merges
 *    continue. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef DISTRO_WITH_SYNC
#include "sync/syncer_state.h"
#include "sync_harness.h"

#include "sync_proc.h"

typedef sp_proc proc;
#define spawn(p, ep, id, steps, ms, off) sp_spawn_learner(p, ep, id, steps, ms, off, NULL, 0)
#define reap sp_reap
#define rate sp_rate

static void base_options(distro_syncer_options *o, const char *ep) {
  *o = distro_syncer_options_default();
  o->endpoint = ep;
  o->fragments = 4;
  o->interval_s = 0.04;
  o->timeout_s = 0.8;
  o->heartbeat_s = 0.1;
}

Test(sync_cluster, kill_one_learner_quorum_continues_restart_joins_from_peer) {
  static sh_syncer h;
  memset(&h, 0, sizeof h);
  h.record_values = 1;
  sh_tmpdir(h.dir, sizeof h.dir);
  char ep[300];
  snprintf(ep, sizeof ep, "ipc://%s/s.ipc", h.dir);
  distro_syncer_options o;
  base_options(&o, ep);
  o.quorum = 3;
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  proc L[5];
  const double T0 = sh_now();
  for (int i = 0; i < 4; i++) spawn(&L[i], ep, i, 900, 8, 0.1 * i);
  /* Phase 1: all four train. */
  sh_sleep(3.0);
  const double t_kill = sh_now();
  kill(L[3].pid, SIGKILL);
  sh_sleep(3.0);
  const double t_restart = sh_now();
  spawn(&L[4], ep, 3, 150, 8, 0.3);
  for (int i = 0; i < 3; i++) reap(&L[i]);
  reap(&L[4]);
  waitpid(L[3].pid, NULL, 0);
  pthread_join(L[3].th, NULL);
  fclose(L[3].out);
  free(L[3].params);
  /* Survivors' step rate: 1 s before the kill vs the 2 s after it. */
  for (int i = 0; i < 3; i++) {
    const double before = rate(&L[i], t_kill - 1.5, t_kill), after = rate(&L[i], t_kill + 0.5, t_restart);
    cr_log_info("learner %d: %.1f steps/s before the kill, %.1f while learner 3 is dead", i, before, after);
    cr_assert_gt(before, 0);
    cr_assert_geq(after, 0.9 * before, "learner %d slowed down: %.1f -> %.1f steps/s", i, before, after);
  }
  /* Merges while learner 3 was dead (after its timeout): quorum 3 of 3 live. */
  int dead_merges = 0, all_merges = sh_merges(&h);
  for (int k = 0; k < all_merges; k++)
    if (h.t_merge[k] > t_kill + 1.2 && h.t_merge[k] < t_restart) {
      dead_merges++;
      cr_assert_eq(h.m[k].live, 3, "merge %d: live %d", k, h.m[k].live);
      cr_assert_geq(h.m[k].participants, 3, "merge %d: %d participants", k, h.m[k].participants);
      cr_assert_eq(h.m[k].participant_mask & 8u, 0u);
    }
  cr_log_info("%d merges while learner 3 was dead; %d in all over %.1f s", dead_merges, all_merges, sh_now() - T0);
  cr_assert_geq(dead_merges, 10, "merges continue at quorum");
  /* The restarted learner joined from a peer with the global fragments. */
  cr_assert_eq(L[4].joined_source, 1, "restarted learner joined via %d (1 = peer)", L[4].joined_source);
  cr_assert_eq(L[4].nparams, 256);
  const distro__sy_layout *Lay = &h.s->L;
  unsigned long long v[4];
  cr_assert_eq(sscanf(L[4].versions, "%llu,%llu,%llu,%llu", &v[0], &v[1], &v[2], &v[3]), 4);
  for (int p = 0; p < 4; p++) {
    int64_t idx[256], n = 0;
    for (int q = Lay->frags.start[p]; q < Lay->frags.start[p + 1]; q++)
      for (int64_t j = 0; j < Lay->frags.pieces[q].count; j++)
        idx[n++] = Lay->toff[Lay->frags.pieces[q].tensor] + Lay->frags.pieces[q].offset + j;
    const int r = sh_check_fragment(&h, p, v[p], L[4].params, idx, n);
    cr_assert_eq(r, 1, "fragment %d version %llu: %s", p, v[p], r == 0 ? "values differ" : "version never merged");
  }
  free(L[4].params);
  for (int i = 0; i < 3; i++) free(L[i].params);
  sh_stop(&h);
}

Test(sync_cluster, syncer_restart_resumes_from_checkpoint_no_version_goes_back) {
  static sh_syncer h;
  memset(&h, 0, sizeof h);
  sh_tmpdir(h.dir, sizeof h.dir);
  char ep[300], ck[300];
  snprintf(ep, sizeof ep, "ipc://%s/s.ipc", h.dir);
  snprintf(ck, sizeof ck, "%s/syncer.ckpt", h.dir);
  distro_syncer_options o;
  base_options(&o, ep);
  o.checkpoint = ck;
  o.checkpoint_every = 7;
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  proc L[3];
  for (int i = 0; i < 3; i++) spawn(&L[i], ep, i, 800, 8, 0.1 * i);
  sh_sleep(2.5);
  uint64_t before[4], loaded[4], after[4];
  sh_stop(&h); /* a crash: nothing written since the last periodic checkpoint */
  /* The versions the learners hold are what the syncer had: read from the merge log. */
  for (int p = 0; p < 4; p++) before[p] = 0;
  for (int k = 0; k < h.nm; k++)
    if (h.m[k].version > before[h.m[k].fragment]) before[h.m[k].fragment] = h.m[k].version;
  const int merges1 = h.nm;
  sh_sleep(1.0);
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  distro_syncer_stats st;
  distro_syncer_get_stats(h.s, &st);
  cr_assert_eq(st.epoch, 2);
  cr_assert(st.initialized, "the checkpoint was loaded");
  cr_assert_eq(distro_syncer_versions(h.s, loaded, 4), DISTRO_OK);
  sh_sleep(3.0);
  cr_assert_eq(distro_syncer_versions(h.s, after, 4), DISTRO_OK);
  for (int p = 0; p < 4; p++) {
    cr_log_info("fragment %d: version %llu before the crash, %llu in the checkpoint, %llu after restart", p,
                (unsigned long long)before[p], (unsigned long long)loaded[p], (unsigned long long)after[p]);
    cr_assert_leq(loaded[p], before[p]);
    cr_assert_gt(after[p], before[p], "fragment %d went from %llu to %llu", p, (unsigned long long)before[p],
                 (unsigned long long)after[p]);
  }
  cr_assert_geq(h.nm - merges1, 8, "merges continue after the restart (%d)", h.nm - merges1);
  for (int i = 0; i < 3; i++) reap(&L[i]);
  for (int i = 0; i < 3; i++) free(L[i].params);
  for (int i = 0; i < 3; i++) {
    cr_assert(L[i].done, "learner %d finished", i);
    cr_assert_geq(L[i].rejoins, 1, "learner %d rejoined the restarted syncer", i);
  }
  sh_stop(&h);
}
/* The same with the distro-syncer process SIGKILLed (no shutdown at all)
 * and started again on its checkpoint: versions read from its merge log. */
static pid_t spawn_syncer(const char *ep, const char *ck, const char *log) {
  const char *args[] = {"--endpoint", ep, "--fragments", "4", "--interval", "0.04", "--timeout", "0.8", "--heartbeat",
                        "0.1", "--checkpoint", ck, "--checkpoint-every", "7", NULL};
  return sp_spawn_syncer(log, args);
}

static int read_syncer_log(const char *log, uint64_t v[4], unsigned long long *epoch) {
  return sp_read_syncer_log(log, v, 4, epoch);
}

Test(sync_cluster, syncer_process_sigkill_restart_from_checkpoint) {
  char dir[256], ep[300], ck[300], log1[300], log2[300];
  sh_tmpdir(dir, sizeof dir);
  cr_assert(dir[0]);
  snprintf(ep, sizeof ep, "ipc://%s/s.ipc", dir);
  snprintf(ck, sizeof ck, "%s/syncer.ckpt", dir);
  snprintf(log1, sizeof log1, "%s/syncer1.log", dir);
  snprintf(log2, sizeof log2, "%s/syncer2.log", dir);
  pid_t s1 = spawn_syncer(ep, ck, log1);
  sh_sleep(0.3);
  proc L[3];
  for (int i = 0; i < 3; i++) spawn(&L[i], ep, i, 800, 8, 0.1 * i);
  sh_sleep(2.5);
  kill(s1, SIGKILL);
  waitpid(s1, NULL, 0);
  uint64_t before[4], after[4];
  unsigned long long e1, e2;
  const int merges1 = read_syncer_log(log1, before, &e1);
  cr_assert_geq(merges1, 8, "merges before the kill (%d)", merges1);
  cr_assert_eq(access(ck, R_OK), 0, "a periodic checkpoint was written before the kill");
  sh_sleep(1.0);
  pid_t s2 = spawn_syncer(ep, ck, log2);
  sh_sleep(3.0);
  kill(s2, SIGTERM);
  waitpid(s2, NULL, 0);
  const int merges2 = read_syncer_log(log2, after, &e2);
  cr_assert_eq(e1, 1, "first syncer: epoch %llu", e1);
  cr_assert_eq(e2, 2, "the restarted syncer resumed the checkpoint (epoch %llu)", e2);
  cr_assert_geq(merges2, 8, "merges continue after the restart (%d)", merges2);
  for (int p = 0; p < 4; p++) {
    cr_log_info("fragment %d: version %llu before the kill, %llu after the restart", p,
                (unsigned long long)before[p], (unsigned long long)after[p]);
    cr_assert_gt(after[p], before[p], "fragment %d: %llu before the kill, %llu after", p,
                 (unsigned long long)before[p], (unsigned long long)after[p]);
  }
  for (int i = 0; i < 3; i++) kill(L[i].pid, SIGTERM);
  for (int i = 0; i < 3; i++) {
    reap(&L[i]);
    cr_assert_geq(L[i].rejoins, 1, "learner %d rejoined the restarted syncer", i);
    free(L[i].params);
  }
}
#else
Test(sync_cluster, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
