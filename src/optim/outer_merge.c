/* Outer-gradient merging and the outer step (see outer_merge.h). */
#include "optim/outer_merge.h"

#include <math.h>
#include <stdlib.h>

#define PAR_MIN 32768

void distro__outer_weights(distro_merge mode, int n, const double *tokens, const double *steps, double *w) {
  const int tok = mode == DISTRO_MERGE_TOKENS || mode == DISTRO_MERGE_RADIAL_TOKENS;
  double sum = 0;
  for (int r = 0; r < n; r++) {
    w[r] = tok ? (steps[r] > 0 ? tokens[r] * tokens[r] / steps[r] : 0.0) : 1.0;
    sum += w[r];
  }
  for (int r = 0; r < n; r++) w[r] = sum > 0 && isfinite(sum) ? w[r] / sum : 1.0 / n;
}

double distro__sumsq(const float *x, int64_t n) {
  const int64_t C = 65536, nc = (n + C - 1) / C;
  double *part = nc > 1 ? malloc(sizeof *part * (size_t)nc) : NULL;
  double s = 0;
  if (!part) {
    for (int64_t j = 0; j < n; j++) s += (double)x[j] * (double)x[j];
    return s;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < nc; c++) {
    double a = 0;
    const int64_t hi = (c + 1) * C < n ? (c + 1) * C : n;
    for (int64_t j = c * C; j < hi; j++) a += (double)x[j] * (double)x[j];
    part[c] = a;
  }
  for (int64_t c = 0; c < nc; c++) s += part[c];
  free(part);
  return s;
}

void distro__outer_merge(const distro__fragments *f, const int64_t *piece_elem, const unsigned *tflags, int p,
                         distro_merge mode, int n, const double *w, const distro__outer_source *src, float *out,
                         float *coef, double *nrm) {
  float *c2 = coef + n;
  for (int r = 0; r < n; r++) coef[r] = (float)w[r];
  if (mode != DISTRO_MERGE_RADIAL && mode != DISTRO_MERGE_RADIAL_TOKENS) {
    src->accumulate(src->ctx, f->start[p], f->start[p + 1], coef, out);
    return;
  }
  /* Per tensor within the fragment (its pieces are consecutive). */
  for (int g0 = f->start[p]; g0 < f->start[p + 1];) {
    int g1 = g0 + 1;
    while (g1 < f->start[p + 1] && f->pieces[g1].tensor == f->pieces[g0].tensor) g1++;
    const int64_t e0 = piece_elem[g0], e1 = g1 < f->start[p + 1] ? piece_elem[g1] : f->numel[p];
    int plain = (tflags[f->pieces[g0].tensor] & DISTRO_DILOCO_PLAIN_MERGE) != 0;
    double R = 0;
    for (int r = 0; r < n && !plain; r++) {
      nrm[r] = src->norm(src->ctx, r, g0, g1);
      if (!(nrm[r] > 0) || !isfinite(nrm[r])) plain = 1;
      R += w[r] * nrm[r];
    }
    if (!plain) {
      for (int r = 0; r < n; r++) c2[r] = (float)(w[r] / nrm[r]);
      src->accumulate(src->ctx, g0, g1, c2, out);
      const double un = sqrt(distro__sumsq(out + e0, e1 - e0));
      if (un > 0 && isfinite(un)) {
        const float s = (float)(R / un);
#pragma omp parallel for schedule(static) if (e1 - e0 > PAR_MIN)
        for (int64_t j = e0; j < e1; j++) out[j] *= s;
      } else {
        plain = 1;
      }
    }
    if (plain) src->accumulate(src->ctx, g0, g1, coef, out);
    g0 = g1;
  }
}

int distro__outer_step(const float *theta, const float *mom, const float *g, int64_t n, float lr, float mu,
                       int nesterov, float *new_theta, float *new_mom) {
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > PAR_MIN)
  for (int64_t j = 0; j < n; j++) {
    const float gj = g[j];
    const float m = mu * mom[j] + gj;
    const float th = nesterov ? theta[j] - lr * (gj + mu * m) : theta[j] - lr * m;
    bad |= !isfinite(gj) | !isfinite(m) | !isfinite(th);
    new_mom[j] = m;
    new_theta[j] = th;
  }
  return !bad;
}
