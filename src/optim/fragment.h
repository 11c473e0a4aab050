/* Internal: splitting the parameters into P streaming-DiLoCo fragments.
 *
 * A fragment is a list of pieces, each a contiguous range of one tensor,
 * sorted by (tensor, offset) with adjacent ranges of a tensor merged. Every
 * element of every tensor is in exactly one piece of one fragment.
 *
 * BALANCED and SEQUENTIAL first cut each tensor into blocks: a tensor of n
 * elements becomes k = ceil(n / max_block) near-equal blocks (sizes differ
 * by at most one element). BALANCED places the blocks, largest first (ties
 * by tensor, then offset), each into the fragment with the fewest elements
 * so far (ties: lowest index); the fragment sizes then differ by at most the
 * largest block. SEQUENTIAL walks the blocks in registration order and cuts
 * the list into P contiguous runs at the block boundaries nearest to
 * multiples of total/P. STRIDED keeps tensors whole: the distinct layer ids
 * are ranked 0..L-1 and rank l goes to fragment l mod P. A strategy with
 * fewer units (blocks or layers) than P fails with DISTRO_ERR_INVALID. */
#ifndef DISTRO_OPTIM_FRAGMENT_H
#define DISTRO_OPTIM_FRAGMENT_H

#include <stdint.h>
#include <distro/diloco.h>

typedef struct distro__piece {
  int tensor;
  int64_t offset, count;
} distro__piece;

typedef struct distro__fragments {
  int nfrag;
  int npieces;
  distro__piece *pieces; /* fragment-major */
  int *start;            /* nfrag + 1: fragment p is pieces[start[p] .. start[p+1]) */
  int64_t *numel;        /* nfrag: elements in each fragment */
  int nunits;            /* blocks (BALANCED, SEQUENTIAL) or layers (STRIDED) */
  int64_t max_unit;      /* elements in the largest block or layer */
} distro__fragments;

/* max_block <= 0 picks distro__fragments_auto_block(total, P). `layer` may
 * be NULL (layer i = tensor index i). */
distro_status distro__fragments_build(distro__fragments *f, distro_fragmenting strategy, int P, int ntensors,
                                      const int64_t *numel, const int *layer, int64_t max_block);
void distro__fragments_destroy(distro__fragments *f);

/* ceil(total / 8P) rounded up to a multiple of 64 (at least 64). */
int64_t distro__fragments_auto_block(int64_t total, int P);

/* Number of units the strategy would produce (without building). */
int64_t distro__fragments_units(distro_fragmenting strategy, int ntensors, const int64_t *numel, const int *layer,
                                int64_t max_block);

#endif
