/* Value codecs of wire v2. See value_codec.h. */
#include "compress/value_codec.h"

#include <math.h>
#include <string.h>

#include "compress/bits.h"
#include "compress/frame.h"

/* bf16 fields: sign 1, exponent 8, mantissa 7. */
static inline int bf16_exp(uint16_t b) { return (b >> 7) & 0xff; }

static int chunk_max_exp(const float *v, int64_t k) {
  int e = 0;
  for (int64_t j = 0; j < k; j++) {
    int ej = bf16_exp(distro__bf16_from_float(v[j]));
    if (ej > e) e = ej;
  }
  return e;
}

/* Largest-scale quantizer: q = round(v / s) with s a bf16 rounded up so
 * that |q| <= qmax always holds, and small enough that qmax * s stays finite
 * (values beyond that, near FLT_MAX, saturate). */
static uint16_t quant_scale(const float *v, int64_t k, int qmax) {
  float amax = 0.0f;
  for (int64_t j = 0; j < k; j++) { /* NaN is skipped, as fmaxf would (inline: no libm call per value) */
    const float a = fabsf(v[j]);
    amax = a > amax ? a : amax;
  }
  if (amax == 0.0f) return 0;
  float s = amax / (float)qmax;
  uint16_t b = distro__bf16_from_float(s);
  while (distro__bf16_to_float(b) * (float)qmax < amax && (b & 0x7f80u) != 0x7f80u) b++; /* round up */
  while (!isfinite(distro__bf16_to_float(b) * (float)qmax)) b--;
  return b;
}

static inline int quantize(float v, float s, int qmax) {
  if (s == 0.0f) return 0;
  long q = lrintf(v / s);
  return (int)(q > qmax ? qmax : q < -qmax ? -qmax : q);
}

/* INT2: the code c in 0..3 of the level (c - 3/2) s nearest to v, for
 * |v| <= 2s: floor(v / s) + 2, clamped (v = 2s lands on the top level). */
static inline unsigned quantize2(float v, float s) {
  if (s == 0.0f) return 2u;
  const float q = floorf(v / s);
  return q >= 1.0f ? 3u : q <= -2.0f ? 0u : (unsigned)(int)q + 2u;
}

static uint64_t bf16_bits(const float *val, int64_t nchunks, int64_t k, int b) {
  uint64_t bits = 0;
  for (int64_t c = 0; c < nchunks; c++) {
    const float *v = val + c * k;
    int emax = chunk_max_exp(v, k);
    bits += 8;
    for (int64_t j = 0; j < k; j++)
      bits += 8 + ((uint64_t)(emax - bf16_exp(distro__bf16_from_float(v[j]))) >> b) + 1 + (uint64_t)b;
  }
  return bits;
}

size_t distro__val_bound(distro_values v, int64_t nchunks, int64_t k) {
  const uint64_t count = (uint64_t)nchunks * (uint64_t)k;
  switch (v) {
    case DISTRO_VALUES_F32: return 4 * count;
    case DISTRO_VALUES_BF16: return 2 * count; /* plain words, when the exponent code is larger */
    case DISTRO_VALUES_SIGN1: return (count + 7) / 8;
    case DISTRO_VALUES_INT8: return (uint64_t)nchunks * 2 + count;
    case DISTRO_VALUES_INT4: return (uint64_t)nchunks * 2 + (count + 1) / 2;
    case DISTRO_VALUES_INT2: return (uint64_t)nchunks * 2 + (count + 3) / 4;
  }
  return 0;
}

size_t distro__val_plan(distro_values v, const float *val, int64_t nchunks, int64_t k, int *param) {
  const uint64_t count = (uint64_t)nchunks * (uint64_t)k;
  *param = 0;
  switch (v) {
    case DISTRO_VALUES_F32:
    case DISTRO_VALUES_SIGN1:
    case DISTRO_VALUES_INT8:
    case DISTRO_VALUES_INT4:
    case DISTRO_VALUES_INT2: return distro__val_bound(v, nchunks, k); /* the size is fixed */
    case DISTRO_VALUES_BF16: {
      /* Plain 16-bit words (param 15) unless the exponent code is smaller. */
      uint64_t best = 16 * count;
      *param = DISTRO__BF16_RAW;
      for (int b = 0; b <= 3; b++) {
        uint64_t bits = bf16_bits(val, nchunks, k, b);
        if (bits < best) {
          best = bits;
          *param = b;
        }
      }
      return (size_t)((best + 7) / 8);
    }
  }
  return 0;
}

