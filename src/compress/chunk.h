/* Internal: chunk rule and tile geometry of a tensor. */
#ifndef DISTRO_COMPRESS_CHUNK_H
#define DISTRO_COMPRESS_CHUNK_H

#include <stdint.h>
#include <distro/status.h>

/* Largest divisor of n that is <= target (n itself if n < target). A prime
 * n > target gets 1, as in the DeMo reference. */
int64_t distro__chunk_size(int64_t n, int64_t target);

/* A tensor seen as a (rows, cols) matrix cut into h x w tiles. 1-D tensors
 * are (1, n); >= 3-D ones fold their leading dims into rows (h divides the
 * second-to-last dim, so tiles never straddle a batch entry). */
typedef struct distro__tiling {
  int64_t rows, cols;     /* matrix view */
  int64_t h, w;           /* tile edges */
  int64_t tiles_r, tiles_c;
  int64_t nchunks;        /* tiles_r * tiles_c */
  int64_t chunk_elems;    /* h * w */
  int64_t k;              /* coefficients kept per chunk, clamped to [1, h*w] */
} distro__tiling;

distro_status distro__tiling_init(distro__tiling *t, int ndim, const int64_t *shape, int64_t target, int64_t topk);

/* Position in the (rows, cols) layout of in-chunk index i (row-major within
 * the h x w tile) of chunk c (tiles numbered row-major). */
static inline int64_t distro__tile_offset(const distro__tiling *t, int64_t c, uint32_t i) {
  const int64_t r0 = (c / t->tiles_c) * t->h, c0 = (c % t->tiles_c) * t->w;
  return (r0 + i / t->w) * t->cols + c0 + i % t->w;
}

#endif
