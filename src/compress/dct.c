/* Chunked orthonormal DCT-II.
 *
 * The separable transform of every h x w tile is two matrix products against
 * fixed bases: along columns the whole tensor is one (rows*tiles_c, w) x (w, w)
 * GEMM (row segments of length w are contiguous), along rows each block of h
 * rows is an (h, h) x (h, cols) GEMM. OpenBLAS runs these; FFTW's REDFT10/01
 * and a naive loop are kept for the benchmark (bench/bench_dct.c) that chose
 * GEMM as the default. */
#include "compress/dct.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#ifdef DISTRO_HAVE_FFTW
#include <fftw3.h>
#endif

void distro__dct_basis(int64_t n, float *basis) {
  const double pi = 3.14159265358979323846;
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < n; k++) {
      double ck = k == 0 ? sqrt(1.0 / (double)n) : sqrt(2.0 / (double)n);
      basis[i * n + k] = (float)(ck * cos(pi * (double)(2 * i + 1) * (double)k / (double)(2 * n)));
    }
}

#ifdef DISTRO_HAVE_FFTW
/* FFTW's planner is process-global and not thread-safe; this lock guards
 * FFTW's state (planning only), not any state of ours. */
static pthread_mutex_t fftw_plan_lock = PTHREAD_MUTEX_INITIALIZER;

static void *fftw_tile_plan(const distro__tiling *t, int inverse) {
  fftwf_iodim dims[2] = {{(int)t->h, (int)t->cols, (int)t->cols}, {(int)t->w, 1, 1}};
  fftwf_iodim many[2] = {{(int)t->tiles_r, (int)(t->h * t->cols), (int)(t->h * t->cols)},
                         {(int)t->tiles_c, (int)t->w, (int)t->w}};
  fftwf_r2r_kind kind = inverse ? FFTW_REDFT01 : FFTW_REDFT10;
  fftwf_r2r_kind kinds[2] = {kind, kind};
  /* Dimensions of size 1 are dropped: FFTW's REDFT of length 1 is x -> 2x /
   * x -> x, simpler to leave out than to rescale. */
  fftwf_iodim d2[2];
  int rank = 0;
  for (int i = 0; i < 2; i++)
    if (dims[i].n > 1) d2[rank++] = dims[i];
  if (rank == 0) return NULL;
  float *a = fftwf_alloc_real(1), *b = fftwf_alloc_real(1);
  pthread_mutex_lock(&fftw_plan_lock);
  fftwf_plan p = fftwf_plan_guru_r2r(rank, d2, 2, many, a, b, kinds, FFTW_ESTIMATE | FFTW_UNALIGNED);
  pthread_mutex_unlock(&fftw_plan_lock);
  fftwf_free(a);
  fftwf_free(b);
  return p;
}
#endif

distro_status distro__dct_plan_init(distro__dct_plan *p, const distro__tiling *t, distro__dct_method m) {
  memset(p, 0, sizeof *p);
  p->t = *t;
  p->method = m;
  if (t->h > 65536 || t->w > 65536 || t->rows > INT32_MAX || t->cols > INT32_MAX)
    return distro__fail(DISTRO_ERR_INVALID, "tile %lldx%lld or tensor too large for the DCT", (long long)t->h,
                        (long long)t->w);
  p->fh = malloc(sizeof(float) * (size_t)(t->h * t->h));
  p->fw = malloc(sizeof(float) * (size_t)(t->w * t->w));
  if (!p->fh || !p->fw) {
    distro__dct_plan_destroy(p);
    return distro__fail(DISTRO_ERR_NOMEM, "DCT basis allocation failed");
  }
  distro__dct_basis(t->h, p->fh);
  distro__dct_basis(t->w, p->fw);
  if (m == DISTRO__DCT_FFTW) {
#ifdef DISTRO_HAVE_FFTW
    if (t->chunk_elems > 1) {
      p->fftw_fwd = fftw_tile_plan(t, 0);
      p->fftw_inv = fftw_tile_plan(t, 1);
      if (!p->fftw_fwd || !p->fftw_inv) {
        distro__dct_plan_destroy(p);
        return distro__fail(DISTRO_ERR_UNSUPPORTED, "FFTW could not plan a %lldx%lld tile DCT", (long long)t->h,
                            (long long)t->w);
      }
    }
#else
    distro__dct_plan_destroy(p);
    return distro__fail(DISTRO_ERR_UNSUPPORTED, "built without FFTW");
#endif
  }
  return DISTRO_OK;
}

void distro__dct_plan_destroy(distro__dct_plan *p) {
  if (!p) return;
  free(p->fh);
  free(p->fw);
#ifdef DISTRO_HAVE_FFTW
  pthread_mutex_lock(&fftw_plan_lock);
  if (p->fftw_fwd) fftwf_destroy_plan(p->fftw_fwd);
  if (p->fftw_inv) fftwf_destroy_plan(p->fftw_inv);
  pthread_mutex_unlock(&fftw_plan_lock);
#endif
  memset(p, 0, sizeof *p);
}

/* ---- GEMM method ---------------------------------------------------------- */

static void gemm_encode(const distro__dct_plan *p, const float *x, float *coef, float *scratch) {
  const distro__tiling *t = &p->t;
  const int64_t n = t->rows * t->cols;
  /* Along columns: Y = X' Fw with X' the (rows*tiles_c, w) view. */
  float *y = t->h == 1 ? coef : scratch;
  if (t->w == 1)
    memcpy(y, x, sizeof(float) * (size_t)n);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(t->rows * t->tiles_c), (int)t->w, (int)t->w, 1.0f, x,
                (int)t->w, p->fw, (int)t->w, 0.0f, y, (int)t->w);
  if (t->h == 1) return;
  /* Along rows: each block of h rows gets Fh^T Y_block. */
  for (int64_t a = 0; a < t->tiles_r; a++)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t->h, (int)t->cols, (int)t->h, 1.0f, p->fh, (int)t->h,
                y + a * t->h * t->cols, (int)t->cols, 0.0f, coef + a * t->h * t->cols, (int)t->cols);
}

