/* The GPT trainer (python-free-examples/gpt) end to end: the binary is run on
 * a tiny model and a generated text, and its exit status, messages, CSV log
 * and parameter checksum are checked. GPT_TRAIN is the binary's path. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpt_cli.h"

static const char *OPTIMS[] = {"adamw", "distro", "distro-adamw"};

TestSuite(gpt_train, .init = setup, .fini = teardown);

Test(gpt_train, loss_decreases) {
  for (int i = 0; i < 3; i++) {
    char args[2048], log[400], v[80][32];
    snprintf(log, sizeof log, "%s/%s.csv", dir, OPTIMS[i]);
    /* Learning rates for this tiny model (the defaults are tuned for the demo). */
    snprintf(args, sizeof args, "--optim %s --lr %s --steps 80 --eval-every 0 --log '%s'", OPTIMS[i],
             i == 1 ? "2e-3" : "3e-3", log);
    free(train(args));
    cr_assert_eq(csv_column(log, 2, v, 80), 80);
    double first = 0, last = 0;
    for (int s = 0; s < 5; s++) {
      first += atof(v[s]) / 5;
      last += atof(v[75 + s]) / 5;
    }
    cr_expect(last < first - 1.5, "%s: train loss did not fall: first steps %.3f, last steps %.3f", OPTIMS[i],
              first, last);
  }
}

Test(gpt_train, same_seed_same_losses) {
  for (int i = 0; i < 3; i++) {
    char args[2048], log[3][400], a[30][32], b[30][32], c[30][32];
    unsigned long long sum[3];
    for (int k = 0; k < 3; k++) {
      snprintf(log[k], sizeof log[k], "%s/%s.%d.csv", dir, OPTIMS[i], k);
      snprintf(args, sizeof args, "--optim %s --steps 30 --eval-every 10 --seed %d --checksum --log '%s'", OPTIMS[i],
               k == 2 ? 8 : 7, log[k]);
      char *out = train(args);
      sum[k] = checksum_of(out);
      free(out);
    }
    cr_assert_eq(csv_column(log[0], 2, a, 30), 30);
    cr_assert_eq(csv_column(log[1], 2, b, 30), 30);
    cr_assert_eq(csv_column(log[2], 2, c, 30), 30);
    for (int s = 0; s < 30; s++)
      cr_assert_str_eq(a[s], b[s], "%s: step %d: loss %s then %s with the same seed", OPTIMS[i], s + 1, a[s], b[s]);
    cr_assert_eq(sum[0], sum[1], "%s: parameters differ between two runs with the same seed", OPTIMS[i]);
    cr_assert_neq(sum[0], sum[2], "%s: another seed gave the same parameters", OPTIMS[i]);
    cr_assert_str_neq(a[0], c[0], "%s: another seed gave the same first loss", OPTIMS[i]);
  }
}

/* --tensor-log: DeMo sign moves every element of every tensor by exactly
 * lr (weight decay 0), so each row's update ratio is 1; with one rank and
 * no clipping the per-tensor gradient RMS add up to the log's gradient
 * norm, so the rows cover the whole model once. */
