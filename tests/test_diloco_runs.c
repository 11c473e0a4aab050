/* DiLoCo outer loop, part 2: learners (each 1 or 2 in-process ranks) through
 * the public API: bit-identity with inner data-parallel ranks, the progress
 * thread against the blocking path, save/load, bad payloads, mismatched
 * learners, streamed bytes and hidden latency. The float64 reference is in
 * test_diloco_reference.c; options and state files in test_diloco_api.c. */
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
#include "testutil.h"

/* ---- tests -------------------------------------------------------------------- */

/* Learners that are data-parallel inside (2 ranks each): ranks stay
 * bit-identical inside a learner, and after sync_all every rank of every
 * learner holds the same bits, equal to the global copy. */
Test(diloco, learners_bit_identical_with_inner_data_parallel, .timeout = 60) {
  for (int c = 0; c < 2; c++) {
    run x;
    run_init(&x, 2, 2, 12);
    if (c == 0) {
      x.inner = distro_options_default(DISTRO_ALG_ADAMW);
      x.lr = 1e-3f;
      x.dl.codec = DISTRO_OUTER_INT4;
      x.dl.merge = DISTRO_MERGE_RADIAL_TOKENS;
    } else {
      x.inner = distro_options_default(DISTRO_ALG_DEMO);
      x.inner.topk = 4;
      x.lr = 1e-3f;
      x.dl.codec = DISTRO_OUTER_FP4;
      x.dl.merge = DISTRO_MERGE_TOKENS;
    }
    x.tokens_base = 100;
    x.dl.H = 4;
    x.dl.fragments = 2;
    x.dl.overlap = 1;
    x.dl.alpha = 0.5f;
    x.dl.progress_thread = c;
    x.sync_all = 2 - c;
    run_exec(&x);
    expect_ok(&x, c ? "demo inside" : "adamw inside");
    for (int m = 0; m < 2; m++) {
      cr_assert_eq(first_diff(x.pre[m][0], x.pre[m][1]), -1, "config %d: ranks of learner %d differ", c, m);
      cr_assert_eq(first_diff(x.glob[m][0], x.glob[m][1]), -1, "config %d: global copies of learner %d differ", c, m);
    }
    cr_assert_neq(first_diff(x.pre[0][0], x.pre[1][0]), -1, "config %d: learners should differ before sync_all", c);
    for (int m = 0; m < 2; m++)
      for (int r = 0; r < 2; r++) {
        cr_assert_eq(first_diff(x.out[m][r], x.out[0][0]), -1, "config %d: after sync_all learner %d rank %d differs", c,
                     m, r);
        cr_assert_eq(first_diff(x.out[m][r], x.glob[m][r]), -1, "config %d: parameters != global copy", c);
      }
    /* the token counts were summed over the learner's ranks: same weights
       in both columns, or the ranks would have diverged above */
    run_free(&x);
  }
}

/* The progress thread gives the same bits as the blocking path, for tau = 0
 * (the overlap machinery with nothing to overlap) and tau > 0; and tau > 0
 * does change the result. Stats: sends every H/P steps, applies tau later. */
