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

typedef enum { DISTRO__DCT_GEMM = 0, DISTRO__DCT_FFTW = 1, DISTRO__DCT_NAIVE = 2 } distro__dct_method;

/* Basis matrices for one tiling; fh is h x h, fw is w x w. */
typedef struct distro__dct_plan {
  distro__tiling t;
  distro__dct_method method;
  float *fh, *fw;
  void *fftw_fwd, *fftw_inv; /* FFTW plans, when method == FFTW */
} distro__dct_plan;

distro_status distro__dct_plan_init(distro__dct_plan *p, const distro__tiling *t, distro__dct_method m);
void distro__dct_plan_destroy(distro__dct_plan *p);

/* coef = per-tile DCT(x). `scratch` holds rows*cols floats. x and coef may
 * not alias. Deterministic for any thread count. */
void distro__dct_encode_tiles(const distro__dct_plan *p, const float *x, float *coef, float *scratch);
/* x = per-tile inverse DCT(coef). */
void distro__dct_decode_tiles(const distro__dct_plan *p, const float *coef, float *x, float *scratch);

#endif