Test(gpt_train, tensor_log_measures_each_tensors_step) {
  char args[2048], tl[400], log[400], line[512], g[8][32];
  snprintf(tl, sizeof tl, "%s/tensors.csv", dir);
  snprintf(args, sizeof args, "--optim distro --steps 6 --eval-every 0 --tensor-log '%s' --tensor-every 2", tl);
  free(train(args));
  FILE *f = fopen(tl, "r");
  cr_assert(f, "no tensor log %s", tl);
  cr_assert(fgets(line, sizeof line, f));
  cr_assert_str_eq(line, "step,tensor,numel,weight_rms,grad_rms,update_rms_over_lr\n");
  int rows = 0, steps_seen[7] = {0};
  while (fgets(line, sizeof line, f)) {
    int step;
    char name[64];
    size_t numel;
    double w, gr, u;
    cr_assert_eq(sscanf(line, "%d,%63[^,],%zu,%lf,%lf,%lf", &step, name, &numel, &w, &gr, &u), 6, "row '%s'", line);
    cr_assert(step == 2 || step == 4 || step == 6, "a row for step %d (every 2nd step only)", step);
    steps_seen[step]++;
    cr_assert(w > 0 && gr > 0 && numel > 0, "row '%s'", line);
    cr_assert(fabs(u - 1.0) < 1e-3, "step %d, %s: the sign step moved %.6f lr, not 1", step, name, u);
    rows++;
  }
  fclose(f);
  cr_assert_eq(rows, 3 * 16, "%d rows: 16 tensors of a 1-layer model at steps 2, 4, 6", rows);
  cr_assert(steps_seen[2] == 16 && steps_seen[4] == 16 && steps_seen[6] == 16);

  snprintf(log, sizeof log, "%s/adamw.csv", dir);
  snprintf(args, sizeof args,
           "--optim adamw --ranks 1 --clip 0 --steps 3 --eval-every 0 --log '%s' --tensor-log '%s' --tensor-every 3",
           log, tl);
  free(train(args));
  cr_assert_eq(csv_column(log, 4, g, 8), 3);
  f = fopen(tl, "r");
  cr_assert(f && fgets(line, sizeof line, f));
  double sq = 0;
  rows = 0;
  while (fgets(line, sizeof line, f)) {
    int step;
    size_t numel;
    double w, gr, u;
    cr_assert_eq(sscanf(line, "%d,%*[^,],%zu,%lf,%lf,%lf", &step, &numel, &w, &gr, &u), 5);
    cr_assert_eq(step, 3);
    sq += (double)numel * gr * gr;
    rows++;
  }
  fclose(f);
  cr_assert_eq(rows, 16, "a new run rewrites the tensor log: %d rows", rows);
  const double norm = atof(g[2]);
  cr_assert(fabs(sqrt(sq) - norm) <= 1e-4 * norm, "the tensors' gradient RMS give norm %.7g, the log %.7g", sqrt(sq),
            norm);
}

/* The last one resumes the clip's per-tensor shares too (the checkpoint
 * keeps them: without, the resumed run clips by the starting shares). */
static const char *RESUMED[] = {"adamw", "distro", "distro-adamw", "distro-adamw --clip-per-tensor"};

Test(gpt_train, resume_continues_the_same_run) {
  for (int i = 0; i < 4; i++) {
    char args[2048], full[400], part[400], ck[400], a[30][32], b[30][32];
    snprintf(full, sizeof full, "%s/full.%d.csv", dir, i);
    snprintf(part, sizeof part, "%s/part.%d.csv", dir, i);
    snprintf(ck, sizeof ck, "%s/ck.%d.bin", dir, i);
    snprintf(args, sizeof args, "--optim %s --steps 24 --eval-every 8 --checksum --log '%s'", RESUMED[i], full);
    char *out = train(args);
    const unsigned long long want = checksum_of(out);
    free(out);
    /* Stop after 11 steps (between evaluations), then resume to the end. */
    snprintf(args, sizeof args, "--optim %s --steps 24 --eval-every 8 --stop-after 11 --save '%s' --log '%s'",
             RESUMED[i], ck, part);
    free(train(args));
    struct stat st;
    cr_assert_eq(stat(ck, &st), 0, "no checkpoint written");
    snprintf(args, sizeof args, "--optim %s --steps 24 --eval-every 8 --checksum --resume '%s' --log '%s'", RESUMED[i],
             ck, part);
    out = train(args);
    cr_assert_eq(checksum_of(out), want, "%s: resumed run ends with other parameters\n%s", RESUMED[i], out);
    free(out);
    cr_assert_eq(csv_column(full, 2, a, 30), 24);
    cr_assert_eq(csv_column(part, 2, b, 30), 24, "the resumed run appends to the log");
    for (int s = 0; s < 24; s++)
      cr_assert_str_eq(a[s], b[s], "%s: step %d: loss %s uninterrupted, %s with a resume after step 11", RESUMED[i],
                       s + 1, a[s], b[s]);
    /* No temporary files left next to the checkpoint. */
    char cmd[600], *ls;
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c -e tmp -e rank", dir);
    run(cmd, &ls);
    cr_assert_eq(atoi(ls), 0, "temporary files left behind");
    free(ls);
  }
}