size_t distro__val_encode(distro_values v, int param, const float *val, int64_t nchunks, int64_t k, uint8_t *out,
                          size_t cap) {
  const int64_t count = nchunks * k;
  distro__bitw w;
  distro__bitw_init(&w, out, cap);
  switch (v) {
    case DISTRO_VALUES_F32:
      if ((size_t)count * 4 > cap) return 0;
      memcpy(out, val, (size_t)count * 4);
      return (size_t)count * 4;
    case DISTRO_VALUES_SIGN1:
      for (int64_t j = 0; j < count; j++) distro__bitw_put(&w, signbit(val[j]) ? 1 : 0, 1);
      break;
    case DISTRO_VALUES_BF16:
      if (param == DISTRO__BF16_RAW) {
        for (int64_t j = 0; j < count; j++) distro__bitw_put(&w, distro__bf16_from_float(val[j]), 16);
        break;
      }
      for (int64_t c = 0; c < nchunks; c++) {
        const float *cv = val + c * k;
        int emax = chunk_max_exp(cv, k);
        distro__bitw_put(&w, (uint64_t)emax, 8);
        for (int64_t j = 0; j < k; j++) {
          uint16_t b = distro__bf16_from_float(cv[j]);
          distro__bitw_put(&w, (uint64_t)(b >> 15), 1);
          distro__bitw_put(&w, b & 0x7fu, 7);
          distro__bitw_rice(&w, (uint64_t)(emax - bf16_exp(b)), param);
        }
      }
      break;
    case DISTRO_VALUES_INT8:
    case DISTRO_VALUES_INT4:
    case DISTRO_VALUES_INT2: {
      /* INT2: the scale rounds absmax/2 up, so every |value| <= 2s. */
      const int qmax = v == DISTRO_VALUES_INT8 ? 127 : v == DISTRO_VALUES_INT4 ? 7 : 2;
      const int bits = v == DISTRO_VALUES_INT8 ? 8 : v == DISTRO_VALUES_INT4 ? 4 : 2;
      /* Scales first, then the values: two writers into the one zeroed
       * buffer, so each chunk's scale is computed once. */
      distro__bitw ws = w;
      w.pos = (size_t)nchunks * 16;
      for (int64_t c = 0; c < nchunks; c++) {
        const uint16_t sb = quant_scale(val + c * k, k, qmax);
        distro__bitw_put(&ws, sb, 16);
        const float s = distro__bf16_to_float(sb);
        for (int64_t j = 0; j < k; j++) {
          const uint64_t q = v == DISTRO_VALUES_INT2 ? quantize2(val[c * k + j], s)
                                                     : (uint64_t)(quantize(val[c * k + j], s, qmax) & ((1 << bits) - 1));
          distro__bitw_put(&w, q, bits);
        }
      }
      w.overflow |= ws.overflow;
      break;
    }
  }
  return w.overflow ? 0 : distro__bitw_bytes(&w);
}

