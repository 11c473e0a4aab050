/* Chunked DCT against a float64 direct sum, for every method. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/dct.h"
#include "testutil.h"

/* Independent float64 formula: C[b][d] = sum_ij x[i][j] c_b c_d cos(..)cos(..). */
static double basis64(int64_t n, int64_t i, int64_t k) {
  double ck = k == 0 ? sqrt(1.0 / n) : sqrt(2.0 / n);
  return ck * cos(M_PI * (2.0 * i + 1.0) * k / (2.0 * n));
}

static void ref_forward(const distro__tiling *t, const float *x, double *out) {
  for (int64_t tr = 0; tr < t->tiles_r; tr++)
    for (int64_t tc = 0; tc < t->tiles_c; tc++)
      for (int64_t b = 0; b < t->h; b++)
        for (int64_t d = 0; d < t->w; d++) {
          double s = 0;
          for (int64_t i = 0; i < t->h; i++)
            for (int64_t j = 0; j < t->w; j++)
              s += (double)x[(tr * t->h + i) * t->cols + tc * t->w + j] * basis64(t->h, i, b) * basis64(t->w, j, d);
          out[(tr * t->h + b) * t->cols + tc * t->w + d] = s;
        }
}

static const distro__dct_method methods[] = {DISTRO__DCT_GEMM, DISTRO__DCT_NAIVE, DISTRO__DCT_FAST,
#ifdef DISTRO_TEST_HAVE_FFTW
                                             DISTRO__DCT_FFTW
#endif
};

static void check_shape(int ndim, const int64_t *shape, int64_t target) {
  tu_rng rng = {tu_seed()};
  uint64_t seed = rng.s;
  distro__tiling t;
  cr_assert_eq(distro__tiling_init(&t, ndim, shape, target, 1), DISTRO_OK);
  const size_t n = (size_t)(t.rows * t.cols);
  float *x = malloc(n * sizeof *x), *c = malloc(n * sizeof *c), *y = malloc(n * sizeof *y),
        *scr = malloc(n * sizeof *scr);
  double *ref = malloc(n * sizeof *ref);
  tu_fill_normal(&rng, x, n, 1.0f);
  ref_forward(&t, x, ref);
  for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
    distro__dct_plan p;
    cr_assert_eq(distro__dct_plan_init(&p, &t, methods[m]), DISTRO_OK);
    for (size_t i = 0; i < n; i++) c[i] = y[i] = NAN; /* poisoned outputs */
    distro__dct_encode_tiles(&p, x, c, scr);
    long bad = tu_first_mismatch(c, ref, n, 2e-5 * sqrt((double)t.chunk_elems), 1e-5);
    cr_assert_eq(bad, -1, "method %d shape %lldx%lld tile %lldx%lld: coef[%ld]=%g ref %g (seed %llu)", (int)methods[m],
                 (long long)t.rows, (long long)t.cols, (long long)t.h, (long long)t.w, bad, bad >= 0 ? c[bad] : 0.0,
                 bad >= 0 ? ref[bad] : 0.0, (unsigned long long)seed);
    distro__dct_decode_tiles(&p, c, y, scr);
    double *xd = malloc(n * sizeof *xd);
    for (size_t i = 0; i < n; i++) xd[i] = x[i];
    bad = tu_first_mismatch(y, xd, n, 1e-4, 1e-4);
    cr_assert_eq(bad, -1, "method %d round trip: y[%ld]=%g x %g", (int)methods[m], bad, bad >= 0 ? y[bad] : 0.0,
                 bad >= 0 ? xd[bad] : 0.0);
    free(xd);
    distro__dct_plan_destroy(&p);
  }
  free(x);
  free(c);
  free(y);
  free(scr);
  free(ref);
}

Test(dct, basis_is_orthonormal) {
  const int64_t sizes[] = {1, 2, 7, 29, 48, 50, 64};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    int64_t n = sizes[s];
    float *f = malloc(sizeof(float) * n * n);
    distro__dct_basis(n, f);
    for (int64_t a = 0; a < n; a++)
      for (int64_t b = 0; b < n; b++) {
        double dot = 0;
        for (int64_t i = 0; i < n; i++) dot += (double)f[i * n + a] * f[i * n + b];
        cr_assert(fabs(dot - (a == b)) < 1e-6, "n=%lld <%lld,%lld> = %g", (long long)n, (long long)a, (long long)b, dot);
        cr_assert(fabs(f[a * n + b] - basis64(n, a, b)) < 1e-7);
      }
    free(f);
  }
}

