/* Each CUDA kernel against the CPU implementation on fresh random inputs,
 * with poisoned outputs and sizes that are not multiples of the block; the
 * cuFFT DCT also on large chunks (128, 256) with odd and uneven edges. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compress/chunk.h"
#include "compress/dct.h"
#include "compress/topk.h"
#include "cuda/cuda_internal.h"
#include "optim/optim_internal.h"
#include "testutil.h"

#include "cuda_test.h"

static tu_rng rng;

static void *dmalloc(size_t bytes) {
  void *p = NULL;
  CT_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
  CT_CUDA(cudaMemset(p, 0xff, bytes ? bytes : 1)); /* poison: NaN floats, 0xffffffff indices */
  return p;
}
static void up(void *d, const void *h, size_t b) { CT_CUDA(cudaMemcpy(d, h, b, cudaMemcpyHostToDevice)); }
static void down(void *h, const void *d, size_t b) { CT_CUDA(cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost)); }

typedef struct {
  int ndim;
  int64_t shape[3];
  int64_t chunk, topk;
} tcase;

static const tcase cases[] = {
    {2, {96, 100}, 64, 32},  {2, {128, 192}, 64, 32}, {1, {67}, 64, 4},     {1, {1000}, 64, 8},
    {3, {3, 10, 24}, 8, 5},  {2, {7, 5}, 64, 100},    {2, {256, 256}, 128, 40}, {2, {50, 64}, 64, 1},
    {2, {300, 257}, 64, 17},
};

/* Coefficients with many exact magnitude ties (0, +-1, +-0.5, -0). */
static void fill_ties(float *x, int64_t n) {
  static const float v[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f};
  for (int64_t i = 0; i < n; i++) x[i] = v[tu_next(&rng) % 6];
}

static void test_dct(const tcase *c, cublasHandle_t h) {
  distro__tiling t;
  distro__tiling_init(&t, c->ndim, c->shape, c->chunk, c->topk);
  const int64_t n = t.rows * t.cols;
  distro__dct_plan plan;
  CT_CHECK(distro__dct_plan_init(&plan, &t, DISTRO__DCT_GEMM) == DISTRO_OK, "plan");
  float *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n), *scr = malloc(sizeof(float) * n),
        *got = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
  tu_fill_normal(&rng, x, (size_t)n, 1.0f);
  distro__dct_encode_tiles(&plan, x, ref, scr);
  distro__cuda_dct d = {t, NULL, NULL};
  float *fh, *fw;
  CT_CHECK(distro__cuda_basis(t.h, &fh) == DISTRO_OK && distro__cuda_basis(t.w, &fw) == DISTRO_OK, "basis");
  d.fh = fh;
  d.fw = fw;
  float *dx = dmalloc(sizeof(float) * n), *dc = dmalloc(sizeof(float) * n), *ds = dmalloc(sizeof(float) * n),
        *dy = dmalloc(sizeof(float) * n);
  up(dx, x, sizeof(float) * n);
  CT_CHECK(distro__cuda_dct_encode(h, 0, &d, dx, dc, ds) == DISTRO_OK, "encode: %s", distro_last_error());
  down(got, dc, sizeof(float) * n);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
  CT_CHECK(worst < 1e-4, "DCT %lldx%lld (chunk %lldx%lld): max |gpu - cpu| = %g", (long long)t.rows,
           (long long)t.cols, (long long)t.h, (long long)t.w, worst);
  CT_CHECK(distro__cuda_dct_decode(h, 0, &d, dc, dy, ds) == DISTRO_OK, "decode: %s", distro_last_error());
  down(back, dy, sizeof(float) * n);
  worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)back[i] - x[i]));
  CT_CHECK(worst < 1e-4, "inverse DCT round trip: max error %g", worst);
  distro__dct_plan_destroy(&plan);
  cudaFree(fh);
  cudaFree(fw);
  cudaFree(dx);
  cudaFree(dc);
  cudaFree(ds);
  cudaFree(dy);
  free(x);
  free(ref);
  free(scr);
  free(got);
  free(back);
}