/* --overlap-step and --overlap-stale: the first step sends nothing yet (it only starts its
 * exchange), every later one completes the previous one, saves included (a
 * save keeps the exchange in flight); the last exchange is flushed before
 * the final validation and counted; a run that saves every 11 steps ends
 * as one that never saves, and a run stopped after step 11 and resumed
 * follows it step for step; the model learns. */
static unsigned long long library_sent(const char *out) {
  const char *p = strstr(out, "library bytes, all ranks: sent ");
  cr_assert(p, "no byte count:\n%s", out);
  return strtoull(p + 31, NULL, 10);
}

Test(gpt_train, overlap_step_flushes_resumes_and_learns) {
  static const char *const flag[] = {"--overlap-step", "--overlap-stale"}, *const says[] = {"look-ahead", "one-step-stale"};
  for (int j = 0; j < 4; j++) {
    const int i = 1 + j % 2, m = j / 2;
    char args[2048], full[400], part[400], ck[400], ck2[400], a[30][32], b[30][32], sent[30][32], tot[30][32];
    snprintf(full, sizeof full, "%s/ofull.%s.csv", dir, OPTIMS[i]);
    snprintf(part, sizeof part, "%s/opart.%s.csv", dir, OPTIMS[i]);
    snprintf(ck, sizeof ck, "%s/ock.%s.bin", dir, OPTIMS[i]);
    snprintf(ck2, sizeof ck2, "%s/ock2.%s.bin", dir, OPTIMS[i]);
    snprintf(args, sizeof args,
             "--optim %s %s --steps 24 --eval-every 8 --save-every 11 --save '%s' --checksum --log '%s'",
             OPTIMS[i], flag[m], ck2, full);
    char *out = train(args);
    const unsigned long long want = checksum_of(out), total = library_sent(out);
    cr_assert(strstr(out, says[m]), "%s", out);
    free(out);
    cr_assert_eq(csv_column(full, 6, sent, 30), 24);
    cr_assert_eq(csv_column(full, 8, tot, 30), 24);
    /* Only step 1 follows nothing in flight. */
    for (int s = 0; s < 24; s++)
      if (s == 0)
        cr_assert_str_eq(sent[s], "0", "%s: step %d completed an exchange (%s bytes)", OPTIMS[i], s + 1, sent[s]);
      else
        cr_assert(atof(sent[s]) > 0, "%s: step %d completed no exchange (%s)", OPTIMS[i], s + 1, sent[s]);
    /* The flushed last exchange: about one step's bytes of both ranks. */
    const double flushed = (double)total - atof(tot[23]), step = 2 * atof(sent[23]);
    cr_assert(flushed > 0.5 * step && flushed < 2 * step, "%s: %llu bytes in all, %s logged: the flush's %.0f vs a "
              "step's %.0f", OPTIMS[i], total, tot[23], flushed, step);
    snprintf(args, sizeof args, "--optim %s %s --steps 24 --eval-every 8 --checksum", OPTIMS[i], flag[m]);
    out = train(args);
    cr_assert_eq(checksum_of(out), want, "%s %s: the run that saves ends elsewhere than one that does not\n%s",
                 OPTIMS[i], flag[m], out);
    free(out);
    snprintf(args, sizeof args, "--optim %s %s --steps 24 --eval-every 8 --stop-after 11 --save '%s' "
             "--log '%s'", OPTIMS[i], flag[m], ck, part);
    free(train(args));
    snprintf(args, sizeof args, "--optim %s %s --steps 24 --eval-every 8 --save-every 11 --save '%s' "
             "--checksum --resume '%s' --log '%s'", OPTIMS[i], flag[m], ck2, ck, part);
    out = train(args);
    cr_assert_eq(checksum_of(out), want, "%s: the resumed overlapped run ends elsewhere\n%s", OPTIMS[i], out);
    free(out);
    cr_assert_eq(csv_column(full, 2, a, 30), 24);
    cr_assert_eq(csv_column(part, 2, b, 30), 24);
    for (int s = 0; s < 24; s++)
      cr_assert_str_eq(a[s], b[s], "%s: step %d: loss %s vs %s resumed", OPTIMS[i], s + 1, a[s], b[s]);
    cr_assert_lt(atof(a[23]), atof(a[0]) - 0.5, "%s: loss %s -> %s", OPTIMS[i], a[0], a[23]);
  }
}

