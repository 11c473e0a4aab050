/* Internal: codecs for the kept coefficients' values (wire v2).
 *
 *   F32    4 bytes each
 *   BF16   bf16 (round to nearest even), coded losslessly in fewer bits:
 *          per chunk the largest exponent (8 bits), per value sign (1),
 *          mantissa (7) and the exponent's distance below the chunk's
 *          largest, Rice-coded with a per-tensor parameter
 *   SIGN1  1 bit per value; receivers use +-1
 *   INT8   per chunk a bf16 scale, then value/scale rounded to [-127, 127]
 *   INT4   per chunk a bf16 scale, then value/scale rounded to [-7, 7]
 *   INT2   per chunk a bf16 scale s >= absmax/2, then 2-bit codes c for
 *          the levels (c - 3/2) s: floor(value/s) clamped to [-2, 1], so
 *          |error| <= s/2; a zero scale only with code 2 (level +0)
 * Decoded values are what every rank aggregates, the sender's own included. */
#ifndef DISTRO_COMPRESS_VALUE_CODEC_H
#define DISTRO_COMPRESS_VALUE_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <distro/optim.h>

#include "compress/codec_fault.h"

/* BF16 parameter for plain 16-bit words (when the exponent code is larger). */
#define DISTRO__BF16_RAW 15

/* The largest value section of nchunks x k values (the exact size for
 * every codec but BF16, whose coded size depends on the data). */
size_t distro__val_bound(distro_values v, int64_t nchunks, int64_t k);
/* Bytes the section will take and the codec parameter (BF16's Rice b). */
size_t distro__val_plan(distro_values v, const float *val, int64_t nchunks, int64_t k, int *param);
/* Returns bytes written, 0 if cap was too small. */
size_t distro__val_encode(distro_values v, int param, const float *val, int64_t nchunks, int64_t k, uint8_t *out,
                          size_t cap);
/* Decodes exactly `len` bytes. The fault is DISTRO__CODEC_VALUES when the
 * section is malformed (wrong length, non-zero padding, a parameter or a
 * code no encoder writes, a non-finite value or scale), with the chunk
 * where one is to blame. */
distro__codec_fault distro__val_decode(distro_values v, int param, const uint8_t *in, size_t len, int64_t nchunks,
                                       int64_t k, float *val);

#endif
