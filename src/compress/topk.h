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

/* One chunk: the h x w values at x (row stride ld). mag (h*w uint32) and
 * cand (h*w + 8 uint64) are scratch. Same result as distro__topk_tiles. */
void distro__topk_chunk(const float *x, int64_t ld, int64_t h, int64_t w, int64_t k, uint32_t *idx, float *val,
                        uint32_t *mag, uint64_t *cand);

/* The selection's candidates: keys (mag[i] << 32 | ~i) of every mag[i] >=
 * thr, in index order, into cand (room for n + 8); returns their count.
 * portable = 1 skips the AVX-512 path (tests compare the two). */
int64_t distro__topk_gather_keys(const uint32_t *mag, int64_t n, uint32_t thr, uint64_t *cand, int portable);

/* Sets coef at the selected positions to zero (what was sent leaves the
 * momentum). */
void distro__topk_zero_selected(const distro__tiling *t, float *coef, const uint32_t *idx);

#endif
