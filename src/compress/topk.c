/* Per-chunk top-k by magnitude.
 *
 * Each candidate becomes one 64-bit key: the bits of |x| (monotonic for
 * non-negative floats) above the complemented index, so larger key = larger
 * magnitude, then lower index. All keys differ, so the selected set does not
 * depend on the selection algorithm, only on the input. */
#include "compress/topk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t topk_key(float v, uint32_t idx) {
  float a = fabsf(v);
  uint32_t bits;
  memcpy(&bits, &a, sizeof bits);
  return ((uint64_t)bits << 32) | (uint64_t)(0xffffffffu - idx);
}

static inline void swap_u64(uint64_t *a, uint64_t *b) {
  uint64_t t = *a;
  *a = *b;
  *b = t;
}

/* Reorders keys[0..n) so that keys[0..k) are the k largest (in any order). */
static void select_largest(uint64_t *keys, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    /* Median of three as pivot, moved to hi. */
    int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] > keys[lo]) swap_u64(&keys[mid], &keys[lo]);
    if (keys[hi] > keys[lo]) swap_u64(&keys[hi], &keys[lo]);
    if (keys[mid] > keys[hi]) swap_u64(&keys[mid], &keys[hi]);
    uint64_t pivot = keys[hi];
    int64_t store = lo;
    for (int64_t i = lo; i < hi; i++)
      if (keys[i] > pivot) swap_u64(&keys[i], &keys[store++]);
    swap_u64(&keys[store], &keys[hi]);
    /* keys[lo..store) > pivot = keys[store] > keys(store..hi] */
    if (store == k - 1 || store == k) return;
    if (store < k) lo = store + 1;
    else hi = store - 1;
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

static void sort_indices(uint32_t *idx, int64_t k) {
  if (k > 32) {
    qsort(idx, (size_t)k, sizeof *idx, cmp_u32);
    return;
  }
  for (int64_t i = 1; i < k; i++) {
    uint32_t v = idx[i];
    int64_t j = i - 1;
    while (j >= 0 && idx[j] > v) {
      idx[j + 1] = idx[j];
      j--;
    }
    idx[j + 1] = v;
  }
}

/* Selects the k largest of one chunk whose magnitude bits are in mag[0..n):
 * a 256-bucket histogram of the exponent finds the bucket holding the k-th
 * largest; everything above it is in, and only that bucket's members go
 * through an exact selection on (magnitude, index) keys. Typically a few
 * dozen candidates instead of the whole chunk. */
static void select_chunk(const uint32_t *mag, const int32_t *hist, int64_t n, int64_t k, uint64_t *cand,
                         uint32_t *out) {
  int64_t above = 0;
  int t = 255;
  for (; t > 0; t--) {
    if (above + hist[t] >= k) break;
    above += hist[t];
  }
  int64_t m = 0, nc = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t e = mag[i] >> 23;
    if (e > (uint32_t)t) out[m++] = (uint32_t)i;
    else if (e == (uint32_t)t) cand[nc++] = ((uint64_t)mag[i] << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
  }
  const int64_t need = k - m;
  select_largest(cand, nc, need);
  for (int64_t j = 0; j < need; j++) out[m++] = 0xffffffffu - (uint32_t)(cand[j] & 0xffffffffu);
  sort_indices(out, k);
}

void distro__topk_chunk(const float *x, int64_t ld, int64_t h, int64_t w, int64_t k, uint32_t *idx, float *val,
                        uint32_t *mag, uint64_t *cand) {
  const int64_t n = h * w;
  if (k >= n) {
    for (int64_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
  } else {
    int32_t hist[256] = {0};
    int64_t m = 0;
    for (int64_t b = 0; b < h; b++) {
      const float *row = x + b * ld;
      for (int64_t d = 0; d < w; d++, m++) {
        uint32_t bits;
        memcpy(&bits, &row[d], sizeof bits);
        mag[m] = bits & 0x7fffffffu;
        hist[mag[m] >> 23]++;
      }
    }
    select_chunk(mag, hist, n, k, cand, idx);
  }
  const int64_t kk = k < n ? k : n;
  for (int64_t j = 0; j < kk; j++) val[j] = x[(idx[j] / w) * ld + idx[j] % w];
}

void distro__topk_tiles(const distro__tiling *t, const float *coef, uint32_t *idx, float *val) {
  const int64_t n = t->chunk_elems, k = t->k;
#pragma omp parallel
  {
    /* Per-thread scratch; without it (allocation failed) fall back to a
     * slow but allocation-free scan, since selection cannot fail. */
    uint32_t *mag = malloc(sizeof(uint32_t) * (size_t)n);
    uint64_t *cand = malloc(sizeof(uint64_t) * (size_t)n);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < t->nchunks; c++) {
      uint32_t *ci = idx + c * k;
      float *cv = val + c * k;
      const int64_t r0 = (c / t->tiles_c) * t->h, c0 = (c % t->tiles_c) * t->w;
      if (mag && cand) {
        distro__topk_chunk(coef + r0 * t->cols + c0, t->cols, t->h, t->w, k, ci, cv, mag, cand);
        continue;
      }
      uint64_t prev = UINT64_MAX;
      for (int64_t j = 0; j < k; j++) {
        uint64_t best = 0;
        for (int64_t i = 0; i < n; i++) {
          uint64_t key = topk_key(coef[distro__tile_offset(t, c, (uint32_t)i)], (uint32_t)i);
          if (key < prev && key > best) best = key;
        }
        ci[j] = 0xffffffffu - (uint32_t)(best & 0xffffffffu);
        prev = best;
      }
      sort_indices(ci, k);
      for (int64_t j = 0; j < k; j++) cv[j] = coef[distro__tile_offset(t, c, ci[j])];
    }
    free(mag);
    free(cand);
  }
}

void distro__topk_zero_selected(const distro__tiling *t, float *coef, const uint32_t *idx) {
  const int64_t k = t->k;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < t->nchunks; c++)
    for (int64_t j = 0; j < k; j++) coef[distro__tile_offset(t, c, idx[c * k + j])] = 0.0f;
}