/* DiLoCo in the trainer: the learners' outer payloads leave at the scheduled
 * steps only, a fragment's payload at a time, and the model learns. */
Test(gpt_train, diloco_syncs_on_schedule_and_learns) {
  char args[2048], log[400], loss[60][32], sent[60][32];
  snprintf(log, sizeof log, "%s/diloco.csv", dir);
  snprintf(args, sizeof args,
           "--optim diloco --learners 2 --H 10 --fragments 2 --lr 3e-3 --steps 60 --eval-every 0 --log '%s'", log);
  char *out = train(args);
  cr_assert(strstr(out, "final val loss"), "%s", out);
  free(out);
  cr_assert_eq(csv_column(log, 2, loss, 60), 60);
  cr_assert_eq(csv_column(log, 6, sent, 60), 60);
  double first = 0, last = 0;
  for (int s = 0; s < 5; s++) {
    first += atof(loss[s]) / 5;
    last += atof(loss[55 + s]) / 5;
  }
  cr_expect(last < first - 1.0, "diloco: train loss did not fall: first steps %.3f, last steps %.3f", first, last);
  /* Inner AdamW over one rank sends nothing; fragment 0 leaves at steps 10,
   * 20, ..., fragment 1 at 5, 15, ... (offset H/P). */
  long long frag[2] = {0, 0};
  for (int s = 1; s <= 60; s++) {
    const long long b = atoll(sent[s - 1]);
    if (s % 5) {
      cr_expect_eq(b, 0, "step %d sent %lld bytes off schedule", s, b);
    } else {
      cr_expect_gt(b, 0, "step %d: no outer payload", s);
      if (!frag[(s / 5) % 2]) frag[(s / 5) % 2] = b;
      cr_expect_eq(b, frag[(s / 5) % 2], "step %d: payload %lld, earlier %lld", s, b, frag[(s / 5) % 2]);
    }
  }
}

/* SparseLoCo in the trainer: sparse payloads leave on the schedule only, each
 * at least 20x smaller than the f32 payload of the same fragment, and the
 * model learns (at 5% density with 12 syncs: this tiny model's 60 steps are
 * too few for 2%). */
