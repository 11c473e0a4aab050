/* options.clip_norm: this rank's gradient clipped tensor by tensor, each by
 * its own norm to clip_norm * sqrt(its usual share of the squared norm).
 *
 * Why per tensor: the gradient-ready exchange (options.overlap BACKWARD)
 * compresses a tensor while backward is still producing the others, so the
 * whole gradient's norm is not known yet. Why the usual share and not the
 * share of the parameters: a tensor whose gradient is usually large keeps
 * it, so a step is clipped about as the global clip would clip it
 * (docs/design.md, "The gradient-ready exchange"). The same rule runs in
 * every mode, so BACKWARD stays the blocking step bit for bit.
 *
 * The caller's gradient is not written: the step multiplies each element by
 * gscale as it reads it, which gives the bits an in-place `g *= gscale`
 * would (the library is built without floating-point contraction). */
#include <math.h>
#include <omp.h>

#include "optim/optim_internal.h"

#define CLIP_BLOCKS 16
#define CLIP_KEEP 0.9 /* the EMA: 0.9 of the old share, 0.1 of this step's */
#define CLIP_TAKE 0.1

/* Sum of squares of g[0..n) in double over CLIP_BLOCKS fixed blocks, added
 * in block order: the same whatever the thread count. */
static double sum_squares(const float *g, int64_t n) {
  double part[CLIP_BLOCKS];
  const size_t un = (size_t)n;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int b = 0; b < CLIP_BLOCKS; b++) {
    double s = 0;
    for (size_t i = un * (size_t)b / CLIP_BLOCKS; i < un * (size_t)(b + 1) / CLIP_BLOCKS; i++) s += (double)g[i] * g[i];
    part[b] = s;
  }
  double ss = 0;
  for (int b = 0; b < CLIP_BLOCKS; b++) ss += part[b];
  return ss;
}

void distro__clip_init(distro_optim *o) {
  o->grad_norm = -1.0;
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    p->gscale = 1.0f;
    p->clip_ss = 0.0;
    p->clip_share = o->total_numel > 0 ? (double)p->numel / (double)o->total_numel : 0.0;
  }
}

void distro__clip_measure(distro_optim *o, int i) {
  distro__param *p = &o->params[i];
  const double ss = sum_squares(p->grad, p->numel);
  const double budget = (double)o->opt.clip_norm * sqrt(p->clip_share), norm = sqrt(ss);
  p->clip_ss = ss;
  /* A non-finite norm keeps the gradient as it is: the step refuses it. */
  p->gscale = norm > budget ? (float)(budget / norm) : 1.0f;
}

void distro__clip_commit(distro_optim *o) {
  double tot = 0;
  for (int i = 0; i < o->nparams; i++) tot += o->params[i].clip_ss;
  if (tot > 0) /* an all-zero gradient leaves the shares */
    for (int i = 0; i < o->nparams; i++) {
      distro__param *p = &o->params[i];
      p->clip_share = CLIP_KEEP * p->clip_share + CLIP_TAKE * p->clip_ss / tot;
    }
  o->grad_norm = sqrt(tot);
}