Test(diloco, overlap_paths_agree, .timeout = 60) {
  run a[2][2];
  for (int tau = 0; tau < 2; tau++)
    for (int th = 0; th < 2; th++) {
      run *x = &a[tau][th];
      run_init(x, 3, 1, 13);
      x->seed = a[0][0].seed ? a[0][0].seed : x->seed;
      x->dl.H = 6;
      x->dl.fragments = 2;
      x->dl.overlap = tau ? 2 : 0;
      x->dl.alpha = 0.5f;
      x->dl.codec = DISTRO_OUTER_INT8;
      x->dl.merge = DISTRO_MERGE_TOKENS;
      x->tokens_base = 7;
      x->dl.progress_thread = th;
      run_exec(x);
      expect_ok(x, "overlap");
    }
  for (int tau = 0; tau < 2; tau++)
    for (int m = 0; m < 3; m++) {
      cr_assert_eq(first_diff(a[tau][0].out[m][0], a[tau][1].out[m][0]), -1,
                   "tau %d: progress thread and blocking path differ (learner %d)", tau ? 2 : 0, m);
      cr_assert_eq(first_diff(a[tau][0].glob[m][0], a[tau][1].glob[m][0]), -1);
    }
  cr_assert_neq(first_diff(a[0][0].out[0][0], a[1][0].out[0][0]), -1, "tau 2 should differ from tau 0");
  for (int th = 0; th < 2; th++)
    for (int s = 0; s < 13; s++) {
      const distro_diloco_stats *st0 = &a[0][th].stats[1][0][s], *st2 = &a[1][th].stats[1][0][s];
      const int t = s + 1;
      const int due = t % 6 == 0 ? 0 : t % 6 == 3 ? 1 : -1;
      cr_assert_eq(st0->step, t);
      cr_assert_eq(st0->fragment_sent, due, "step %d", t);
      cr_assert_eq(st0->fragment_applied, due, "step %d", t);
      cr_assert_eq(st2->fragment_sent, due, "step %d", t);
      const int due_before = (t - 2) % 6 == 0 && t > 2 ? 0 : (t - 2) % 6 == 3 ? 1 : -1;
      cr_assert_eq(st2->fragment_applied, due_before, "tau 2, step %d: applied %d", t, st2->fragment_applied);
      cr_assert_eq(st0->outer_bytes_sent > 0, due >= 0);
      if (due >= 0) cr_assert_eq(st0->outer_bytes_received, 2 * st0->outer_bytes_sent);
    }
  for (int tau = 0; tau < 2; tau++)
    for (int th = 0; th < 2; th++) run_free(&a[tau][th]);
}

/* Save after step 7 (an exchange started at 6 awaits its application at 8),
 * resume in fresh objects: the rest of the run lands on the same bits. */
Test(diloco, save_load_resumes_bit_identical, .timeout = 60) {
  for (int c = 0; c < 2; c++) {
    run full, tail;
    run_init(&full, c ? 2 : 3, c ? 2 : 1, 14);
    full.inner = distro_options_default(DISTRO_ALG_ADAMW);
    full.lr = 1e-3f;
    full.dl.H = 6;
    full.dl.fragments = 2;
    full.dl.overlap = 2;
    full.dl.alpha = 0.5f;
    full.dl.codec = DISTRO_OUTER_INT4;
    full.dl.merge = DISTRO_MERGE_RADIAL_TOKENS;
    full.dl.progress_thread = 1;
    full.tokens_base = 50;
    snprintf(full.dir, sizeof full.dir, "/tmp/distro_dlc_XXXXXX");
    cr_assert_not_null(mkdtemp(full.dir));
    full.save_after = 7;
    run_exec(&full);
    expect_ok(&full, "full run");
    tail = full;
    memset(tail.out, 0, sizeof tail.out);
    memset(tail.pre, 0, sizeof tail.pre);
    memset(tail.glob, 0, sizeof tail.glob);
    memset(tail.gw0, 0, sizeof tail.gw0);
    memset(tail.gw1, 0, sizeof tail.gw1);
    memset(tail.stats, 0, sizeof tail.stats);
    tail.save_after = 0;
    tail.resume_from = 7;
    run_exec(&tail);
    expect_ok(&tail, "resumed run");
    for (int m = 0; m < full.M; m++)
      for (int r = 0; r < full.R; r++) {
        long dpar = first_diff(full.out[m][r], tail.out[m][r]);
        cr_assert_eq(dpar, -1, "config %d learner %d rank %d: resumed parameters differ at %ld (DISTRO_TEST_SEED=%llu)",
                     c, m, r, dpar, (unsigned long long)full.seed);
        cr_assert_eq(first_diff(full.glob[m][r], tail.glob[m][r]), -1, "resumed global copy differs");
        for (int s = 7; s < 14; s++) {
          cr_assert_eq(tail.stats[m][r][s].step, s + 1);
          cr_assert_eq(tail.stats[m][r][s].fragment_applied, full.stats[m][r][s].fragment_applied);
          cr_assert_eq(tail.stats[m][r][s].total_outer_bytes_sent, full.stats[m][r][s].total_outer_bytes_sent);
        }
      }
    for (int m = 0; m < full.M; m++)
      for (int r = 0; r < full.R; r++) {
        char p[128];
        snprintf(p, sizeof p, "%s/inner-%d-%d.bin", full.dir, m, r);
        unlink(p);
        snprintf(p, sizeof p, "%s/outer-%d-%d.bin", full.dir, m, r);
        unlink(p);
      }
    rmdir(full.dir);
    for (int m = 0; m < MAXL; m++)
      for (int r = 0; r < MAXR; r++) {
        free(tail.out[m][r]);
        free(tail.pre[m][r]);
        free(tail.glob[m][r]);
        free(tail.gw0[m][r]);
        free(tail.gw1[m][r]);
      }
    run_free(&full);
  }
}

