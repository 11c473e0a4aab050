/* Internal: the per-element and per-tile arithmetic of the CUDA DeMo step,
 * written once for the kernels (src/cuda/tile.cu) and for host tests that
 * compile it as C (tests/test_cuda_host.c).
 *
 * Every float operation rounds once, in the order of the CPU step
 * (src/optim/demo.c, src/compress/dct.c's FAST method, src/optim/adamw.c):
 * on the device through __fadd_rn / __fmul_rn / __fdiv_rn / __fsqrt_rn
 * (never contracted into an FMA), on the host through plain operators in a
 * file built with -ffp-contract=off, as the library is. The factored DCT's
 * recursion is unrolled into stages; a value's operands and the order of
 * every sum are the CPU's, so the bits are too.
 *
 * Tile functions are run by `nt` cooperating threads numbered `tid`; between
 * stages they meet at DISTRO_HD_SYNC() (__syncthreads() on the device,
 * nothing on the host, where one thread runs them with tid 0, nt 1). Control
 * flow depends only on the tile's shape and on values every thread reads
 * after a barrier, so every thread of a block reaches every barrier. */
#ifndef DISTRO_CUDA_STEP_MATH_H
#define DISTRO_CUDA_STEP_MATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DISTRO_HD __host__ __device__ static inline
#else
#include <math.h>
#define DISTRO_HD static inline
#endif

#ifdef __CUDA_ARCH__
#define DISTRO_HD_ADD(a, b) __fadd_rn((a), (b))
#define DISTRO_HD_SUB(a, b) __fsub_rn((a), (b))
#define DISTRO_HD_MUL(a, b) __fmul_rn((a), (b))
#define DISTRO_HD_DIV(a, b) __fdiv_rn((a), (b))
#define DISTRO_HD_SQRT(a) __fsqrt_rn(a)
#define DISTRO_HD_SYNC() __syncthreads()
#else
#define DISTRO_HD_ADD(a, b) ((a) + (b))
#define DISTRO_HD_SUB(a, b) ((a) - (b))
#define DISTRO_HD_MUL(a, b) ((a) * (b))
#define DISTRO_HD_DIV(a, b) ((a) / (b))
#define DISTRO_HD_SQRT(a) sqrtf(a)
#define DISTRO_HD_SYNC() ((void)0)
#endif

/* ---- element-wise ----------------------------------------------------------- */

/* The bits of |x| (they order like the magnitudes; the selection's key). */
DISTRO_HD uint32_t distro__hd_mag(float x) {
  union {
    float f;
    uint32_t u;
  } b;
  b.f = x;
  return b.u & 0x7fffffffu;
}

/* 1 if x is Inf or NaN (by its bits, as the CPU checks). */
DISTRO_HD int distro__hd_nonfinite(float x) { return distro__hd_mag(x) >= 0x7f800000u; }

/* demo.c blend_tile: decay*mom + s*f. */
DISTRO_HD float distro__hd_blend(float mom, float f, float decay, float s) {
  return DISTRO_HD_ADD(DISTRO_HD_MUL(decay, mom), DISTRO_HD_MUL(s, f));
}

/* demo.c second_moment: b2 v + (1 - b2) g g. */
DISTRO_HD float distro__hd_second_moment(float v, float g, float b2) {
  return DISTRO_HD_ADD(DISTRO_HD_MUL(b2, v), DISTRO_HD_MUL(DISTRO_HD_MUL(DISTRO_HD_SUB(1.0f, b2), g), g));
}

/* demo.c adam_rows: g / (sqrt(v' / c2) + eps), v' = the second moment. */
DISTRO_HD float distro__hd_adam_input(float g, float vnext, float c2, float eps) {
  return DISTRO_HD_DIV(g, DISTRO_HD_ADD(DISTRO_HD_SQRT(DISTRO_HD_DIV(vnext, c2)), eps));
}

