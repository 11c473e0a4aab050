/* Overlapped optimizers and their state files (options.overlap):
 *  - flush before any step does nothing; a save with an exchange in flight
 *    succeeds, a load with one refuses (naming distro_optim_flush);
 *  - a flushed save resumes bit for bit, overlapped or blocking;
 *  - a save with an exchange in flight changes nothing in the run, and a
 *    run resumed from it goes on bit for bit (each update/value mode, both
 *    overlap kinds, gradients taken at each rank's own parameters), also
 *    when the first call after the load is a flush;
 *  - such a state is refused by a blocking optimizer, by the other overlap
 *    kind and by ranks that loaded states of different saves.
 * The file's own layout and its corrupt records: test_state_io.c.
 * Inputs are fresh each run; a failure prints DISTRO_TEST_SEED to replay. */
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

#include "overlap_fixture.h"

typedef struct {
  distro_options opt;
  const char *path;
  distro_status save_pending, load_pending, flush_idle, save_flushed;
  char msg_save[512], msg_load[512];
  int64_t idle_step;
  uint64_t idle_bytes;
} sl_case;

/* A fresh directory for the ranks' state files: fmt = "DIR/state.%d". */
static void state_dir(char dir[32], char *fmt, size_t n) {
  snprintf(dir, 32, "/tmp/distro_overlap_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(fmt, n, "%s/state.%%d", dir);
}

static distro_status sl_rank(distro_comm *comm, int rank, void *arg) {
  sl_case *k = arg;
  const int64_t n = total();
  float *p = calloc((size_t)n, sizeof(float)), *g = malloc(sizeof(float) * (size_t)n);
  distro_optim *o = NULL;
  distro_status st = distro_optim_create(&k->opt, comm, &o);
  for (int t = 0, off = 0; t < NT && st == DISTRO_OK; off += (int)numel(t), t++)
    st = distro_optim_add_param(o, names[t], p + off, g + off, ndims[t], shapes[t]);
  tu_rng rng = {77 + (uint64_t)rank};
  tu_fill_normal(&rng, g, (size_t)n, 1.0f);
  distro_step_stats s;
  if (st == DISTRO_OK) st = distro_optim_flush(o, &s); /* before any step: nothing to do */
  if (st == DISTRO_OK && rank == 0) {
    k->flush_idle = st;
    k->idle_step = s.step;
    k->idle_bytes = s.bytes_received;
  }
  for (int c = 0; c < 2 && st == DISTRO_OK; c++) st = distro_optim_step(o, 0.01f, NULL);
  if (st == DISTRO_OK && rank == 0) {
    char path[512];
    snprintf(path, sizeof path, "%s.%d", k->path, rank);
    k->save_pending = distro_optim_save(o, path);
    keep(k->msg_save, distro_last_error());
    k->load_pending = distro_optim_load(o, path);
    keep(k->msg_load, distro_last_error());
  }
  if (st == DISTRO_OK) st = distro_optim_flush(o, NULL);
  if (st == DISTRO_OK) st = distro_optim_flush(o, &s); /* a second flush: nothing left */
  if (st == DISTRO_OK && rank == 0) {
    char path[512];
    snprintf(path, sizeof path, "%s.%d", k->path, rank);
    k->save_flushed = distro_optim_save(o, path);
    if (s.step != 2 || s.bytes_received != 0) st = DISTRO_ERR_INVALID;
  }
  distro_optim_free(o);
  free(p);
  free(g);
  return st;
}

Test(overlap_save, flush_and_save_rules) {
  char dir[] = "/tmp/distro_overlap_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[600];
  snprintf(path, sizeof path, "%s/state", dir);
  sl_case k = {.opt = mode_opts(&modes[2], DISTRO_OVERLAP_LOOKAHEAD), .path = path};
  k.save_pending = k.load_pending = k.save_flushed = DISTRO_ERR_CUDA; /* none of the expected */
  k.msg_save[0] = 0;
  cr_assert_eq(distro_comm_run_local(2, sl_rank, &k), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(k.flush_idle, DISTRO_OK);
  cr_assert(k.idle_step == 0 && k.idle_bytes == 0);
  cr_assert_eq(k.save_pending, DISTRO_OK, "save with an exchange in flight: %s", k.msg_save);
  cr_assert_eq(k.load_pending, DISTRO_ERR_INVALID, "load with an exchange in flight: %s",
               distro_status_string(k.load_pending));
  cr_assert(strstr(k.msg_load, "distro_optim_flush") != NULL, "%s", k.msg_load);
  cr_assert_eq(k.save_flushed, DISTRO_OK, "save after the flush failed");
  for (int r = 0; r < 2; r++) {
    snprintf(path, sizeof path, "%s/state.%d", dir, r);
    unlink(path);
  }
  rmdir(dir);
}

/* The caller's parameters after call `at` of a (rank 0's) and a's inputs
 * from then on, for b, which resumes there. */
static void copy_tail(dr_run *b, const dr_run *a, int at) {
  for (int t = 0; t < NT; t++) memcpy(b->init[t], dr_snap(a, at - 1, 0, t), sizeof(float) * (size_t)numel(t));
  for (int s = 0; s < b->steps; s++) {
    b->lrs[s] = a->lrs[at + s];
    for (int r = 0; r < b->world; r++)
      for (int t = 0; t < NT; t++)
        memcpy(b->grads[((size_t)s * b->world + r) * NT + t], a->grads[((size_t)(at + s) * b->world + r) * NT + t],
               sizeof(float) * (size_t)numel(t));
  }
}

static void unlink_ranks(const char *fmt, int world) {
  char path[700];
  for (int r = 0; r < world; r++) {
    snprintf(path, sizeof path, fmt, r);
    unlink(path);
  }
}

/* Saved after a flush at step 5, loaded into a fresh optimizer (with the
 * parameters of that moment), the run continues bit for bit; the state
 * also loads into a blocking optimizer. Three ranks, and DisTrO-AdamW's
 * step is rectified from step 5 on: the next provisional step grows with
 * the saved spread of the flushed aggregate. */
Test(overlap_save, flushed_save_resumes_bit_identically, .timeout = 60) {
  const uint64_t seed = tu_seed();
  char dir[32], fmt[600];
  state_dir(dir, fmt, sizeof fmt);
  const int world = 3, steps = 8, at = 5;
  dr_run a;
  setup(&a, mode_opts(&modes[2], DISTRO_OVERLAP_LOOKAHEAD), world, steps, 0, mix(seed, 600));
  a.save_fmt = fmt;
  a.save_after = at;
  a.flush = 1;
  run_ok(&a, "save", seed);
  for (int blocking = 0; blocking < 2; blocking++) {
    dr_run b;
    setup(&b, mode_opts(&modes[2], blocking ? DISTRO_OVERLAP_OFF : DISTRO_OVERLAP_LOOKAHEAD), world, steps - at, 0,
          mix(seed, 601));
    b.flush = 1;
    b.load_fmt = fmt;
    copy_tail(&b, &a, at);
    run_ok(&b, "resume", seed);
    for (int r = 0; r < world; r++)
      for (int t = 0; t < NT; t++) {
        if (!blocking)
          for (int s = 0; s < steps - at; s++)
            cr_assert(same(dr_snap(&b, s, r, t), dr_snap(&a, at + s, r, t), t),
                      "rank %d '%s': the resumed run differs at call %d (DISTRO_TEST_SEED=%llu)", r, names[t],
                      at + s + 1, (unsigned long long)seed);
        cr_assert(same(b.final[r * NT + t], a.final[r * NT + t], t),
                  "rank %d '%s': the %s resumed run ends elsewhere (DISTRO_TEST_SEED=%llu)", r, names[t],
                  blocking ? "blocking" : "overlapped", (unsigned long long)seed);
      }
    dr_run_free(&b);
  }
  dr_run_free(&a);
  unlink_ranks(fmt, world);
  rmdir(dir);
}

/* Saved with the exchange of step `at` in flight (no flush) and loaded
 * into fresh optimizers, the run goes on bit for bit: every later call and
 * the final flush; the run that saved equals one that never saves. The
 * gradients are taken at each rank's own parameters (g = noise + 0.5 p),
 * and every resumed rank starts from rank 0's parameters: with look-ahead
 * the load itself must give each rank back its own provisional step. Every
 * update/value mode, both overlap kinds, 3 ranks. */
static float **resume_noise; /* [(s * world + r) * NT + t] */
static int resume_off;       /* the run's first step in resume_noise */

static void resume_grad(const dr_run *x, int s, int r, int t, const float *p, float *g) {
  const float *noise = resume_noise[((size_t)(s + resume_off) * x->world + r) * x->nt + t];
  for (int64_t e = 0; e < numel(t); e++) g[e] = noise[e] + 0.5f * p[e];
}

Test(overlap_save, save_in_flight_resumes_bit_identically, .timeout = 120) {
  const uint64_t seed = tu_seed();
  char dir[32], fmt[600];
  state_dir(dir, fmt, sizeof fmt);
  const int world = 3, steps = 8, at = 5; /* the restored provisional step is rectified (step_rule.h) */
  const int kinds[2] = {DISTRO_OVERLAP_LOOKAHEAD, DISTRO_OVERLAP_STALE};
  for (int m = 0; m < (int)(sizeof modes / sizeof modes[0]); m++)
    for (int kk = 0; kk < 2; kk++) {
      const distro_options opt = mode_opts(&modes[m], kinds[kk]);
      const uint64_t sd = mix(seed, 700 + 10 * (uint64_t)m + (uint64_t)kk);
      dr_run a, plain, b;
      setup(&a, opt, world, steps, 0, sd);
      const size_t cells = (size_t)steps * world * NT;
      resume_noise = malloc(sizeof(float *) * cells);
      cr_assert_not_null(resume_noise);
      for (size_t i = 0; i < cells; i++) {
        const size_t bytes = sizeof(float) * (size_t)numel((int)(i % NT));
        resume_noise[i] = malloc(bytes);
        cr_assert_not_null(resume_noise[i]);
        memcpy(resume_noise[i], a.grads[i], bytes);
      }
      resume_off = 0;
      a.grad_fn = resume_grad;
      a.save_fmt = fmt;
      a.save_after = at;
      a.save_in_flight = 1;
      a.flush = 1;
      run_ok(&a, "save in flight", seed);
      setup(&plain, opt, world, steps, 0, sd);
      plain.grad_fn = resume_grad;
      plain.flush = 1;
      run_ok(&plain, "no save", seed);
      setup(&b, opt, world, steps - at, 0, mix(sd, 1));
      b.grad_fn = resume_grad;
      b.flush = 1;
      b.load_fmt = fmt;
      copy_tail(&b, &a, at);
      resume_off = at;
      run_ok(&b, "resume", seed);
      for (size_t i = 0; i < cells; i++) free(resume_noise[i]);
      free(resume_noise);
      resume_noise = NULL;
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          for (int s = 0; s < steps; s++)
            cr_assert(same(dr_snap(&a, s, r, t), dr_snap(&plain, s, r, t), t),
                      "%s %s rank %d '%s': saving changed call %d (DISTRO_TEST_SEED=%llu)", modes[m].label,
                      kk ? "stale" : "look-ahead", r, names[t], s + 1, (unsigned long long)seed);
          for (int s = 0; s < steps - at; s++)
            cr_assert(same(dr_snap(&b, s, r, t), dr_snap(&a, at + s, r, t), t),
                      "%s %s rank %d '%s': the resumed run differs at call %d (DISTRO_TEST_SEED=%llu)",
                      modes[m].label, kk ? "stale" : "look-ahead", r, names[t], at + s + 1,
                      (unsigned long long)seed);
          cr_assert(same(b.final[r * NT + t], a.final[r * NT + t], t),
                    "%s %s rank %d '%s': the resumed run ends elsewhere (DISTRO_TEST_SEED=%llu)", modes[m].label,
                    kk ? "stale" : "look-ahead", r, names[t], (unsigned long long)seed);
        }
      /* The first resumed call completed the restored exchange. */
      cr_assert(b.stats[0].bytes_received > 0 && b.stats[0].step == at,
                "%s: the first resumed call received %llu bytes, step %lld", modes[m].label,
                (unsigned long long)b.stats[0].bytes_received, (long long)b.stats[0].step);
      dr_run_free(&a);
      dr_run_free(&plain);
      dr_run_free(&b);
    }
  unlink_ranks(fmt, world);
  rmdir(dir);
}

/* A flush right after the load applies the restored exchange: the
 * parameters are then the saving run's after its own flush at that step. */
Test(overlap_save, flush_after_load_applies_the_saved_exchange, .timeout = 60) {
  const uint64_t seed = tu_seed();
  char dir[32], fmt[600];
  state_dir(dir, fmt, sizeof fmt);
  const int world = 2, at = 3;
  const distro_options opt = mode_opts(&modes[2], DISTRO_OVERLAP_LOOKAHEAD);
  dr_run a, b;
  setup(&a, opt, world, at, 0, mix(seed, 800));
  a.save_fmt = fmt;
  a.save_after = at;
  a.save_in_flight = 1;
  a.flush = 1;
  run_ok(&a, "save", seed);
  setup(&b, opt, world, 0, 0, mix(seed, 801));
  b.flush = 1;
  b.load_fmt = fmt;
  for (int t = 0; t < NT; t++) memcpy(b.init[t], dr_snap(&a, at - 1, 0, t), sizeof(float) * (size_t)numel(t));
  run_ok(&b, "load and flush", seed);
  for (int r = 0; r < world; r++) {
    cr_assert(b.flush_stats[r].step == at && b.flush_stats[r].bytes_received > 0, "rank %d: the flush applied "
              "step %lld, %llu bytes", r, (long long)b.flush_stats[r].step,
              (unsigned long long)b.flush_stats[r].bytes_received);
    for (int t = 0; t < NT; t++)
      cr_assert(same(b.final[r * NT + t], a.final[r * NT + t], t),
                "rank %d '%s': the flush after the load differs from the saving run's (DISTRO_TEST_SEED=%llu)", r,
                names[t], (unsigned long long)seed);
  }
  dr_run_free(&a);
  dr_run_free(&b);
  unlink_ranks(fmt, world);
  rmdir(dir);
}

/* Where a state saved in flight does not load: a blocking optimizer, the
 * other overlap kind (each with a message naming the mode), and ranks whose states come from different
 * saves (one in flight, one flushed): every rank fails its first step. */
static int copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  int ok = a && b;
  char buf[1 << 14];
  size_t n;
  while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
  if (a) fclose(a);
  if (b && fclose(b) != 0) ok = 0;
  return ok;
}

