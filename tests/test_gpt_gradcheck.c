/* The GPT example's backward pass against central finite differences, in
 * float64 (the model compiled with GPT_DOUBLE), for every tensor of a tiny
 * model: tied and untied head, several layers, heads and positions. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "model.h"
#include "testutil.h"

#if !defined(GPT_DOUBLE)
#error "link gpt_model_f64: the check needs the float64 build of the model"
#endif

/* Parameters of order 0.1..1 so that every nonlinearity (softmax, GELU,
 * LayerNorm) works away from its linear regime. */
static void randomize(gpt_model *m, tu_rng *r) {
  for (int i = 0; i < m->ntensors; i++) {
    const gpt_tensor *t = &m->tensors[i];
    real *p = m->params + t->offset;
    const int gain = strstr(t->name, "ln") && t->name[strlen(t->name) - 1] == 'w';
    for (size_t j = 0; j < t->numel; j++) p[j] = (gain ? 1.0 : 0.0) + 0.4 * tu_normal(r);
  }
}

static void check(gpt_config cfg, int B, uint64_t seed) {
  omp_set_num_threads(1); /* thousands of tiny forward passes: threads only add overhead */
  gpt_model m;
  cr_assert_eq(gpt_init(&m, &cfg, B, 7), 0);
  tu_rng r = {seed};
  randomize(&m, &r);
  const int T = cfg.context;
  uint8_t in[64], tg[64];
  cr_assert(B * T <= 64);
  /* A small alphabet, so that tokens repeat (embedding rows accumulate). */
  for (int i = 0; i < B * T; i++) {
    in[i] = (uint8_t)(97 + tu_next(&r) % 6);
    tg[i] = (uint8_t)(97 + tu_next(&r) % 6);
  }
  gpt_forward(&m, in, tg, B, T);
  gpt_zero_grad(&m);
  gpt_backward(&m);
  double *analytic = malloc(m.nparams * sizeof *analytic);
  cr_assert(analytic);
  memcpy(analytic, m.grads, m.nparams * sizeof *analytic);

  const double h = 1e-5;
  for (int i = 0; i < m.ntensors; i++) {
    const gpt_tensor *t = &m.tensors[i];
    double diff2 = 0, num2 = 0, ana2 = 0, worst = 0;
    size_t worst_at = 0;
    for (size_t j = 0; j < t->numel; j++) {
      real *p = m.params + t->offset + j;
      const real keep = *p;
      *p = keep + h;
      const double lp = gpt_forward(&m, in, tg, B, T);
      *p = keep - h;
      const double lm = gpt_forward(&m, in, tg, B, T);
      *p = keep;
      const double num = (lp - lm) / (2 * h), ana = analytic[t->offset + j];
      const double e = fabs(num - ana) / (1e-7 + 1e-4 * fabs(num));
      diff2 += (num - ana) * (num - ana);
      num2 += num * num;
      ana2 += ana * ana;
      if (e > worst) {
        worst = e;
        worst_at = j;
      }
    }
    const double rel = sqrt(diff2) / fmax(sqrt(num2), 1e-30);
    cr_expect(num2 > 0, "%s: the finite-difference gradient is zero; the check would prove nothing", t->name);
    cr_expect(rel < 1e-6 && worst <= 1,
              "%s: backward disagrees with finite differences: relative L2 error %.3g, worst element %zu "
              "(analytic %.9g, |ana| %.3g |num| %.3g)",
              t->name, rel, worst_at, analytic[t->offset + worst_at], sqrt(ana2), sqrt(num2));
  }
  free(analytic);
  gpt_free(&m);
}

Test(gpt_gradcheck, tied_two_layers) {
  check((gpt_config){.context = 5, .layers = 2, .dim = 8, .heads = 2, .tied = 1}, 2, 11);
}

Test(gpt_gradcheck, untied_one_head) {
  check((gpt_config){.context = 4, .layers = 1, .dim = 6, .heads = 1, .tied = 0}, 3, 12);
}

Test(gpt_gradcheck, shorter_than_context) {
  /* Sequences shorter than the position table: only the first rows of wpe
   * see gradient (the rest must stay exactly zero, and FD agrees). */
  gpt_config cfg = {.context = 8, .layers = 1, .dim = 8, .heads = 4, .tied = 1};
  gpt_model m;
  cr_assert_eq(gpt_init(&m, &cfg, 2, 3), 0);
  uint8_t in[6] = {1, 2, 3, 4, 5, 6}, tg[6] = {2, 3, 4, 5, 6, 7};
  gpt_forward(&m, in, tg, 2, 3);
  gpt_zero_grad(&m);
  gpt_backward(&m);
  const gpt_tensor *wpe = &m.tensors[1];
  cr_assert_str_eq(wpe->name, "wpe");
  for (size_t j = 3 * 8; j < wpe->numel; j++) cr_assert_eq(m.grads[wpe->offset + j], 0.0);
  gpt_free(&m);
}