/* demo.c sign_tile: p shrink - step sign(q). */
DISTRO_HD float distro__hd_sign_update(float p, float q, float shrink, float step) {
  const float s = (float)((q > 0.0f) - (q < 0.0f));
  return DISTRO_HD_SUB(DISTRO_HD_MUL(p, shrink), DISTRO_HD_MUL(step, s));
}

/* adamw.c adamw_range, one element: updates *p, *m, *v from q. */
DISTRO_HD void distro__hd_adamw(float *p, float *m, float *v, float q, float q_scale, float b1, float b2, float eps,
                                float lr, float shrink, float c1, float c2) {
  const float g = DISTRO_HD_MUL(q, q_scale);
  const float mj = DISTRO_HD_ADD(DISTRO_HD_MUL(b1, *m), DISTRO_HD_MUL(DISTRO_HD_SUB(1.0f, b1), g));
  const float vj = DISTRO_HD_ADD(DISTRO_HD_MUL(b2, *v), DISTRO_HD_MUL(DISTRO_HD_MUL(DISTRO_HD_SUB(1.0f, b2), g), g));
  *m = mj;
  *v = vj;
  const float step = DISTRO_HD_DIV(DISTRO_HD_MUL(lr, DISTRO_HD_DIV(mj, c1)),
                                   DISTRO_HD_ADD(DISTRO_HD_SQRT(DISTRO_HD_DIV(vj, c2)), eps));
  *p = DISTRO_HD_SUB(DISTRO_HD_MUL(*p, shrink), step);
}

/* ---- the factored tile DCT (dct.c, FAST) ------------------------------------ */

/* The tables of one tile shape, pointers into host or device memory. They
 * are distro__dct_plan's (FAST) arrays, copied (distro__hd_dct_from_plan). */
typedef struct distro__hd_dct {
  int h, w;
  int wl;                    /* width splits (w even >= 32), 0: dense */
  const float *fw, *fwt;     /* w x w basis and its transpose */
  const float *fo[8], *fe;   /* level l's odd product; the last level's even */
  int hl, hbase;             /* height: splits and base edge */
  const float *cb, *cbt;     /* hbase x hbase (scaled) and its transpose */
  const float *s4[24];       /* level l: (h >> (l+1))^2 DCT-IV, scaled */
} distro__hd_dct;

/* Floats of work a tile function needs (forward, inverse and apply). */
DISTRO_HD int64_t distro__hd_tile_work(int h, int w) { return 10 * (int64_t)h * w + 64; }
/* 32-bit words of index work the apply needs. */
DISTRO_HD int64_t distro__hd_tile_iwork(int h, int w) { return 3 * (int64_t)h * w + h + 8; }

/* s = 0; s += a[i sa] b[i sb] for i < n (lanes_matmul's order). */
DISTRO_HD float distro__hd_dot(const float *a, int64_t sa, const float *b, int64_t sb, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++) s = DISTRO_HD_ADD(s, DISTRO_HD_MUL(a[i * sa], b[i * sb]));
  return s;
}

/* lanes_matmul: out[k ldo + l] = sum_i a[k lda + i] in[i ld + l], k < K, l < L. */
DISTRO_HD void distro__hd_matmul(float *out, int64_t ldo, const float *a, int64_t lda, const float *in, int64_t ld,
                                 int K, int N, int L, int tid, int nt) {
  for (int e = tid; e < K * L; e += nt) {
    const int k = e / L, l = e % L;
    out[k * ldo + l] = distro__hd_dot(a + k * lda, 1, in + l, ld, N);
  }
}

/* out (row stride ldo) = DCT of the h x w tile at x (row stride ldx). work:
 * distro__hd_tile_work floats, not aliasing x or out. Ends after a barrier. */
