/* The syncer's merge source: the reports of one round, decoded into one
 * float array per report (see optim/outer_merge.h for the merge rules,
 * shared with the DiLoCo mode), and the robust rule against hostile
 * reports (coordinate-wise trimmed mean). */
#include <math.h>

#include "optim/outer_merge.h"
#include "sync/sync_internal.h"

typedef struct {
  const distro__sy_layout *L;
  int p;
  const float *const *delta;
  int n;
} report_source;

static void report_accumulate(void *ctx, int q0, int q1, const float *coef, float *out) {
  const report_source *rs = ctx;
  const distro__fragments *f = &rs->L->frags;
  const int64_t e0 = rs->L->piece_elem[q0], e1 = q1 < f->start[rs->p + 1] ? rs->L->piece_elem[q1] : f->numel[rs->p];
  for (int64_t j = e0; j < e1; j++) out[j] = 0;
  for (int r = 0; r < rs->n; r++) {
    const float c = coef[r];
    const float *d = rs->delta[r];
    for (int64_t j = e0; j < e1; j++) out[j] += c * d[j];
  }
}

static double report_norm(void *ctx, int r, int q0, int q1) {
  const report_source *rs = ctx;
  const distro__fragments *f = &rs->L->frags;
  const int64_t e0 = rs->L->piece_elem[q0], e1 = q1 < f->start[rs->p + 1] ? rs->L->piece_elem[q1] : f->numel[rs->p];
  return sqrt(distro__sumsq(rs->delta[r] + e0, e1 - e0));
}

void distro__sy_merge(const distro__sy_layout *L, int p, distro_merge mode, int n, const float *const *delta,
                      const double *w, float *out, float *coef, double *nrm) {
  report_source rs = {L, p, delta, n};
  const distro__outer_source src = {&rs, report_accumulate, report_norm};
  distro__outer_merge(&L->frags, L->piece_elem, L->tflags, p, mode, n, w, &src, out, coef, nrm);
}

/* Per element: the n values sorted, the f lowest and f highest dropped,
 * the rest averaged in float64 in sorted order (so the result does not
 * depend on the reports' order or the thread count). */
void distro__sy_trimmed_mean(const distro__sy_layout *L, int p, int n, int f, const float *const *delta, float *out) {
  const int64_t numel = L->frags.numel[p];
  const int keep = n - 2 * f;
#pragma omp parallel for schedule(static) if (numel > 65536)
  for (int64_t j = 0; j < numel; j++) {
    float v[256];
    for (int r = 0; r < n; r++) {
      /* Insertion sort: n is a handful of learners. */
      const float x = delta[r][j];
      int k = r;
      while (k > 0 && v[k - 1] > x) {
        v[k] = v[k - 1];
        k--;
      }
      v[k] = x;
    }
    double sum = 0;
    for (int r = f; r < n - f; r++) sum += v[r];
    out[j] = (float)(sum / keep);
  }
}
