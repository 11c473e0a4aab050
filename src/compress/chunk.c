/* Chunk rule of the DeMo reference and the tile geometry derived from it. */
#include "compress/chunk.h"

#include "common/error.h"

int64_t distro__chunk_size(int64_t n, int64_t target) {
  if (n <= target) return n;
  /* Largest divisor <= target; 1 for a prime n (the reference then sends
   * every coefficient of that dimension). */
  for (int64_t d = target; d > 1; d--)
    if (n % d == 0) return d;
  return 1;
}

distro_status distro__tiling_init(distro__tiling *t, int ndim, const int64_t *shape, int64_t target,
                                  int64_t topk) {
  if (ndim < 1 || !shape) return distro__fail(DISTRO_ERR_INVALID, "tensor needs ndim >= 1 (got %d)", ndim);
  if (target < 1 || topk < 1)
    return distro__fail(DISTRO_ERR_INVALID, "chunk and topk must be >= 1 (got %lld, %lld)", (long long)target,
                        (long long)topk);
  int64_t lead = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1) return distro__fail(DISTRO_ERR_INVALID, "shape[%d] = %lld, must be >= 1", i, (long long)shape[i]);
    if (i < ndim - 2) {
      if (lead > INT64_MAX / shape[i]) return distro__fail(DISTRO_ERR_INVALID, "tensor too large");
      lead *= shape[i];
    }
  }
  int64_t r = ndim >= 2 ? shape[ndim - 2] : 1;
  int64_t c = shape[ndim - 1];
  if (lead > INT64_MAX / r || lead * r > INT64_MAX / c) return distro__fail(DISTRO_ERR_INVALID, "tensor too large");
  t->rows = lead * r;
  t->cols = c;
  t->h = distro__chunk_size(r, target);
  t->w = distro__chunk_size(c, target);
  t->tiles_r = t->rows / t->h;
  t->tiles_c = t->cols / t->w;
  t->nchunks = t->tiles_r * t->tiles_c;
  t->chunk_elems = t->h * t->w;
  t->k = topk < t->chunk_elems ? topk : t->chunk_elems;
  return DISTRO_OK;
}
