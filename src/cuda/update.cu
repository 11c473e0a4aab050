// Element-wise kernels of the step and the fixed-order aggregation of the
// cuBLAS / cuFFT option. The element arithmetic is step_math.h's (the C
// code's order, round-to-nearest intrinsics, no FMA contraction), so given
// the same inputs each element matches the CPU path bit for bit.
#include <cstdint>

#include <cuda_bf16.h>

#include "cuda/cuda_internal.h"

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 65535 * 16 ? (b ? b : 1) : 65535 * 16);  // grid-stride loops cover the rest
}

#define GRID_STRIDE(j, n) \
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < (n); j += (int64_t)gridDim.x * blockDim.x)

__global__ void nonfinite_kernel(const float *x, int64_t n, int *flags, int slot) {
  int bad = 0;
  GRID_STRIDE(j, n) bad |= !isfinite(x[j]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) flags[slot] = 1;
}

__global__ void flag_slot_kernel(const int *flags, int n, float *out) {
  int any = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) any |= flags[i] != 0;
  any = __syncthreads_or(any);
  if (threadIdx.x == 0) *out = any ? 1.0f : 0.0f;
}

__global__ void momentum_kernel(float *next, const float *mom, float decay, float scale, int64_t n, int *flags,
                                int slot) {
  int bad = 0;
  GRID_STRIDE(j, n) {
    next[j] = distro__hd_blend(mom[j], next[j], decay, scale);
    bad |= distro__hd_nonfinite(next[j]);
  }
  if (bad) flags[slot] = 1;
}

// One block per chunk. Within one rank a chunk's indices are distinct
// (validated on the host), so each rank's pass writes every coefficient at
// most once; the barrier between ranks fixes the summation order.
__global__ void aggregate_kernel(int64_t cols, int h, int w, int64_t tiles_c, int n, int k, const uint32_t *idx,
                                 const float *val, int64_t stride, const uint8_t *dropped, int world, float *coef,
                                 int *cnt) {
  const int64_t c = blockIdx.x;
  const int64_t r0 = (c / tiles_c) * h, c0 = (c % tiles_c) * w;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t a = (r0 + e / w) * cols + c0 + e % w;
    coef[a] = 0.0f;
    cnt[a] = 0;
  }
  __syncthreads();
  for (int r = 0; r < world; r++) {
    if (dropped[r]) continue;
    const uint32_t *ri = idx + (int64_t)r * stride + c * k;
    const float *rv = val + (int64_t)r * stride + c * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
      const uint32_t ix = ri[j];
      const int64_t a = (r0 + ix / w) * cols + c0 + ix % w;
      coef[a] = __fadd_rn(coef[a], rv[j]);
      cnt[a]++;
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t a = (r0 + e / w) * cols + c0 + e % w;
    if (cnt[a] > 1) coef[a] = __fdiv_rn(coef[a], (float)cnt[a]);
  }
}

__global__ void sign_kernel(float *p, const float *q, float lr, float shrink, int64_t n) {
  GRID_STRIDE(j, n) p[j] = distro__hd_sign_update(p[j], q[j], shrink, lr);
}

__global__ void adamw_kernel(float *p, float *m, float *v, const float *q, int64_t n, float q_scale, float b1,
                             float b2, float eps, float lr, float shrink, float c1, float c2) {
  GRID_STRIDE(j, n) distro__hd_adamw(&p[j], &m[j], &v[j], q[j], q_scale, b1, b2, eps, lr, shrink, c1, c2);
}

// DisTrO-AdamW's input (demo.c, adam_tile): u = g / (sqrt(v'/c2) + eps),
// v' the second moment after this step (also stored in vnext, with overlap);
// flags[slot] set if v' is not finite.
__global__ void adam_input_kernel(const float *g, const float *v, float *vnext, float *u, int64_t n, float b2,
                                  float eps, float c2, int *flags, int slot) {
  int bad = 0;
  GRID_STRIDE(j, n) {
    const float vj = distro__hd_second_moment(v[j], g[j], b2);
    u[j] = distro__hd_adam_input(g[j], vj, c2, eps);
    if (vnext) vnext[j] = vj;
    bad |= distro__hd_nonfinite(vj);
  }
  if (bad) flags[slot] = 1;
}

