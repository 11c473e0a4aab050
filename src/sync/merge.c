/* Syncer merge math: token weights, plain and radial-directional averaging
 * of the outer gradients (per tensor within a fragment), and the outer SGD
 * step with Nesterov momentum, the same rules as the DiLoCo mode
 * (docs/diloco.md), over however many reports a round collected. */
#include <math.h>
#include <string.h>

#include "common/error.h"
#include "sync/sync_internal.h"

void distro__sy_weights(distro_merge mode, int n, const double *tokens, const double *steps, double *w) {
  const int tok = mode == DISTRO_MERGE_TOKENS || mode == DISTRO_MERGE_RADIAL_TOKENS;
  double sum = 0;
  for (int r = 0; r < n; r++) {
    w[r] = tok ? (steps[r] > 0 ? tokens[r] * tokens[r] / steps[r] : 0.0) : 1.0;
    sum += w[r];
  }
  for (int r = 0; r < n; r++) w[r] = sum > 0 && isfinite(sum) ? w[r] / sum : 1.0 / n;
}

static double norm2(const float *x, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; j++) s += (double)x[j] * (double)x[j];
  return sqrt(s);
}

static void weighted_sum(int n, const float *const *delta, const double *coef, int64_t e0, int64_t e1, float *out) {
  for (int64_t j = e0; j < e1; j++) out[j] = 0;
  for (int r = 0; r < n; r++) {
    const float c = (float)coef[r];
    const float *d = delta[r];
    for (int64_t j = e0; j < e1; j++) out[j] += c * d[j];
  }
}

void distro__sy_merge(const distro__sy_layout *L, int p, distro_merge mode, int n, const float *const *delta,
                      const double *w, float *out) {
  const distro__fragments *f = &L->frags;
  const int radial = mode == DISTRO_MERGE_RADIAL || mode == DISTRO_MERGE_RADIAL_TOKENS;
  if (!radial) {
    weighted_sum(n, delta, w, 0, f->numel[p], out);
    return;
  }
  double c2[64], nrm[64];
  for (int g0 = f->start[p]; g0 < f->start[p + 1];) {
    int g1 = g0 + 1;
    while (g1 < f->start[p + 1] && f->pieces[g1].tensor == f->pieces[g0].tensor) g1++;
    const int64_t e0 = L->piece_elem[g0], e1 = g1 < f->start[p + 1] ? L->piece_elem[g1] : f->numel[p];
    int plain = (L->tflags[f->pieces[g0].tensor] & DISTRO_DILOCO_PLAIN_MERGE) != 0 || n > 64;
    double R = 0;
    for (int r = 0; r < n && !plain; r++) {
      nrm[r] = norm2(delta[r] + e0, e1 - e0);
      if (!(nrm[r] > 0) || !isfinite(nrm[r])) plain = 1;
      R += w[r] * nrm[r];
    }
    if (!plain) {
      for (int r = 0; r < n; r++) c2[r] = w[r] / nrm[r];
      weighted_sum(n, delta, c2, e0, e1, out);
      const double un = norm2(out + e0, e1 - e0);
      if (un > 0 && isfinite(un)) {
        const float s = (float)(R / un);
        for (int64_t j = e0; j < e1; j++) out[j] *= s;
      } else {
        plain = 1;
      }
    }
    if (plain) weighted_sum(n, delta, w, e0, e1, out);
    g0 = g1;
  }
}

distro_status distro__sy_outer_step(float *global, float *mom, const float *g, int64_t n, float lr, float mu,
                                    int nesterov, float *sg, float *sm) {
  for (int64_t j = 0; j < n; j++) {
    const float m = mu * mom[j] + g[j];
    const float th = nesterov ? global[j] - lr * (g[j] + mu * m) : global[j] - lr * m;
    if (!isfinite(m) || !isfinite(th))
      return distro__fail(DISTRO_ERR_PAYLOAD, "outer step overflows at element %lld", (long long)j);
    sm[j] = m;
    sg[j] = th;
  }
  memcpy(mom, sm, sizeof(float) * (size_t)n);
  memcpy(global, sg, sizeof(float) * (size_t)n);
  return DISTRO_OK;
}