Test(overlap_save, state_saved_in_flight_refusals, .timeout = 60) {
  const uint64_t seed = tu_seed();
  char dir[32], fmt[600], flushed[600], mixed[600], from[700], to[700];
  state_dir(dir, fmt, sizeof fmt);
  snprintf(flushed, sizeof flushed, "%s/flushed.%%d", dir);
  snprintf(mixed, sizeof mixed, "%s/mixed.%%d", dir);
  const int world = 2, at = 2;
  dr_run a;
  setup(&a, mode_opts(&modes[0], DISTRO_OVERLAP_LOOKAHEAD), world, at, 0, mix(seed, 900));
  a.save_fmt = fmt;
  a.save_after = at;
  a.save_in_flight = 1;
  run_ok(&a, "save in flight", seed);
  dr_run_free(&a);
  setup(&a, mode_opts(&modes[0], DISTRO_OVERLAP_LOOKAHEAD), world, at, 0, mix(seed, 900));
  a.save_fmt = flushed;
  a.save_after = at;
  run_ok(&a, "flushed save", seed);
  dr_run_free(&a);
  const int other[2] = {DISTRO_OVERLAP_OFF, DISTRO_OVERLAP_STALE};
  for (int j = 0; j < 2; j++) {
    dr_run b;
    setup(&b, mode_opts(&modes[0], other[j]), world, 2, 0, mix(seed, 901));
    b.load_fmt = fmt;
    cr_assert_eq(dr_run_exec(&b), DISTRO_ERR_SHAPE, "overlap %d loaded a look-ahead state in flight", other[j]);
    for (int r = 0; r < world; r++)
      cr_assert(strstr(b.err[r], "load") && strstr(b.err[r], "exchange in flight") && strstr(b.err[r], "LOOKAHEAD"),
                "rank %d: %s", r, b.err[r]);
    dr_run_free(&b);
  }
  for (int r = 0; r < world; r++) {
    snprintf(from, sizeof from, r == 0 ? fmt : flushed, r);
    snprintf(to, sizeof to, mixed, r);
    cr_assert(copy_file(from, to), "cannot copy %s", from);
  }
  dr_run b;
  setup(&b, mode_opts(&modes[0], DISTRO_OVERLAP_LOOKAHEAD), world, 2, 0, mix(seed, 902));
  b.load_fmt = mixed;
  cr_assert_eq(dr_run_exec(&b), DISTRO_ERR_SHAPE, "ranks with states of different saves stepped");
  for (int r = 0; r < world; r++)
    cr_assert(strstr(b.err[r], "step 1") && strstr(b.err[r], "saved at the same step"), "rank %d: %s", r, b.err[r]);
  dr_run_free(&b);
  unlink_ranks(fmt, world);
  unlink_ranks(flushed, world);
  unlink_ranks(mixed, world);
  rmdir(dir);
}