Test(dct, matrix_shapes) {
  int64_t a[] = {128, 192};
  check_shape(2, a, 64);
  int64_t b[] = {96, 100};
  check_shape(2, b, 64);
  int64_t c[] = {67, 64};
  check_shape(2, c, 64);
  int64_t d[] = {64, 67};
  check_shape(2, d, 64);
  int64_t e[] = {29, 58};
  check_shape(2, e, 64);
}

Test(dct, vector_and_batched_shapes) {
  int64_t a[] = {768};
  check_shape(1, a, 64);
  int64_t b[] = {67};
  check_shape(1, b, 64);
  int64_t c[] = {3, 48, 50};
  check_shape(3, c, 64);
  int64_t d[] = {16, 16};
  check_shape(2, d, 8);
}

/* One tile's inverse from a list of nonzero coefficients against the
 * float64 formula, for tiles with and without a factored height, thin
 * tiles, and lists long enough to take the dense fallback. */
Test(dct, sparse_tile_inverse) {
  tu_rng rng = {tu_seed()};
  uint64_t seed = rng.s;
  const int64_t shapes[][2] = {{32, 32}, {64, 64}, {1, 64}, {17, 32}, {8, 8}, {32, 12}};
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
    const int64_t h = shapes[si][0], w = shapes[si][1], e = h * w;
    const int64_t shape[2] = {h, w};
    distro__tiling t;
    cr_assert_eq(distro__tiling_init(&t, h > 1 ? 2 : 1, h > 1 ? shape : shape + 1, h > w ? h : w, 1), DISTRO_OK);
    cr_assert(t.h == h && t.w == w, "tiling %lldx%lld", (long long)t.h, (long long)t.w);
    distro__dct_plan p;
    cr_assert_eq(distro__dct_plan_init(&p, &t, DISTRO__DCT_FAST), DISTRO_OK);
    float *coef = calloc((size_t)e, sizeof(float)), *x = malloc(sizeof(float) * (size_t)(2 * e));
    float *work = malloc(sizeof(float) * (size_t)distro__dct_tile_work(&p));
    uint32_t *pos = malloc(sizeof(uint32_t) * (size_t)e);
    double *ref = malloc(sizeof(double) * (size_t)e);
    const int64_t counts[] = {1, 5, e / 8 + 1, e / 2, e / 2 + 1, e};
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      const int64_t npos = counts[ci];
      /* npos distinct positions in a random order (partial Fisher-Yates). */
      for (int64_t i = 0; i < e; i++) pos[i] = (uint32_t)i;
      for (int64_t i = 0; i < npos; i++) {
        const int64_t j = i + (int64_t)(tu_next(&rng) % (uint64_t)(e - i));
        const uint32_t tmp = pos[i];
        pos[i] = pos[j];
        pos[j] = tmp;
      }
      memset(coef, 0, sizeof(float) * (size_t)e);
      for (int64_t q = 0; q < npos; q++) tu_fill_normal(&rng, &coef[pos[q]], 1, 1.0f);
      for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) {
          double s = 0;
          for (int64_t q = 0; q < npos; q++)
            s += (double)coef[pos[q]] * basis64(h, i, pos[q] / w) * basis64(w, j, pos[q] % w);
          ref[i * w + j] = s;
        }
      for (int64_t i = 0; i < 2 * e; i++) x[i] = NAN;
      /* Output at row stride 2w: only the tile's part is written. */
      distro__dct_tile_inverse_sparse(&p, coef, pos, npos, x, 2 * w, work);
      for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) {
          const double got = x[i * 2 * w + j], want = ref[i * w + j];
          cr_assert(fabs(got - want) <= 1e-5 * sqrt((double)npos) + 1e-5 * fabs(want),
                    "tile %lldx%lld, %lld nonzeros: x[%lld][%lld] = %g, float64 %g (seed %llu)", (long long)h,
                    (long long)w, (long long)npos, (long long)i, (long long)j, got, want, (unsigned long long)seed);
          if (i + 1 < h) cr_assert(isnan(x[i * 2 * w + w + j]), "wrote outside the tile");
        }
    }
    free(coef);
    free(x);
    free(work);
    free(pos);
    free(ref);
    distro__dct_plan_destroy(&p);
  }
}