Test(gpt_train, sparseloco_sends_little_and_learns) {
  char args[2048], log[400], loss[60][32], sent[60][32], f32[10][32];
  snprintf(log, sizeof log, "%s/f32.csv", dir);
  snprintf(args, sizeof args, "--optim diloco --learners 2 --H 5 --outer-codec f32 --steps 10 --eval-every 0 --log '%s'",
           log);
  free(train(args));
  cr_assert_eq(csv_column(log, 6, f32, 10), 10);
  const long long dense = atoll(f32[4]);
  cr_assert_gt(dense, 0);
  snprintf(log, sizeof log, "%s/sparse.csv", dir);
  snprintf(args, sizeof args,
           "--optim sparseloco --learners 2 --H 5 --density 0.05 --outer-lr 2 --ef-beta 0.9 --lr 3e-3 --steps 60 "
           "--eval-every 0 --log '%s'", log);
  char *out = train(args);
  cr_assert(strstr(out, "final val loss") && strstr(out, "sparse int2 outer gradients"), "%s", out);
  free(out);
  cr_assert_eq(csv_column(log, 2, loss, 60), 60);
  cr_assert_eq(csv_column(log, 6, sent, 60), 60);
  double first = 0, last = 0;
  for (int s = 0; s < 5; s++) {
    first += atof(loss[s]) / 5;
    last += atof(loss[55 + s]) / 5;
  }
  cr_expect(last < first - 1.0, "sparseloco: train loss did not fall: first steps %.3f, last steps %.3f", first, last);
  for (int s = 1; s <= 60; s++) {
    const long long b = atoll(sent[s - 1]);
    if (s % 5) {
      cr_expect_eq(b, 0, "step %d sent %lld bytes off schedule", s, b);
    } else {
      cr_expect_gt(b, 0, "step %d: no outer payload", s);
      cr_expect_lt(20 * b, dense, "step %d: sparse payload %lld bytes, f32 %lld: not 20x smaller", s, b, dense);
    }
  }
}

#ifdef SYNC_SYNCER_BIN
/* Decoupled DiLoCo: a distro-syncer process and two gpt-train learners, one
 * of them data-parallel over 2 ranks and slowed down, the other with
 * DisTrO as its inner optimizer (PID-free: the shell waits for both). */
Test(gpt_train, decoupled_learners_join_merge_and_learn) {
  char cmd[4096], ep[400], epf[400], *out;
  snprintf(ep, sizeof ep, "ipc://%s/syncer.ipc", dir);
  snprintf(epf, sizeof epf, "%s/endpoint", dir);
  const pid_t sp = fork();
  cr_assert_geq(sp, 0);
  if (sp == 0) {
    char log[400];
    snprintf(log, sizeof log, "%s/syncer.log", dir);
    if (!freopen(log, "w", stdout)) _exit(126);
    execl(SYNC_SYNCER_BIN, SYNC_SYNCER_BIN, "--endpoint", ep, "--endpoint-file", epf, "--fragments", "2", "--quorum",
          "1", "--H", "10", "--overlap", "1", "--timeout", "1", "--heartbeat", "0.1", (char *)NULL);
    _exit(127);
  }
  struct stat sb;
  for (int i = 0; i < 500 && stat(epf, &sb) != 0; i++) usleep(10000);
  cr_assert_eq(stat(epf, &sb), 0, "the syncer did not start");
  const char *common = "--layers 1 --dim 32 --heads 2 --context 32 --batch 4 --threads 1 --eval-batches 2 "
                       "--steps 150 --eval-every 0 --print-every 50 --optim decoupled";
  snprintf(cmd, sizeof cmd,
           "'%s' --data '%s' %s --syncer '%s' --learner-id 0 --ranks 2 --step-delay-ms 6 --log '%s/l0.csv' "
           "> '%s/l0.out' 2>&1 & "
           "'%s' --data '%s' %s --syncer '%s' --learner-id 1 --ranks 1 --inner distro --step-delay-ms 3 --log '%s/l1.csv' "
           "> '%s/l1.out' 2>&1 & "
           "wait %%1; a=$?; wait %%2; b=$?; cat '%s/l0.out' '%s/l1.out'; exit $((a + b))",
           GPT_TRAIN, corpus, common, ep, dir, dir, GPT_TRAIN, corpus, common, ep, dir, dir, dir, dir);
  const int rc = run(cmd, &out);
  kill(sp, SIGTERM);
  int ws;
  waitpid(sp, &ws, 0);
  cr_assert_eq(rc, 0, "a learner failed (exit %d):\n%s", rc, out);
  cr_expect(strstr(out, "learner 0 joined the syncer") && strstr(out, "learner 1 joined the syncer"), "%s", out);
  cr_expect(strstr(out, "(seeded the syncer)") &&
                (strstr(out, "(state pulled from a peer)") || strstr(out, "(state fetched from the syncer)")),
            "one learner seeds, the other gets the global copy:\n%s", out);
  cr_expect(strstr(out, "of the global copy as this learner last applied it"), "%s", out);
  /* Learner 0's 2 ranks: 2 x 4 x 32 tokens per step; learner 1: 4 x 32. */
  static const long long tokens[2] = {150 * 2 * 4 * 32, 150 * 4 * 32};
  for (int l = 0; l < 2; l++) {
    char csv[400], applies[150][32], tok[150][32], loss[150][32];
    snprintf(csv, sizeof csv, "%s/l%d.csv", dir, l);
    cr_assert_eq(csv_column(csv, 15, applies, 150), 150);
    cr_assert_eq(csv_column(csv, 18, tok, 150), 150);
    cr_assert_eq(csv_column(csv, 2, loss, 150), 150);
    cr_expect_geq(atoll(applies[149]), 4, "learner %d applied %s merged fragments", l, applies[149]);
    cr_expect_eq(atoll(tok[149]), tokens[l], "learner %d counted %s tokens", l, tok[149]);
    double first = 0, last = 0;
    for (int s = 0; s < 5; s++) first += atof(loss[s]) / 5, last += atof(loss[145 + s]) / 5;
    cr_expect(last < first - 0.5, "learner %d: train loss %.3f -> %.3f", l, first, last);
  }
  free(out);
  char log[400];
  snprintf(log, sizeof log, "%s/syncer.log", dir);
  FILE *f = fopen(log, "r");
  cr_assert(f);
  char line[1024];
  int merges = 0, both = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "merge frag=")) continue;
    merges++;
    both += strstr(line, "participants=2") != NULL;
  }
  fclose(f);
  cr_expect_geq(merges, 4, "the syncer merged %d times", merges);
  cr_expect_geq(both, 1, "no merge had both learners");
}
#endif

