/* Chunked orthonormal DCT-II.
 *
 * The separable transform of every h x w tile is two matrix products against
 * fixed bases: along columns the whole tensor is one (rows*tiles_c, w) x (w, w)
 * GEMM (row segments of length w are contiguous), along rows each block of h
 * rows is an (h, h) x (h, cols) GEMM. OpenBLAS runs these, with kernels it
 * picks per CPU model that round differently, so the library itself (DeMo,
 * SparseLoCo) uses the FAST method below, which rounds the same on every
 * CPU; GEMM, FFTW's REDFT10/01 and a naive loop are kept for benchmarks
 * (bench/bench_dct.c) and tests. */
#include "compress/dct.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clones.h"
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

static int dct1_init(distro__dct1 *d, int64_t n);
static void dct1_destroy(distro__dct1 *d);

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
  p->fwt = malloc(sizeof(float) * (size_t)(t->w * t->w));
  if (!p->fh || !p->fw || !p->fwt) {
    distro__dct_plan_destroy(p);
    return distro__fail(DISTRO_ERR_NOMEM, "DCT basis allocation failed");
  }
  distro__dct_basis(t->h, p->fh);
  distro__dct_basis(t->w, p->fw);
  for (int64_t j = 0; j < t->w; j++)
    for (int64_t d = 0; d < t->w; d++) p->fwt[d * t->w + j] = p->fw[j * t->w + d];
  /* The forward's width splits (width_forward) pay where the halves still
   * fill the 16 vector lanes: level l splits a run of n_l = w >> l into
   * mirrored sums and differences; fo[l] takes the differences to the odd
   * frequencies of that level, fe[l] (last level only) the sums to the
   * even ones. Their columns are fw's at stride 2^l, rows its first n_l/2. */
  for (int64_t l = 0, nl = t->w; m == DISTRO__DCT_FAST && nl % 2 == 0 && nl >= 32 && l < 8; l++, nl /= 2) {
    const int64_t ml = nl / 2, stride = (int64_t)1 << l;
    const int last = !(ml % 2 == 0 && ml >= 32 && l + 1 < 8);
    p->fo[l] = malloc(sizeof(float) * (size_t)(ml * ml));
    if (last) p->fe[l] = malloc(sizeof(float) * (size_t)(ml * ml));
    if (!p->fo[l] || (last && !p->fe[l])) {
      distro__dct_plan_destroy(p);
      return distro__fail(DISTRO_ERR_NOMEM, "DCT basis allocation failed");
    }
    for (int64_t j = 0; j < ml; j++)
      for (int64_t k = 0; k < ml; k++) {
        p->fo[l][j * ml + k] = p->fw[j * t->w + stride * (2 * k + 1)];
        if (last) p->fe[l][j * ml + k] = p->fw[j * t->w + stride * 2 * k];
      }
    if (last) break;
  }
  if (m == DISTRO__DCT_FAST && !dct1_init(&p->dh, t->h)) {
    distro__dct_plan_destroy(p);
    return distro__fail(DISTRO_ERR_NOMEM, "DCT table allocation failed");
  }
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
  free(p->fwt);
  for (int l = 0; l < 8; l++) {
    free(p->fe[l]);
    free(p->fo[l]);
  }
  dct1_destroy(&p->dh);
#ifdef DISTRO_HAVE_FFTW
  pthread_mutex_lock(&fftw_plan_lock);
  if (p->fftw_fwd) fftwf_destroy_plan(p->fftw_fwd);
  if (p->fftw_inv) fftwf_destroy_plan(p->fftw_inv);
  pthread_mutex_unlock(&fftw_plan_lock);
#endif
  memset(p, 0, sizeof *p);
}

