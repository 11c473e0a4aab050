/* Internal: orthonormal chunked DCT-II of a tiled matrix.
 *
 * Coefficients are stored in the same (rows, cols) layout as the input: tile
 * (tr, tc) keeps coefficient (b, d) at [tr*h + b][tc*w + d]; its in-chunk
 * index is b*w + d. */
#ifndef DISTRO_COMPRESS_DCT_H
#define DISTRO_COMPRESS_DCT_H

#include <stdint.h>
#include <distro/status.h>
#include "compress/chunk.h"

/* basis[i*n + k] = c_k cos(pi (2i+1) k / 2n); computed in double. */
void distro__dct_basis(int64_t n, float *basis);

typedef enum {
  DISTRO__DCT_GEMM = 0,  /* OpenBLAS against the dense bases (rounds per CPU model: benchmark only) */
  DISTRO__DCT_FFTW = 1,  /* FFTW REDFT10/01 (benchmark only) */
  DISTRO__DCT_NAIVE = 2, /* float64 direct sums (benchmark only) */
  DISTRO__DCT_FAST = 3   /* even/odd butterflies, vectorized across a tile's rows or columns */
} distro__dct_method;

/* One-dimensional orthonormal DCT-II of length n as `levels` even/odd
 * splits down to a dense base (docs/algorithms.md's F, factored):
 *   DCT_n x = (1/sqrt2) [ DCT_{n/2} (x_lo + rev x_hi) ; DCT-IV_{n/2} (x_lo - rev x_hi) ]
 * with the even half recursing and the DCT-IV half a dense product. The
 * 1/sqrt2 factors are folded into the stored matrices. */
typedef struct distro__dct1 {
  int64_t n, base;   /* base = n >> levels: odd or <= 4, transformed densely */
  int levels;
  float *cb, *cbt;   /* base x base DCT-II and its transpose, scaled */
  float *s4[24];     /* level l: (n >> (l+1))^2 DCT-IV (symmetric), scaled */
} distro__dct1;

/* Basis matrices for one tiling; fh is h x h, fw is w x w. */
typedef struct distro__dct_plan {
  distro__tiling t;
  distro__dct_method method;
  float *fh, *fw, *fwt;      /* fwt: fw transposed */
  float *fe[8], *fo[8];      /* FAST, w even and >= 32: the width splits'
                                products (dct.c, width_forward) */
  distro__dct1 dh;           /* FAST: the height's factored transform */
  void *fftw_fwd, *fftw_inv; /* FFTW plans, when method == FFTW */
} distro__dct_plan;

distro_status distro__dct_plan_init(distro__dct_plan *p, const distro__tiling *t, distro__dct_method m);
void distro__dct_plan_destroy(distro__dct_plan *p);

/* coef = per-tile DCT(x). `scratch` holds rows*cols floats. x and coef may
 * not alias. Deterministic for any thread count. */
void distro__dct_encode_tiles(const distro__dct_plan *p, const float *x, float *coef, float *scratch);
/* x = per-tile inverse DCT(coef). */
void distro__dct_decode_tiles(const distro__dct_plan *p, const float *coef, float *x, float *scratch);

/* FAST plans, without allocating: x = per-tile DCT(src) (inverse 0) or its
 * inverse (1), the same bits as distro__dct_encode_tiles / _decode_tiles, on
 * at most nwork threads; thread i uses work + i*stride, stride >=
 * distro__dct_tiles_work(p) floats. */
int64_t distro__dct_tiles_work(const distro__dct_plan *p);
void distro__dct_fast_tiles(const distro__dct_plan *p, const float *src, float *dst, int inverse, float *work,
                            int64_t stride, int nwork);

/* ---- one tile at a time (FAST method) ----------------------------------
 * The fused step works tile by tile so that a tile's data stays in cache
 * between the transform, the momentum blend, the selection and the update.
 * A tile's coefficients are row-major: (b, d) at out[b*w + d]. */

/* Floats of `work` the tile functions need. */
int64_t distro__dct_tile_work(const distro__dct_plan *p);
/* out (h x w) = DCT of the h x w tile at x (row stride ldx). */
void distro__dct_tile_forward(const distro__dct_plan *p, const float *x, int64_t ldx, float *out, float *work);
/* x (h x w, row stride ldx) = inverse DCT of the coefficients in (h x w). */
void distro__dct_tile_inverse(const distro__dct_plan *p, const float *in, float *x, int64_t ldx, float *work);

/* The same for a tile whose only nonzero coefficients are at in[pos[q]],
 * q < npos (distinct in-tile indices): about h w (npos + the height's
 * factored work) multiply-adds instead of the dense h w (w + ...); falls
 * back to the dense transform where more than half the tile is listed.
 * Deterministic for a given order of pos; rounds differently from
 * distro__dct_tile_inverse (within float tolerance). */
void distro__dct_tile_inverse_sparse(const distro__dct_plan *p, const float *in, const uint32_t *pos, int64_t npos,
                                     float *x, int64_t ldx, float *work);

#endif
