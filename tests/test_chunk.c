/* Chunk rule and tile geometry. */
#include <criterion/criterion.h>

#include "common/error.h"
#include "compress/chunk.h"
#include "testutil.h"

/* The reference rule, spelled out: walk the sorted divisors. */
static int64_t ref_chunk(int64_t n, int64_t target) {
  int64_t best = -1;
  for (int64_t d = 1; d <= n; d++) {
    if (n % d) continue;
    if (d == target) return d;
    if (d > target) return best > 0 ? best : d;
    best = d;
  }
  return n;
}

Test(chunk, published_examples) {
  cr_expect_eq(distro__chunk_size(768, 64), 64);
  cr_expect_eq(distro__chunk_size(96, 64), 48);
  cr_expect_eq(distro__chunk_size(100, 64), 50);
  cr_expect_eq(distro__chunk_size(50, 64), 50);
  cr_expect_eq(distro__chunk_size(67, 64), 1);
  cr_expect_eq(distro__chunk_size(50257, 64), 29);
  cr_expect_eq(distro__chunk_size(32000, 64), 64);
  cr_expect_eq(distro__chunk_size(64, 64), 64);
  cr_expect_eq(distro__chunk_size(1, 64), 1);
}

Test(chunk, matches_divisor_walk_on_many_sizes) {
  for (int64_t n = 1; n <= 5000; n++)
    for (int64_t target = 1; target <= 130; target += 7)
      cr_assert_eq(distro__chunk_size(n, target), ref_chunk(n, target), "n=%lld target=%lld", (long long)n,
                   (long long)target);
  const int64_t primes[] = {67, 101, 1009, 7919, 65537};
  for (size_t i = 0; i < sizeof primes / sizeof *primes; i++) cr_expect_eq(distro__chunk_size(primes[i], 64), 1);
}

Test(chunk, tiling_geometry) {
  distro__tiling t;
  int64_t s1[] = {100};
  cr_assert_eq(distro__tiling_init(&t, 1, s1, 64, 32), DISTRO_OK);
  cr_expect(t.rows == 1 && t.cols == 100 && t.h == 1 && t.w == 50 && t.nchunks == 2 && t.k == 32);
  int64_t s2[] = {96, 67};
  cr_assert_eq(distro__tiling_init(&t, 2, s2, 64, 32), DISTRO_OK);
  cr_expect(t.h == 48 && t.w == 1 && t.tiles_r == 2 && t.tiles_c == 67 && t.chunk_elems == 48 && t.k == 32);
  int64_t s3[] = {3, 48, 50};
  cr_assert_eq(distro__tiling_init(&t, 3, s3, 64, 4096), DISTRO_OK);
  cr_expect(t.rows == 144 && t.cols == 50 && t.h == 48 && t.w == 50 && t.nchunks == 3 && t.k == 48 * 50);
  int64_t s4[] = {67};
  cr_assert_eq(distro__tiling_init(&t, 1, s4, 64, 32), DISTRO_OK);
  cr_expect(t.nchunks == 67 && t.k == 1, "a prime 1-D tensor sends every element");
}

Test(chunk, rejects_bad_shapes) {
  distro__tiling t;
  int64_t bad[] = {4, 0};
  cr_expect_eq(distro__tiling_init(&t, 2, bad, 64, 32), DISTRO_ERR_INVALID);
  cr_expect(strlen(distro_last_error()) > 0);
  int64_t ok[] = {4, 4};
  cr_expect_eq(distro__tiling_init(&t, 0, ok, 64, 32), DISTRO_ERR_INVALID);
  cr_expect_eq(distro__tiling_init(&t, 2, ok, 0, 32), DISTRO_ERR_INVALID);
  cr_expect_eq(distro__tiling_init(&t, 2, ok, 64, 0), DISTRO_ERR_INVALID);
}