static void test_topk(const tcase *c, int ties) {
  distro__tiling t;
  distro__tiling_init(&t, c->ndim, c->shape, c->chunk, c->topk);
  const int64_t n = t.rows * t.cols, sel = t.nchunks * t.k;
  float *x = malloc(sizeof(float) * n), *xz = malloc(sizeof(float) * n), *gz = malloc(sizeof(float) * n);
  uint32_t *ri = malloc(sizeof(uint32_t) * sel), *gi = malloc(sizeof(uint32_t) * sel);
  float *rv = malloc(sizeof(float) * sel), *gv = malloc(sizeof(float) * sel);
  if (ties)
    fill_ties(x, n);
  else
    tu_fill_normal(&rng, x, (size_t)n, 1.0f);
  memcpy(xz, x, sizeof(float) * n);
  distro__topk_tiles(&t, xz, ri, rv);
  distro__topk_zero_selected(&t, xz, ri);
  float *dx = dmalloc(sizeof(float) * n), *dv = dmalloc(sizeof(float) * sel);
  uint32_t *di = dmalloc(sizeof(uint32_t) * sel);
  up(dx, x, sizeof(float) * n);
  CT_CUDA(distro__cuda_topk(0, &t, dx, di, dv));
  CT_CUDA(cudaDeviceSynchronize());
  down(gi, di, sizeof(uint32_t) * sel);
  down(gv, dv, sizeof(float) * sel);
  down(gz, dx, sizeof(float) * n);
  CT_CHECK(memcmp(ri, gi, sizeof(uint32_t) * sel) == 0, "top-k indices differ (%lldx%lld, chunk %lldx%lld, k %lld, ties %d)",
           (long long)t.rows, (long long)t.cols, (long long)t.h, (long long)t.w, (long long)t.k, ties);
  CT_CHECK(memcmp(rv, gv, sizeof(float) * sel) == 0, "top-k values differ");
  CT_CHECK(memcmp(xz, gz, sizeof(float) * n) == 0, "selected entries were not zeroed alike");
  cudaFree(dx);
  cudaFree(dv);
  cudaFree(di);
  free(x);
  free(xz);
  free(gz);
  free(ri);
  free(gi);
  free(rv);
  free(gv);
}

/* Reference aggregation: demo.c's rule, in rank order. */
static void ref_aggregate(const distro__tiling *t, const uint32_t *idx, const float *val, int64_t stride,
                          const uint8_t *dropped, int world, float *coef) {
  const int64_t n = t->rows * t->cols;
  int *cnt = calloc((size_t)n, sizeof(int));
  memset(coef, 0, sizeof(float) * n);
  for (int64_t c = 0; c < t->nchunks; c++) {
    const int64_t r0 = (c / t->tiles_c) * t->h, c0 = (c % t->tiles_c) * t->w;
    for (int r = 0; r < world; r++) {
      if (dropped[r]) continue;
      for (int64_t j = c * t->k; j < (c + 1) * t->k; j++) {
        uint32_t ix = idx[r * stride + j];
        int64_t at = (r0 + ix / t->w) * t->cols + c0 + ix % t->w;
        coef[at] += val[r * stride + j];
        cnt[at]++;
      }
    }
  }
  for (int64_t i = 0; i < n; i++)
    if (cnt[i] > 1) coef[i] /= (float)cnt[i];
  free(cnt);
}

