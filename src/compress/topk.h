/* Internal: per-chunk top-k by magnitude. */
#ifndef DISTRO_COMPRESS_TOPK_H
#define DISTRO_COMPRESS_TOPK_H

#include <stdint.h>
#include "compress/chunk.h"

/* For every chunk c of the coefficient matrix `coef` (layout as in dct.h),
 * writes the k in-chunk indices of largest |value| to idx[c*k ..], sorted
 * ascending, and their values to val[c*k ..]. Ties in magnitude go to the
 * lower index, so the result is fully determined by the input. */
void distro__topk_tiles(const distro__tiling *t, const float *coef, uint32_t *idx, float *val);

/* Sets coef at the selected positions to zero (what was sent leaves the
 * momentum). */
void distro__topk_zero_selected(const distro__tiling *t, float *coef, const uint32_t *idx);

#endif
