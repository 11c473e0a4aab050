/* Per-chunk top-k by magnitude.
 *
 * Each candidate becomes one 64-bit key: the bits of |x| (monotonic for
 * non-negative floats) above the complemented index, so larger key = larger
 * magnitude, then lower index. All keys differ, so the selected set does not
 * depend on the selection algorithm, only on the input. */
#include "compress/topk.h"

#include "common/clones.h"

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

/* Magnitude bits of the h x w values at x (row stride ld) into mag, and
 * their maximum. */
DISTRO__CLONES
static uint32_t magnitudes(const float *restrict x, int64_t ld, int64_t h, int64_t w, uint32_t *restrict mag) {
  uint32_t top = 0;
  for (int64_t b = 0; b < h; b++) {
    const float *row = x + b * ld;
    uint32_t *m = mag + b * w;
    for (int64_t d = 0; d < w; d++) {
      uint32_t bits;
      memcpy(&bits, &row[d], sizeof bits);
      m[d] = bits & 0x7fffffffu;
      top = m[d] > top ? m[d] : top;
    }
  }
  return top;
}

/* Magnitudes in mag[0..n) at or above thr. */
DISTRO__CLONES
static int64_t count_at_least(const uint32_t *restrict mag, int64_t n, uint32_t thr) {
  uint32_t c = 0; /* 32-bit lanes, as wide as the compares (a chunk has < 2^32 elements) */
  for (int64_t i = 0; i < n; i++) c += mag[i] >= thr;
  return c;
}

/* Keys (magnitude, complemented index) of the magnitudes at or above thr,
 * in index order; returns their count. The candidates are a few percent of
 * the chunk at random places, so a branch would mispredict: the portable
 * version writes a key for every element and keeps it by advancing the
 * count; with AVX-512 eight keys at a time are compressed in a register and
 * stored whole (a compressing store to memory is microcoded on some CPUs).
 * Either way the keys and their order are the same. cand has room for n + 8
 * keys. */
