/* The GPT trainer's global clip (python-free-examples/gpt/clip.c) against a
 * float64 reference on fresh random gradients: the norm it returns, the
 * gradient scaled to the bound when above it and left bit for bit when not
 * (or with no bound), the same bits with 1 and 2 threads. The per-tensor
 * clip is the library's options.clip_norm (test_clip.c). */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "model.h"
#include "testutil.h"

static void setup(gpt_model *m) {
  const gpt_config cfg = {.context = 16, .layers = 2, .dim = 32, .heads = 2, .tied = 1};
  cr_assert_eq(gpt_init(m, &cfg, 1, 3), 0);
}

Test(gpt_clip, global_norm_against_a_float64_reference) {
  gpt_model m;
  setup(&m);
  const size_t n = m.nparams;
  real *g0 = malloc(sizeof(real) * n), *g1 = malloc(sizeof(real) * n);
  cr_assert(g0 && g1);
  tu_rng r = {tu_seed()};
  for (int trial = 0; trial < 6; trial++) {
    const double amp = exp(2.0 * tu_normal(&r)) * 0.02;
    for (size_t i = 0; i < n; i++) g0[i] = (real)(amp * tu_normal(&r));
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g0[i] * g0[i];
    const double ref = sqrt(ss);
    /* A bound below the norm, above it, and none. */
    const float bounds[3] = {(float)(0.5 * ref), (float)(2.0 * ref), 0.0f};
    for (int b = 0; b < 3; b++) {
      memcpy(m.grads, g0, sizeof(real) * n);
      omp_set_num_threads(1 + trial % 2);
      const float got = gpt_clip_global(&m, bounds[b]);
      cr_assert(fabs(got - ref) <= 1e-6 * ref, "trial %d: norm %.9g, reference %.9g", trial, (double)got, ref);
      if (b == 0) {
        for (size_t i = 0; i < n; i++)
          cr_assert(fabs(m.grads[i] - g0[i] * bounds[0] / ref) <= 1e-6 * fabs(g0[i]) + 1e-30,
                    "trial %d element %zu: %.9g, want %.9g", trial, i, (double)m.grads[i], g0[i] * bounds[0] / ref);
        /* The same bits with the other thread count. */
        memcpy(g1, m.grads, sizeof(real) * n);
        memcpy(m.grads, g0, sizeof(real) * n);
        omp_set_num_threads(2 - trial % 2);
        cr_assert(gpt_clip_global(&m, bounds[0]) == got);
        cr_assert(!memcmp(g1, m.grads, sizeof(real) * n), "trial %d: the clip depends on the thread count", trial);
      } else {
        cr_assert(!memcmp(m.grads, g0, sizeof(real) * n), "trial %d bound %d: a gradient within it was changed", trial,
                  b);
      }
    }
  }
  free(g0);
  free(g1);
  gpt_free(&m);
}