DISTRO_HD void distro__hd_tile_forward(const distro__hd_dct *D, const float *x, int64_t ldx, float *out, int64_t ldo,
                                       float *work, int tid, int nt) {
  const int h = D->h, w = D->w, e = h * w;
  float *R = h > 1 ? work : out; /* the width's result (one row: straight out) */
  const int64_t ldr = h > 1 ? w : ldo;
  float *cur = work + e;
  if (D->wl > 0) {
    /* width_forward unrolled: split level by level, the products, then the
     * interleaves from the deepest level up. */
    float *U[8], *V[8], *OD[8], *OUT[8], *ev = 0;
    const float *src = x;
    int64_t sld = ldx;
    int n = w;
    for (int l = 0; l < D->wl; l++) {
      const int m = n / 2;
      U[l] = cur;
      V[l] = cur + h * m;
      OD[l] = cur + 2 * h * m;
      OUT[l] = cur + 3 * h * m; /* level l's interleaved rows (h x n), l >= 1 */
      cur += 3 * h * m + h * n;
      for (int t = tid; t < h * m; t += nt) {
        const int i = t / m, j = t % m;
        const float a = src[i * sld + j], b = src[i * sld + n - 1 - j];
        U[l][i * m + j] = DISTRO_HD_ADD(a, b);
        V[l][i * m + j] = DISTRO_HD_SUB(a, b);
      }
      DISTRO_HD_SYNC();
      src = U[l];
      sld = m;
      n = m;
    }
    ev = cur;
    {
      const int m = n; /* the last level's half width */
      distro__hd_matmul(ev, m, U[D->wl - 1], m, D->fe, m, h, m, m, tid, nt);
    }
    for (int l = 0, m = w / 2; l < D->wl; l++, m /= 2) distro__hd_matmul(OD[l], m, V[l], m, D->fo[l], m, h, m, m, tid, nt);
    DISTRO_HD_SYNC();
    const float *even = ev;
    for (int l = D->wl - 1; l >= 0; l--) {
      const int m = w >> (l + 1);
      float *dst = l == 0 ? R : OUT[l];
      const int64_t ldd = l == 0 ? ldr : 2 * m;
      for (int t = tid; t < h * m; t += nt) {
        const int i = t / m, k = t % m;
        dst[i * ldd + 2 * k] = even[i * m + k];
        dst[i * ldd + 2 * k + 1] = OD[l][i * m + k];
      }
      DISTRO_HD_SYNC();
      even = dst;
    }
  } else if (w > 1) {
    distro__hd_matmul(R, ldr, x, ldx, D->fw, w, h, w, w, tid, nt);
    DISTRO_HD_SYNC();
  } else {
    for (int i = tid; i < h; i += nt) R[i * ldr] = x[i * ldx];
    DISTRO_HD_SYNC();
  }
  if (h == 1) return;
  /* dct1_forward along the height (lanes: the w columns). */
  cur = work + e;
  float *V[24];
  const float *src = R;
  int n = h;
  for (int l = 0; l < D->hl; l++) {
    const int m = n / 2;
    float *u = cur;
    V[l] = cur + m * w;
    cur += 2 * m * w;
    for (int t = tid; t < m * w; t += nt) {
      const int i = t / w, c = t % w;
      const float a = src[i * w + c], b = src[(n - 1 - i) * w + c];
      u[i * w + c] = DISTRO_HD_ADD(a, b);
      V[l][i * w + c] = DISTRO_HD_SUB(a, b);
    }
    DISTRO_HD_SYNC();
    src = u;
    n = m;
  }
  distro__hd_matmul(out, ldo << D->hl, D->cb, D->hbase, src, w, D->hbase, D->hbase, w, tid, nt);
  for (int l = 0; l < D->hl; l++) {
    const int m = h >> (l + 1);
    distro__hd_matmul(out + (ldo << l), ldo << (l + 1), D->s4[l], m, V[l], w, m, m, w, tid, nt);
  }
  DISTRO_HD_SYNC();
}

