// Chunked orthonormal DCT-II through cuFFT, for large tiles (where the GEMM
// path's 2(h+w) flops per element per direction grow with the chunk).
//
// Each 1-D pass is Makhoul's length-N method: permute v = (x0, x2, x4, ...,
// x5, x3, x1), V = rfft(v), X[k] = c_k Re(e^{-i pi k / 2N} V[k]); the inverse
// builds V[k] = e^{i pi k / 2N} (y[k] - i y[N-k]) from y = X / c_k, runs the
// complex-to-real FFT (unnormalized: scaled by 1/N here) and undoes the
// permutation. Along w the segments are contiguous (batches of length N,
// one per row and tile column); along h the permuted buffer is interleaved
// (element j of every segment of one tile row side by side: stride B, batch
// distance 1), so every gather and scatter below is coalesced.
#include <cmath>
#include <cstring>

#include "cuda/cuda_internal.h"

#define DISTRO_CUFFT_TRY(call)                                                                        \
  do {                                                                                                \
    cufftResult r_ = (call);                                                                          \
    if (r_ != CUFFT_SUCCESS) {                                                                        \
      st = distro__fail(DISTRO_ERR_CUDA, "%s failed: cuFFT error %d", #call, (int)r_);                \
      goto fail;                                                                                      \
    }                                                                                                 \
  } while (0)

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 65535 * 16 ? (b ? b : 1) : 65535 * 16);
}

// One 1-D pass: transform length N, B segments, H = N/2 + 1 complex outputs.
struct Pass {
  int64_t N, B, H, cols, h, w, tiles_c;
  int along_h;
  float s0, sk;  // forward scales c_0, c_k
  float i0, ik;  // inverse scales 1 / (c_0 N), 1 / (c_k N)
};

Pass make_pass(const distro__tiling *t, int along_h) {
  Pass p;
  p.N = along_h ? t->h : t->w;
  p.B = along_h ? t->tiles_r * t->cols : t->rows * t->tiles_c;
  p.H = p.N / 2 + 1;
  p.cols = t->cols;
  p.h = t->h;
  p.w = t->w;
  p.tiles_c = t->tiles_c;
  p.along_h = along_h;
  const double n = (double)p.N;
  p.s0 = (float)std::sqrt(1.0 / n);
  p.sk = (float)std::sqrt(2.0 / n);
  p.i0 = (float)(1.0 / (std::sqrt(1.0 / n) * n));
  p.ik = (float)(1.0 / (std::sqrt(2.0 / n) * n));
  return p;
}

#define GRID_STRIDE(j, n) \
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < (n); j += (int64_t)gridDim.x * blockDim.x)

__device__ void elem_to_bj(const Pass &p, int64_t e, int64_t &b, int64_t &j) {
  const int64_t r = e / p.cols, c = e % p.cols;
  if (p.along_h) {
    j = r % p.h;
    b = (r / p.h) * p.cols + c;
  } else {
    j = c % p.w;
    b = r * p.tiles_c + c / p.w;
  }
}
__device__ int64_t bj_to_elem(const Pass &p, int64_t b, int64_t j) {
  if (p.along_h) return ((b / p.cols) * p.h + j) * p.cols + b % p.cols;
  return (b / p.tiles_c) * p.cols + (b % p.tiles_c) * p.w + j;
}
// Where x[j] sits in the permuted segment.
__device__ int64_t perm_pos(const Pass &p, int64_t j) { return (j & 1) ? p.N - 1 - (j >> 1) : (j >> 1); }
__device__ int64_t ridx(const Pass &p, int64_t b, int64_t j) { return p.along_h ? j * p.B + b : b * p.N + j; }
__device__ int64_t cidx(const Pass &p, int64_t b, int64_t k) { return p.along_h ? k * p.B + b : b * p.H + k; }

__global__ void permute_kernel(Pass p, const float *x, float *v, int64_t n) {
  GRID_STRIDE(e, n) {
    int64_t b, j;
    elem_to_bj(p, e, b, j);
    v[ridx(p, b, perm_pos(p, j))] = x[e];
  }
}

__global__ void unpermute_kernel(Pass p, const float *v, float *x, int64_t n) {
  GRID_STRIDE(e, n) {
    int64_t b, j;
    elem_to_bj(p, e, b, j);
    x[e] = v[ridx(p, b, perm_pos(p, j))];
  }
}

