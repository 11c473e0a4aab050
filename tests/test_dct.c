/* Chunked DCT against a float64 direct sum, for every method. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

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
