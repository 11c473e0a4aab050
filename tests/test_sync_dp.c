/* Data-parallel learners (distro_learner_options.comm): a learner of two
 * in-process ranks joins from a peer, and while it trains against a syncer
 * on a thread
 *  - its ranks hold bit-identical parameters after every step (merged
 *    fragments are applied on both ranks at the same step), and those
 *    parameters are not what local training alone would give;
 *  - its reports carry the tokens of both ranks (101 + 30 per step), seen
 *    both in its stats and in the syncer's merges;
 * plus the collective failures: ranks that registered different tensors,
 * and rank 0 unable to join. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include "sync_harness.h"

#define N 64 /* parameters: "w" 48 and "b" 16, as the harness learner */
#define NW (N - N / 4)

typedef struct dp_ctx {
  const char *ep;
  sh_learner *seed;     /* stopped by rank 0 once the data-parallel learner joined */
  int bad_rank1;        /* rank 1 registers other tensors */
  double join_timeout;
  /* Results per rank. */
  distro_status start_st[2];
  char start_err[2][512];
  int joined_from[2];
  int equal_after_join;
  long steps, mismatches, checks;
  distro_learner_stats last[2];
  uint64_t versions[2][8];
  int differs_from_local;
  int global_equal;       /* distro_learner_get_global: the same on both ranks */
  distro_status global_bad_size;
} dp_ctx;

/* 1 if every rank holds the same bytes in theta (collective). */
static int ranks_equal(distro_comm *c, const float *theta) {
  float all[2 * N];
  if (distro_comm_allgather(c, theta, sizeof(float) * N, all) != DISTRO_OK) return 0;
  return memcmp(all, all + N, sizeof(float) * N) == 0;
}

static distro_status dp_rank(distro_comm *c, int rank, void *arg) {
  dp_ctx *x = arg;
  float theta[N], local[N];
  /* Different starting points: the join must overwrite both with the global copy. */
  for (int i = 0; i < N; i++) theta[i] = (float)(rank + 3) * (float)cos(0.3 * i);
  distro_learner_options o = distro_learner_options_default();
  o.syncer = x->ep;
  o.learner_id = 1;
  o.heartbeat_s = 0.1;
  o.timeout_s = 1.0;
  o.join_timeout_s = x->join_timeout;
  o.comm = c;
  distro_learner *l = NULL;
  distro_status st = distro_learner_create(&o, &l);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "w", theta, NW, 0);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "b", theta + NW, x->bad_rank1 && rank == 1 ? N / 8 : N / 4, 0);
  if (st == DISTRO_OK) st = distro_learner_start(l);
  x->start_st[rank] = st;
  if (st != DISTRO_OK) {
    snprintf(x->start_err[rank], sizeof x->start_err[rank], "%s", distro_last_error());
    distro_learner_free(l);
    return DISTRO_OK;
  }
  distro_learner_stats s;
  distro_learner_get_stats(l, &s);
  x->joined_from[rank] = s.joined_from_peer;
  const int eq = ranks_equal(c, theta);
  if (rank == 0) {
    x->equal_after_join = eq;
    sh_learner_join(x->seed); /* from now on only this learner reports */
  }
  memcpy(local, theta, sizeof local);
  /* Inner steps: each rank's gradient pulls towards its own target; the
   * all-reduced mean makes the update the same on both ranks. */
  const float target = rank == 0 ? -1.0f : -0.5f, lr = 0.05f;
  long t = 0, mism = 0, checks = 0;
  memset(&s, 0, sizeof s);
  for (; t < 3000 && !(t >= 150 && s.applies >= 6); t++) {
    float g[N], gl[N];
    for (int i = 0; i < N; i++) g[i] = theta[i] - target, gl[i] = local[i] - target;
    if ((st = distro_comm_allreduce_sum(c, g, N)) != DISTRO_OK) break;
    if ((st = distro_comm_allreduce_sum(c, gl, N)) != DISTRO_OK) break;
    for (int i = 0; i < N; i++) theta[i] -= lr * g[i] / 2, local[i] -= lr * gl[i] / 2;
    sh_sleep(0.004);
    if ((st = distro_learner_step(l, rank == 0 ? 101 : 30, &s)) != DISTRO_OK) break;
    checks++;
    if (!ranks_equal(c, theta)) mism++;
  }
  x->last[rank] = s;
  float glob[N];
  int gok = distro_learner_get_global(l, "w", glob, NW) == DISTRO_OK &&
            distro_learner_get_global(l, "b", glob + NW, N / 4) == DISTRO_OK;
  const int geq = ranks_equal(c, glob);
  if (rank == 0) {
    x->global_equal = gok && geq;
    x->global_bad_size = distro_learner_get_global(l, "b", glob, N);
  }
  distro_learner_versions(l, x->versions[rank], distro_learner_fragments(l));
  if (rank == 0) {
    x->steps = t;
    x->mismatches = mism;
    x->checks = checks;
    x->differs_from_local = memcmp(theta, local, sizeof theta) != 0;
  }
  distro_learner_free(l);
  return st;
}