static void test_aggregate(const tcase *c) {
  distro__tiling t;
  distro__tiling_init(&t, c->ndim, c->shape, c->chunk, c->topk);
  const int world = 5;
  const int64_t n = t.rows * t.cols, sel = t.nchunks * t.k, stride = sel + 3;
  uint32_t *idx = malloc(sizeof(uint32_t) * stride * world);
  float *val = malloc(sizeof(float) * stride * world), *ref = malloc(sizeof(float) * n),
        *got = malloc(sizeof(float) * n);
  uint8_t dropped[5] = {0, 1, 0, 0, 0};
  float *x = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * sel);
  for (int r = 0; r < world; r++) {
    tu_fill_normal(&rng, x, (size_t)n, 1.0f);
    if (r == 3) memset(x, 0, sizeof(float) * n / 2); /* ties: lower indices win */
    distro__topk_tiles(&t, x, idx + r * stride, v);
    for (int64_t j = 0; j < sel; j++) val[r * stride + j] = (float)tu_normal(&rng);
  }
  ref_aggregate(&t, idx, val, stride, dropped, world, ref);
  uint32_t *di = dmalloc(sizeof(uint32_t) * stride * world);
  float *dv = dmalloc(sizeof(float) * stride * world), *dc = dmalloc(sizeof(float) * n);
  int *dn = dmalloc(sizeof(int) * n);
  uint8_t *dd = dmalloc(world);
  up(di, idx, sizeof(uint32_t) * stride * world);
  up(dv, val, sizeof(float) * stride * world);
  up(dd, dropped, world);
  CT_CUDA(distro__cuda_aggregate(0, &t, di, dv, stride, dd, world, dc, dn));
  down(got, dc, sizeof(float) * n);
  CT_CHECK(memcmp(ref, got, sizeof(float) * n) == 0, "aggregate differs from the CPU rule");
  cudaFree(di);
  cudaFree(dv);
  cudaFree(dc);
  cudaFree(dn);
  cudaFree(dd);
  free(idx);
  free(val);
  free(ref);
  free(got);
  free(x);
  free(v);
}