/* ---- errors ------------------------------------------------------------ */

/* Runs with `args` (no --data unless given), expects exit `code` and `msg` in the output. */
/* --sampling: with one rank both modes read the same windows (the same
 * parameters); with two, shard confines each rank to its half of the text,
 * so the runs differ; each mode is reproducible. */
Test(gpt_train, sampling_modes_choose_the_text) {
  unsigned long long sum[2][3];
  for (int ranks = 1; ranks <= 2; ranks++)
    for (int k = 0; k < 3; k++) {
      char cmd[4096], *out;
      snprintf(cmd, sizeof cmd,
               "'%s' --data '%s' --layers 1 --dim 32 --heads 2 --context 32 --batch 4 --threads 1 --eval-batches 2 "
               "--ranks %d --optim distro-adamw --steps 12 --eval-every 0 --checksum --sampling %s",
               GPT_TRAIN, corpus, ranks, k == 1 ? "shard" : "global");
      int rc = run(cmd, &out);
      cr_assert_eq(rc, 0, "gpt-train failed (exit %d):\n%s\n%s", rc, cmd, out);
      cr_assert(strstr(out, k == 1 ? "shard sampling" : "global sampling"), "the mode is not reported:\n%s", out);
      sum[ranks - 1][k] = checksum_of(out);
      free(out);
    }
  cr_expect_eq(sum[0][0], sum[0][2], "global sampling is not reproducible (1 rank)");
  cr_expect_eq(sum[1][0], sum[1][2], "global sampling is not reproducible (2 ranks)");
  cr_expect_eq(sum[0][0], sum[0][1], "with one rank, global and shard sampling read different windows");
  cr_expect_neq(sum[1][0], sum[1][1], "with two ranks, shard sampling gave global's parameters");
}

