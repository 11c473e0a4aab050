/* Outer-gradient codecs: round trips within the stated bounds, int4 and fp4
 * on known distributions, sizes, rejection of every malformed code, and
 * thread-count independence. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "compress/outer_codec.h"
#include "testutil.h"

static const distro_outer_codec codecs[] = {DISTRO_OUTER_F32, DISTRO_OUTER_BF16, DISTRO_OUTER_INT8, DISTRO_OUTER_INT4,
                                            DISTRO_OUTER_FP4};
#define NC 5

static uint8_t *encode(distro_outer_codec c, const float *x, int64_t n, int block, size_t *bytes) {
  *bytes = distro__outer_bytes(c, n, block);
  uint8_t *b = malloc(*bytes + 1);
  b[*bytes] = 0xA5; /* guard */
  distro__outer_encode(c, x, n, block, b);
  cr_assert_eq(b[*bytes], 0xA5, "%s wrote past its size", distro__outer_codec_name(c));
  return b;
}

/* The stated bound for element j of a block with absmax `amax`. */
static double bound(distro_outer_codec c, float x, float amax) {
  const double slack = 1e-6 * amax + 1e-30;
  switch (c) {
    case DISTRO_OUTER_F32: return 0;
    case DISTRO_OUTER_BF16: return ldexp(fabs(x), -8) + 1e-38;
    case DISTRO_OUTER_INT8: return amax / 127.0 / 2 + slack;
    case DISTRO_OUTER_INT4: return amax / 7.0 / 2 + slack;
    case DISTRO_OUTER_FP4: return fmax(fabs(x) / 3.0, ldexp(amax, -7)) * (1 + 1e-6) + 1e-30;
  }
  return 0;
}

Test(outer_codec, round_trip_within_stated_error) {
  uint64_t seed = tu_seed();
  const int64_t sizes[] = {1, 2, 7, 63, 64, 65, 127, 1000, 4097};
  const int blocks[] = {1, 7, 64, 256};
  for (int ci = 0; ci < NC; ci++)
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
      for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
        const distro_outer_codec c = codecs[ci];
        const int64_t n = sizes[si];
        const int block = blocks[bi];
        tu_rng r = {seed ^ (uint64_t)(ci * 1000003 + si * 101 + bi)};
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        tu_fill_normal(&r, x, (size_t)n, 1.0f);
        /* a wide dynamic range, zeros and a zero block */
        for (int64_t j = 0; j < n; j++) x[j] *= (float)ldexp(1.0, (int)(j % 23) - 11);
        for (int64_t j = 0; j < n; j += 5) x[j] = 0.0f;
        if (n > 2 * block)
          for (int64_t j = block; j < 2 * block; j++) x[j] = 0.0f;
        size_t bytes;
        uint8_t *b = encode(c, x, n, block, &bytes);
        cr_assert_eq(distro__outer_check(c, b, n, block), DISTRO_OK, "%s n %lld block %d: %s",
                     distro__outer_codec_name(c), (long long)n, block, distro_last_error());
        distro__outer_decode(c, b, n, block, y);
        for (int64_t lo = 0; lo < n; lo += block) {
          const int64_t hi = lo + block < n ? lo + block : n;
          float amax = 0;
          for (int64_t j = lo; j < hi; j++) amax = fmaxf(amax, fabsf(x[j]));
          for (int64_t j = lo; j < hi; j++) {
            const double err = fabs((double)y[j] - (double)x[j]);
            cr_assert(isfinite(y[j]) && err <= bound(c, x[j], amax),
                      "%s n %lld block %d: element %lld is %.9g, was %.9g (block absmax %g, bound %g; "
                      "DISTRO_TEST_SEED=%llu)", distro__outer_codec_name(c), (long long)n, block, (long long)j,
                      (double)y[j], (double)x[j], (double)amax, bound(c, x[j], amax), (unsigned long long)seed);
            if (x[j] == 0.0f) cr_assert_eq(y[j], 0.0f);
            if (amax > 0 && fabsf(x[j]) == amax && c != DISTRO_OUTER_BF16)
              cr_assert(fabsf(y[j] - x[j]) <= 1e-6f * amax, "%s: the block maximum must be (nearly) exact",
                        distro__outer_codec_name(c));
          }
        }
        free(b);
        free(x);
        free(y);
      }
}

