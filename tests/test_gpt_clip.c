/* The GPT trainer's --clip-per-tensor rule (python-free-examples/gpt/clip.c)
 * against a float64 reference written out here, on fresh random gradients
 * over several steps: each tensor is clipped to clip * sqrt(its usual share),
 * the share an EMA (0.9) of its squared norm over the whole's, starting at
 * its share of the parameters; tensors come in backward's order, in groups. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clip.h"
#include "model.h"
#include "testutil.h"

#define STEPS 6

/* A tiny tied model and its clip shares, at their start. */
static void setup(gpt_model *m, gpt_clip_shares *sh, int layers, int dim) {
  const gpt_config cfg = {.context = 16, .layers = layers, .dim = dim, .heads = 2, .tied = 1};
  cr_assert_eq(gpt_init(m, &cfg, 1, 3), 0);
  cr_assert_eq(gpt_clip_shares_init(sh, m), 0);
  cr_assert_eq(sh->n, m->ntensors);
}

Test(gpt_clip, per_tensor_shares_against_a_float64_reference) {
  gpt_model m;
  gpt_clip_shares sh;
  setup(&m, &sh, 2, 32);
  double *share = malloc(sizeof(double) * (size_t)m.ntensors), *ss = malloc(sizeof(double) * (size_t)m.ntensors);
  double *want = malloc(sizeof(double) * m.nparams);
  cr_assert(share && ss && want);
  for (int t = 0; t < m.ntensors; t++) share[t] = (double)m.tensors[t].numel / (double)m.nparams;
  tu_rng r = {0x5eed ^ (uint64_t)time(NULL)};
  const float clip = 0.8f;
  int clipped = 0, kept = 0;
  for (int step = 0; step < STEPS; step++) {
    /* Each tensor's gradient at its own scale, changing from step to step,
     * so that the shares move and some tensors are clipped, some not. */
    for (int t = 0; t < m.ntensors; t++) {
      const gpt_tensor *ts = &m.tensors[t];
      const double scale = exp(2.0 * tu_normal(&r)) * 0.05;
      for (size_t i = 0; i < ts->numel; i++) m.grads[ts->offset + i] = (real)(scale * tu_normal(&r));
    }
    /* The reference: budgets from the shares before this step. */
    double tot = 0;
    for (int t = 0; t < m.ntensors; t++) {
      const gpt_tensor *ts = &m.tensors[t];
      double s = 0;
      for (size_t i = 0; i < ts->numel; i++) s += (double)m.grads[ts->offset + i] * m.grads[ts->offset + i];
      ss[t] = s;
      tot += s;
      const double budget = clip * sqrt(share[t]), f = sqrt(s) > budget ? budget / sqrt(s) : 1.0;
      if (f < 1.0) clipped++;
      else kept++;
      for (size_t i = 0; i < ts->numel; i++) want[ts->offset + i] = m.grads[ts->offset + i] * f;
    }
    for (int t = 0; t < m.ntensors; t++) share[t] = 0.9 * share[t] + 0.1 * ss[t] / tot;
    /* The trainer's hook, in backward's order: the last tensors first. */
    gpt_clip_each rc = {&m, clip, 1e-3f, NULL, &sh, DISTRO_OK, ""};
    for (int first = m.ntensors; first > 0;) {
      const int count = first >= 3 ? 3 : first;
      first -= count;
      gpt_clip_each_ready(&rc, first, count);
    }
    const double got = gpt_clip_shares_update(&sh);
    cr_assert(fabs(got - tot) <= 1e-9 * tot, "step %d: the squared norm %.17g, want %.17g", step, got, tot);
    for (size_t i = 0; i < m.nparams; i++)
      cr_assert(fabs(m.grads[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-30, "step %d, element %zu: %.9g, want %.9g",
                step, i, (double)m.grads[i], want[i]);
    for (int t = 0; t < m.ntensors; t++)
      cr_assert(fabs(sh.share[t] - share[t]) <= 1e-12, "step %d, tensor %s: share %.17g, want %.17g", step,
                m.tensors[t].name, sh.share[t], share[t]);
  }
  cr_assert(clipped > 0 && kept > 0, "the draw clipped %d tensors and kept %d: both cases must occur", clipped, kept);
  free(share);
  free(ss);
  free(want);
  gpt_clip_shares_free(&sh);
  gpt_free(&m);
}

/* A gradient of zeros (no data reached any tensor) leaves the shares. */
Test(gpt_clip, a_zero_gradient_leaves_the_shares) {
  gpt_model m;
  gpt_clip_shares sh;
  setup(&m, &sh, 1, 16);
  double *before = malloc(sizeof(double) * (size_t)sh.n);
  cr_assert(before);
  memcpy(before, sh.share, sizeof(double) * (size_t)sh.n);
  gpt_zero_grad(&m);
  gpt_clip_each rc = {&m, 1.0f, 1e-3f, NULL, &sh, DISTRO_OK, ""};
  gpt_clip_each_ready(&rc, 0, m.ntensors);
  gpt_clip_shares_update(&sh);
  cr_assert_eq(memcmp(before, sh.share, sizeof(double) * (size_t)sh.n), 0);
  free(before);
  gpt_clip_shares_free(&sh);
  gpt_free(&m);
}