/* --comm-timeout changes how a collective waits, never what it computes:
 * the same parameters with and without it, for the all-reduce, the blocking
 * all-gather and those on the overlapped steps' helper threads (the
 * look-ahead's, and the gradient-ready exchange's buckets). */
Test(gpt_train, comm_timeout_same_parameters) {
  static const char *runs[] = {"--optim adamw", "--optim distro-adamw", "--optim distro-adamw --overlap-step",
                               "--optim distro-adamw --overlap-backward"};
  for (int i = 0; i < 4; i++) {
    char args[512];
    snprintf(args, sizeof args, "%s --steps 8 --eval-every 4 --checksum --quiet", runs[i]);
    char *out = train(args);
    const unsigned long long want = checksum_of(out);
    free(out);
    snprintf(args, sizeof args, "%s --steps 8 --eval-every 4 --checksum --quiet --comm-timeout 600", runs[i]);
    out = train(args);
    cr_expect_eq(checksum_of(out), want, "%s: --comm-timeout changed the parameters", runs[i]);
    free(out);
  }
}

/* Whether /proc/cpuinfo's first "flags" line lists `flag` as a whole word. */
static int cpu_has(const char *flag) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return 0;
  char line[8192];
  int has = 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "flags", 5)) {
      for (char *t = strtok(strchr(line, ':') + 1, " \n"); t; t = strtok(NULL, " \n"))
        if (!strcmp(t, flag)) has = 1;
      break;
    }
  fclose(f);
  return has;
}

/* The kernel family in the trainer's "matrix products: OpenBLAS, X kernels" line. */
static void blas_kernels(const char *out, char *core, size_t n) {
  const char *p = strstr(out, "matrix products: OpenBLAS, ");
  cr_assert(p, "no matrix products line:\n%s", out);
  p += strlen("matrix products: OpenBLAS, ");
  size_t k = strcspn(p, " \n");
  cr_assert(k > 0 && k < n);
  memcpy(core, p, k);
  core[k] = 0;
}

/* Debian 12's OpenBLAS falls back to its SSE3 kernels on a CPU model it does
 * not know (about 4x slower GEMMs): on a CPU with FMA, the trainer must not
 * run on those, and a user's own OPENBLAS_CORETYPE must be kept. */
Test(gpt_train, matrix_products_run_on_the_cpus_fma_kernels) {
  if (!cpu_has("avx2") || !cpu_has("fma")) cr_skip_test("this CPU has no AVX2 + FMA");
  static const char *pre_fma[] = {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2",
                                  "Penryn", "Dunnington", "Nehalem", "Opteron", "Barcelona", "Nano", "Bobcat",
                                  "Sandybridge", "Unknown"};
  char cmd[4096], core[64], *out;
  snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE '%s' --data '%s' " TINY " --steps 1 --eval-every 0",
           GPT_TRAIN, corpus);
  cr_assert_eq(run(cmd, &out), 0, "%s", out);
  blas_kernels(out, core, sizeof core);
  for (size_t i = 0; i < sizeof pre_fma / sizeof *pre_fma; i++)
    cr_expect(strcasecmp(core, pre_fma[i]) != 0, "OpenBLAS runs its %s kernels on a CPU with FMA:\n%s", core, out);
  free(out);

  snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=Haswell '%s' --data '%s' " TINY " --steps 1 --eval-every 0",
           GPT_TRAIN, corpus);
  cr_assert_eq(run(cmd, &out), 0, "%s", out);
  blas_kernels(out, core, sizeof core);
  cr_expect_str_eq(core, "Haswell", "the user's OPENBLAS_CORETYPE was not kept:\n%s", out);
  cr_expect(!strstr(out, "restarting"), "restarted despite the user's setting:\n%s", out);
  free(out);
}

/* ---- --compare ------------------------------------------------------------ */

