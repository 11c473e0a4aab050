// Chunked orthonormal DCT-II on the device: the same two GEMMs per direction
// as src/compress/dct.c, through cuBLAS in FP32 (the handle's math mode is
// CUBLAS_DEFAULT_MATH, which never uses TF32 for sgemm).
//
// cuBLAS is column-major: a row-major (m x n) matrix is its (n x m)
// transpose, so row-major C = A B is computed as C^T = B^T A^T.
#include <climits>
#include <cstdlib>

#include "cuda/cuda_internal.h"

extern "C" {
#include "compress/dct.h"
}

extern "C" distro_status distro__cuda_basis(int64_t n, float **out) {
  distro_status st = DISTRO_OK;
  float *host = (float *)malloc(sizeof(float) * (size_t)(n * n)), *dev = NULL;
  *out = NULL;
  if (!host) return distro__fail(DISTRO_ERR_NOMEM, "out of memory for a DCT basis");
  distro__dct_basis(n, host);
  DISTRO_CUDA_TRY(cudaMalloc((void **)&dev, sizeof(float) * (size_t)(n * n)));
  DISTRO_CUDA_TRY(cudaMemcpy(dev, host, sizeof(float) * (size_t)(n * n), cudaMemcpyHostToDevice));
  free(host);
  *out = dev;
  return DISTRO_OK;
fail:
  free(host);
  if (dev) cudaFree(dev);
  return st;
}

extern "C" distro_status distro__cuda_dct_check(const distro__tiling *t) {
  if (t->rows * t->tiles_c > INT_MAX || t->cols > INT_MAX || t->h * t->cols > INT_MAX || t->tiles_r > INT_MAX)
    return distro__fail(DISTRO_ERR_INVALID, "tensor %lldx%lld is too large for the CUDA DCT", (long long)t->rows,
                        (long long)t->cols);
  return DISTRO_OK;
}

extern "C" distro_status distro__cuda_dct_encode(cublasHandle_t h, cudaStream_t s, const distro__cuda_dct *p,
                                                 const float *x, float *coef, float *scratch) {
  distro_status st = DISTRO_OK;
  const distro__tiling *t = &p->t;
  const float one = 1.0f, zero = 0.0f;
  const size_t bytes = sizeof(float) * (size_t)(t->rows * t->cols);
  const int w = (int)t->w, hh = (int)t->h, cols = (int)t->cols, m = (int)(t->rows * t->tiles_c);
  float *y = t->h == 1 ? coef : scratch;
  // Along columns: Y = X' Fw, X' the (rows*tiles_c, w) view.
  if (t->w == 1) {
    DISTRO_CUDA_TRY(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
  } else {
    DISTRO_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, w, m, w, &one, p->fw, w, x, w, &zero, y, w));
  }
  if (t->h == 1) return DISTRO_OK;
  // Along rows: each block of h rows gets Fh^T Y_block (one batch entry per block).
  DISTRO_CUBLAS_TRY(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, cols, hh, hh, &one, y, cols,
                                              (long long)hh * cols, p->fh, hh, 0, &zero, coef, cols,
                                              (long long)hh * cols, (int)t->tiles_r));
  return DISTRO_OK;
fail:
  return st;
}

extern "C" distro_status distro__cuda_dct_decode(cublasHandle_t h, cudaStream_t s, const distro__cuda_dct *p,
                                                 const float *coef, float *x, float *scratch) {
  distro_status st = DISTRO_OK;
  const distro__tiling *t = &p->t;
  const float one = 1.0f, zero = 0.0f;
  const size_t bytes = sizeof(float) * (size_t)(t->rows * t->cols);
  const int w = (int)t->w, hh = (int)t->h, cols = (int)t->cols, m = (int)(t->rows * t->tiles_c);
  const float *y = coef;
  if (t->h > 1) {
    float *yb = t->w == 1 ? x : scratch;
    DISTRO_CUBLAS_TRY(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, cols, hh, hh, &one, coef, cols,
                                                (long long)hh * cols, p->fh, hh, 0, &zero, yb, cols,
                                                (long long)hh * cols, (int)t->tiles_r));
    if (t->w == 1) return DISTRO_OK;
    y = yb;
  }
  if (t->w == 1) {
    DISTRO_CUDA_TRY(cudaMemcpyAsync(x, y, bytes, cudaMemcpyDeviceToDevice, s));
    return DISTRO_OK;
  }
  DISTRO_CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, w, m, w, &one, p->fw, w, y, w, &zero, x, w));
  return DISTRO_OK;
fail:
  return st;
}