/* dct1_inverse along the height: x (h x w, row stride ldx) from the
 * coefficients c (h x w, row stride w). work: 3 h w floats. */
DISTRO_HD void distro__hd_height_inverse(const distro__hd_dct *D, const float *c, float *x, int64_t ldx, float *work,
                                         int tid, int nt) {
  const int h = D->h, w = D->w;
  if (D->hl == 0) {
    distro__hd_matmul(x, ldx, D->cbt, D->hbase, c, w, D->hbase, D->hbase, w, tid, nt);
    DISTRO_HD_SYNC();
    return;
  }
  float *B[24], *cur = work;
  for (int l = 0; l < D->hl; l++) {
    const int m = h >> (l + 1);
    B[l] = cur;
    cur += m * w;
    distro__hd_matmul(B[l], w, D->s4[l], m, c + ((int64_t)w << l), (int64_t)w << (l + 1), m, m, w, tid, nt);
  }
  float *A = cur; /* the base's result, then each level's join */
  cur += D->hbase * w;
  distro__hd_matmul(A, w, D->cbt, D->hbase, c, (int64_t)w << D->hl, D->hbase, D->hbase, w, tid, nt);
  DISTRO_HD_SYNC();
  for (int l = D->hl - 1; l >= 0; l--) {
    const int n = h >> l, m = n / 2;
    float *dst = l == 0 ? x : cur;
    const int64_t ldd = l == 0 ? ldx : w;
    for (int t = tid; t < m * w; t += nt) {
      const int i = t / w, col = t % w;
      const float a = A[i * w + col], b = B[l][i * w + col];
      dst[i * ldd + col] = DISTRO_HD_ADD(a, b);
      dst[(n - 1 - i) * ldd + col] = DISTRO_HD_SUB(a, b);
    }
    DISTRO_HD_SYNC();
    A = cur;
    cur += n * w;
  }
}

/* distro__dct_tile_inverse: x (row stride ldx) from the contiguous h x w
 * coefficients in. work: distro__hd_tile_work floats. */
DISTRO_HD void distro__hd_tile_inverse(const distro__hd_dct *D, const float *in, float *x, int64_t ldx, float *work,
                                       int tid, int nt) {
  const int h = D->h, w = D->w, e = h * w;
  const float *rows = in;
  if (h > 1) {
    distro__hd_height_inverse(D, in, work, w, work + e, tid, nt);
    rows = work;
  }
  if (w > 1) distro__hd_matmul(x, ldx, rows, w, D->fwt, w, h, w, w, tid, nt);
  else
    for (int i = tid; i < h; i += nt) x[i * ldx] = rows[i];
  DISTRO_HD_SYNC();
}

/* distro__dct_tile_inverse_sparse, with the npos distinct positions given
 * bucketed by tile row: row b's are bucket[rowstart[b] .. rowstart[b+1]) in
 * their order in the CPU's pos list. */
DISTRO_HD void distro__hd_tile_inverse_sparse(const distro__hd_dct *D, const float *in, const uint32_t *rowstart,
                                              const uint32_t *bucket, int npos, float *x, int64_t ldx, float *work,
                                              int tid, int nt) {
  const int h = D->h, w = D->w, e = h * w;
  if (2 * npos > e) {
    distro__hd_tile_inverse(D, in, x, ldx, work, tid, nt);
    return;
  }
  float *rows = h > 1 ? work : x; /* one row: straight into x */
  for (int t = tid; t < e; t += nt) {
    const int b = t / w, j = t % w;
    float s = 0.0f;
    for (uint32_t q = rowstart[b]; q < rowstart[b + 1]; q++) {
      const uint32_t at = bucket[q];
      s = DISTRO_HD_ADD(s, DISTRO_HD_MUL(in[at], D->fwt[(int64_t)(at % (uint32_t)w) * w + j]));
    }
    rows[t] = s; /* one row (b = 0): x's first row */
  }
  DISTRO_HD_SYNC();
  if (h > 1) distro__hd_height_inverse(D, rows, x, ldx, work + e, tid, nt);
}

