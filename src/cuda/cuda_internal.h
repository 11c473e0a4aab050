/* Internal: the CUDA backend's kernels (launchers callable from C) and its
 * error helpers. Every launcher queues work on `s` and returns the launch
 * status; none synchronizes. */
#ifndef DISTRO_CUDA_INTERNAL_H
#define DISTRO_CUDA_INTERNAL_H

#include <stdint.h>
#include <cublas_v2.h>
#include <cufft.h>
#include <cuda_runtime_api.h>
#include <distro/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/error.h"
#include "compress/chunk.h"
#include "cuda/step_math.h"

/* CUDA / cuBLAS failures become DISTRO_ERR_CUDA with the call named. */
#define DISTRO_CUDA_TRY(call)                                                                         \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      st = distro__fail(DISTRO_ERR_CUDA, "%s failed: %s", #call, cudaGetErrorString(e_));             \
      goto fail;                                                                                      \
    }                                                                                                 \
  } while (0)
#define DISTRO_CUBLAS_TRY(call)                                                                       \
  do {                                                                                                \
    cublasStatus_t b_ = (call);                                                                       \
    if (b_ != CUBLAS_STATUS_SUCCESS) {                                                                \
      st = distro__fail(DISTRO_ERR_CUDA, "%s failed: %s", #call, cublasGetStatusString(b_));          \
      goto fail;                                                                                      \
    }                                                                                                 \
  } while (0)

/* ---- chunked DCT (dct_gemm.cu) ------------------------------------------- */

/* Device bases of one tiling: fh (h x h) and fw (w x w), row-major as
 * distro__dct_basis. Borrowed from the optimizer's basis cache. */
typedef struct distro__cuda_dct {
  distro__tiling t;
  const float *fh, *fw;
} distro__cuda_dct;

/* Uploads distro__dct_basis(n) into a new device buffer. */
distro_status distro__cuda_basis(int64_t n, float **out);
/* Checks that the tiling's GEMM sizes fit cuBLAS's int arguments. */
distro_status distro__cuda_dct_check(const distro__tiling *t);
/* coef = per-tile DCT(x); scratch holds rows*cols floats; no aliasing. */
distro_status distro__cuda_dct_encode(cublasHandle_t h, cudaStream_t s, const distro__cuda_dct *p, const float *x,
                                      float *coef, float *scratch);
/* x = per-tile inverse DCT(coef). */
distro_status distro__cuda_dct_decode(cublasHandle_t h, cudaStream_t s, const distro__cuda_dct *p, const float *coef,
                                      float *x, float *scratch);

/* ---- chunked DCT through cuFFT (dct_fft.cu) ------------------------------ */

/* Four 1-D plans (R2C and C2R along w, then along h; a plan is absent when
 * that tile edge is 1), made without work areas: the caller gives one
 * shared area of the largest size any plan asked for. */
typedef struct distro__cuda_fft_dct {
  distro__tiling t;
  cufftHandle plan[4];
  int have[4];
} distro__cuda_fft_dct;

/* Plans for one tiling; *work grows to the largest work size needed. */
distro_status distro__cuda_fft_init(distro__cuda_fft_dct *p, const distro__tiling *t, size_t *work);
distro_status distro__cuda_fft_set_work(distro__cuda_fft_dct *p, void *work);
void distro__cuda_fft_destroy(distro__cuda_fft_dct *p); /* safe after a failed init */
/* Complex elements (cufftComplex) the encode/decode buffer must hold. */
int64_t distro__cuda_fft_cbuf(const distro__tiling *t);
/* As distro__cuda_dct_encode / _decode: scratch holds rows*cols floats, cbuf
 * distro__cuda_fft_cbuf(t) complex values; no aliasing. */
distro_status distro__cuda_fft_encode(const distro__cuda_fft_dct *p, cudaStream_t s, const float *x, float *coef,
                                      float *scratch, void *cbuf);
distro_status distro__cuda_fft_decode(const distro__cuda_fft_dct *p, cudaStream_t s, const float *coef, float *x,
                                      float *scratch, void *cbuf);

/* ---- the exact tile passes (tile.cu; arithmetic in step_math.h) ---------- */

/* The factored DCT's tables for the tiling's tile shape (tile_tables.c):
 * the CPU's FAST plan (the floats the CPU step multiplies by) copied into
 * one device buffer *blob (cudaFree it); *dev points into it. */
distro_status distro__cuda_tile_tables(const distro__tiling *t, float **blob, distro__hd_dct *dev);

/* demo.c's compress phase without the selection, tile by tile in the CPU's
 * rounding: next = decay*mom + scale*DCT(x), x the gradient or (adam)
 * DisTrO-AdamW's normalized gradient; flags[slot] = 1 if a second moment
 * or a momentum value is Inf or NaN; vnext (overlap, else NULL) gets the
 * second moment v'. D: device tables. work: max_blocks x distro__hd_tile_work
 * floats. */
cudaError_t distro__cuda_compress_tiles(cudaStream_t s, const distro__hd_dct *D, const distro__tiling *t,
                                        const float *grad, const float *v, float *vnext, int adam, float b2,
                                        float c2, float eps,
                                        const float *mom, float *next, float decay, float scale, float *work,
                                        int max_blocks, int *flags, int slot);
/* demo.c's apply phase: aggregate every rank's selection (idx/val: rank 0's
 * entries of this tensor, rank r's `stride` further on), the inverse DCT
 * (sparse where the CPU's is), p = p shrink - step sign(Q) and with adam the
 * second moment. iwork: max_blocks x distro__hd_tile_iwork words. */
cudaError_t distro__cuda_apply_tiles(cudaStream_t s, const distro__hd_dct *D, const distro__tiling *t,
                                     const uint32_t *idx, const float *val, int64_t stride, const uint8_t *dropped,
                                     int world, float *param, const float *grad, float *v, int adam, float b2,
                                     float shrink, float step, float *work, uint32_t *iwork, int max_blocks);

/* demo.c's look-ahead: param = base - ahead sign(inverse DCT of next plus
 * this rank's selection idx/val, this tensor's entries); ahead 0: a copy. */
cudaError_t distro__cuda_ahead_tiles(cudaStream_t s, const distro__hd_dct *D, const distro__tiling *t,
                                     const float *next, const uint32_t *idx, const float *val, const float *base,
                                     float *param, float ahead, float *work, int max_blocks);

/* ---- per-chunk top-k (topk.cu) ------------------------------------------- */

/* As distro__topk_tiles followed by distro__topk_zero_selected: the k
 * largest |coef| per chunk (ties to the lower index), indices ascending,
 * their values; the selected entries of coef become 0. */
cudaError_t distro__cuda_topk(cudaStream_t s, const distro__tiling *t, float *coef, uint32_t *idx, float *val);

/* ---- element-wise and aggregation kernels (update.cu) -------------------- */

/* flags[slot] = 1 if any x[0..n) is NaN or Inf (flags is not cleared). */
cudaError_t distro__cuda_nonfinite(cudaStream_t s, const float *x, int64_t n, int *flags, int slot);
/* *out = 1.0f if any flags[0..n) is set, else 0.0f (the baseline's flag slot). */
cudaError_t distro__cuda_flag_slot(cudaStream_t s, const int *flags, int n, float *out);
/* next = decay*mom + scale*next, rounded as the C code does; flags[slot] =
 * 1 if a result is Inf or NaN (the CPU refuses such a momentum). */
cudaError_t distro__cuda_momentum(cudaStream_t s, float *next, const float *mom, float decay, float scale, int64_t n,
                                  int *flags, int slot);
/* Dense coefficients of tensor t from every rank's decoded selection: per
 * coefficient the mean over the ranks that selected it, summed in rank
 * order; ranks with dropped[r] != 0 are skipped. `idx`/`val` point at rank
 * 0's entries of this tensor, rank r's are `stride` further on. cnt: n ints. */
cudaError_t distro__cuda_aggregate(cudaStream_t s, const distro__tiling *t, const uint32_t *idx, const float *val,
                                   int64_t stride, const uint8_t *dropped, int world, float *coef, int *cnt);
/* p = p*(1 - lr*wd) - lr*sign(q). */
cudaError_t distro__cuda_sign_update(cudaStream_t s, float *p, const float *q, float lr, float shrink, int64_t n);
/* distro__adamw_update on the device; c1, c2 are the bias corrections. */
cudaError_t distro__cuda_adamw_update(cudaStream_t s, float *p, float *m, float *v, const float *q, int64_t n,
                                      float q_scale, float b1, float b2, float eps, float lr, float shrink, float c1,
                                      float c2);
/* DisTrO-AdamW (demo.c's adam_tile and apply, same bits): u = g / (sqrt(v'/c2)
 * + eps) with v' = b2 v + (1 - b2) g^2, flags[slot] set if v' is not
 * finite (and stored in vnext unless NULL: overlap stages it); then v <- v'
 * once the step commits. */
cudaError_t distro__cuda_adam_input(cudaStream_t s, const float *g, const float *v, float *vnext, float *u, int64_t n,
                                    float b2, float eps, float c2, int *flags, int slot);
cudaError_t distro__cuda_adam_commit(cudaStream_t s, float *v, const float *g, int64_t n, float b2);
/* out = bf16(x), round to nearest even. */
cudaError_t distro__cuda_to_bf16(cudaStream_t s, const float *x, uint16_t *out, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