/* SparseLoCo's DCT sections run FAST with edges up to 256 (sparse_chunk,
 * and a whole prime dimension up to it), where the float64 reference above
 * is too slow: FAST against GEMM (checked against it above) for such tiles,
 * forward and back, and through distro__dct_fast_tiles' preallocated work
 * on 1 and 3 threads with the same bits as distro__dct_encode_tiles. */
Test(dct, fast_matches_gemm_up_to_edge_256, .timeout = 60) {
  tu_rng rng = {tu_seed()};
  const uint64_t seed = rng.s;
  const int64_t shapes[][2] = {{256, 512}, {255, 254}, {251, 96}, {257, 96}, {96, 257}, {250, 200}};
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
    distro__tiling t;
    cr_assert_eq(distro__tiling_init(&t, 2, shapes[si], 256, 1), DISTRO_OK);
    const size_t n = (size_t)(t.rows * t.cols);
    float *x = malloc(n * sizeof *x), *cg = malloc(n * sizeof *cg), *cf = malloc(n * sizeof *cf),
          *c2 = malloc(n * sizeof *c2), *y = malloc(n * sizeof *y), *y2 = malloc(n * sizeof *y2),
          *scr = malloc(n * sizeof *scr);
    double *ref = malloc(n * sizeof *ref);
    tu_fill_normal(&rng, x, n, 1.0f);
    distro__dct_plan g, f;
    cr_assert_eq(distro__dct_plan_init(&g, &t, DISTRO__DCT_GEMM), DISTRO_OK);
    cr_assert_eq(distro__dct_plan_init(&f, &t, DISTRO__DCT_FAST), DISTRO_OK);
    distro__dct_encode_tiles(&g, x, cg, scr);
    distro__dct_encode_tiles(&f, x, cf, scr);
    for (size_t i = 0; i < n; i++) ref[i] = cg[i];
    long bad = tu_first_mismatch(cf, ref, n, 1e-5 * sqrt((double)t.chunk_elems), 1e-5);
    cr_assert_eq(bad, -1, "shape %lldx%lld tile %lldx%lld: FAST coef[%ld]=%g GEMM %g (seed %llu)", (long long)t.rows,
                 (long long)t.cols, (long long)t.h, (long long)t.w, bad, bad >= 0 ? cf[bad] : 0.0,
                 bad >= 0 ? ref[bad] : 0.0, (unsigned long long)seed);
    distro__dct_decode_tiles(&f, cf, y, scr);
    for (size_t i = 0; i < n; i++) ref[i] = x[i];
    bad = tu_first_mismatch(y, ref, n, 1e-4, 1e-4);
    cr_assert_eq(bad, -1, "tile %lldx%lld round trip: y[%ld]=%g x %g", (long long)t.h, (long long)t.w, bad,
                 bad >= 0 ? y[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0);
    const int64_t stride = distro__dct_tiles_work(&f) + 3; /* any stride >= the work */
    float *work = malloc(sizeof(float) * (size_t)(3 * stride));
    for (int nwork = 1; nwork <= 3; nwork += 2) {
      distro__dct_fast_tiles(&f, x, c2, 0, work, stride, nwork);
      cr_assert_eq(memcmp(c2, cf, n * sizeof *c2), 0, "tile %lldx%lld, %d threads: forward differs", (long long)t.h,
                   (long long)t.w, nwork);
      distro__dct_fast_tiles(&f, cf, y2, 1, work, stride, nwork);
      cr_assert_eq(memcmp(y2, y, n * sizeof *y2), 0, "tile %lldx%lld, %d threads: inverse differs", (long long)t.h,
                   (long long)t.w, nwork);
    }
    distro__dct_plan_destroy(&g);
    distro__dct_plan_destroy(&f);
    free(work);
    free(x);
    free(cg);
    free(cf);
    free(c2);
    free(y);
    free(y2);
    free(scr);
    free(ref);
  }
}