/* ---- aggregation (demo.c aggregate_tile) ------------------------------------ */

/* coef (n = h w, contiguous) = per coefficient the mean over the live ranks
 * that selected it, summed in rank order. idx/val: rank 0's k entries of
 * this tile, rank r's `stride` further on. The distinct positions, in the
 * order first seen (rank, then payload order), are bucketed by tile row into
 * rowstart (h + 1 words; rowstart[h] = their count) and bucket (n words).
 * cnt: n words of scratch. Within one rank a tile's indices are distinct
 * (the payload validation checks it), so each rank's pass is parallel. */
DISTRO_HD void distro__hd_aggregate(const uint32_t *idx, const float *val, int64_t stride, const uint8_t *dropped,
                                    int world, int k, int h, int w, float *coef, uint32_t *cnt, uint32_t *rowstart,
                                    uint32_t *bucket, int tid, int nt) {
  const int n = h * w;
  for (int t = tid; t < n; t += nt) {
    coef[t] = 0.0f;
    cnt[t] = 0;
  }
  DISTRO_HD_SYNC();
  for (int r = 0; r < world; r++) {
    if (dropped[r]) continue;
    const uint32_t *ri = idx + r * stride;
    const float *rv = val + r * stride;
    for (int j = tid; j < k; j += nt) {
      coef[ri[j]] = DISTRO_HD_ADD(coef[ri[j]], rv[j]);
      cnt[ri[j]]++;
    }
    DISTRO_HD_SYNC();
  }
  if (tid == 0) {
    /* The CPU's pass over the positions: divide each once, note its row. */
    uint32_t *pos = bucket + n; /* n more words: the positions in order */
    uint32_t npos = 0;
    for (int b = 0; b <= h; b++) rowstart[b] = 0;
    for (int r = 0; r < world; r++) {
      if (dropped[r]) continue;
      const uint32_t *ri = idx + r * stride;
      for (int j = 0; j < k; j++) {
        const uint32_t a = ri[j];
        if (!cnt[a]) continue;
        if (cnt[a] > 1) coef[a] = DISTRO_HD_DIV(coef[a], (float)cnt[a]);
        cnt[a] = 0;
        pos[npos++] = a;
        rowstart[a / (uint32_t)w + 1]++;
      }
    }
    for (int b = 0; b < h; b++) rowstart[b + 1] += rowstart[b];
    /* Stable bucketing: cnt (all zero again) counts what each row holds. */
    for (uint32_t q = 0; q < npos; q++) {
      const uint32_t b = pos[q] / (uint32_t)w;
      bucket[rowstart[b] + cnt[b]++] = pos[q];
    }
    for (int b = 0; b < h; b++) cnt[b] = 0;
  }
  DISTRO_HD_SYNC();
}

/* ---- per-chunk top-k (topk.cu) ---------------------------------------------- */

/* The selection is the CPU's (topk.c): the k largest magnitudes, ties to the
 * lower index, indices ascending. The kernel finds the k-th largest
 * magnitude T by a radix select over the magnitude bits, 8 bits a pass from
 * the top, then takes everything above T and the lowest-indexed entries
 * equal to T. These are its decisions; distro__hd_select runs them on one
 * thread. */
/* One radix pass: hist counts the candidates (magnitudes whose bits above
 * `shift + 8` equal prefix's) by their byte at `shift`; the byte that holds
 * the need-th largest candidate extends the prefix. Returns the new need
 * (how many of the entries matching the longer prefix are still wanted). */
DISTRO_HD int distro__hd_radix_pick(const int *hist, int need, int shift, uint32_t *prefix) {
  int above = 0, b = 255;
  for (; b > 0; b--) {
    if (above + hist[b] >= need) break;
    above += hist[b];
  }
  *prefix |= (uint32_t)b << shift;
  return need - above;
}