static void gemm_decode(const distro__dct_plan *p, const float *coef, float *x, float *scratch) {
  const distro__tiling *t = &p->t;
  const int64_t n = t->rows * t->cols;
  const float *y = coef;
  if (t->h > 1) {
    float *yb = t->w == 1 ? x : scratch;
    for (int64_t a = 0; a < t->tiles_r; a++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t->h, (int)t->cols, (int)t->h, 1.0f, p->fh,
                  (int)t->h, coef + a * t->h * t->cols, (int)t->cols, 0.0f, yb + a * t->h * t->cols, (int)t->cols);
    if (t->w == 1) return;
    y = yb;
  }
  if (t->w == 1) {
    memcpy(x, y, sizeof(float) * (size_t)n);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(t->rows * t->tiles_c), (int)t->w, (int)t->w, 1.0f, y,
              (int)t->w, p->fw, (int)t->w, 0.0f, x, (int)t->w);
}

/* ---- naive method (float64 accumulation, for benchmarks) ------------------ */

static void naive_apply(const distro__dct_plan *p, const float *in, float *out, int inverse) {
  const distro__tiling *t = &p->t;
  const int64_t h = t->h, w = t->w;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < t->nchunks; c++) {
    const int64_t r0 = (c / t->tiles_c) * h, c0 = (c % t->tiles_c) * w;
    for (int64_t b = 0; b < h; b++)
      for (int64_t d = 0; d < w; d++) {
        double s = 0;
        for (int64_t i = 0; i < h; i++)
          for (int64_t j = 0; j < w; j++) {
            /* forward: sum_ij x[i][j] Fh[i][b] Fw[j][d]; inverse: sum_ij X[i][j] Fh[b][i] Fw[d][j] */
            double f = inverse ? (double)p->fh[b * h + i] * p->fw[d * w + j] : (double)p->fh[i * h + b] * p->fw[j * w + d];
            s += f * in[(r0 + i) * t->cols + c0 + j];
          }
        out[(r0 + b) * t->cols + c0 + d] = (float)s;
      }
  }
}

/* ---- FFTW method ------------------------------------------------------------ */

#ifdef DISTRO_HAVE_FFTW
/* Orthonormal scale of FFTW's unnormalized REDFT10 output, per frequency. */
static double ortho_scale(int64_t k, int64_t n) {
  if (n == 1) return 1.0;
  return (k == 0 ? sqrt(1.0 / (double)n) : sqrt(2.0 / (double)n)) * 0.5;
}

static void fftw_scale(const distro__tiling *t, float *a, int inverse) {
  /* Inverse: REDFT01 computes X_0 + 2 sum_j X_j cos(..), so pre-scale by
   * c_0 for j = 0 and c_j / 2 otherwise; that equals the forward factors
   * except for k = 0 (twice as large). */
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < t->rows; r++) {
    int64_t b = r % t->h;
    double sb = ortho_scale(b, t->h) * (inverse && b == 0 && t->h > 1 ? 2.0 : 1.0);
    for (int64_t col = 0; col < t->cols; col++) {
      int64_t d = col % t->w;
      double sd = ortho_scale(d, t->w) * (inverse && d == 0 && t->w > 1 ? 2.0 : 1.0);
      a[r * t->cols + col] = (float)(a[r * t->cols + col] * sb * sd);
    }
  }
}

static void fftw_encode(const distro__dct_plan *p, const float *x, float *coef) {
  const distro__tiling *t = &p->t;
  if (!p->fftw_fwd) {
    memcpy(coef, x, sizeof(float) * (size_t)(t->rows * t->cols));
    return;
  }
  fftwf_execute_r2r(p->fftw_fwd, (float *)x, coef);
  fftw_scale(t, coef, 0);
}

static void fftw_decode(const distro__dct_plan *p, const float *coef, float *x, float *scratch) {
  const distro__tiling *t = &p->t;
  const size_t n = (size_t)(t->rows * t->cols);
  memcpy(scratch, coef, sizeof(float) * n);
  if (!p->fftw_inv) {
    memcpy(x, scratch, sizeof(float) * n);
    return;
  }
  fftw_scale(t, scratch, 1);
  fftwf_execute_r2r(p->fftw_inv, scratch, x);
}
#endif

void distro__dct_encode_tiles(const distro__dct_plan *p, const float *x, float *coef, float *scratch) {
  switch (p->method) {
    case DISTRO__DCT_GEMM: gemm_encode(p, x, coef, scratch); return;
    case DISTRO__DCT_NAIVE: naive_apply(p, x, coef, 0); return;
    case DISTRO__DCT_FFTW:
#ifdef DISTRO_HAVE_FFTW
      fftw_encode(p, x, coef);
#endif
      return;
  }
}

void distro__dct_decode_tiles(const distro__dct_plan *p, const float *coef, float *x, float *scratch) {
  switch (p->method) {
    case DISTRO__DCT_GEMM: gemm_decode(p, coef, x, scratch); return;
    case DISTRO__DCT_NAIVE: naive_apply(p, coef, x, 1); return;
    case DISTRO__DCT_FFTW:
#ifdef DISTRO_HAVE_FFTW
      fftw_decode(p, coef, x, scratch);
#endif
      return;
  }
}
