/* Replicas stay bit-identical: across ranks after every step (world 2-4),
 * across OpenMP thread counts (1 vs 2, set inside each rank thread), and
 * across a save / load of the optimizer state in the middle of a run. */
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

/* Large enough for the library to split work across threads. */
static const char *const names[] = {"m256x1024", "v50257", "m67x64", "t3x64x96", "v100"};
static const int ndims[] = {2, 1, 2, 3, 1};
static const int64_t sh0[] = {256, 1024}, sh1[] = {50257}, sh2[] = {67, 64}, sh3[] = {3, 64, 96}, sh4[] = {100};
static const int64_t *const shapes[] = {sh0, sh1, sh2, sh3, sh4};
#define NT ((int)(sizeof ndims / sizeof ndims[0]))
#define STEPS 4

typedef struct {
  const char *label;
  distro_algorithm alg;
  distro_update update;
  distro_values values;
  float lr;
} mode;

static const mode modes[] = {
    {"sign/f32", DISTRO_ALG_DEMO, DISTRO_UPDATE_SIGN, DISTRO_VALUES_F32, 0.01f},
    {"sign/sign1", DISTRO_ALG_DEMO, DISTRO_UPDATE_SIGN, DISTRO_VALUES_SIGN1, 0.01f},
    {"adamw-update/bf16", DISTRO_ALG_DEMO, DISTRO_UPDATE_ADAMW, DISTRO_VALUES_BF16, 1e-3f},
    {"adamw-baseline", DISTRO_ALG_ADAMW, DISTRO_UPDATE_ADAMW, DISTRO_VALUES_F32, 1e-3f},
};
#define NMODES ((int)(sizeof modes / sizeof modes[0]))

static void setup(dr_run *x, const mode *md, int world, int threads, uint64_t seed) {
  memset(x, 0, sizeof *x);
  x->opt = distro_options_default(md->alg);
  if (md->alg == DISTRO_ALG_DEMO) {
    x->opt.update = md->update;
    x->opt.values = md->values;
    x->opt.topk = 8;
  }
  x->opt.lr = md->lr;
  x->opt.weight_decay = 0.1f;
  x->world = world;
  x->steps = STEPS;
  x->nt = NT;
  x->names = names;
  x->ndims = ndims;
  x->shapes = shapes;
  x->omp_threads = threads;
  cr_assert_eq(dr_run_prepare(x, seed, 1.0), 0, "out of memory");
}

static void run_ok(dr_run *x, const char *label, uint64_t seed) {
  distro_status st = dr_run_exec(x);
  cr_assert_eq(st, DISTRO_OK, "%s world %d threads %d: %s / %s (DISTRO_TEST_SEED=%llu)", label, x->world,
               x->omp_threads, x->err[0], x->err[x->world - 1], (unsigned long long)seed);
}

/* Index of the first differing float, -1 if the buffers are bit-identical. */
static long first_diff(const float *a, const float *b, int64_t n) {
  if (!memcmp(a, b, sizeof(float) * (size_t)n)) return -1;
  for (int64_t i = 0; i < n; i++)
    if (memcmp(a + i, b + i, sizeof(float))) return (long)i;
  return -1;
}

Test(determinism, ranks_bit_identical_world_2_to_4, .timeout = 120) {
  uint64_t seed = tu_seed();
  for (int mi = 0; mi < NMODES; mi++)
    for (int world = 2; world <= 4; world++) {
      dr_run x;
      setup(&x, &modes[mi], world, 0, seed ^ (uint64_t)(mi * 16 + world));
      run_ok(&x, modes[mi].label, seed);
      for (int s = 0; s < STEPS; s++)
        for (int t = 0; t < NT; t++) {
          int64_t n = dr_shape_numel(ndims[t], shapes[t]);
          for (int r = 1; r < world; r++) {
            long d = first_diff(dr_snap(&x, s, 0, t), dr_snap(&x, s, r, t), n);
            cr_assert_eq(d, -1, "%s world %d step %d: rank %d differs from rank 0 in %s[%ld] (%.9g vs %.9g) "
                         "(DISTRO_TEST_SEED=%llu)", modes[mi].label, world, s + 1, r, names[t], d,
                         d >= 0 ? dr_snap(&x, s, r, t)[d] : 0.0, d >= 0 ? dr_snap(&x, s, 0, t)[d] : 0.0,
                         (unsigned long long)seed);
          }
        }
      /* the run did move the parameters */
      cr_assert_neq(first_diff(x.init[0], dr_snap(&x, STEPS - 1, 0, 0), dr_shape_numel(ndims[0], shapes[0])), -1);
      dr_run_free(&x);
    }
}