/* ---- FAST method: factored 1-D transforms on lanes ------------------------
 *
 * A "lane vector" is n rows of L floats (row stride ld): the 1-D transform
 * runs along the rows, independently for each of the L lanes, so every inner
 * loop is a contiguous run of L floats that the compiler vectorizes. Along a
 * tile's height the lanes are its w columns (read in place); along its width
 * the tile is transposed first and the lanes are its h rows.
 *
 * Each kernel is compiled for several instruction sets (common/clones.h)
 * with bit-identical results, so unlike the GEMM path (OpenBLAS picks its
 * kernel by CPU) the transform rounds the same on every CPU. */

static int64_t dct1_base(int64_t n, int *levels) {
  int l = 0;
  while (n % 2 == 0 && n > 4) {
    n /= 2;
    l++;
  }
  *levels = l;
  return n;
}

static void dct1_destroy(distro__dct1 *d) {
  free(d->cb);
  free(d->cbt);
  for (int l = 0; l < d->levels; l++) free(d->s4[l]);
  memset(d, 0, sizeof *d);
}

static int dct1_init(distro__dct1 *d, int64_t n) {
  const double pi = 3.14159265358979323846;
  memset(d, 0, sizeof *d);
  d->n = n;
  d->base = dct1_base(n, &d->levels);
  const int64_t b = d->base;
  const double sb = pow(sqrt(0.5), d->levels);
  d->cb = malloc(sizeof(float) * (size_t)(b * b));
  d->cbt = malloc(sizeof(float) * (size_t)(b * b));
  if (!d->cb || !d->cbt) goto fail;
  for (int64_t k = 0; k < b; k++)
    for (int64_t i = 0; i < b; i++) {
      double ck = k == 0 ? sqrt(1.0 / (double)b) : sqrt(2.0 / (double)b);
      float v = (float)(sb * ck * cos(pi * (double)(2 * i + 1) * (double)k / (double)(2 * b)));
      d->cb[k * b + i] = v;
      d->cbt[i * b + k] = v;
    }
  for (int l = 0; l < d->levels; l++) {
    const int64_t m = n >> (l + 1);
    const double sl = pow(sqrt(0.5), l + 1) * sqrt(2.0 / (double)m);
    d->s4[l] = malloc(sizeof(float) * (size_t)(m * m));
    if (!d->s4[l]) goto fail;
    for (int64_t k = 0; k < m; k++)
      for (int64_t i = 0; i < m; i++)
        d->s4[l][k * m + i] = (float)(sl * cos(pi * (double)(2 * i + 1) * (double)(2 * k + 1) / (double)(4 * m)));
  }
  return 1;
fail:
  dct1_destroy(d);
  return 0;
}

/* out[k][:] = sum_i a[k][i] in[i][:] for k < K, i < N, rows of a, in and
 * out at strides lda, ld and ldo. Four output rows and 16 lanes are
 * accumulated at once in registers; the sum over i always runs in
 * increasing order. */
DISTRO__CLONES
static void lanes_matmul(float *restrict out, int64_t ldo, const float *restrict a, int64_t lda,
                         const float *restrict in, int64_t ld, int64_t K, int64_t N, int64_t L) {
  int64_t l0 = 0;
  for (; l0 + 16 <= L; l0 += 16) {
    int64_t k0 = 0;
    for (; k0 + 4 <= K; k0 += 4) {
      float acc[4][16] = {{0}};
      const float *a0 = a + k0 * lda;
      for (int64_t i = 0; i < N; i++) {
        const float *x = in + i * ld + l0;
        const float c0 = a0[i], c1 = a0[lda + i], c2 = a0[2 * lda + i], c3 = a0[3 * lda + i];
        for (int j = 0; j < 16; j++) {
          acc[0][j] += c0 * x[j];
          acc[1][j] += c1 * x[j];
          acc[2][j] += c2 * x[j];
          acc[3][j] += c3 * x[j];
        }
      }
      for (int r = 0; r < 4; r++) memcpy(out + (k0 + r) * ldo + l0, acc[r], sizeof acc[r]);
    }
    for (; k0 < K; k0++) {
      float acc[16] = {0};
      for (int64_t i = 0; i < N; i++) {
        const float *x = in + i * ld + l0;
        const float c = a[k0 * lda + i];
        for (int j = 0; j < 16; j++) acc[j] += c * x[j];
      }
      memcpy(out + k0 * ldo + l0, acc, sizeof acc);
    }
  }
  if (l0 < L) /* remaining lanes, one at a time (same order of the sum) */
    for (int64_t k = 0; k < K; k++)
      for (int64_t l = l0; l < L; l++) {
        float s = 0.0f;
        for (int64_t i = 0; i < N; i++) s += a[k * lda + i] * in[i * ld + l];
        out[k * ldo + l] = s;
      }
}

