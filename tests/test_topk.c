/* Per-chunk top-k against brute force. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/topk.h"
#include "testutil.h"

/* Brute force: is element m among the k largest (|x| desc, index asc)? */
static int ref_selected(const float *vals, int64_t n, int64_t k, int64_t m) {
  int64_t better = 0;
  for (int64_t i = 0; i < n; i++) {
    float a = fabsf(vals[i]), b = fabsf(vals[m]);
    if (a > b || (a == b && i < m)) better++;
  }
  return better < k;
}

static void check(int ndim, const int64_t *shape, int64_t target, int64_t topk, int ties) {
  tu_rng rng = {tu_seed()};
  uint64_t seed = rng.s;
  distro__tiling t;
  cr_assert_eq(distro__tiling_init(&t, ndim, shape, target, topk), DISTRO_OK);
  const int64_t n = t.rows * t.cols, k = t.k;
  float *x = malloc(sizeof(float) * n), *val = malloc(sizeof(float) * t.nchunks * k);
  uint32_t *idx = malloc(sizeof(uint32_t) * t.nchunks * k);
  tu_fill_normal(&rng, x, (size_t)n, 1.0f);
  if (ties == 1)
    for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(x[i] * 2)) * (tu_next(&rng) & 1 ? 1.f : -1.f);
  if (ties == 2) /* one binade, a few hundred ulps wide: the mantissa bisection's case */
    for (int64_t i = 0; i < n; i++) x[i] = (1.0f + 1e-5f * fabsf(x[i])) * (tu_next(&rng) & 1 ? 1.f : -1.f);
  if (ties == 3) /* magnitudes over many binades */
    for (int64_t i = 0; i < n; i++) x[i] = expf(8.0f * x[i]) * (tu_next(&rng) & 1 ? 1.f : -1.f);
  distro__topk_tiles(&t, x, idx, val);
  float *chunk = malloc(sizeof(float) * t.chunk_elems);
  for (int64_t c = 0; c < t.nchunks; c++) {
    int64_t r0 = (c / t.tiles_c) * t.h, c0 = (c % t.tiles_c) * t.w;
    for (int64_t m = 0; m < t.chunk_elems; m++) chunk[m] = x[(r0 + m / t.w) * t.cols + c0 + m % t.w];
    for (int64_t j = 0; j < k; j++) {
      uint32_t m = idx[c * k + j];
      cr_assert(m < (uint32_t)t.chunk_elems);
      if (j) cr_assert(idx[c * k + j - 1] < m, "indices sorted and unique");
      cr_assert(ref_selected(chunk, t.chunk_elems, k, m), "chunk %lld: index %u not in top-%lld (seed %llu)",
                (long long)c, m, (long long)k, (unsigned long long)seed);
      cr_assert_eq(val[c * k + j], chunk[m]);
    }
  }
  distro__topk_zero_selected(&t, x, idx);
  for (int64_t c = 0; c < t.nchunks; c++) {
    int64_t r0 = (c / t.tiles_c) * t.h, c0 = (c % t.tiles_c) * t.w;
    for (int64_t j = 0; j < k; j++) {
      uint32_t m = idx[c * k + j];
      cr_assert_eq(x[(r0 + m / t.w) * t.cols + c0 + m % t.w], 0.0f);
    }
  }
  free(x);
  free(val);
  free(idx);
  free(chunk);
}

Test(topk, random_inputs) {
  int64_t a[] = {128, 192};
  check(2, a, 64, 32, 0);
  check(2, a, 64, 1, 0);
  check(2, a, 64, 4095, 0);
  int64_t b[] = {100};
  check(1, b, 64, 8, 0);
  int64_t c[] = {67, 64};
  check(2, c, 64, 4, 0);
  int64_t d[] = {3, 48, 50};
  check(3, d, 64, 100, 0);
}

Test(topk, ties_go_to_lower_index) {
  int64_t a[] = {128, 128};
  check(2, a, 64, 32, 1);
  check(2, a, 64, 1000, 1);
  int64_t b[] = {64, 64};
  distro__tiling t;
  cr_assert_eq(distro__tiling_init(&t, 2, b, 64, 3), DISTRO_OK);
  float *x = calloc(64 * 64, sizeof(float));
  x[5] = -1.0f;
  x[2 * 64 + 1] = 1.0f; /* in-chunk index 129 */
  x[7] = 1.0f;
  x[9] = 0.5f;
  uint32_t idx[3];
  float val[3];
  distro__topk_tiles(&t, x, idx, val);
  cr_expect(idx[0] == 5 && idx[1] == 7 && idx[2] == 129, "got %u %u %u", idx[0], idx[1], idx[2]);
  cr_expect(val[0] == -1.0f && val[1] == 1.0f && val[2] == 1.0f);
  free(x);
}

/* The threshold search narrows by binades, then by exponent and mantissa
 * bisection; inputs packed into one binade or spread over many take the
 * different routes. */
Test(topk, packed_and_spread_magnitudes) {
  int64_t a[] = {128, 192}, b[] = {96, 96};
  for (int mode = 2; mode <= 3; mode++) {
    check(2, a, 64, 32, mode);
    check(2, a, 64, 1, mode);
    check(2, a, 64, 300, mode);
    check(2, b, 32, 32, mode);
    check(2, b, 32, 7, mode);
  }
}

Test(topk, full_selection_keeps_everything) {
  int64_t a[] = {48, 50};
  check(2, a, 64, 1 << 20, 0);
}

/* The candidate gather has an AVX-512 path and a portable one; both give
 * the same keys in the same order, at every threshold and length (also
 * lengths that are not multiples of the vector width). */
Test(topk, candidate_gather_paths_agree) {
  tu_rng rng = {tu_seed()};
  const int64_t lens[] = {1, 7, 8, 9, 63, 64, 1024, 1031, 4096};
  for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
    const int64_t n = lens[l];
    uint32_t *mag = malloc(sizeof(uint32_t) * (size_t)n);
    uint64_t *a = malloc(sizeof(uint64_t) * (size_t)(n + 8)), *b = malloc(sizeof(uint64_t) * (size_t)(n + 8));
    for (int64_t i = 0; i < n; i++) mag[i] = (uint32_t)(tu_next(&rng) & 0x7fffffffu);
    const uint32_t thrs[] = {0, 0x3f800000u, 0x60000000u, 0x7fffffffu, mag[n / 2]};
    for (size_t t = 0; t < sizeof thrs / sizeof *thrs; t++) {
      const int64_t na = distro__topk_gather_keys(mag, n, thrs[t], a, 0);
      const int64_t nb = distro__topk_gather_keys(mag, n, thrs[t], b, 1);
      int64_t want = 0;
      for (int64_t i = 0; i < n; i++) want += mag[i] >= thrs[t];
      cr_assert_eq(na, want, "n %lld thr %#x", (long long)n, thrs[t]);
      cr_assert_eq(nb, want);
      cr_assert(memcmp(a, b, sizeof(uint64_t) * (size_t)na) == 0, "n %lld thr %#x: keys differ", (long long)n, thrs[t]);
      for (int64_t j = 1; j < na; j++) cr_assert_lt(0xffffffffu - (uint32_t)a[j - 1], 0xffffffffu - (uint32_t)a[j]);
    }
    free(mag);
    free(a);
    free(b);
  }
}