/* A corrupt payload (flipped byte), a well-formed payload with a NaN, and a
 * learner whose parameters went NaN: every learner rejects that exchange
 * with DISTRO_ERR_PAYLOAD, the global copy is untouched, and the next
 * exchange works (learners end identical after it). */
Test(diloco, bad_payloads_rejected_global_untouched, .timeout = 60) {
  for (int kind = 0; kind < 4; kind++) {
    run x;
    run_init(&x, 3, 1, kind == 2 ? 6 : 9);
    x.dl.H = 3;
    int bad_step = 6;
    if (kind == 0 || kind == 3) {
      x.corrupt_exchange = 2; /* the exchange at step 6 */
      x.corrupt_learner = 1;
    }
    if (kind == 1) {
      x.corrupt_exchange = 2;
      x.corrupt_learner = 2;
      x.corrupt_nan = 1;
    }
    if (kind == 2) {
      x.nan_step = 6;
      x.nan_learner = 0;
    }
    if (kind == 3) { /* overlap with the progress thread: reported when applied */
      x.dl.H = 4;
      x.dl.overlap = 1;
      x.dl.progress_thread = 1;
      x.steps = 13;
      x.corrupt_exchange = 1; /* sent at 4, applied at 5 */
      bad_step = 5;
    }
    x.watch_from = kind == 3 ? 4 : bad_step;
    x.watch_to = bad_step;
    run_exec(&x);
    for (int m = 0; m < 3; m++) {
      cr_assert_eq(x.final_st[m][0], DISTRO_OK, "kind %d learner %d: %s", kind, m, x.err[m][0]);
      for (int s = 0; s < x.steps; s++) {
        const distro_status want = s + 1 == bad_step ? DISTRO_ERR_PAYLOAD : DISTRO_OK;
        cr_assert_eq(x.st[m][0][s], want, "kind %d learner %d step %d: status %d (%s)", kind, m, s + 1, x.st[m][0][s],
                     x.err[m][0]);
        cr_assert_eq(x.stats[m][0][s].inner_done, 1);
      }
      cr_assert(strstr(x.err[m][0], kind == 0 || kind == 3 ? "checksum" : "not finite") != NULL, "kind %d: %s", kind,
                x.err[m][0]);
      cr_assert_eq(x.stats[m][0][bad_step - 1].fragment_applied, -1);
      cr_assert_eq(first_diff(x.gw0[m][0], x.gw1[m][0]), -1, "kind %d learner %d: the global copy changed", kind, m);
      if (kind != 2) { /* the next exchange was applied: learners identical again */
        cr_assert_eq(first_diff(x.out[m][0], x.out[0][0]), -1, "kind %d: learner %d differs at the end", kind, m);
        cr_assert_neq(first_diff(x.gw0[m][0], x.glob[m][0]), -1, "kind %d: no later exchange was applied", kind);
      }
    }
    run_free(&x);
  }
}

/* Learners that disagree fail together with DISTRO_ERR_SHAPE before any
 * step is taken. */