/* u[i] = x[i] + x[N-1-i], v[i] = x[i] - x[N-1-i]; u, v contiguous M x L. */
DISTRO__CLONES
static void lanes_split(float *restrict u, float *restrict v, const float *restrict x, int64_t ld, int64_t n,
                        int64_t L) {
  const int64_t m = n / 2;
  for (int64_t i = 0; i < m; i++) {
    const float *lo = x + i * ld, *hi = x + (n - 1 - i) * ld;
    float *ui = u + i * L, *vi = v + i * L;
    for (int64_t l = 0; l < L; l++) {
      ui[l] = lo[l] + hi[l];
      vi[l] = lo[l] - hi[l];
    }
  }
}

/* x[i] = a[i] + b[i], x[N-1-i] = a[i] - b[i]. */
DISTRO__CLONES
static void lanes_join(float *restrict x, int64_t ld, const float *restrict a, const float *restrict b, int64_t n,
                       int64_t L) {
  const int64_t m = n / 2;
  for (int64_t i = 0; i < m; i++) {
    float *lo = x + i * ld, *hi = x + (n - 1 - i) * ld;
    const float *ai = a + i * L, *bi = b + i * L;
    for (int64_t l = 0; l < L; l++) {
      lo[l] = ai[l] + bi[l];
      hi[l] = ai[l] - bi[l];
    }
  }
}

/* out (n rows of L lanes, row stride ldo) = DCT of the lane vector x (row
 * stride ld). The even coefficients land on every other row of out, so the
 * recursion writes them in place with twice the stride. work: 2 n L floats. */
static void dct1_forward(const distro__dct1 *d, int level, int64_t n, const float *x, int64_t ld, float *out,
                         int64_t ldo, int64_t L, float *work) {
  if (level == d->levels) {
    lanes_matmul(out, ldo, d->cb, n, x, ld, n, n, L);
    return;
  }
  const int64_t m = n / 2;
  float *u = work, *v = work + m * L;
  lanes_split(u, v, x, ld, n, L);
  dct1_forward(d, level + 1, m, u, L, out, 2 * ldo, L, work + n * L);
  lanes_matmul(out + ldo, 2 * ldo, d->s4[level], m, v, L, m, m, L);
}

/* x (row stride ld) = inverse DCT of c (n rows of L lanes, row stride ldc).
 * work: 3 n L floats. */
static void dct1_inverse(const distro__dct1 *d, int level, int64_t n, const float *c, int64_t ldc, float *x,
                         int64_t ld, int64_t L, float *work) {
  if (level == d->levels) {
    lanes_matmul(x, ld, d->cbt, n, c, ldc, n, n, L);
    return;
  }
  const int64_t m = n / 2;
  float *a = work, *b = work + m * L;
  dct1_inverse(d, level + 1, m, c, 2 * ldc, a, L, L, work + n * L);
  lanes_matmul(b, L, d->s4[level], m, c + ldc, 2 * ldc, m, m, L);
  lanes_join(x, ld, a, b, n, L);
}

int64_t distro__dct_tile_work(const distro__dct_plan *p) {
  const int64_t e = p->t.h * p->t.w;
  return 5 * e; /* a tile, then the width splits' work (4 e) or the 1-D transform's (3 n L) */
}

/* One even/odd split along each row of an h x w tile (row stride ld):
 * u[i][j] = x[i][j] + x[i][w-1-j], v[i][j] = x[i][j] - x[i][w-1-j], j < m. */
