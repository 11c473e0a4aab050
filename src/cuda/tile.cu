// The DeMo step's tile passes on the device, in the CPU's arithmetic
// (step_math.h): one thread block per tile, blocks striding over a tensor's
// tiles, each with its own slice of global work memory.
#include <cstdint>

#include "cuda/cuda_internal.h"
#include "cuda/step_math.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    compress_kernel(distro__hd_dct D, distro__tiling t, const float *grad, const float *v, float *vnext, int adam,
                    float b2, float c2, float eps, const float *mom, float *next, float decay, float s, float *work,
                    int64_t wstride, int *flags, int slot) {
  __shared__ uint32_t flag;
  float *my = work + (int64_t)blockIdx.x * wstride;
  int bad = 0;
  for (int64_t c = blockIdx.x; c < t.nchunks; c += gridDim.x) {
    const int64_t off = (c / t.tiles_c) * t.h * t.cols + (c % t.tiles_c) * t.w;
    bad |= distro__hd_compress_tile(&D, grad + off, adam ? v + off : nullptr, vnext ? vnext + off : nullptr, adam, b2,
                                    c2, eps, mom + off,
                                    next + off, t.cols, decay, s, my, &flag, (int)threadIdx.x, (int)blockDim.x);
  }
  if (bad && threadIdx.x == 0) flags[slot] = 1;
}

__global__ void __launch_bounds__(kThreads)
    apply_kernel(distro__hd_dct D, distro__tiling t, const uint32_t *idx, const float *val, int64_t stride,
                 const uint8_t *dropped, int world, float *param, const float *grad, float *v, int adam, float b2,
                 float shrink, float step, float *work, int64_t wstride, uint32_t *iwork, int64_t iwstride) {
  float *my = work + (int64_t)blockIdx.x * wstride;
  uint32_t *imy = iwork + (int64_t)blockIdx.x * iwstride;
  for (int64_t c = blockIdx.x; c < t.nchunks; c += gridDim.x) {
    const int64_t off = (c / t.tiles_c) * t.h * t.cols + (c % t.tiles_c) * t.w;
    distro__hd_apply_tile(&D, idx + c * t.k, val + c * t.k, stride, dropped, world, (int)t.k, param + off,
                          adam ? grad + off : nullptr, adam ? v + off : nullptr, adam, b2, t.cols, shrink, step, my,
                          imy, (int)threadIdx.x, (int)blockDim.x);
  }
}

__global__ void __launch_bounds__(kThreads)
    ahead_kernel(distro__hd_dct D, distro__tiling t, const float *next, const uint32_t *idx, const float *val,
                 const float *base, float *param, float ahead, float *work, int64_t wstride) {
  float *my = work + (int64_t)blockIdx.x * wstride;
  for (int64_t c = blockIdx.x; c < t.nchunks; c += gridDim.x) {
    const int64_t off = (c / t.tiles_c) * t.h * t.cols + (c % t.tiles_c) * t.w;
    distro__hd_ahead_tile(&D, next + off, idx + c * t.k, val + c * t.k, (int)t.k, base + off, param + off, t.cols,
                          ahead, my, (int)threadIdx.x, (int)blockDim.x);
  }
}

unsigned blocks(const distro__tiling *t, int max_blocks) {
  return (unsigned)(t->nchunks < max_blocks ? t->nchunks : max_blocks);
}

}  // namespace

extern "C" cudaError_t distro__cuda_compress_tiles(cudaStream_t s, const distro__hd_dct *D, const distro__tiling *t,
                                                   const float *grad, const float *v, float *vnext, int adam, float b2,
                                                   float c2,
                                                   float eps, const float *mom, float *next, float decay, float scale,
                                                   float *work, int max_blocks, int *flags, int slot) {
  if (t->nchunks == 0) return cudaSuccess;
  compress_kernel<<<blocks(t, max_blocks), kThreads, 0, s>>>(*D, *t, grad, v, vnext, adam, b2, c2, eps, mom, next,
                                                              decay,
                                                              scale, work, distro__hd_tile_work(D->h, D->w), flags,
                                                              slot);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_apply_tiles(cudaStream_t s, const distro__hd_dct *D, const distro__tiling *t,
                                                const uint32_t *idx, const float *val, int64_t stride,
                                                const uint8_t *dropped, int world, float *param, const float *grad,
                                                float *v, int adam, float b2, float shrink, float step, float *work,
                                                uint32_t *iwork, int max_blocks) {
  if (t->nchunks == 0) return cudaSuccess;
  apply_kernel<<<blocks(t, max_blocks), kThreads, 0, s>>>(*D, *t, idx, val, stride, dropped, world, param, grad, v,
                                                           adam, b2, shrink, step, work,
                                                           distro__hd_tile_work(D->h, D->w), iwork,
                                                           distro__hd_tile_iwork(D->h, D->w));
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_ahead_tiles(cudaStream_t s, const distro__hd_dct *D, const distro__tiling *t,
                                                const float *next, const uint32_t *idx, const float *val,
                                                const float *base, float *param, float ahead, float *work,
                                                int max_blocks) {
  if (t->nchunks == 0) return cudaSuccess;
  ahead_kernel<<<blocks(t, max_blocks), kThreads, 0, s>>>(*D, *t, next, idx, val, base, param, ahead, work,
                                                           distro__hd_tile_work(D->h, D->w));
  return cudaGetLastError();
}
