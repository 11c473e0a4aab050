// Per-chunk top-k by magnitude, one thread block per chunk.
//
// The selection equals src/compress/topk.c's: the k largest (|x|, lower
// index first) keys. A 4-pass 8-bit radix select on the magnitude bits finds
// the k-th largest magnitude T; everything above T is in, and of the entries
// equal to T the lowest indices fill the rest. A block scan in index order
// then writes the selection with indices ascending and zeroes it in coef.
// Integer shared-memory atomics only (histograms), so results are exact.
// The decisions (magnitude bits, the byte of each pass) are step_math.h's,
// which test_cuda_host checks against topk.c on the CPU; the byte of each
// pass is picked by one warp (warp_pick), equal to distro__hd_radix_pick.
#include <cstdint>

#include "cuda/cuda_internal.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kSmemElems = 8192;  // 32 KiB of magnitudes (under the 48 KiB default)

struct Tile {
  int64_t cols, r0, c0;
  int w;
  __device__ int64_t at(int e) const { return (r0 + e / w) * cols + c0 + e % w; }
};


// Exclusive prefix sum over the block; *total gets the block's sum.
__device__ int block_scan(int x, int *total, int *warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int v = x;
  for (int d = 1; d < 32; d <<= 1) {
    int y = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += y;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int s = lane < kWarps ? warp_sums[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += y;
    }
    if (lane < kWarps) warp_sums[lane] = s;  // inclusive
  }
  __syncthreads();
  const int before = warp ? warp_sums[warp - 1] : 0;
  *total = warp_sums[kWarps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return before + v - x;
}

// distro__hd_radix_pick on one warp: the bins from 255 down, 8 a lane; the
// first bin b >= 1 at which the count from the top reaches `need` extends
// the prefix (b = 0 when none does), and the new need is what is left of it
// after the bins above b. Integer sums: the same answer as the serial scan,
// without one thread walking up to 255 bins while the block waits.
__device__ void warp_pick(const int *hist, int need, int shift, uint32_t prefix, uint32_t *out_prefix, int *out_need) {
  const int lane = threadIdx.x & 31;
  int cnt[8], tot = 0;
  for (int j = 0; j < 8; j++) {
    cnt[j] = hist[255 - 8 * lane - j];
    tot += cnt[j];
  }
  int incl = tot;  // inclusive sum over lanes (bins from the top)
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  const int all = __shfl_sync(0xffffffffu, incl, 31);
  int above = incl - tot, hit = -1, hit_above = 0;
  for (int j = 0; j < 8; j++) {
    const int b = 255 - 8 * lane - j;
    if (hit < 0 && b >= 1 && above + cnt[j] >= need) {
      hit = b;
      hit_above = above;
    }
    above += cnt[j];
  }
  const unsigned hits = __ballot_sync(0xffffffffu, hit >= 0);
  if (hits == 0) {  // bin 0: everything above it is in
    if (lane == 0) {
      *out_prefix = prefix;
      *out_need = need - (all - hist[0]);
    }
  } else if (lane == __ffs(hits) - 1) {
    *out_prefix = prefix | (uint32_t)hit << shift;
    *out_need = need - hit_above;
  }
}

__global__ void __launch_bounds__(kThreads) topk_kernel(float *coef, int64_t cols, int h, int w, int64_t tiles_c,
                                                        int n, int k, int cache, uint32_t *out_idx, float *out_val) {
  extern __shared__ uint32_t smag[];
  __shared__ int hist[256];
  __shared__ int warp_sums[kWarps];
  __shared__ uint32_t s_prefix;
  __shared__ int s_need;
  const int64_t c = blockIdx.x;
  const Tile tile{cols, (c / tiles_c) * h, (c % tiles_c) * w, w};
  uint32_t *oi = out_idx + c * k;
  float *ov = out_val + c * k;

  if (k >= n) {  // everything is sent
    for (int e = threadIdx.x; e < n; e += kThreads) {
      const int64_t a = tile.at(e);
      oi[e] = (uint32_t)e;
      ov[e] = coef[a];
      coef[a] = 0.0f;
    }
    return;
  }
  if (cache) {
    for (int e = threadIdx.x; e < n; e += kThreads) smag[e] = distro__hd_mag(coef[tile.at(e)]);
  }
  // Radix select of the k-th largest magnitude, most significant byte first.
  uint32_t prefix = 0, mask = 0;
  int need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    // Lanes of a warp that fall into one bin add once (most magnitudes of a
    // tile share their top byte): far fewer shared atomics on one address.
    for (int base = 0; base < n; base += kThreads) {
      const int e = base + threadIdx.x;
      uint32_t key = 0xffffffffu;  // not counted (past the tile or another prefix)
      if (e < n) {
        const uint32_t m = cache ? smag[e] : distro__hd_mag(coef[tile.at(e)]);
        if ((m & mask) == prefix) key = (m >> shift) & 0xffu;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      if (key != 0xffffffffu && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[key], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < 32) warp_pick(hist, need, shift, prefix, &s_prefix, &s_need);
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  // prefix is T; `need` entries equal to T are taken, lowest index first.
  int eq_before = 0, out_before = 0;
  for (int base = 0; base < n; base += kThreads) {
    const int e = base + threadIdx.x;
    uint32_t m = 0;
    if (e < n) m = cache ? smag[e] : distro__hd_mag(coef[tile.at(e)]);
    const int is_eq = e < n && m == prefix, is_gt = e < n && m > prefix;
    int eq_total, sel_total;
    const int eq_rank = block_scan(is_eq, &eq_total, warp_sums);
    const int sel = is_gt || (is_eq && eq_before + eq_rank < need);
    const int pos = block_scan(sel, &sel_total, warp_sums);
    if (sel) {
      const int64_t a = tile.at(e);
      oi[out_before + pos] = (uint32_t)e;
      ov[out_before + pos] = coef[a];
      coef[a] = 0.0f;
    }
    eq_before += eq_total;
    out_before += sel_total;
  }
}

}  // namespace

extern "C" cudaError_t distro__cuda_topk(cudaStream_t s, const distro__tiling *t, float *coef, uint32_t *idx,
                                         float *val) {
  if (t->nchunks == 0) return cudaSuccess;
  const int cache = t->chunk_elems <= kSmemElems && t->k < t->chunk_elems;
  const size_t smem = cache ? sizeof(uint32_t) * (size_t)t->chunk_elems : 0;
  topk_kernel<<<(unsigned)t->nchunks, kThreads, smem, s>>>(coef, t->cols, (int)t->h, (int)t->w, t->tiles_c,
                                                           (int)t->chunk_elems, (int)t->k, cache, idx, val);
  return cudaGetLastError();
}
