/* Codecs for DiLoCo outer gradients; formats and error bounds in
 * outer_codec.h. Every function is element- or block-wise, so the result
 * does not depend on the OpenMP thread count. */
#include "compress/outer_codec.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "compress/wire.h"

#define PAR_MIN 32768 /* elements below which a run is handled by one thread */

int distro__outer_codec_known(int c) {
  return c == DISTRO_OUTER_F32 || c == DISTRO_OUTER_BF16 || c == DISTRO_OUTER_INT8 || c == DISTRO_OUTER_INT4 ||
         c == DISTRO_OUTER_FP4;
}

const char *distro__outer_codec_name(distro_outer_codec c) {
  switch (c) {
    case DISTRO_OUTER_F32: return "f32";
    case DISTRO_OUTER_BF16: return "bf16";
    case DISTRO_OUTER_INT8: return "int8";
    case DISTRO_OUTER_INT4: return "int4";
    case DISTRO_OUTER_FP4: return "fp4";
  }
  return "?";
}

static int64_t nblocks(int64_t n, int block) { return (n + block - 1) / block; }

size_t distro__outer_bytes(distro_outer_codec c, int64_t n, int block) {
  const size_t scales = 4 * (size_t)nblocks(n, block);
  switch (c) {
    case DISTRO_OUTER_F32: return 4 * (size_t)n;
    case DISTRO_OUTER_BF16: return 2 * (size_t)n;
    case DISTRO_OUTER_INT8: return scales + (size_t)n;
    case DISTRO_OUTER_INT4:
    case DISTRO_OUTER_FP4: return scales + (size_t)(n + 1) / 2;
  }
  return 0;
}


static float get_f32(const uint8_t *p) {
  float x;
  memcpy(&x, p, 4);
  return x;
}

static int qmax_of(distro_outer_codec c) { return c == DISTRO_OUTER_INT8 ? 127 : 7; }

/* E3M0 code of y = |x| / s in [0, 1]: 0, or e in 1..7 for 2^(e-7), nearest
 * in linear distance: the number of thresholds 2^-7 (half of the smallest
 * magnitude) and 1.5 * 2^k (k = -6..-1, midpoints) that y reaches. */
static const float fp4_threshold[7] = {0x1p-7f, 0x1.8p-6f, 0x1.8p-5f, 0x1.8p-4f, 0x1.8p-3f, 0x1.8p-2f, 0x1.8p-1f};
static const float fp4_value[8] = {0.0f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 1.0f};

static inline unsigned fp4_code(float y) {
  unsigned e = 0;
  for (int i = 0; i < 7; i++) e += y >= fp4_threshold[i];
  return e;
}

/* roundf (half away from zero) without a libm call: |v| is small. */
static inline int round_int(float v) {
  int q = (int)v; /* toward zero */
  const float r = v - (float)q; /* exact */
  return q + (r >= 0.5f) - (r <= -0.5f);
}

/* One block of the INT8/INT4/FP4 codecs: scale, then codes. */
static void encode_block(distro_outer_codec c, const float *x, int64_t n, float *scale_out, uint8_t *codes,
                         int64_t first) {
  float amax = 0.0f;
  for (int64_t j = 0; j < n; j++) {
    float a = fabsf(x[j]);
    if (a > amax) amax = a;
  }
  float s = c == DISTRO_OUTER_FP4 ? amax : amax / (float)qmax_of(c);
  *scale_out = s;
  for (int64_t j = 0; j < n; j++) {
    unsigned code;
    if (c == DISTRO_OUTER_FP4) {
      code = s > 0.0f ? fp4_code(fabsf(x[j]) / s) : 0u;
      if (code && x[j] < 0.0f) code |= 8u;
    } else {
      const int qm = qmax_of(c);
      int q = s > 0.0f ? round_int(x[j] / s) : 0;
      if (q > qm) q = qm;
      if (q < -qm) q = -qm;
      code = (unsigned)q;
    }
    const int64_t at = first + j;
    if (c == DISTRO_OUTER_INT8) {
      codes[at] = (uint8_t)code;
    } else {
      code &= 15u;
      if (at & 1) codes[at >> 1] = (uint8_t)(codes[at >> 1] | code << 4);
      else codes[at >> 1] = (uint8_t)code; /* even first: the block starts the byte */
    }
  }
}

