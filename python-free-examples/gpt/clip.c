/* Gradient clipping for the trainer (clip.h). */
#include "clip.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Global L2 norm of this rank's gradient, clipped to max_norm (0: no clip).
 * Partial sums over fixed blocks keep the result independent of the thread
 * count (MPI and in-process ranks must agree bit for bit). */
/* Sum of squares of g[0..n) over nblk (<= 64) fixed blocks, added in
 * block order: the same whatever the thread count. */
static double sum_squares(const real *g, size_t n, int nblk) {
  double part[64];
#pragma omp parallel for schedule(static)
  for (int b = 0; b < nblk; b++) {
    double s = 0;
    for (size_t i = n * b / nblk; i < n * (b + 1) / nblk; i++) s += (double)g[i] * g[i];
    part[b] = s;
  }
  double ss = 0;
  for (int b = 0; b < nblk; b++) ss += part[b];
  return ss;
}

float gpt_clip_global(gpt_model *m, float max_norm) {
  const size_t n = m->nparams;
  real *g = m->grads;
  const float norm = (float)sqrt(sum_squares(g, n, 64));
  if (max_norm > 0 && norm > max_norm) {
    const float scale = max_norm / norm;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] *= scale;
  }
  return norm;
}

int gpt_clip_shares_init(gpt_clip_shares *s, const gpt_model *m) {
  s->n = m->ntensors;
  s->share = calloc((size_t)s->n, sizeof *s->share);
  s->ss = calloc((size_t)s->n, sizeof *s->ss);
  if (!s->share || !s->ss) {
    gpt_clip_shares_free(s);
    return -1;
  }
  for (int t = 0; t < s->n; t++) s->share[t] = (double)m->tensors[t].numel / (double)m->nparams;
  return 0;
}

double gpt_clip_shares_update(gpt_clip_shares *s) {
  double tot = 0;
  for (int t = 0; t < s->n; t++) tot += s->ss[t];
  if (tot > 0)
    for (int t = 0; t < s->n; t++) s->share[t] = 0.9 * s->share[t] + 0.1 * s->ss[t] / tot;
  return tot;
}

void gpt_clip_shares_free(gpt_clip_shares *s) {
  free(s->share);
  free(s->ss);
  s->share = s->ss = NULL;
  s->n = 0;
}

/* --clip-per-tensor: backward's hook clips each tensor by its own norm as
 * soon as its gradient is final (the global norm is known only at the end)
 * and, with --overlap-backward, hands it to the optimizer, whose exchange
 * then starts during the rest of backward. The budget is the tensor's usual
 * share of the norm, not its share of the parameters: a tensor whose
 * gradient is usually large keeps it, so a step is clipped about as the
 * global clip would clip it (docs/design.md, "The gradient-ready
 * exchange"). */
void gpt_clip_each_ready(void *arg, int first, int count) {
  gpt_clip_each *r = arg;
  gpt_model *m = r->m;
  for (int t = first; t < first + count; t++) {
    const gpt_tensor *ts = &m->tensors[t];
    real *g = m->grads + ts->offset;
    const size_t n = ts->numel;
    const double ss = sum_squares(g, n, 16);
    r->shares->ss[t] = ss;
    const double budget = r->max_norm * sqrt(r->shares->share[t]), norm = sqrt(ss);
    if (r->max_norm > 0 && norm > budget) {
      const float scale = (float)(budget / norm);
      for (size_t i = 0; i < n; i++) g[i] *= scale;
    }
    if (r->opt && r->st == DISTRO_OK) {
      r->st = distro_optim_grad_ready(r->opt, ts->name, r->lr);
      if (r->st != DISTRO_OK) snprintf(r->err, sizeof r->err, "%s", distro_last_error());
    }
  }
}