Test(outer_codec, sizes) {
  cr_assert_eq(distro__outer_bytes(DISTRO_OUTER_F32, 1000, 64), 4000);
  cr_assert_eq(distro__outer_bytes(DISTRO_OUTER_BF16, 1000, 64), 2000);
  cr_assert_eq(distro__outer_bytes(DISTRO_OUTER_INT8, 1000, 64), 16 * 4 + 1000);
  cr_assert_eq(distro__outer_bytes(DISTRO_OUTER_INT4, 1000, 64), 16 * 4 + 500);
  cr_assert_eq(distro__outer_bytes(DISTRO_OUTER_FP4, 1001, 64), 16 * 4 + 501);
  /* 4-bit with a float32 scale per 64: 4 / (0.5 + 4/64) = 7.1x fewer than F32 */
  double ratio = (double)distro__outer_bytes(DISTRO_OUTER_F32, 1 << 20, 64) /
                 (double)distro__outer_bytes(DISTRO_OUTER_INT4, 1 << 20, 64);
  cr_assert(fabs(ratio - 64.0 / 9.0) < 1e-9, "ratio %g", ratio);
}

/* Values on the int4 grid survive exactly; standard normal data in blocks of
 * 64 loses what uniform rounding predicts: absmax ~ 2.4 sigma, step
 * s = absmax/7, RMS error s/sqrt(12) ~ 0.1 sigma. */
Test(outer_codec, int4_known_distributions) {
  uint64_t seed = tu_seed();
  const int64_t n = 1 << 16;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  for (int64_t j = 0; j < n; j++) x[j] = (float)((j % 15) - 7) * 0.125f; /* every block holds -7/8 .. 7/8 */
  size_t bytes;
  uint8_t *b = encode(DISTRO_OUTER_INT4, x, n, 60, &bytes); /* 60 = 4 whole periods per block */
  distro__outer_decode(DISTRO_OUTER_INT4, b, n, 60, y);
  cr_assert_eq(memcmp(x, y, sizeof(float) * n), 0, "int4 grid values must round-trip exactly");
  free(b);
  tu_rng r = {seed};
  tu_fill_normal(&r, x, n, 3.0f);
  b = encode(DISTRO_OUTER_INT4, x, n, 64, &bytes);
  distro__outer_decode(DISTRO_OUTER_INT4, b, n, 64, y);
  double se = 0, sx = 0, bias = 0;
  for (int64_t j = 0; j < n; j++) {
    se += (double)(y[j] - x[j]) * (y[j] - x[j]);
    sx += (double)x[j] * x[j];
    bias += (double)(y[j] - x[j]);
  }
  const double rel = sqrt(se / sx);
  cr_assert(rel > 0.08 && rel < 0.12, "int4 relative RMS error on N(0,1) blocks of 64 is %.4f, expected ~0.10 "
            "(DISTRO_TEST_SEED=%llu)", rel, (unsigned long long)seed);
  cr_assert(fabs(bias / n) < 0.01 * 3.0, "int4 rounding is biased: mean error %g", bias / n);
  free(b);
  /* FP4 E3M0: powers of two times the scale are exact; on normal data the
   * error is relative, RMS well under the 1/3 worst case. */
  for (int64_t j = 0; j < n; j++) x[j] = (j % 64 == 0) ? 1.0f : ldexpf((j & 1) ? -1.0f : 1.0f, -(int)(j % 7));
  b = encode(DISTRO_OUTER_FP4, x, n, 64, &bytes);
  distro__outer_decode(DISTRO_OUTER_FP4, b, n, 64, y);
  cr_assert_eq(memcmp(x, y, sizeof(float) * n), 0, "fp4 powers of two must round-trip exactly");
  free(b);
  tu_fill_normal(&r, x, n, 1.0f);
  b = encode(DISTRO_OUTER_FP4, x, n, 64, &bytes);
  distro__outer_decode(DISTRO_OUTER_FP4, b, n, 64, y);
  se = sx = 0;
  for (int64_t j = 0; j < n; j++) {
    se += (double)(y[j] - x[j]) * (y[j] - x[j]);
    sx += (double)x[j] * x[j];
  }
  cr_assert(sqrt(se / sx) < 0.2, "fp4 relative RMS error %.4f", sqrt(se / sx));
  free(b);
  free(x);
  free(y);
}

