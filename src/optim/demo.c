/* The DeMo step (ALGORITHMS.md section 1), momentum kept in the DCT domain.
 *
 * The transform is orthonormal, so decay*DCT(d) + s*DCT(g) = DCT(decay*d +
 * s*g), and removing the sent coefficients from DCT(d) is the reference's
 * "decode own payload and subtract". Each step then costs one forward DCT (of
 * the gradient) and one inverse (of the aggregate) instead of three. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "compress/topk.h"
#include "optim/optim_internal.h"

/* DisTrO-AdamW's input, from this rank's own AdamW moments (ALGORITHMS.md
 * section 1, docs/design.md): u = g / (sqrt(vhat') + eps), the gradient
 * normalized by the moments it would have after this step (v' = b2 v +
 * (1 - b2) g^2, not stored: the step may still fail), and the RMS of the
 * step AdamW would take here, mhat' / (sqrt(vhat') + eps). The squares are
 * summed in float64 in the order of common/blocksum.h, so the RMS depends
 * neither on the thread count nor on the device. Returns 0 if v' is not
 * finite. */
static int adam_input(distro_optim *o, const distro__param *p, float *u, float *rms) {
  const int64_t n = p->numel, t = o->step + 1, nb = (n + DISTRO__SUM_BLOCK - 1) / DISTRO__SUM_BLOCK;
  const float b1 = o->opt.beta1, b2 = o->opt.beta2, eps = o->opt.eps;
  const float c1 = (float)(1.0 - pow((double)b1, (double)t)), c2 = (float)(1.0 - pow((double)b2, (double)t));
  const float *g = p->grad, *m = p->m, *v = p->v;
  double *part = o->partials;
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
  for (int64_t b = 0; b < nb; b++) {
    const int64_t lo = b * DISTRO__SUM_BLOCK, hi = lo + DISTRO__SUM_BLOCK < n ? lo + DISTRO__SUM_BLOCK : n;
    double lane[DISTRO__SUM_LANES] = {0};
    for (int64_t j = lo; j < hi; j++) {
      const float mj = b1 * m[j] + (1.0f - b1) * g[j];
      const float vj = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
      const float den = sqrtf(vj / c2) + eps;
      const float step = (mj / c1) / den;
      u[j] = g[j] / den;
      lane[(j - lo) % DISTRO__SUM_LANES] += (double)step * (double)step;
      bad |= !isfinite(vj);
    }
    for (int w = DISTRO__SUM_LANES / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    part[b] = lane[0];
  }
  double s = 0;
  for (int64_t b = 0; b < nb; b++) s += part[b];
  *rms = (float)sqrt(s / (double)(n ? n : 1));
  return !bad;
}

/* Sum of x[j]^2 in float64, in the order of common/blocksum.h. */
double distro__sum_squares(const float *x, int64_t n, double *part) {
  const int64_t nb = (n + DISTRO__SUM_BLOCK - 1) / DISTRO__SUM_BLOCK;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; b++) {
    const int64_t lo = b * DISTRO__SUM_BLOCK, hi = lo + DISTRO__SUM_BLOCK < n ? lo + DISTRO__SUM_BLOCK : n;
    double lane[DISTRO__SUM_LANES] = {0};
    for (int64_t j = lo; j < hi; j++) lane[(j - lo) % DISTRO__SUM_LANES] += (double)x[j] * (double)x[j];
    for (int w = DISTRO__SUM_LANES / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    part[b] = lane[0];
  }
  double s = 0;
  for (int64_t b = 0; b < nb; b++) s += part[b];
  return s;
}

/* Commits the moments adam_input used: the same operations, stored. */
static void adam_commit(const distro_optim *o, distro__param *p) {
  const float b1 = o->opt.beta1, b2 = o->opt.beta2;
  const float *g = p->grad;
  float *m = p->m, *v = p->v;
  const int64_t n = p->numel;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; j++) {
    m[j] = b1 * m[j] + (1.0f - b1) * g[j];
    v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
  }
}

/* mom_next = decay*mom + s*DCT(x); select; remove the selection. x is the
 * gradient (sign update) or DisTrO-AdamW's normalized gradient.
 * Returns 0 if mom_next is not finite. A NaN or Inf in the gradient reaches
 * every coefficient of its tile through the transform, so checking the new
 * momentum in the pass that writes it replaces a separate scan of the
 * gradient (and also catches a momentum that overflowed). */
static int compress_tensor(distro_optim *o, int i, float s, distro_step_stats *st) {
  distro__param *p = &o->params[i];
  const int64_t n = p->numel;
  const float decay = o->opt.compression_decay;
  double t0 = distro__now();
  const float *x = p->grad;
  if (o->opt.update == DISTRO_UPDATE_ADAMW) {
    if (!adam_input(o, p, o->scratch_c, &o->scales[i])) return 0;
    x = o->scratch_c;
  }
  distro__dct_encode_tiles(&p->plan, x, p->mom_next, o->scratch_a);
  float *next = p->mom_next;
  const float *mom = p->mom;
  uint32_t bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
  for (int64_t j = 0; j < n; j++) {
    const float v = decay * mom[j] + s * next[j];
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    next[j] = v;
    bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u); /* Inf or NaN; vectorizes */
  }
  double t1 = distro__now();
  st->seconds_transform += t1 - t0;
  if (bad) return 0;
  distro__topk_tiles(&p->tiling, next, p->idx, p->val);
  distro__topk_zero_selected(&p->tiling, next, p->idx);
  st->seconds_topk += distro__now() - t1;
  return 1;
}