static void test_elementwise(void) {
  const int64_t n = 100003;
  float *p = malloc(sizeof(float) * n), *m = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n),
        *q = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
  tu_fill_normal(&rng, p, (size_t)n, 1.0f);
  tu_fill_normal(&rng, m, (size_t)n, 0.1f);
  tu_fill_normal(&rng, q, (size_t)n, 1.0f);
  for (int64_t j = 0; j < n; j++) v[j] = fabsf(m[j]) * 0.01f;
  for (int64_t j = 0; j < n; j += 97) q[j] = 0.0f;
  float *dp = dmalloc(sizeof(float) * n), *dm = dmalloc(sizeof(float) * n), *dv = dmalloc(sizeof(float) * n),
        *dq = dmalloc(sizeof(float) * n);
  up(dp, p, sizeof(float) * n);
  up(dm, m, sizeof(float) * n);
  up(dv, v, sizeof(float) * n);
  up(dq, q, sizeof(float) * n);
  /* momentum: next = decay*mom + s*next (demo.c) */
  const float decay = 0.999f, s = 3e-3f;
  int *dflag = (int *)dmalloc(sizeof(int) * 2), hflag[2] = {0, 0};
  CT_CUDA(cudaMemset(dflag, 0, sizeof(int) * 2));
  CT_CUDA(distro__cuda_momentum(0, dq, dm, decay, s, n, dflag, 0));
  down(out, dq, sizeof(float) * n);
  int bad = 0;
  for (int64_t j = 0; j < n; j++) bad += out[j] != decay * m[j] + s * q[j];
  CT_CHECK(bad == 0, "momentum: %d elements differ", bad);
  /* a momentum that overflows is flagged, as the CPU's blend refuses it */
  q[n / 3] = 3e38f;
  up(dq, q, sizeof(float) * n);
  CT_CUDA(distro__cuda_momentum(0, dq, dm, decay, 10.0f, n, dflag, 1));
  down(hflag, dflag, sizeof(int) * 2);
  CT_CHECK(hflag[0] == 0 && hflag[1] == 1, "momentum flags %d %d, want 0 1 (finite, then overflowed)", hflag[0],
           hflag[1]);
  cudaFree(dflag);
  q[n / 3] = 0.5f;
  up(dq, q, sizeof(float) * n);
  /* sign update */
  const float lr = 1e-3f, shrink = 1.0f - lr * 0.1f;
  CT_CUDA(distro__cuda_sign_update(0, dp, dq, lr, shrink, n));
  down(out, dp, sizeof(float) * n);
  bad = 0;
  for (int64_t j = 0; j < n; j++) bad += out[j] != p[j] * shrink - lr * (float)((q[j] > 0) - (q[j] < 0));
  CT_CHECK(bad == 0, "sign update: %d elements differ", bad);
  /* AdamW against distro__adamw_update */
  up(dp, p, sizeof(float) * n);
  distro_options o = distro_options_default(DISTRO_ALG_ADAMW);
  const int64_t t = 7;
  const float c1 = (float)(1.0 - pow((double)o.beta1, (double)t)), c2 = (float)(1.0 - pow((double)o.beta2, (double)t));
  CT_CUDA(distro__cuda_adamw_update(0, dp, dm, dv, dq, n, 0.5f, o.beta1, o.beta2, o.eps, lr, 1.0f - lr * o.weight_decay,
                                    c1, c2));
  distro__adamw_update(p, m, v, q, n, 0.5f, &o, lr, t);
  down(out, dp, sizeof(float) * n);
  bad = memcmp(out, p, sizeof(float) * n) != 0;
  down(out, dm, sizeof(float) * n);
  bad |= memcmp(out, m, sizeof(float) * n) != 0;
  down(out, dv, sizeof(float) * n);
  bad |= memcmp(out, v, sizeof(float) * n) != 0;
  CT_CHECK(!bad, "AdamW update differs from distro__adamw_update");
  /* bf16 rounding */
  uint16_t *db = dmalloc(sizeof(uint16_t) * n), *hb = malloc(sizeof(uint16_t) * n);
  CT_CUDA(distro__cuda_to_bf16(0, dp, db, n));
  down(hb, db, sizeof(uint16_t) * n);
  bad = 0;
  for (int64_t j = 0; j < n; j++) bad += hb[j] != distro__bf16_from_float(p[j]);
  CT_CHECK(bad == 0, "bf16: %d elements differ from distro__bf16_from_float", bad);
  /* non-finite detection */
  int *df = dmalloc(sizeof(int) * 2), hf[2];
  CT_CUDA(cudaMemset(df, 0, sizeof(int) * 2));
  CT_CUDA(distro__cuda_nonfinite(0, dq, n, df, 0));
  q[n - 1] = NAN;
  up(dq, q, sizeof(float) * n);
  CT_CUDA(distro__cuda_nonfinite(0, dq, n, df, 1));
  down(hf, df, sizeof hf);
  CT_CHECK(hf[0] == 0 && hf[1] == 1, "non-finite flags %d %d", hf[0], hf[1]);
  cudaFree(dp);
  cudaFree(dm);
  cudaFree(dv);
  cudaFree(dq);
  cudaFree(db);
  cudaFree(df);
  free(p);
  free(m);
  free(v);
  free(q);
  free(out);
  free(hb);
}

/* Large chunks for the cuFFT DCT: even, odd and non-power-of-two edges. */
static const tcase fft_cases[] = {
    {2, {384, 640}, 128, 32}, {2, {250, 96}, 128, 16}, {1, {1000}, 128, 8},
    {3, {2, 256, 200}, 256, 64}, {2, {512, 512}, 256, 100}, {2, {129, 131}, 256, 7},
};

