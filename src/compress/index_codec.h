/* Internal: codecs for each chunk's sorted set of k in-chunk indices (wire v2).
 *
 *   FIXED  u8 / u16 / u32 per index, by chunk size (the v1 layout)
 *   PACK12 12 bits per index (chunks of at most 4096 elements)
 *   RICE   gaps between consecutive indices, Rice-coded with a per-tensor
 *          parameter b
 *   ENUM   the set's rank in the combinatorial number system, in exactly
 *          ceil(log2 C(n, k)) bits per chunk (when C(n, k) < 2^127)
 *
 * The encoder picks, per tensor, whichever gives the fewest bytes. */
#ifndef DISTRO_COMPRESS_INDEX_CODEC_H
#define DISTRO_COMPRESS_INDEX_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "compress/codec_fault.h"

typedef enum {
  DISTRO__IDX_FIXED = 0,
  DISTRO__IDX_PACK12 = 1,
  DISTRO__IDX_RICE = 2,
  DISTRO__IDX_ENUM = 3
} distro__idx_codec;

/* Binomial table for ENUM on chunks of n elements with k kept:
 * C(c, i) for c < n, i <= k. NULL when ENUM does not apply. */
typedef struct distro__enum_table {
  int64_t n, k;
  int bits; /* ceil(log2 C(n, k)) */
  unsigned __int128 *c; /* c[i*n + r] = C(r, i), i <= k, r < n: by i, so the
                           decoder's searches run along one row */
} distro__enum_table;

/* Returns 0 and leaves t->c NULL when ENUM cannot code (n, k). */
int distro__enum_table_init(distro__enum_table *t, int64_t n, int64_t k);
void distro__enum_table_destroy(distro__enum_table *t);

/* Chooses the smallest codec for `nchunks` chunks of `k` sorted indices in
 * [0, n); writes codec and parameter and returns the section's bytes. */
size_t distro__idx_choose(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, const distro__enum_table *et,
                          distro__idx_codec *codec, int *param);

/* Encodes into out (cap bytes); returns bytes written, 0 on overflow. */
size_t distro__idx_encode(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, const distro__enum_table *et,
                          distro__idx_codec codec, int param, uint8_t *out, size_t cap);

/* Decodes a section of exactly `len` bytes; checks that every chunk's
 * indices are strictly increasing and < n and that the section holds
 * nothing else. The fault: DISTRO__CODEC_INDEX_ORDER with the first bad
 * chunk, or DISTRO__CODEC_INDEX_SECTION when the section's length, trailing
 * bits, codec or parameter are wrong. */
distro__codec_fault distro__idx_decode(const uint8_t *in, size_t len, int64_t nchunks, int64_t k, int64_t n,
                                       const distro__enum_table *et, distro__idx_codec codec, int param, uint32_t *idx);

#endif