/* The whole selection of a contiguous n-entry chunk on one thread: idx (k,
 * ascending) and val, the selected entries of x zeroed. hist: 256 ints. */
DISTRO_HD void distro__hd_select(float *x, int n, int k, uint32_t *idx, float *val, int *hist) {
  if (k >= n) {
    for (int e = 0; e < n; e++) {
      idx[e] = (uint32_t)e;
      val[e] = x[e];
      x[e] = 0.0f;
    }
    return;
  }
  uint32_t prefix = 0, mask = 0;
  int need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = 0; b < 256; b++) hist[b] = 0;
    for (int e = 0; e < n; e++) {
      const uint32_t m = distro__hd_mag(x[e]);
      if ((m & mask) == prefix) hist[(m >> shift) & 0xffu]++;
    }
    need = distro__hd_radix_pick(hist, need, shift, &prefix);
    mask |= 0xffu << shift;
  }
  int eq = 0, out = 0;
  for (int e = 0; e < n; e++) {
    const uint32_t m = distro__hd_mag(x[e]);
    if (m > prefix || (m == prefix && eq++ < need)) {
      idx[out] = (uint32_t)e;
      val[out++] = x[e];
      x[e] = 0.0f;
    }
  }
}

/* ---- the step's two tile passes -------------------------------------------- */

/* demo.c compress_tile without the selection: the tile's input (the
 * gradient, or with adam the normalized gradient u = g / (sqrt(v'/c2) +
 * eps)), its DCT, and next = decay*mom + s*DCT, all in the (rows, cols)
 * layout at row stride ld (grad, v, mom, next at the tile's first element);
 * with adam and vnext (overlap), v' is also stored there, as the CPU stages
 * it. Returns nonzero (to every thread) if a v' or a momentum value is Inf or
 * NaN. flag: one word of scratch every thread can see. */
DISTRO_HD int distro__hd_compress_tile(const distro__hd_dct *D, const float *grad, const float *v, float *vnext,
                                       int adam, float b2, float c2, float eps, const float *mom, float *next,
                                       int64_t ld, float decay, float s, float *work, uint32_t *flag, int tid,
                                       int nt) {
  const int h = D->h, w = D->w, e = h * w;
  float *T = work, *U = work + e, *W = work + 2 * e;
  const float *x = grad;
  int64_t ldx = ld;
  if (tid == 0) *flag = 0;
  DISTRO_HD_SYNC();
  uint32_t bad = 0;
  if (adam) {
    for (int t = tid; t < e; t += nt) {
      const int b = t / w, d = t % w;
      const float vj = distro__hd_second_moment(v[b * ld + d], grad[b * ld + d], b2);
      U[t] = distro__hd_adam_input(grad[b * ld + d], vj, c2, eps);
      if (vnext) vnext[b * ld + d] = vj; /* overlap: v' staged until the step commits */
      bad |= (uint32_t)distro__hd_nonfinite(vj);
    }
    x = U;
    ldx = w;
    DISTRO_HD_SYNC();
  }
  distro__hd_tile_forward(D, x, ldx, T, w, W, tid, nt);
  for (int t = tid; t < e; t += nt) {
    const int b = t / w, d = t % w;
    const float f = distro__hd_blend(mom[b * ld + d], T[t], decay, s);
    next[b * ld + d] = f;
    bad |= (uint32_t)distro__hd_nonfinite(f);
  }
  if (bad) *flag = 1; /* a benign race: every writer stores 1 */
  DISTRO_HD_SYNC();
  const int any = *flag != 0;
  DISTRO_HD_SYNC();
  return any;
}

/* demo.c apply_tile: aggregate, inverse DCT (sparse where it pays, as the
 * CPU), p = p shrink - step sign(Q) and with adam v = b2 v + (1-b2) g^2.
 * param, grad, v at the tile's first element, row stride ld. */