void distro__outer_encode(distro_outer_codec c, const float *x, int64_t n, int block, uint8_t *out) {
  if (c == DISTRO_OUTER_F32) {
    memcpy(out, x, 4 * (size_t)n);
    return;
  }
  if (c == DISTRO_OUTER_BF16) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t j = 0; j < n; j++) {
      distro__put_u16(out + 2 * j, distro__bf16_from_float(x[j]));
    }
    return;
  }
  const int64_t nb = nblocks(n, block);
  uint8_t *codes = out + 4 * (size_t)nb;
  /* Nibble codecs: an odd block size puts two blocks in one byte; handle
   * such blocks on one thread so no byte is written by two. */
  const int shared_bytes = c != DISTRO_OUTER_INT8 && (block & 1);
  (void)shared_bytes; /* read by the pragma only: unused without OpenMP */
  if (c != DISTRO_OUTER_INT8 && (n & 1)) codes[n >> 1] = 0; /* padding nibble */
#pragma omp parallel for schedule(static) if (n > PAR_MIN && !shared_bytes)
  for (int64_t b = 0; b < nb; b++) {
    const int64_t lo = b * block, len = lo + block <= n ? block : n - lo;
    float s;
    encode_block(c, x + lo, len, &s, codes, lo);
    memcpy(out + 4 * b, &s, 4);
  }
}

distro_status distro__outer_check(distro_outer_codec c, const uint8_t *in, int64_t n, int block) {
  if (c == DISTRO_OUTER_F32) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > PAR_MIN)
    for (int64_t j = 0; j < n; j++) bad |= !isfinite(get_f32(in + 4 * j));
    if (bad)
      for (int64_t j = 0; j < n; j++)
        if (!isfinite(get_f32(in + 4 * j)))
          return distro__fail(DISTRO_ERR_PAYLOAD, "f32 outer gradient element %lld is not finite", (long long)j);
    return DISTRO_OK;
  }
  if (c == DISTRO_OUTER_BF16) {
    for (int64_t j = 0; j < n; j++)
      if (((in[2 * j + 1] & 0x7f) == 0x7f) && (in[2 * j] & 0x80))
        return distro__fail(DISTRO_ERR_PAYLOAD, "bf16 outer gradient element %lld is not finite", (long long)j);
    return DISTRO_OK;
  }
  const int64_t nb = nblocks(n, block);
  const float smax = c == DISTRO_OUTER_FP4 ? FLT_MAX : FLT_MAX / (float)qmax_of(c);
  for (int64_t b = 0; b < nb; b++) {
    float s = get_f32(in + 4 * b);
    if (!(s >= 0.0f && s <= smax))
      return distro__fail(DISTRO_ERR_PAYLOAD, "%s outer gradient: scale of block %lld is %g (must be finite, >= 0)",
                          distro__outer_codec_name(c), (long long)b, (double)s);
  }
  const uint8_t *codes = in + 4 * (size_t)nb;
  if (c == DISTRO_OUTER_INT8) {
    const uint8_t *hit = memchr(codes, 0x80, (size_t)n);
    if (hit)
      return distro__fail(DISTRO_ERR_PAYLOAD, "int8 outer gradient: code -128 at element %lld",
                          (long long)(hit - codes));
    return DISTRO_OK;
  }
  const int64_t nbytes = (n + 1) / 2;
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > PAR_MIN)
  for (int64_t j = 0; j < nbytes; j++) bad |= (codes[j] & 15u) == 8u || (codes[j] >> 4) == 8u;
  if (bad)
    for (int64_t j = 0; j < n; j++)
      if (((codes[j >> 1] >> (4 * (j & 1))) & 15u) == 8u)
        return distro__fail(DISTRO_ERR_PAYLOAD, "%s outer gradient: invalid code 8 at element %lld",
                            distro__outer_codec_name(c), (long long)j);
  if ((n & 1) && (codes[n >> 1] >> 4))
    return distro__fail(DISTRO_ERR_PAYLOAD, "%s outer gradient: non-zero padding", distro__outer_codec_name(c));
  return DISTRO_OK;
}

/* Decoded element j of a checked run (scale s of its block for the block
 * codecs). */
static inline float decoded(distro_outer_codec c, const uint8_t *in, const uint8_t *codes, int64_t j, float s) {
  switch (c) {
    case DISTRO_OUTER_F32: return get_f32(in + 4 * j);
    case DISTRO_OUTER_BF16: return distro__bf16_to_float(distro__get_u16(in + 2 * j));
    case DISTRO_OUTER_INT8: return (float)(int8_t)codes[j] * s;
    case DISTRO_OUTER_INT4: {
      const unsigned code = (codes[j >> 1] >> (4 * (j & 1))) & 15u;
      return (float)(code & 8u ? (int)code - 16 : (int)code) * s;
    }
    case DISTRO_OUTER_FP4: {
      const unsigned code = (codes[j >> 1] >> (4 * (j & 1))) & 15u;
      const float v = s * fp4_value[code & 7u]; /* a power of two: exact, as ldexpf */
      return code & 8u ? -v : v;
    }
  }
  return 0.0f;
}