static void expect_reject(distro_outer_codec c, uint8_t *b, int64_t n, int block, const char *what) {
  distro_status st = distro__outer_check(c, b, n, block);
  cr_assert_eq(st, DISTRO_ERR_PAYLOAD, "%s: %s was accepted", distro__outer_codec_name(c), what);
  cr_assert_neq(distro_last_error()[0], 0);
}

Test(outer_codec, rejects_malformed_payloads) {
  const int64_t n = 129;
  const int block = 64;
  float x[129];
  for (int j = 0; j < n; j++) x[j] = (float)sin(j) * 3.0f;
  for (int ci = 0; ci < NC; ci++) {
    const distro_outer_codec c = codecs[ci];
    size_t bytes;
    uint8_t *b = encode(c, x, n, block, &bytes), *k = malloc(bytes);
    const float nan = NAN, inf = INFINITY, neg = -1.0f;
    if (c == DISTRO_OUTER_F32) {
      memcpy(k, b, bytes);
      memcpy(k + 4 * 5, &nan, 4);
      expect_reject(c, k, n, block, "NaN");
      memcpy(k, b, bytes);
      memcpy(k + 4 * 7, &inf, 4);
      expect_reject(c, k, n, block, "Inf");
    } else if (c == DISTRO_OUTER_BF16) {
      memcpy(k, b, bytes);
      k[2 * 3] = 0x80;
      k[2 * 3 + 1] = 0x7f; /* +Inf */
      expect_reject(c, k, n, block, "Inf");
      k[2 * 3] = 0xc0; /* NaN */
      expect_reject(c, k, n, block, "NaN");
    } else {
      memcpy(k, b, bytes);
      memcpy(k + 4, &nan, 4);
      expect_reject(c, k, n, block, "a NaN scale");
      memcpy(k, b, bytes);
      memcpy(k + 8, &neg, 4);
      expect_reject(c, k, n, block, "a negative scale");
      memcpy(k, b, bytes);
      const float huge = FLT_MAX;
      memcpy(k, &huge, 4);
      if (c != DISTRO_OUTER_FP4) expect_reject(c, k, n, block, "a scale that overflows");
      const size_t codes = 4 * 3;
      memcpy(k, b, bytes);
      if (c == DISTRO_OUTER_INT8) {
        k[codes + 10] = 0x80;
        expect_reject(c, k, n, block, "code -128");
      } else {
        k[codes + 10] = (uint8_t)((k[codes + 10] & 0xf0) | 0x8);
        expect_reject(c, k, n, block, "code 8");
        memcpy(k, b, bytes);
        k[codes + n / 2] |= 0x10; /* n odd: the high nibble of the last byte is padding */
        expect_reject(c, k, n, block, "a non-zero padding nibble");
      }
    }
    free(k);
    free(b);
  }
}

Test(outer_codec, independent_of_thread_count) {
  uint64_t seed = tu_seed();
  const int64_t n = 200003; /* above the parallel threshold, odd */
  float *x = malloc(sizeof(float) * n), *y1 = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n);
  tu_rng r = {seed};
  tu_fill_normal(&r, x, n, 1.0f);
  for (int ci = 0; ci < NC; ci++) {
    const distro_outer_codec c = codecs[ci];
    size_t bytes;
    omp_set_num_threads(1);
    uint8_t *b1 = encode(c, x, n, 64, &bytes);
    distro__outer_decode(c, b1, n, 64, y1);
    omp_set_num_threads(2);
    uint8_t *b2 = encode(c, x, n, 64, &bytes);
    distro__outer_decode(c, b2, n, 64, y2);
    cr_assert_eq(memcmp(b1, b2, bytes), 0, "%s: encoding depends on the thread count", distro__outer_codec_name(c));
    cr_assert_eq(memcmp(y1, y2, sizeof(float) * n), 0);
    free(b1);
    free(b2);
  }
  free(x);
  free(y1);
  free(y2);
}