DISTRO_HD void distro__hd_apply_tile(const distro__hd_dct *D, const uint32_t *idx, const float *val, int64_t stride,
                                     const uint8_t *dropped, int world, int k, float *param, const float *grad,
                                     float *v, int adam, float b2, int64_t ld, float shrink, float step, float *work,
                                     uint32_t *iwork, int tid, int nt) {
  const int h = D->h, w = D->w, e = h * w;
  float *coef = work, *Q = work + e, *W = work + 2 * e;
  uint32_t *cnt = iwork, *rowstart = iwork + e, *bucket = iwork + e + h + 1;
  distro__hd_aggregate(idx, val, stride, dropped, world, k, h, w, coef, cnt, rowstart, bucket, tid, nt);
  const int npos = (int)rowstart[h];
  distro__hd_tile_inverse_sparse(D, coef, rowstart, bucket, npos, Q, w, W, tid, nt);
  for (int t = tid; t < e; t += nt) {
    const int b = t / w, d = t % w;
    param[b * ld + d] = distro__hd_sign_update(param[b * ld + d], Q[t], shrink, step);
    if (adam) v[b * ld + d] = distro__hd_second_moment(v[b * ld + d], grad[b * ld + d], b2);
  }
  DISTRO_HD_SYNC();
}

/* demo.c ahead_tile (look-ahead): p = base - ahead sign(the inverse DCT of
 * this rank's whole momentum), the staged residual `next` (row stride ld,
 * its selected entries zeroed) plus the tile's k selected (position, value)
 * pairs; with ahead 0, p = base. base, param, next at the tile's first
 * element. */
DISTRO_HD void distro__hd_ahead_tile(const distro__hd_dct *D, const float *next, const uint32_t *idx,
                                     const float *val, int k, const float *base, float *param, int64_t ld, float ahead,
                                     float *work, int tid, int nt) {
  const int h = D->h, w = D->w, e = h * w;
  if (ahead == 0.0f) {
    for (int t = tid; t < e; t += nt) param[(t / w) * ld + t % w] = base[(t / w) * ld + t % w];
    DISTRO_HD_SYNC();
    return;
  }
  float *A = work, *X = work + e, *W = work + 2 * e;
  for (int t = tid; t < e; t += nt) A[t] = next[(t / w) * ld + t % w];
  DISTRO_HD_SYNC();
  for (int j = tid; j < k; j += nt) A[idx[j]] = val[j]; /* distinct positions */
  DISTRO_HD_SYNC();
  distro__hd_tile_inverse(D, A, X, w, W, tid, nt);
  for (int t = tid; t < e; t += nt) {
    const int64_t at = (t / w) * ld + t % w;
    param[at] = DISTRO_HD_SUB(base[at], DISTRO_HD_MUL(ahead, (float)((X[t] > 0.0f) - (X[t] < 0.0f))));
  }
  DISTRO_HD_SYNC();
}

#ifndef __CUDACC__
#include "compress/dct.h"
/* The tables of a FAST plan (host pointers into p's arrays). */
static inline void distro__hd_dct_from_plan(const distro__dct_plan *p, distro__hd_dct *D) {
  memset(D, 0, sizeof *D);
  D->h = (int)p->t.h;
  D->w = (int)p->t.w;
  D->fw = p->fw;
  D->fwt = p->fwt;
  while (D->wl < 8 && p->fo[D->wl]) {
    D->fo[D->wl] = p->fo[D->wl];
    if (p->fe[D->wl]) D->fe = p->fe[D->wl];
    D->wl++;
  }
  D->hl = p->dh.levels;
  D->hbase = (int)p->dh.base;
  D->cb = p->dh.cb;
  D->cbt = p->dh.cbt;
  for (int l = 0; l < p->dh.levels && l < 24; l++) D->s4[l] = p->dh.s4[l];
}
#endif

#endif
