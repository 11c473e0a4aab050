/* Internal: codecs for DiLoCo outer gradients (docs/diloco.md).
 *
 * A run of n float32 elements is encoded on its own; the block codecs cut it
 * into blocks of `block` elements (the last one shorter), each with a
 * float32 absmax scale s. Layouts, all little-endian:
 *   F32   n x float32                      exact
 *   BF16  n x bf16 (round to nearest even) |err| <= 2^-8 |x|
 *   INT8  nb x float32 scale | n x int8    s = absmax/127, |err| <= s/2
 *   INT4  nb x float32 scale | ceil(n/2)   s = absmax/7,   |err| <= s/2
 *         bytes, element j in the low nibble of byte j/2 when j is even,
 *         two's complement in [-7, 7]
 *   FP4   nb x float32 scale | ceil(n/2)   E3M0: bit 3 sign, bits 0-2 e;
 *         bytes, nibbles as INT4           e = 0 is 0, else s * 2^(e-7);
 *                                          s = absmax, |err| <= max(|x|/3, s*2^-7)
 * (nb = ceil(n / block); each bound is up to float rounding of the scale.)
 * Codes an encoder never writes (int8 -128, int4 -8, fp4 "negative zero",
 * a non-zero padding nibble) and non-finite values or scales are rejected by
 * distro__outer_check, so a decoded payload is always finite. */
#ifndef DISTRO_COMPRESS_OUTER_CODEC_H
#define DISTRO_COMPRESS_OUTER_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <distro/diloco.h>

int distro__outer_codec_known(int codec);
const char *distro__outer_codec_name(distro_outer_codec c);

/* Encoded size of n elements. */
size_t distro__outer_bytes(distro_outer_codec c, int64_t n, int block);

/* x must be finite. Writes exactly distro__outer_bytes(c, n, block) bytes. */
void distro__outer_encode(distro_outer_codec c, const float *x, int64_t n, int block, uint8_t *out);

/* DISTRO_OK, or DISTRO_ERR_PAYLOAD naming the first bad element/scale. */
distro_status distro__outer_check(distro_outer_codec c, const uint8_t *in, int64_t n, int block);

/* The header of every DiLoCo outer payload: dense (version 1, the pieces
 * encoded with an outer codec above) and sparse (version 2,
 * compress/outer_sparse.h). Integers little-endian.
 *   0 u32 magic "DLC1"   4 u16 version   6 u16 codec (sparse: distro_values)
 *   8 u32 learner       12 u32 fragment  16 u64 round (inner steps completed
 *  at the send)  24 u64 tokens (the learner's, since the fragment's last
 *  send)  32 u64 steps (since that send)  40 u64 elements
 *  48 u32 flags (bit 0: abort, no data; bit 1: sparse with the DCT)
 *  52 u32 codec block (sparse: chunk edge)
 * The payload ends with the CRC32C of everything before it. */
#define DISTRO__DLC_MAGIC 0x31434c44u
#define DISTRO__DLC_VERSION 1
#define DISTRO__DLC_HEADER 56
#define DISTRO__DLC_FLAG_ABORT 1u

typedef struct distro__dlc_head {
  unsigned version, codec;
  uint32_t learner, fragment;
  uint64_t round, tokens, steps, elements;
  uint32_t flags, block;
} distro__dlc_head;

void distro__dlc_put_header(uint8_t *b, const distro__dlc_head *h);

/* Checks a received payload of `size` (>= DISTRO__DLC_HEADER + 4) bytes in
 * slot `slot`, in order: its CRC32C, magic and version, codec and block,
 * that the learner field is the slot, fragment and round, elements, flags
 * (besides abort, exactly want->flags) and the abort flag. Fills *got.
 * DISTRO_ERR_PAYLOAD names the learner and the fragment. */
distro_status distro__dlc_check_header(const uint8_t *b, size_t size, int slot, const distro__dlc_head *want,
                                       distro__dlc_head *got);

/* Decodes a checked run into out[0..n-1]. */
void distro__outer_decode(distro_outer_codec c, const uint8_t *in, int64_t n, int block, float *out);

/* acc[j] = coef * x[j] (first) or acc[j] += coef * x[j], x the decoded run:
 * the same bits as decoding, then scaling and adding. */
void distro__outer_decode_axpy(distro_outer_codec c, const uint8_t *in, int64_t n, int block, float coef, float *acc,
                               int first);

#endif