// out[e] = c_k Re(e^{-i pi k / 2N} V[k]), V[k] = conj(V[N-k]) above N/2.
__global__ void post_kernel(Pass p, const cufftComplex *V, float *out, int64_t n) {
  GRID_STRIDE(e, n) {
    int64_t b, k;
    elem_to_bj(p, e, b, k);
    cufftComplex z;
    if (k < p.H) {
      z = V[cidx(p, b, k)];
    } else {
      z = V[cidx(p, b, p.N - k)];
      z.y = -z.y;
    }
    float s, c;
    sincospif((float)k / (float)(2 * p.N), &s, &c);
    out[e] = (k ? p.sk : p.s0) * (z.x * c + z.y * s);
  }
}

// V[k] = e^{i pi k / 2N} (y[k] - i y[N-k]) / N with y = Y / c.
__global__ void pretwiddle_kernel(Pass p, const float *Y, cufftComplex *V, int64_t nc) {
  GRID_STRIDE(q, nc) {
    int64_t b, k;
    if (p.along_h) {
      k = q / p.B;
      b = q % p.B;
    } else {
      b = q / p.H;
      k = q % p.H;
    }
    const float a = Y[bj_to_elem(p, b, k)] * (k ? p.ik : p.i0);
    const float d = k ? Y[bj_to_elem(p, b, p.N - k)] * p.ik : 0.0f;  // y[N] = 0; N-k >= 1 here
    float s, c;
    sincospif((float)k / (float)(2 * p.N), &s, &c);
    cufftComplex z;
    z.x = a * c + d * s;
    z.y = a * s - d * c;
    V[q] = z;
  }
}

distro_status make_plan(cufftHandle *plan, const Pass &p, cufftType type, size_t *work) {
  distro_status st = DISTRO_OK;
  long long n[1] = {p.N}, nemb_r[1] = {p.N}, nemb_c[1] = {p.H};
  const int r2c = type == CUFFT_R2C;
  // Real side: stride/distance of the permuted buffer; complex side likewise.
  const long long rs = p.along_h ? p.B : 1, rd = p.along_h ? 1 : p.N;
  const long long cs = p.along_h ? p.B : 1, cd = p.along_h ? 1 : p.H;
  size_t ws = 0;
  DISTRO_CUFFT_TRY(cufftCreate(plan));
  DISTRO_CUFFT_TRY(cufftSetAutoAllocation(*plan, 0));
  if (r2c)
    DISTRO_CUFFT_TRY(cufftMakePlanMany64(*plan, 1, n, nemb_r, rs, rd, nemb_c, cs, cd, type, p.B, &ws));
  else
    DISTRO_CUFFT_TRY(cufftMakePlanMany64(*plan, 1, n, nemb_c, cs, cd, nemb_r, rs, rd, type, p.B, &ws));
  if (ws > *work) *work = ws;
  return DISTRO_OK;
fail:
  return st;
}

}  // namespace

extern "C" int64_t distro__cuda_fft_cbuf(const distro__tiling *t) {
  int64_t a = t->w > 1 ? t->rows * t->tiles_c * (t->w / 2 + 1) : 0;
  int64_t b = t->h > 1 ? t->tiles_r * t->cols * (t->h / 2 + 1) : 0;
  return a > b ? a : b;
}

extern "C" distro_status distro__cuda_fft_init(distro__cuda_fft_dct *p, const distro__tiling *t, size_t *work) {
  distro_status st = DISTRO_OK;
  memset(p, 0, sizeof *p);
  p->t = *t;
  if (t->w > 1) {
    const Pass w = make_pass(t, 0);
    DISTRO_CHECK(make_plan(&p->plan[0], w, CUFFT_R2C, work));
    p->have[0] = 1;
    DISTRO_CHECK(make_plan(&p->plan[1], w, CUFFT_C2R, work));
    p->have[1] = 1;
  }
  if (t->h > 1) {
    const Pass h = make_pass(t, 1);
    DISTRO_CHECK(make_plan(&p->plan[2], h, CUFFT_R2C, work));
    p->have[2] = 1;
    DISTRO_CHECK(make_plan(&p->plan[3], h, CUFFT_C2R, work));
    p->have[3] = 1;
  }
  return DISTRO_OK;
fail:
  distro__cuda_fft_destroy(p);
  return st;
}

extern "C" void distro__cuda_fft_destroy(distro__cuda_fft_dct *p) {
  for (int i = 0; i < 4; i++)
    if (p->have[i]) cufftDestroy(p->plan[i]);
  memset(p->have, 0, sizeof p->have);
}