Test(determinism, omp_threads_1_vs_2_bit_identical, .timeout = 120) {
  uint64_t seed = tu_seed();
  for (int mi = 0; mi < NMODES; mi++) {
    int world = 2 + mi % 2;
    dr_run a, b;
    uint64_t s = seed ^ (uint64_t)(mi * 977);
    setup(&a, &modes[mi], world, 1, s);
    setup(&b, &modes[mi], world, 2, s);
    run_ok(&a, modes[mi].label, seed);
    run_ok(&b, modes[mi].label, seed);
    for (int st = 0; st < STEPS; st++)
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          long d = first_diff(dr_snap(&a, st, r, t), dr_snap(&b, st, r, t), dr_shape_numel(ndims[t], shapes[t]));
          cr_assert_eq(d, -1, "%s world %d step %d rank %d: 1 thread vs 2 threads differ in %s[%ld] "
                       "(%.9g vs %.9g) (DISTRO_TEST_SEED=%llu)", modes[mi].label, world, st + 1, r, names[t], d,
                       d >= 0 ? dr_snap(&a, st, r, t)[d] : 0.0, d >= 0 ? dr_snap(&b, st, r, t)[d] : 0.0,
                       (unsigned long long)seed);
        }
    dr_run_free(&a);
    dr_run_free(&b);
  }
}

/* Save after step 2, then a fresh optimizer that loads that state and is
 * given the step-2 parameters and the gradients of steps 3-4 must land on
 * the same bits as the uninterrupted run. */
Test(determinism, save_load_resumes_bit_identical, .timeout = 120) {
  uint64_t seed = tu_seed();
  char dir[] = "/tmp/distro_det_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char fmt[128];
  snprintf(fmt, sizeof fmt, "%s/state-%%d.bin", dir);
  for (int mi = 0; mi < NMODES; mi++) {
    int world = 2;
    dr_run full, tail;
    uint64_t s = seed ^ (uint64_t)(mi * 31337);
    setup(&full, &modes[mi], world, 0, s);
    full.save_fmt = fmt;
    full.save_after = 2;
    run_ok(&full, modes[mi].label, seed);
    /* the tail run: steps 3..4, starting from the step-2 parameters */
    setup(&tail, &modes[mi], world, 0, s);
    tail.load_fmt = fmt;
    for (int t = 0; t < NT; t++) {
      int64_t n = dr_shape_numel(ndims[t], shapes[t]);
      cr_assert_eq(first_diff(dr_snap(&full, 1, 0, t), dr_snap(&full, 1, world - 1, t), n), -1);
      memcpy(tail.init[t], dr_snap(&full, 1, 0, t), sizeof(float) * (size_t)n);
    }
    tail.steps = STEPS - 2;
    for (int st = 0; st < tail.steps; st++)
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          int64_t n = dr_shape_numel(ndims[t], shapes[t]);
          memcpy(tail.grads[((size_t)st * world + r) * NT + t], full.grads[((size_t)(st + 2) * world + r) * NT + t],
                 sizeof(float) * (size_t)n);
        }
    run_ok(&tail, modes[mi].label, seed);
    for (int st = 0; st < tail.steps; st++) {
      for (int r = 0; r < world; r++)
        for (int t = 0; t < NT; t++) {
          long d = first_diff(dr_snap(&full, st + 2, r, t), dr_snap(&tail, st, r, t),
                              dr_shape_numel(ndims[t], shapes[t]));
          cr_assert_eq(d, -1, "%s: resumed run differs at step %d rank %d %s[%ld] (DISTRO_TEST_SEED=%llu)",
                       modes[mi].label, st + 3, r, names[t], d, (unsigned long long)seed);
        }
      cr_assert_eq(tail.stats[(size_t)st * world].step, st + 3, "%s: step counter not restored",
                   modes[mi].label);
    }
    tail.steps = STEPS; /* dr_run_free walks the allocated cells */
    dr_run_free(&full);
    dr_run_free(&tail);
  }
  for (int r = 0; r < 2; r++) {
    char p[160];
    snprintf(p, sizeof p, fmt, r);
    unlink(p);
  }
  rmdir(dir);
}