DISTRO__CLONES
static void rows_split(float *restrict u, float *restrict v, const float *restrict x, int64_t ld, int64_t h,
                       int64_t w) {
  const int64_t m = w / 2;
  for (int64_t i = 0; i < h; i++)
    for (int64_t j = 0; j < m; j++) {
      const float a = x[i * ld + j], b = x[i * ld + w - 1 - j];
      u[i * m + j] = a + b;
      v[i * m + j] = a - b;
    }
}

/* out[i][2k] = e[i][k], out[i][2k+1] = o[i][k]. */
DISTRO__CLONES
static void rows_interleave(float *restrict out, const float *restrict e, const float *restrict o, int64_t h,
                            int64_t m) {
  for (int64_t i = 0; i < h; i++)
    for (int64_t k = 0; k < m; k++) {
      out[i * 2 * m + 2 * k] = e[i * m + k];
      out[i * 2 * m + 2 * k + 1] = o[i * m + k];
    }
}

/* out (h x n, contiguous) = the DCT along the rows of x (h x n, row
 * stride ld) at width-split level `level`: the even frequencies come from
 * the sums (the next level, or fe), the odd ones from the differences.
 * work: 4 h n floats at most over all levels. */
static void width_forward(const distro__dct_plan *p, int level, const float *x, int64_t ld, int64_t n, float *out,
                          float *work) {
  const int64_t h = p->t.h, m = n / 2;
  float *u = work, *v = u + h * m, *ev = v + h * m, *od = ev + h * m;
  rows_split(u, v, x, ld, h, n);
  if (p->fe[level]) lanes_matmul(ev, m, u, m, p->fe[level], m, h, m, m);
  else width_forward(p, level + 1, u, m, m, ev, od + h * m);
  lanes_matmul(od, m, v, m, p->fo[level], m, h, m, m);
  rows_interleave(out, ev, od, h, m);
}

void distro__dct_tile_forward(const distro__dct_plan *p, const float *x, int64_t ldx, float *out, float *work) {
  const int64_t h = p->t.h, w = p->t.w, e = h * w;
  float *b = work, *wk = work + e;
  /* Width first, straight from the tensor (no transposes): the even and odd
   * frequencies of a row depend only on the sums and the differences of its
   * mirrored pairs, so one split halves the dense product (out[i][d] = sum_j
   * x[i][j] F[j][d], lanes: the frequencies); narrow tiles keep the dense
   * product. Then the height, factored, along the rows (lanes: the w
   * columns), which leaves coefficient (b, d) at out[b*w + d]. */
  float *rows = h > 1 ? b : out;
  if (p->fo[0]) {
    width_forward(p, 0, x, ldx, w, rows, work + e);
  } else if (w > 1) {
    lanes_matmul(rows, w, x, ldx, p->fw, w, h, w, w);
  } else {
    for (int64_t i = 0; i < h; i++) rows[i] = x[i * ldx];
  }
  if (h > 1) dct1_forward(&p->dh, 0, h, b, w, out, w, w, wk);
}

void distro__dct_tile_inverse(const distro__dct_plan *p, const float *in, float *x, int64_t ldx, float *work) {
  const int64_t h = p->t.h, w = p->t.w;
  float *a = work, *wk = work + h * w;
  const float *rows = in;
  if (h > 1) {
    dct1_inverse(&p->dh, 0, h, in, w, a, w, w, wk); /* height: lanes are the w columns */
    rows = a;
  }
  if (w > 1) lanes_matmul(x, ldx, rows, w, p->fwt, w, h, w, w); /* x[i][j] = sum_d rows[i][d] F[j][d] */
  else
    for (int64_t i = 0; i < h; i++) x[i * ldx] = rows[i];
}

/* rows[b][:] += c fwt[d][:]: one coefficient's width basis vector. */
DISTRO__CLONES
static void axpy_row(float *restrict row, const float *restrict f, float c, int64_t w) {
  for (int64_t j = 0; j < w; j++) row[j] += c * f[j];
}