__global__ void second_moment_kernel(float *v, const float *g, int64_t n, float b2) {
  GRID_STRIDE(j, n) v[j] = distro__hd_second_moment(v[j], g[j], b2);
}

__global__ void bf16_kernel(const float *x, uint16_t *out, int64_t n) {
  GRID_STRIDE(j, n) out[j] = __bfloat16_as_ushort(__float2bfloat16_rn(x[j]));
}

}  // namespace

extern "C" cudaError_t distro__cuda_nonfinite(cudaStream_t s, const float *x, int64_t n, int *flags, int slot) {
  if (n == 0) return cudaSuccess;
  nonfinite_kernel<<<grid_for(n), kThreads, 0, s>>>(x, n, flags, slot);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_flag_slot(cudaStream_t s, const int *flags, int n, float *out) {
  flag_slot_kernel<<<1, kThreads, 0, s>>>(flags, n, out);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_momentum(cudaStream_t s, float *next, const float *mom, float decay, float scale,
                                             int64_t n, int *flags, int slot) {
  if (n == 0) return cudaSuccess;
  momentum_kernel<<<grid_for(n), kThreads, 0, s>>>(next, mom, decay, scale, n, flags, slot);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_aggregate(cudaStream_t s, const distro__tiling *t, const uint32_t *idx,
                                              const float *val, int64_t stride, const uint8_t *dropped, int world,
                                              float *coef, int *cnt) {
  if (t->nchunks == 0) return cudaSuccess;
  int64_t want = t->chunk_elems > t->k ? t->chunk_elems : t->k;
  const int threads = want >= kThreads ? kThreads : (int)((want + 31) / 32 * 32);
  aggregate_kernel<<<(unsigned)t->nchunks, threads, 0, s>>>(t->cols, (int)t->h, (int)t->w, t->tiles_c,
                                                             (int)t->chunk_elems, (int)t->k, idx, val, stride,
                                                             dropped, world, coef, cnt);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_sign_update(cudaStream_t s, float *p, const float *q, float lr, float shrink,
                                                int64_t n) {
  if (n == 0) return cudaSuccess;
  sign_kernel<<<grid_for(n), kThreads, 0, s>>>(p, q, lr, shrink, n);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_adamw_update(cudaStream_t s, float *p, float *m, float *v, const float *q,
                                                 int64_t n, float q_scale, float b1, float b2, float eps, float lr,
                                                 float shrink, float c1, float c2) {
  if (n == 0) return cudaSuccess;
  adamw_kernel<<<grid_for(n), kThreads, 0, s>>>(p, m, v, q, n, q_scale, b1, b2, eps, lr, shrink, c1, c2);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_to_bf16(cudaStream_t s, const float *x, uint16_t *out, int64_t n) {
  if (n == 0) return cudaSuccess;
  bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(x, out, n);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_adam_input(cudaStream_t s, const float *g, const float *v, float *vnext, float *u,
                                               int64_t n, float b2, float eps, float c2, int *flags, int slot) {
  if (n == 0) return cudaSuccess;
  adam_input_kernel<<<grid_for(n), kThreads, 0, s>>>(g, v, vnext, u, n, b2, eps, c2, flags, slot);
  return cudaGetLastError();
}

extern "C" cudaError_t distro__cuda_adam_commit(cudaStream_t s, float *v, const float *g, int64_t n, float b2) {
  if (n == 0) return cudaSuccess;
  second_moment_kernel<<<grid_for(n), kThreads, 0, s>>>(v, g, n, b2);
  return cudaGetLastError();
}