distro__codec_fault distro__val_decode(distro_values v, int param, const uint8_t *in, size_t len, int64_t nchunks,
                                       int64_t k, float *val) {
  const int64_t count = nchunks * k;
  const distro__codec_fault section = distro__codec_fault_at(DISTRO__CODEC_VALUES, -1);
#define BAD_CHUNK(c) distro__codec_fault_at(DISTRO__CODEC_VALUES, (c))
  distro__bitr r;
  distro__bitr_init(&r, in, len);
  switch (v) {
    case DISTRO_VALUES_F32:
      if (len != (size_t)count * 4) return section;
      memcpy(val, in, len);
      for (int64_t j = 0; j < count; j++)
        if (!isfinite(val[j])) return BAD_CHUNK(j / k);
      return DISTRO__CODEC_NO_FAULT;
    case DISTRO_VALUES_SIGN1:
      for (int64_t j = 0; j < count; j++) val[j] = distro__bitr_get(&r, 1) ? -1.0f : 1.0f;
      break;
    case DISTRO_VALUES_BF16:
      if (param == DISTRO__BF16_RAW) {
        for (int64_t j = 0; j < count && !r.error; j++) {
          val[j] = distro__bf16_to_float((uint16_t)distro__bitr_get(&r, 16));
          if (!isfinite(val[j])) return BAD_CHUNK(j / k);
        }
        break;
      }
      if (param < 0 || param > 3) return section;
      for (int64_t c = 0; c < nchunks && !r.error; c++) {
        int emax = (int)distro__bitr_get(&r, 8);
        for (int64_t j = 0; j < k && !r.error; j++) {
          uint32_t sign = (uint32_t)distro__bitr_get(&r, 1), man = (uint32_t)distro__bitr_get(&r, 7);
          uint64_t d = distro__bitr_rice(&r, param, 255u >> param);
          if (d > (uint64_t)emax) return BAD_CHUNK(c);
          uint16_t b = (uint16_t)(sign << 15 | (uint32_t)(emax - (int)d) << 7 | man);
          float x = distro__bf16_to_float(b);
          if (!isfinite(x)) return BAD_CHUNK(c);
          val[c * k + j] = x;
        }
      }
      break;
    case DISTRO_VALUES_INT8:
    case DISTRO_VALUES_INT4: {
      const int qmax = v == DISTRO_VALUES_INT8 ? 127 : 7, bits = v == DISTRO_VALUES_INT8 ? 8 : 4;
      const uint8_t *scales = in;
      if (len < (size_t)nchunks * 2) return section;
      distro__bitr_init(&r, in + nchunks * 2, len - (size_t)nchunks * 2);
      for (int64_t c = 0; c < nchunks; c++) {
        float s = distro__bf16_to_float((uint16_t)(scales[2 * c] | scales[2 * c + 1] << 8));
        if (!isfinite(s) || s < 0) return BAD_CHUNK(c);
        for (int64_t j = 0; j < k; j++) {
          int q = (int)distro__bitr_get(&r, bits);
          if (q >= 1 << (bits - 1)) q -= 1 << bits; /* sign-extend */
          if (q < -qmax) return BAD_CHUNK(c);       /* -128 / -8 are never written */
          val[c * k + j] = (float)q * s;
          if (!isfinite(val[c * k + j])) return BAD_CHUNK(c); /* a scale no encoder writes */
        }
      }
      if (r.error) return section;
      if ((r.pos + 7) / 8 != r.len || (r.pos % 8 && (r.buf[r.len - 1] >> (r.pos % 8)))) return section;
      return DISTRO__CODEC_NO_FAULT;
    }
    case DISTRO_VALUES_INT2: {
      if (len < (size_t)nchunks * 2) return section;
      const uint8_t *scales = in;
      distro__bitr_init(&r, in + nchunks * 2, len - (size_t)nchunks * 2);
      for (int64_t c = 0; c < nchunks; c++) {
        const uint16_t raw = (uint16_t)(scales[2 * c] | scales[2 * c + 1] << 8);
        const float s = distro__bf16_to_float(raw);
        if ((raw & 0x8000u) || !isfinite(2.0f * s)) return BAD_CHUNK(c); /* encoders write 0 <= s, 2s finite */
        for (int64_t j = 0; j < k; j++) {
          const unsigned code = (unsigned)distro__bitr_get(&r, 2);
          if (s == 0.0f && code != 2u) return BAD_CHUNK(c); /* the only code written with a zero scale */
          val[c * k + j] = ((float)code - 1.5f) * s;
        }
      }
      if (r.error) return section;
      if ((r.pos + 7) / 8 != r.len || (r.pos % 8 && (r.buf[r.len - 1] >> (r.pos % 8)))) return section;
      return DISTRO__CODEC_NO_FAULT;
    }
  }
#undef BAD_CHUNK
  if (r.error) return section;
  if ((r.pos + 7) / 8 != len) return section;
  if (r.pos % 8 && (in[len - 1] >> (r.pos % 8))) return section;
  return DISTRO__CODEC_NO_FAULT;
}