void distro__dct_tile_inverse_sparse(const distro__dct_plan *p, const float *in, const uint32_t *pos, int64_t npos,
                                     float *x, int64_t ldx, float *work) {
  const int64_t h = p->t.h, w = p->t.w, e = h * w;
  if (2 * npos > e) {
    distro__dct_tile_inverse(p, in, x, ldx, work);
    return;
  }
  /* Width first, one basis row per coefficient (npos w multiply-adds
   * instead of the dense product's h w w), in the order of pos; then the
   * height, factored, as the dense path does. */
  float *rows = h > 1 ? work : x; /* one row: straight into x */
  memset(rows, 0, sizeof(float) * (size_t)e);
  const int pow2 = (w & (w - 1)) == 0, shift = __builtin_ctzll((unsigned long long)w); /* no division per entry */
  for (int64_t q = 0; q < npos; q++) {
    const int64_t b = pow2 ? pos[q] >> shift : pos[q] / w, d = pow2 ? pos[q] & (w - 1) : pos[q] % w;
    axpy_row(rows + b * w, p->fwt + d * w, in[pos[q]], w);
  }
  if (h > 1) dct1_inverse(&p->dh, 0, h, rows, w, x, ldx, w, work + e);
}

int64_t distro__dct_tiles_work(const distro__dct_plan *p) { return distro__dct_tile_work(p) + p->t.h * p->t.w; }

/* Tile c of the whole tensor through the one-tile functions (a tile's
 * coefficients are contiguous there, strided in the tensor's layout). work:
 * distro__dct_tiles_work(p) floats. */
static void fast_tile(const distro__dct_plan *p, const float *src, float *dst, int inverse, int64_t c, float *work) {
  const distro__tiling *t = &p->t;
  const int64_t h = t->h, w = t->w;
  const int64_t at = (c / t->tiles_c) * h * t->cols + (c % t->tiles_c) * w;
  float *tile = work + distro__dct_tile_work(p);
  if (inverse) {
    for (int64_t b = 0; b < h; b++) memcpy(tile + b * w, src + at + b * t->cols, sizeof(float) * (size_t)w);
    distro__dct_tile_inverse(p, tile, dst + at, t->cols, work);
  } else {
    distro__dct_tile_forward(p, src + at, t->cols, tile, work);
    for (int64_t b = 0; b < h; b++) memcpy(dst + at + b * t->cols, tile + b * w, sizeof(float) * (size_t)w);
  }
}

/* The whole tensor for benchmarks and tests: the library's path below, with
 * work for every thread allocated here (one thread if that fails). */
static void fast_tiles(const distro__dct_plan *p, const float *src, float *dst, int inverse) {
  const int64_t stride = distro__dct_tiles_work(p);
  int n = omp_get_max_threads();
  float *work = malloc(sizeof(float) * (size_t)(stride * n));
  if (!work) work = malloc(sizeof(float) * (size_t)stride), n = 1;
  if (work) distro__dct_fast_tiles(p, src, dst, inverse, work, stride, n);
  free(work);
}

void distro__dct_fast_tiles(const distro__dct_plan *p, const float *src, float *dst, int inverse, float *work,
                            int64_t stride, int nwork) {
  const int n = nwork < 1 ? 1 : nwork;
#pragma omp parallel for schedule(static) num_threads(n) if (n > 1 && p->t.nchunks > 1)
  for (int64_t c = 0; c < p->t.nchunks; c++)
    fast_tile(p, src, dst, inverse, c, work + (size_t)omp_get_thread_num() * (size_t)stride);
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
    case DISTRO__DCT_FAST: fast_tiles(p, x, coef, 0); return;
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
    case DISTRO__DCT_FAST: fast_tiles(p, coef, x, 1); return;
    case DISTRO__DCT_NAIVE: naive_apply(p, coef, x, 1); return;
    case DISTRO__DCT_FFTW:
#ifdef DISTRO_HAVE_FFTW
      fftw_decode(p, coef, x, scratch);
#endif
      return;
  }
}