Test(diloco, mismatched_learners_rejected, .timeout = 60) {
  for (int kind = 0; kind < 5; kind++) {
    run x;
    run_init(&x, 3, kind >= 3 ? 2 : 1, 2);
    x.alt_learner = kind == 0 ? 1 : 2;
    if (kind == 0 || kind == 3) {
      x.alt_options = 1;
      x.alt_dl = x.dl;
      if (kind == 0) x.alt_dl.H = 250;
      else x.alt_dl.codec = DISTRO_OUTER_INT4;
      if (kind == 3) {
        x.alt_learner = 0;
        x.alt_rank = 1; /* one rank of a learner disagrees with its sibling */
      }
    }
    if (kind == 1) x.alt_shape = 1;
    if (kind == 2) x.alt_init = 1;
    if (kind == 4) { /* the learner's ranks start differently */
      x.alt_learner = 1;
      x.alt_rank = 0;
      x.alt_init = 1;
    }
    run_exec(&x);
    for (int m = 0; m < 3; m++)
      for (int r = 0; r < x.R; r++) {
        cr_assert_eq(x.final_st[m][r], DISTRO_ERR_SHAPE, "kind %d learner %d rank %d: status %d (%s)", kind, m, r,
                     x.final_st[m][r], x.err[m][r]);
        cr_assert_eq(x.stats[m][r][0].inner_done, 0);
        cr_assert_eq(x.stats[m][r][0].step, 0);
      }
    run_free(&x);
  }
}

/* Streaming: P fragments cut the peak bytes of any step ~P-fold at the same
 * total; INT4 payloads are ~7x smaller than F32. */
Test(diloco, streaming_and_codec_bytes, .timeout = 30) {
  uint64_t peak[3], total[3];
  const int P[3] = {1, 4, 4};
  for (int c = 0; c < 3; c++) {
    run x;
    run_init(&x, 2, 1, 16);
    x.dl.H = 8;
    x.dl.fragments = P[c];
    if (c == 2) x.dl.codec = DISTRO_OUTER_INT4;
    run_exec(&x);
    expect_ok(&x, "bytes");
    peak[c] = x.stats[0][0][15].peak_outer_bytes_sent;
    total[c] = x.stats[0][0][15].total_outer_bytes_sent;
    uint64_t sum = 0;
    for (int s = 0; s < 16; s++) sum += x.stats[0][0][s].outer_bytes_sent;
    cr_assert_eq(sum, total[c]);
    run_free(&x);
  }
  cr_assert_geq((double)peak[0] / (double)peak[1], 0.8 * 4, "peak P=1 %llu, P=4 %llu", (unsigned long long)peak[0],
                (unsigned long long)peak[1]);
  cr_assert_lt(fabs((double)total[0] - (double)total[1]) / (double)total[0], 0.03, "same data per H steps");
  cr_assert_geq((double)total[1] / (double)total[2], 6.0, "int4 %llu vs f32 %llu", (unsigned long long)total[2],
                (unsigned long long)total[1]);
}

/* With 200 ms of outer latency and 50 ms of compute per step, the progress
 * thread hides most of each exchange behind the tau = 3 following steps:
 * blocking costs >= 200 (agreement) + 11 x 50 + 2 x 200 ms; with the thread
 * about 200 + 11 x 50 + 2 x 50. */
Test(diloco, progress_thread_hides_latency, .timeout = 60) {
  run x[2];
  for (int th = 0; th < 2; th++) {
    run_init(&x[th], 3, 1, 11);
    if (th) x[th].seed = x[0].seed;
    x[th].dl.H = 4;
    x[th].dl.overlap = 3;
    x[th].dl.progress_thread = th;
    x[th].sleep_ms = 50;
    x[th].delay_ms = 200;
    run_exec(&x[th]);
    expect_ok(&x[th], "latency");
  }
  for (int m = 0; m < 3; m++) cr_assert_eq(first_diff(x[0].out[m][0], x[1].out[m][0]), -1);
  double waited = 0;
  for (int s = 0; s < 11; s++) waited += x[1].stats[0][0][s].seconds_wait;
  cr_log_info("outer latency 200 ms, compute 50 ms/step, tau 3: blocking %.3f s, progress thread %.3f s "
              "(waited %.3f s)", x[0].seconds, x[1].seconds, waited);
  cr_assert_lt(x[1].seconds + 0.2, x[0].seconds, "blocking %.3f s, progress thread %.3f s", x[0].seconds,
               x[1].seconds);
  cr_assert_lt(waited, 0.25, "waited %.3f s for the progress thread", waited);
  run_free(&x[0]);
  run_free(&x[1]);
}