static int64_t gather_keys_from(const uint32_t *restrict mag, int64_t lo, int64_t n, uint32_t thr,
                                uint64_t *restrict cand) {
  int64_t nc = 0;
  for (int64_t i = lo; i < n; i++) {
    cand[nc] = ((uint64_t)mag[i] << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
    nc += mag[i] >= thr;
  }
  return nc;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !DISTRO_PORTABLE
#define DISTRO__GATHER_AVX512 1
#include <immintrin.h>
__attribute__((target("avx512f"))) static int64_t gather_keys_avx512(const uint32_t *restrict mag, int64_t n,
                                                                      uint32_t thr, uint64_t *restrict cand) {
  const __m512i vthr = _mm512_set1_epi64((long long)thr), lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i ones = _mm512_set1_epi64(0xffffffffLL);
  int64_t nc = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i m = _mm512_cvtepu32_epi64(_mm256_loadu_si256((const __m256i *)(mag + i)));
    const __mmask8 keep = _mm512_cmpge_epu64_mask(m, vthr);
    /* No early exit for empty groups: whether a group of eight holds a
     * candidate is close to a coin toss, and the mispredictions cost more
     * than the store. */
    const __m512i idx = _mm512_add_epi64(_mm512_set1_epi64(i), lane);
    const __m512i key = _mm512_or_si512(_mm512_slli_epi64(m, 32), _mm512_xor_si512(idx, ones));
    _mm512_storeu_si512((void *)(cand + nc), _mm512_maskz_compress_epi64(keep, key));
    nc += __builtin_popcount((unsigned)keep);
  }
  return nc + gather_keys_from(mag, i, n, thr, cand + nc);
}
#endif

int64_t distro__topk_gather_keys(const uint32_t *mag, int64_t n, uint32_t thr, uint64_t *cand, int portable) {
#if DISTRO__GATHER_AVX512
  if (!portable && __builtin_cpu_supports("avx512f")) return gather_keys_avx512(mag, n, thr, cand);
#endif
  (void)portable;
  return gather_keys_from(mag, 0, n, thr, cand);
}

/* The k-th largest of keys[0..n) (k >= 1), reordering them. */
static uint64_t kth_largest(uint64_t *keys, int64_t n, int64_t k) {
  select_largest(keys, n, k);
  uint64_t m = keys[0];
  for (int64_t j = 1; j < k; j++) m = keys[j] < m ? keys[j] : m;
  return m;
}

/* Selects the k largest of one chunk whose magnitude bits are in mag[0..n),
 * their maximum top, and writes their indices in increasing order. A
 * threshold t with count(mag >= t) >= k is narrowed by vector counting
 * passes: binade by binade from the top, by bisection of the exponent, then
 * of the mantissa until at most k + SLACK magnitudes lie at or above it.
 * Those candidates (keys in index order) go through an exact selection of
 * the k-th largest key on a copy, and one pass over the candidates keeps
 * the keys at or above it, already in index order. Where ties leave more
 * candidates (equal magnitudes), the selection runs on all of them and the
 * k indices are sorted. */
enum { SLACK = 16, MAX_PASSES = 40 };
static void select_chunk(const uint32_t *mag, uint32_t top, int64_t n, int64_t k, uint64_t *cand, uint32_t *out) {
  /* lo: count(lo) = clo >= k; hi: count(hi) < k (hi may be top + 1). */
  uint32_t lo = 0, hi = top + 1u;
  int64_t clo = n;
  int passes = 0;
  for (uint32_t e = top >> 23; e > 0 && passes < 5; e--, passes++) { /* the top binades */
    const int64_t c = count_at_least(mag, n, e << 23);
    if (c >= k) {
      lo = e << 23;
      clo = c;
      break;
    }
    hi = e << 23;
  }
  while (clo > k + SLACK && hi - lo > 1 && passes < MAX_PASSES) {
    /* Bisect the exponent first while the range spans binades, then the
     * mantissa (the bits order like the values). */
    const uint32_t elo = lo >> 23, ehi = (hi - 1u) >> 23;
    const uint32_t mid = ehi - elo > 1 ? ((elo + (ehi - elo + 1) / 2) << 23) : lo + (hi - lo) / 2;
    const int64_t c = count_at_least(mag, n, mid);
    passes++;
    if (c >= k) {
      lo = mid;
      clo = c;
    } else {
      hi = mid;
    }
  }
  const int64_t nc = distro__topk_gather_keys(mag, n, lo, cand, 0);
  if (nc == k || (nc > k && 2 * nc <= n + 8)) {
    uint64_t kth = 0;
    if (nc > k) {
      memcpy(cand + nc, cand, sizeof(uint64_t) * (size_t)nc);
      kth = kth_largest(cand + nc, nc, k);
    }
    int64_t j = 0;
    for (int64_t i = 0; i < nc; i++)
      if (cand[i] >= kth) out[j++] = 0xffffffffu - (uint32_t)(cand[i] & 0xffffffffu);
    return;
  }
  select_largest(cand, nc, k);
  for (int64_t j = 0; j < k; j++) out[j] = 0xffffffffu - (uint32_t)(cand[j] & 0xffffffffu);
  sort_indices(out, k);
}

void distro__topk_chunk(const float *x, int64_t ld, int64_t h, int64_t w, int64_t k, uint32_t *idx, float *val,
                        uint32_t *mag, uint64_t *cand) {
  const int64_t n = h * w;
  if (k >= n) {
    for (int64_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
  } else {
    select_chunk(mag, magnitudes(x, ld, h, w, mag), n, k, cand, idx);
  }
  const int64_t kk = k < n ? k : n;
  if (ld == w) /* a contiguous tile (the step's): no division per index */
    for (int64_t j = 0; j < kk; j++) val[j] = x[idx[j]];
  else
    for (int64_t j = 0; j < kk; j++) val[j] = x[(idx[j] / w) * ld + idx[j] % w];
}

void distro__topk_tiles(const distro__tiling *t, const float *coef, uint32_t *idx, float *val) {
  const int64_t n = t->chunk_elems, k = t->k;
#pragma omp parallel
  {
    /* Per-thread scratch; without it (allocation failed) fall back to a
     * slow but allocation-free scan, since selection cannot fail. */
    uint32_t *mag = malloc(sizeof(uint32_t) * (size_t)n);
    uint64_t *cand = malloc(sizeof(uint64_t) * (size_t)(n + 8));
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