/* The cuFFT DCT against the CPU DCT (and its own inverse). */
static void test_fft_dct(const tcase *c) {
  distro__tiling t;
  distro__tiling_init(&t, c->ndim, c->shape, c->chunk, c->topk);
  const int64_t n = t.rows * t.cols;
  distro__dct_plan plan;
  CT_CHECK(distro__dct_plan_init(&plan, &t, DISTRO__DCT_GEMM) == DISTRO_OK, "plan");
  float *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n), *scr = malloc(sizeof(float) * n),
        *got = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
  tu_fill_normal(&rng, x, (size_t)n, 1.0f);
  distro__dct_encode_tiles(&plan, x, ref, scr);
  distro__cuda_fft_dct f;
  size_t work = 0;
  CT_CHECK(distro__cuda_fft_init(&f, &t, &work) == DISTRO_OK, "fft init: %s", distro_last_error());
  void *dw = dmalloc(work), *dcb = dmalloc(sizeof(float) * 2 * (size_t)distro__cuda_fft_cbuf(&t));
  CT_CHECK(distro__cuda_fft_set_work(&f, dw) == DISTRO_OK, "fft work: %s", distro_last_error());
  float *dx = dmalloc(sizeof(float) * n), *dc = dmalloc(sizeof(float) * n), *ds = dmalloc(sizeof(float) * n),
        *dy = dmalloc(sizeof(float) * n);
  up(dx, x, sizeof(float) * n);
  CT_CHECK(distro__cuda_fft_encode(&f, 0, dx, dc, ds, dcb) == DISTRO_OK, "fft encode: %s", distro_last_error());
  down(got, dc, sizeof(float) * n);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
  CT_CHECK(worst < 1e-4, "cuFFT DCT %lldx%lld (chunk %lldx%lld): max |gpu - cpu| = %g", (long long)t.rows,
           (long long)t.cols, (long long)t.h, (long long)t.w, worst);
  printf("cuFFT DCT %lldx%lld, tile %lldx%lld: max |gpu - cpu| %.2e", (long long)t.rows, (long long)t.cols,
         (long long)t.h, (long long)t.w, worst);
  CT_CHECK(distro__cuda_fft_decode(&f, 0, dc, dy, ds, dcb) == DISTRO_OK, "fft decode: %s", distro_last_error());
  down(back, dy, sizeof(float) * n);
  worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)back[i] - x[i]));
  CT_CHECK(worst < 1e-4, "cuFFT inverse DCT round trip (tile %lldx%lld): max error %g", (long long)t.h,
           (long long)t.w, worst);
  /* the inverse of the CPU's coefficients */
  up(dc, ref, sizeof(float) * n);
  CT_CHECK(distro__cuda_fft_decode(&f, 0, dc, dy, ds, dcb) == DISTRO_OK, "fft decode: %s", distro_last_error());
  down(back, dy, sizeof(float) * n);
  double w2 = 0;
  for (int64_t i = 0; i < n; i++) w2 = fmax(w2, fabs((double)back[i] - x[i]));
  CT_CHECK(w2 < 1e-4, "cuFFT inverse of the CPU DCT (tile %lldx%lld): max error %g", (long long)t.h, (long long)t.w,
           w2);
  printf(", round trip %.2e, inverse of CPU coefficients %.2e\n", worst, w2);
  distro__cuda_fft_destroy(&f);
  distro__dct_plan_destroy(&plan);
  cudaFree(dw);
  cudaFree(dcb);
  cudaFree(dx);
  cudaFree(dc);
  cudaFree(ds);
  cudaFree(dy);
  free(x);
  free(ref);
  free(scr);
  free(got);
  free(back);
}

int main(void) {
  ct_require_gpu("test_cuda_kernels");
  ct_seed_used = tu_seed();
  rng.s = ct_seed_used;
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "FAIL: cublasCreate\n");
    return 1;
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    test_dct(&cases[i], h);
    test_fft_dct(&cases[i]);
    test_topk(&cases[i], 0);
    test_topk(&cases[i], 1);
    test_aggregate(&cases[i]);
  }
  for (size_t i = 0; i < sizeof fft_cases / sizeof fft_cases[0]; i++) test_fft_dct(&fft_cases[i]);
  test_elementwise();
  cublasDestroy(h);
  return ct_finish("test_cuda_kernels");
}