/* Aggregate every rank's decoded selection for tensor i into coef: per
 * coefficient the mean over the ranks that selected it, summed in rank order
 * so the result does not depend on thread count. Dropped ranks are skipped.
 * cnt is all zero on entry and on return: only the selected positions are
 * touched, so neither a memset nor a pass over the whole tile is needed. */
static void aggregate_tensor(const distro_optim *o, int i, float *coef, uint16_t *cnt) {
  const distro__tiling *t = &o->tilings[i];
  const int world = o->comm->size;
  const int64_t k = t->k;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < t->nchunks; c++) {
    const int64_t r0 = (c / t->tiles_c) * t->h, c0 = (c % t->tiles_c) * t->w;
    for (int64_t b = 0; b < t->h; b++) memset(coef + (r0 + b) * t->cols + c0, 0, sizeof(float) * (size_t)t->w);
    for (int r = 0; r < world; r++) {
      if (o->dropped[r]) continue;
      const size_t base = (size_t)r * (size_t)o->total_sel + (size_t)o->sel_off[i];
      const uint32_t *ri = o->dec_idx + base;
      const float *rv = o->dec_val + base;
      for (int64_t j = c * k; j < (c + 1) * k; j++) {
        uint32_t ix = ri[j];
        int64_t at = (r0 + ix / t->w) * t->cols + c0 + ix % t->w;
        coef[at] += rv[j];
        cnt[at]++;
      }
    }
    /* Divide each selected coefficient once (the first visit clears cnt). */
    for (int r = 0; r < world; r++) {
      if (o->dropped[r]) continue;
      const uint32_t *ri = o->dec_idx + (size_t)r * (size_t)o->total_sel + (size_t)o->sel_off[i];
      for (int64_t j = c * k; j < (c + 1) * k; j++) {
        uint32_t ix = ri[j];
        int64_t at = (r0 + ix / t->w) * t->cols + c0 + ix % t->w;
        if (cnt[at] > 1) coef[at] /= (float)cnt[at];
        cnt[at] = 0;
      }
    }
  }
}

static inline float signf(float x) { return (float)((x > 0) - (x < 0)); }

distro_status distro__demo_step(distro_optim *o, float lr, distro_step_stats *s) {
  distro_status st = DISTRO_OK;
  const int sign_update = o->opt.update == DISTRO_UPDATE_SIGN;

  /* 1. Compress locally into staged state, or announce that we cannot. */
  int bad = -1;
  for (int i = 0; i < o->nparams && bad < 0; i++)
    /* The sign variant folds lr into the momentum (the reference's choice);
     * DisTrO-AdamW accumulates its normalized gradient. */
    if (!compress_tensor(o, i, sign_update ? lr : 1.0f, s)) bad = i;
  double t0 = distro__now();
  size_t size = distro__payload_encode(o, bad);
  s->seconds_topk += distro__now() - t0;
  s->seconds_codec += distro__now() - t0;
  if (size == 0) DISTRO_FAIL(DISTRO_ERR_PAYLOAD, "internal error: the payload did not fit its bound");

  /* 2-3. Exchange, then validate and decode everything before applying. */
  DISTRO_CHECK(distro__payload_exchange(o, size, s));

  /* 4. Commit: the staged momentum becomes current, and every rank applies
   * the same aggregate. */
  for (int i = 0; i < o->nparams; i++) {
    distro__param *p = &o->params[i];
    float *tmp = p->mom;
    p->mom = p->mom_next;
    p->mom_next = tmp;
    double ta = distro__now();
    aggregate_tensor(o, i, o->scratch_a, o->counts);
    double tb = distro__now();
    distro__dct_decode_tiles(&p->plan, o->scratch_a, o->scratch_b, o->scratch_c);
    double tc = distro__now();
    const float *q = o->scratch_b;
    float *w = p->param;
    const int64_t n = p->numel;
    const float shrink = 1.0f - lr * o->opt.weight_decay;
    if (sign_update) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < n; j++) w[j] = w[j] * shrink - lr * signf(q[j]);
    } else {
      /* DisTrO-AdamW: Q rescaled to the RMS of the step AdamW would take,
       * p -= lr (rho / RMS(Q)) Q, with rho the mean over the ranks of that
       * RMS on each rank's own data; then this step's moments are stored. */
      const float rms = (float)sqrt(distro__sum_squares(q, n, o->partials) / (double)n);
      const float a = rms > 0.0f ? lr * (distro__mean_scale(o, i) / rms) : 0.0f;
      adam_commit(o, p);
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < n; j++) w[j] = w[j] * shrink - a * q[j];
    }
    s->seconds_decode += (tb - ta) + (distro__now() - tc);
    s->seconds_transform += tc - tb;
  }
  return DISTRO_OK;
fail:
  return st;
}