/* mode 0: out = x; 1: out = coef * x; 2: out += coef * x. */
static void decode_into(distro_outer_codec c, const uint8_t *in, int64_t n, int block, float coef, float *out, int mode) {
  const int scaled = c == DISTRO_OUTER_INT8 || c == DISTRO_OUTER_INT4 || c == DISTRO_OUTER_FP4;
  const int64_t nb = scaled ? nblocks(n, block) : 1, len = scaled ? block : n;
  const uint8_t *codes = scaled ? in + 4 * (size_t)nb : in;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
  for (int64_t b = 0; b < nb; b++) {
    const float s = scaled ? get_f32(in + 4 * b) : 0.0f;
    const int64_t lo = b * len, hi = lo + len <= n ? lo + len : n;
    if (mode == 0)
      for (int64_t j = lo; j < hi; j++) out[j] = decoded(c, in, codes, j, s);
    else if (mode == 1)
      for (int64_t j = lo; j < hi; j++) out[j] = coef * decoded(c, in, codes, j, s);
    else
      for (int64_t j = lo; j < hi; j++) out[j] += coef * decoded(c, in, codes, j, s);
  }
}

void distro__outer_decode(distro_outer_codec c, const uint8_t *in, int64_t n, int block, float *out) {
  if (c == DISTRO_OUTER_F32) {
    memcpy(out, in, 4 * (size_t)n);
    return;
  }
  decode_into(c, in, n, block, 1.0f, out, 0);
}

void distro__outer_decode_axpy(distro_outer_codec c, const uint8_t *in, int64_t n, int block, float coef, float *acc,
                               int first) {
  decode_into(c, in, n, block, coef, acc, first ? 1 : 2);
}

/* ---- payload header ------------------------------------------------------- */

void distro__dlc_put_header(uint8_t *b, const distro__dlc_head *h) {
  memset(b, 0, DISTRO__DLC_HEADER);
  distro__put_u32(b, DISTRO__DLC_MAGIC);
  distro__put_u16(b + 4, (uint16_t)h->version);
  distro__put_u16(b + 6, (uint16_t)h->codec);
  distro__put_u32(b + 8, h->learner);
  distro__put_u32(b + 12, h->fragment);
  distro__put_u64(b + 16, h->round);
  distro__put_u64(b + 24, h->tokens);
  distro__put_u64(b + 32, h->steps);
  distro__put_u64(b + 40, h->elements);
  distro__put_u32(b + 48, h->flags);
  distro__put_u32(b + 52, h->block);
}

distro_status distro__dlc_check_header(const uint8_t *b, size_t size, int r, const distro__dlc_head *want,
                                       distro__dlc_head *got) {
  const unsigned p = want->fragment;
  if (distro__get_u32(b + size - 4) != distro__crc32c(b, size - 4))
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's payload for fragment %u failed its checksum", r, p);
  if (distro__get_u32(b) != DISTRO__DLC_MAGIC || distro__get_u16(b + 4) != want->version)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's payload is not an outer payload of version %u", r,
                        want->version);
  if (distro__get_u16(b + 6) != want->codec || distro__get_u32(b + 52) != want->block)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d used a different codec or codec block", r);
  if (distro__get_u32(b + 8) != (uint32_t)r)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: the payload in learner %d's slot says it is from learner %u", r,
                        distro__get_u32(b + 8));
  if (distro__get_u32(b + 12) != p || distro__get_u64(b + 16) != want->round)
    return distro__fail(DISTRO_ERR_PAYLOAD,
                        "diloco: learner %d sent fragment %u of step %llu, expected fragment %u of step %llu", r,
                        distro__get_u32(b + 12), (unsigned long long)distro__get_u64(b + 16), p,
                        (unsigned long long)want->round);
  if (distro__get_u64(b + 40) != want->elements)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's fragment %u has %llu elements, expected %llu", r, p,
                        (unsigned long long)distro__get_u64(b + 40), (unsigned long long)want->elements);
  const uint32_t flags = distro__get_u32(b + 48);
  if ((flags & ~DISTRO__DLC_FLAG_ABORT) != want->flags)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d set flags 0x%x, expected 0x%x (besides abort)", r,
                        flags, want->flags);
  if (flags & DISTRO__DLC_FLAG_ABORT)
    return distro__fail(DISTRO_ERR_PAYLOAD, "diloco: learner %d's outer gradient for fragment %u is not finite", r, p);
  *got = *want;
  got->tokens = distro__get_u64(b + 24);
  got->steps = distro__get_u64(b + 32);
  return DISTRO_OK;
}