extern "C" distro_status distro__cuda_fft_set_work(distro__cuda_fft_dct *p, void *work) {
  distro_status st = DISTRO_OK;
  for (int i = 0; i < 4; i++)
    if (p->have[i]) DISTRO_CUFFT_TRY(cufftSetWorkArea(p->plan[i], work));
fail:
  return st;
}

extern "C" distro_status distro__cuda_fft_encode(const distro__cuda_fft_dct *p, cudaStream_t s, const float *x,
                                                 float *coef, float *scratch, void *cbuf) {
  distro_status st = DISTRO_OK;
  const distro__tiling *t = &p->t;
  const int64_t n = t->rows * t->cols;
  cufftComplex *C = (cufftComplex *)cbuf;
  const float *src = x;
  if (n == 0) return DISTRO_OK;
  if (t->w == 1 && t->h == 1) {
    DISTRO_CUDA_TRY(cudaMemcpyAsync(coef, x, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice, s));
    return DISTRO_OK;
  }
  if (t->w > 1) {
    const Pass w = make_pass(t, 0);
    float *dst = t->h > 1 ? scratch : coef;
    permute_kernel<<<grid_for(n), kThreads, 0, s>>>(w, x, scratch, n);
    DISTRO_CUDA_TRY(cudaGetLastError());
    DISTRO_CUFFT_TRY(cufftSetStream(p->plan[0], s));
    DISTRO_CUFFT_TRY(cufftExecR2C(p->plan[0], scratch, C));
    post_kernel<<<grid_for(n), kThreads, 0, s>>>(w, C, dst, n);
    DISTRO_CUDA_TRY(cudaGetLastError());
    src = dst;
  }
  if (t->h > 1) {
    const Pass h = make_pass(t, 1);
    float *v = src == scratch ? coef : scratch;  // the permuted copy goes where src is not
    permute_kernel<<<grid_for(n), kThreads, 0, s>>>(h, src, v, n);
    DISTRO_CUDA_TRY(cudaGetLastError());
    DISTRO_CUFFT_TRY(cufftSetStream(p->plan[2], s));
    DISTRO_CUFFT_TRY(cufftExecR2C(p->plan[2], v, C));
    post_kernel<<<grid_for(n), kThreads, 0, s>>>(h, C, coef, n);
    DISTRO_CUDA_TRY(cudaGetLastError());
  }
  return DISTRO_OK;
fail:
  return st;
}

extern "C" distro_status distro__cuda_fft_decode(const distro__cuda_fft_dct *p, cudaStream_t s, const float *coef,
                                                 float *x, float *scratch, void *cbuf) {
  distro_status st = DISTRO_OK;
  const distro__tiling *t = &p->t;
  const int64_t n = t->rows * t->cols;
  cufftComplex *C = (cufftComplex *)cbuf;
  const float *src = coef;
  if (n == 0) return DISTRO_OK;
  if (t->w == 1 && t->h == 1) {
    DISTRO_CUDA_TRY(cudaMemcpyAsync(x, coef, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice, s));
    return DISTRO_OK;
  }
  if (t->h > 1) {
    const Pass h = make_pass(t, 1);
    const int64_t nc = h.B * h.H;
    pretwiddle_kernel<<<grid_for(nc), kThreads, 0, s>>>(h, coef, C, nc);
    DISTRO_CUDA_TRY(cudaGetLastError());
    DISTRO_CUFFT_TRY(cufftSetStream(p->plan[3], s));
    DISTRO_CUFFT_TRY(cufftExecC2R(p->plan[3], C, scratch));
    unpermute_kernel<<<grid_for(n), kThreads, 0, s>>>(h, scratch, x, n);
    DISTRO_CUDA_TRY(cudaGetLastError());
    src = x;
  }
  if (t->w > 1) {
    const Pass w = make_pass(t, 0);
    const int64_t nc = w.B * w.H;
    pretwiddle_kernel<<<grid_for(nc), kThreads, 0, s>>>(w, src, C, nc);
    DISTRO_CUDA_TRY(cudaGetLastError());
    DISTRO_CUFFT_TRY(cufftSetStream(p->plan[1], s));
    DISTRO_CUFFT_TRY(cufftExecC2R(p->plan[1], C, scratch));
    unpermute_kernel<<<grid_for(n), kThreads, 0, s>>>(w, scratch, x, n);
    DISTRO_CUDA_TRY(cudaGetLastError());
  }
  return DISTRO_OK;
fail:
  return st;
}