Test(gpt_train, compare_prints_the_table_and_plots) {
  char args[2048], png[400];
  snprintf(png, sizeof png, "%s/cmp.png", dir);
  snprintf(args, sizeof args, "--compare --steps 12 --eval-every 4 --print-every 100 --plot '%s'", png);
  char *out = train(args);
  cr_assert(strstr(out, "== Comparison"), "no table:\n%s", out);
  for (int i = 0; i < 3; i++) {
    char row[64];
    snprintf(row, sizeof row, "\n%-13s ", OPTIMS[i]);
    cr_assert(strstr(out, row), "no row for %s:\n%s", OPTIMS[i], out);
  }
  cr_assert(strstr(out, "targets: "), "no target line:\n%s", out);
  cr_assert(strstr(out, "DisTrO-AdamW: distro-adamw"), "no DisTrO-AdamW target line:\n%s", out);
  cr_assert(!strstr(out, "\nsparseloco ") && !strstr(out, "\ndiloco "), "rows beyond the swap's three:\n%s", out);
  struct stat st;
  cr_assert_eq(stat(png, &st), 0, "no plot written:\n%s", out);
  cr_assert_gt(st.st_size, 1000);
  free(out);

  /* --compare-all: every row, with the DiLoCo and SparseLoCo target lines. */
  snprintf(args, sizeof args, "--compare-all --steps 4 --eval-every 4 --print-every 100");
  out = train(args);
  cr_assert(strstr(out, "\nsparseloco ") && strstr(out, "SparseLoCo: sparseloco"), "no sparseloco row:\n%s", out);
  cr_assert(strstr(out, "\ndiloco-stream ") && strstr(out, "DiLoCo: diloco"), "no DiLoCo rows:\n%s", out);
  cr_assert(strstr(out, "\ndistro-ref "), "no distro-ref row:\n%s", out);
  free(out);

  /* Without gnuplot: the table still comes, then a clear message and exit 2. */
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "PATH=/nonexistent '%s' --data '%s' " TINY " --compare --steps 2 --plot '%s'",
           GPT_TRAIN, corpus, png);
  int rc = run(cmd, &out);
  cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
  cr_assert(strstr(out, "== Comparison") && strstr(out, "gnuplot is not installed"), "%s", out);
  free(out);
}

/* --overlap-backward: the optimizer's gradient-ready exchange gives the bits
 * of the blocking step with the same per-tensor clip (--clip-per-tensor),
 * at 3 ranks and 2 threads, for both DisTrO optimizers; the per-tensor clip
 * is not the global one (the checksums differ); refusals. */
Test(gpt_train, overlap_backward_is_the_blocking_step) {
  for (int i = 1; i < 3; i++) {
    char args[512];
    snprintf(args, sizeof args, "--optim %s --ranks 3 --threads 2 --steps 12 --checksum --clip-per-tensor", OPTIMS[i]);
    char *out = train(args);
    const unsigned long long each = checksum_of(out);
    cr_assert(strstr(out, "each tensor clipped by its own norm"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "--optim %s --ranks 3 --threads 2 --steps 12 --checksum --overlap-backward", OPTIMS[i]);
    out = train(args);
    cr_assert_eq(checksum_of(out), each, "%s: --overlap-backward ends elsewhere than the blocking step\n%s", OPTIMS[i],
                 out);
    cr_assert(strstr(out, "gradient-ready"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "--optim %s --ranks 3 --threads 2 --steps 12 --checksum", OPTIMS[i]);
    out = train(args);
    cr_assert_neq(checksum_of(out), each, "%s: the per-tensor clip changed nothing\n%s", OPTIMS[i], out);
    free(out);
  }
  char cmd[1024], *out;
  snprintf(cmd, sizeof cmd, "'%s' --data '%s' " TINY " --optim adamw --overlap-backward --steps 2", GPT_TRAIN, corpus);
  cr_assert_eq(run(cmd, &out), 2, "%s", out);
  cr_assert(strstr(out, "--overlap-backward"), "%s", out);
  free(out);
}
