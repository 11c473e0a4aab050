/* The syncer's merge source: the reports of one round, decoded into one
 * float array per report (see optim/outer_merge.h for the merge rules,
 * shared with the DiLoCo mode), and the robust rule against hostile
 * reports (coordinate-wise trimmed mean). */
#include <math.h>
#include <stdint.h>

#include "common/clones.h"
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

/* Compare-exchange: a <= b afterwards (branch-free; reports are finite). */
#define CX(a, b)                    \
  do {                              \
    const float lo_ = b < a ? b : a; \
    const float hi_ = b < a ? a : b; \
    a = lo_;                        \
    b = hi_;                        \
  } while (0)

/* The common quorums as sorting networks (vectorized, cloned per ISA):
 * the same sorted values as the insertion sort below, summed in the same
 * order from the same +0, so the same bits. Elements [j0, j1). */
DISTRO__CLONES
static void trim3(const float *const *d, float *out, int64_t j0, int64_t j1) {
  const float *d0 = d[0], *d1 = d[1], *d2 = d[2];
  for (int64_t j = j0; j < j1; j++) {
    float a = d0[j], b = d1[j], c = d2[j];
    CX(a, b);
    CX(b, c);
    CX(a, b);
    double sum = 0;
    sum += b;
    out[j] = (float)(sum / 1);
  }
}

DISTRO__CLONES
static void trim4(const float *const *d, float *out, int64_t j0, int64_t j1) {
  const float *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3];
  for (int64_t j = j0; j < j1; j++) {
    float a = d0[j], b = d1[j], c = d2[j], e = d3[j];
    CX(a, b);
    CX(c, e);
    CX(a, c);
    CX(b, e);
    CX(b, c);
    double sum = 0;
    sum += b;
    sum += c;
    out[j] = (float)(sum / 2);
  }
}

DISTRO__CLONES
static void trim5(const float *const *d, float *out, int64_t j0, int64_t j1, int f) {
  const float *d0 = d[0], *d1 = d[1], *d2 = d[2], *d3 = d[3], *d4 = d[4];
  const int mid_only = f == 2;
  for (int64_t j = j0; j < j1; j++) {
    float a = d0[j], b = d1[j], c = d2[j], e = d3[j], g = d4[j];
    CX(a, b);
    CX(e, g);
    CX(c, g);
    CX(c, e);
    CX(a, e);
    CX(a, c);
    CX(b, g);
    CX(b, e);
    CX(b, c);
    double sum = 0; /* f = 1: b + c + e over 3; f = 2: c alone */
    sum += mid_only ? 0.0f : b;
    sum += c;
    sum += mid_only ? 0.0f : e;
    out[j] = (float)(sum / (mid_only ? 1 : 3));
  }
}

/* Batcher's odd-even merge sort network on N = 2^k inputs: its
 * compare-exchange pairs in order, into pr (N log N (log N + 1) / 4 of
 * them); returns how many. */
static int batcher_pairs(int N, uint8_t (*pr)[2]) {
  int np = 0;
  for (int p = 1; p < N; p <<= 1)
    for (int k = p; k >= 1; k >>= 1)
      for (int j = k % p; j + k < N; j += 2 * k)
        for (int i = 0; i < k && i + j + k < N; i++)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
            pr[np][0] = (uint8_t)(i + j);
            pr[np][1] = (uint8_t)(i + j + k);
            np++;
          }
  return np;
}

#define TRIM_MAX 32 /* reports the network path takes */
#define TRIM_LANES 64

static inline void cx_rows(float *restrict a, float *restrict b) {
  for (int l = 0; l < TRIM_LANES; l++) CX(a[l], b[l]);
}

/* Any n <= TRIM_MAX: the network of the next power of two over columns of
 * TRIM_LANES elements, the missing inputs +Inf (finite reports sort before
 * them), then the kept rows summed in order as the rule says. */
DISTRO__CLONES
static void trim_network(const float *const *d, float *out, int64_t j0, int64_t j1, int n, int f, int N,
                         const uint8_t (*pr)[2], int np) {
  float v[TRIM_MAX][TRIM_LANES];
  double sum[TRIM_LANES];
  for (int64_t j = j0; j < j1; j += TRIM_LANES) {
    const int m = j1 - j < TRIM_LANES ? (int)(j1 - j) : TRIM_LANES;
    for (int r = 0; r < N; r++) {
      int l = 0;
      if (r < n)
        for (; l < m; l++) v[r][l] = d[r][j + l];
      for (; l < TRIM_LANES; l++) v[r][l] = INFINITY;
    }
    for (int q = 0; q < np; q++) cx_rows(v[pr[q][0]], v[pr[q][1]]);
    for (int l = 0; l < TRIM_LANES; l++) sum[l] = 0;
    for (int r = f; r < n - f; r++)
      for (int l = 0; l < TRIM_LANES; l++) sum[l] += v[r][l];
    for (int l = 0; l < m; l++) out[j + l] = (float)(sum[l] / (n - 2 * f));
  }
}

static int trimmed_small(int64_t numel, int n, int f, const float *const *d, float *out) {
  if (n > TRIM_MAX) return 0;
  const int special = (n == 3 && f == 1) || (n == 4 && f == 1) || (n == 5 && (f == 1 || f == 2));
  int N = 1;
  while (N < n) N <<= 1;
  uint8_t pr[TRIM_MAX * 15][2]; /* 32 log2(32) (log2(32) + 1) / 4 = 240 pairs at most */
  const int np = special ? 0 : batcher_pairs(N, pr);
  const int64_t block = 16384, nb = (numel + block - 1) / block;
#pragma omp parallel for schedule(static) if (numel > 65536)
  for (int64_t k = 0; k < nb; k++) {
    const int64_t j0 = k * block, j1 = j0 + block < numel ? j0 + block : numel;
    if (!special) trim_network(d, out, j0, j1, n, f, N, (const uint8_t(*)[2])pr, np);
    else if (n == 3) trim3(d, out, j0, j1);
    else if (n == 4) trim4(d, out, j0, j1);
    else trim5(d, out, j0, j1, f);
  }
  return 1;
}

/* Per element: the n values sorted, the f lowest and f highest dropped,
 * the rest averaged in float64 in sorted order (so the result does not
 * depend on the reports' order or the thread count). */
void distro__sy_trimmed_mean(const distro__sy_layout *L, int p, int n, int f, const float *const *delta, float *out) {
  const int64_t numel = L->frags.numel[p];
  const int keep = n - 2 * f;
  if (trimmed_small(numel, n, f, delta, out)) return;
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
