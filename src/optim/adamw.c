/* AdamW: the update shared by DisTrO-AdamW and the all-reduce baseline, and
 * the baseline step itself. */
#include <math.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/clones.h"
#include "common/error.h"
#include "optim/optim_internal.h"

/* Elements [lo, hi) of the update; one clone per instruction set. */
DISTRO__CLONES
static void adamw_range(float *restrict p, float *restrict m, float *restrict v, const float *restrict q, int64_t lo,
                        int64_t hi, float q_scale, float b1, float b2, float eps, float c1, float c2, float shrink,
                        float lr) {
  for (int64_t j = lo; j < hi; j++) {
    float g = q[j] * q_scale;
    float mj = b1 * m[j] + (1.0f - b1) * g;
    float vj = b2 * v[j] + (1.0f - b2) * g * g;
    m[j] = mj;
    v[j] = vj;
    p[j] = p[j] * shrink - lr * (mj / c1) / (sqrtf(vj / c2) + eps);
  }
}

#define ADAMW_BLOCK 4096 /* elements per OpenMP work item */

void distro__adamw_update(float *p, float *m, float *v, const float *q, int64_t n, float q_scale,
                          const distro_options *o, float lr, int64_t t) {
  const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
  const float c1 = (float)(1.0 - pow((double)b1, (double)t));
  const float c2 = (float)(1.0 - pow((double)b2, (double)t));
  const float shrink = 1.0f - lr * o->weight_decay;
  const int64_t blocks = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t lo = b * ADAMW_BLOCK, hi = lo + ADAMW_BLOCK < n ? lo + ADAMW_BLOCK : n;
    adamw_range(p, m, v, q, lo, hi, q_scale, b1, b2, eps, c1, c2, shrink, lr);
  }
}

/* dst = gs src (gs: options.clip_norm's scale, 1 without); returns nonzero
 * if src holds an Inf or NaN. */
static int copy_check(float *restrict dst, const float *restrict src, int64_t n, float gs) {
  uint32_t bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
  for (int64_t j = 0; j < n; j++) {
    const float x = src[j] * gs;
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    dst[j] = x;
    bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u); /* Inf or NaN; vectorizes */
  }
  return bad != 0;
}

/* Index of the first tensor with a non-finite gradient, or -1. */
static int first_nonfinite_grad(const distro_optim *o) {
  for (int i = 0; i < o->nparams; i++) {
    const float *g = o->params[i].grad;
    const int64_t n = o->params[i].numel;
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (int64_t j = 0; j < n; j++) bad |= !isfinite(g[j]);
    if (bad) return i;
  }
  return -1;
}

distro_status distro__adamw_step(distro_optim *o, float lr, distro_step_stats *s) {
  distro_status st = DISTRO_OK;
  distro_comm *comm = o->comm;
  const int world = comm->size;
  const int64_t n = o->total_numel;
  double t1;
  if (world == 1) {
    /* Nothing to exchange: check the gradients, then update from them. */
    int bad = first_nonfinite_grad(o);
    if (bad >= 0)
      DISTRO_FAIL(DISTRO_ERR_NONFINITE, "non-finite gradient in tensor '%s'; nothing was applied", o->params[bad].name);
    t1 = distro__now();
    for (int i = 0; i < o->nparams; i++) {
      distro__param *p = &o->params[i];
      distro__adamw_update(p->param, p->m, p->v, p->grad, p->numel, p->gscale, &o->opt, lr, o->step + 1);
    }
    s->seconds_decode += distro__now() - t1;
    return DISTRO_OK;
  }
  /* Flatten the gradients, checking them on the way; the last slot counts
   * ranks whose gradient is not finite, so every rank learns of it from the
   * same all-reduce. */
  int64_t off = 0;
  int bad = -1;
  for (int i = 0; i < o->nparams; i++) {
    if (copy_check(o->flat + off, o->params[i].grad, o->params[i].numel, o->params[i].gscale) && bad < 0) bad = i;
    off += o->params[i].numel;
  }
  o->flat[n] = bad >= 0 ? 1.0f : 0.0f;
  double t0 = distro__now();
  DISTRO_CHECK(comm->ops->allreduce_sum(comm, o->flat, (size_t)n + 1));
  s->seconds_exchange += distro__now() - t0;
  /* Ring all-reduce: each rank sends and receives 2(W-1)/W of the buffer. */
  uint64_t ring = (uint64_t)(2.0 * (double)(world - 1) / (double)world * 4.0 * (double)n);
  s->bytes_sent = s->bytes_received = ring;
  if (o->flat[n] != 0.0f) {
    if (bad >= 0)
      DISTRO_FAIL(DISTRO_ERR_NONFINITE, "non-finite gradient in tensor '%s'; nothing was applied",
                  o->params[bad].name);
    DISTRO_FAIL(DISTRO_ERR_NONFINITE, "%g rank(s) reported a non-finite gradient; nothing was applied",
                (double)o->flat[n]);
  }
  int overflow = 0;
  float *flat = o->flat;
#pragma omp parallel for reduction(| : overflow) schedule(static)
  for (int64_t j = 0; j < n; j++) overflow |= !isfinite(flat[j]);
  if (overflow) DISTRO_FAIL(DISTRO_ERR_NONFINITE, "the summed gradient overflowed; nothing was applied");
  t1 = distro__now();
  off = 0;
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    distro__adamw_update(p->param, p->m, p->v, o->flat + off, p->numel, 1.0f / (float)world, &o->opt, lr, o->step + 1);
    off += p->numel;
  }
  s->seconds_decode += distro__now() - t1;
  return DISTRO_OK;
fail:
  return st;
}