Test(sync_dp, two_ranks_stay_identical_and_report_summed_tokens) {
  sh_syncer h;
  memset(&h, 0, sizeof h);
  char dir[256], ep[400];
  sh_tmpdir(dir, sizeof dir);
  cr_assert(dir[0]);
  snprintf(ep, sizeof ep, "ipc://%s/s.ipc", dir);
  distro_syncer_options o = distro_syncer_options_default();
  o.endpoint = ep;
  o.fragments = 2;
  o.interval_s = 0.03;
  o.overlap = 1;
  o.timeout_s = 1.0;
  o.heartbeat_s = 0.1;
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());

  /* A single-rank learner seeds the syncer; the data-parallel one pulls the state from it. */
  sh_learner seed;
  sh_learner_init(&seed, ep, 0, N, 1.0, 3);
  cr_assert_eq(sh_learner_run(&seed), 0);
  for (double t0 = sh_now(); atomic_load(&seed.done) < 20 && sh_now() - t0 < 20;) sh_sleep(0.01);
  cr_assert_geq(atomic_load(&seed.done), 20, "the seeding learner did not start: %s", seed.start_error);

  dp_ctx x;
  memset(&x, 0, sizeof x);
  x.ep = ep;
  x.seed = &seed;
  x.join_timeout = 15;
  const distro_status rs = distro_comm_run_local(2, dp_rank, &x);
  sh_stop(&h);
  free(seed.theta);
  cr_assert_eq(x.start_st[0], DISTRO_OK, "rank 0: %s", x.start_err[0]);
  cr_assert_eq(x.start_st[1], DISTRO_OK, "rank 1: %s", x.start_err[1]);
  cr_assert_eq(rs, DISTRO_OK, "%s", distro_last_error());

  cr_expect_eq(x.joined_from[0], 1, "rank 0 joined from source %d, not from the peer", x.joined_from[0]);
  cr_expect_eq(x.joined_from[1], 1, "rank 1 reports source %d", x.joined_from[1]);
  cr_expect(x.equal_after_join, "the ranks' parameters differ after the join");
  cr_expect_geq(x.last[0].applies, 6, "only %llu merged fragments applied in %ld steps",
                (unsigned long long)x.last[0].applies, x.steps);
  cr_expect_eq(x.mismatches, 0, "the ranks' parameters differed after %ld of %ld steps", x.mismatches, x.checks);
  cr_expect(x.global_equal, "distro_learner_get_global failed or differs between the ranks");
  cr_expect_eq(x.global_bad_size, DISTRO_ERR_SHAPE);
  cr_expect(x.differs_from_local, "the merges changed nothing: the test would not see a missing broadcast");
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(x.last[r].tokens, 131ull * (unsigned long long)x.steps, "rank %d: %llu tokens after %ld steps", r,
                 (unsigned long long)x.last[r].tokens, x.steps);
    cr_expect_eq(x.last[r].ranks, 2);
    cr_expect_eq(x.last[r].applies, x.last[0].applies);
  }
  cr_expect_eq(memcmp(x.versions[0], x.versions[1], sizeof x.versions[0]), 0, "versions differ: %llu,%llu vs %llu,%llu",
               (unsigned long long)x.versions[0][0], (unsigned long long)x.versions[0][1],
               (unsigned long long)x.versions[1][0], (unsigned long long)x.versions[1][1]);

  /* The syncer's view: merges of learner 1's reports alone carry multiples of 131 tokens. */
  int alone = 0;
  uint64_t sum = 0;
  for (int k = 0; k < h.nm; k++) {
    if (h.m[k].participant_mask != 2u) continue;
    alone++;
    sum += h.m[k].tokens;
    cr_expect(h.m[k].tokens > 0 && h.m[k].tokens % 131 == 0, "merge %d (fragment %d) counted %llu tokens", k,
              h.m[k].fragment, (unsigned long long)h.m[k].tokens);
  }
  cr_expect_geq(alone, 4, "only %d merges of the data-parallel learner alone", alone);
  cr_expect_leq(sum, 2 * 131ull * (unsigned long long)x.steps, "merged %llu tokens, more than were processed",
                (unsigned long long)sum);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_expect_eq(system(cmd), 0);
}

Test(sync_dp, ranks_with_other_tensors_fail_together) {
  dp_ctx x;
  memset(&x, 0, sizeof x);
  x.ep = "ipc:///tmp/distro-no-syncer-here.ipc";
  x.bad_rank1 = 1;
  x.join_timeout = 5;
  cr_assert_eq(distro_comm_run_local(2, dp_rank, &x), DISTRO_OK);
  for (int r = 0; r < 2; r++) {
    cr_expect_eq(x.start_st[r], DISTRO_ERR_SHAPE, "rank %d: %s", r, distro_status_string(x.start_st[r]));
    cr_expect(strstr(x.start_err[r], "rank 1 registered other tensors"), "rank %d: %s", r, x.start_err[r]);
  }
}

Test(sync_dp, rank0_join_failure_reaches_every_rank) {
  dp_ctx x;
  memset(&x, 0, sizeof x);
  x.ep = "ipc:///tmp/distro-no-syncer-here.ipc";
  x.join_timeout = 0.5;
  cr_assert_eq(distro_comm_run_local(2, dp_rank, &x), DISTRO_OK);
  cr_expect_eq(x.start_st[0], DISTRO_ERR_TIMEOUT, "rank 0: %s: %s", distro_status_string(x.start_st[0]),
               x.start_err[0]);
  cr_expect_eq(x.start_st[1], DISTRO_ERR_COMM, "rank 1: %s", distro_status_string(x.start_st[1]));
  cr_expect(strstr(x.start_err[1], "rank 0 could not join"), "rank 1: %s", x.start_err[1]);
}

#else
Test(sync_dp, skipped_without_libzmq) { cr_skip_test("built without libzmq"); }
#endif
