/* Wire v2 section codecs (docs/wire-format.md, "Wire format v2"), part 3: the
 * five value codecs (F32, BF16, SIGN1, INT8, INT4). Every section is checked
 * against an independent bit-by-bit reference writer built from the document,
 * round-tripped, and mutated to check that the decoder rejects it. Bit
 * streams and the document's examples are in test_codecs_bits.c, the index
 * codecs in test_codecs_index.c.
 *
 * Inputs are fresh random each run (DISTRO_TEST_SEED reproduces one); the seed
 * is in every failure message. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs_util.h"
#include "compress/bits.h"
#include "compress/value_codec.h"
#include "compress/wire.h"
#include "testutil.h"
#include "wire_ref.h"

/* ========================================================== value codecs */

/* Values over many binades, with signed zeros, subnormals and extremes. */
static float value_of(tu_rng *r, int kind) {
  uint64_t u = tu_next(r);
  switch (kind) {
    case 0: /* mixed */
      switch (u % 16) {
        case 0: return 0.0f;
        case 1: return -0.0f;
        default: return (float)(tu_normal(r) * ldexp(1.0, (int)((u >> 8) % 41) - 20));
      }
    case 1: { /* every finite binade, subnormals included */
      uint32_t e = (uint32_t)((u >> 8) % 255), m = (uint32_t)(u >> 32) & 0x7fffffu, s = (uint32_t)(u & 1) << 31;
      return u2f(s | e << 23 | m);
    }
    case 2: /* one binade: the exponent code's best case */
      return (float)((u & 1 ? -1 : 1) * (1.0 + tu_uniform(r)) * 0.25);
    case 3: return u & 1 ? -0.0f : 0.0f;
    default: { /* near the top: BF16 saturates */
      static const uint32_t edge[] = {0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x00000001u, 0x80000001u, 0x00800000u};
      return u % 3 ? u2f(edge[(u >> 8) % 6]) : (float)tu_normal(r);
    }
  }
}

static const int64_t vshape[][2] = {{1, 1}, {3, 4}, {16, 32}, {7, 5}, {1, 4096}, {100, 3}, {2, 65}};
#define NVSHAPE ((int)(sizeof vshape / sizeof vshape[0]))

static int bexp(uint16_t b) { return (b >> 7) & 0xff; }

/* Reference BF16 section: raw words (param 15) or the exponent code. */
static size_t ref_bf16(const float *v, int64_t nchunks, int64_t k, int param, uint8_t *out, size_t cap) {
  rbits w;
  rinit(&w, out, cap);
  for (int64_t c = 0; c < nchunks; c++) {
    const float *cv = v + c * k;
    if (param == DISTRO__BF16_RAW) {
      for (int64_t j = 0; j < k; j++) rput(&w, distro__bf16_from_float(cv[j]), 16);
      continue;
    }
    int emax = 0;
    for (int64_t j = 0; j < k; j++)
      if (bexp(distro__bf16_from_float(cv[j])) > emax) emax = bexp(distro__bf16_from_float(cv[j]));
    rput(&w, (uint64_t)emax, 8);
    for (int64_t j = 0; j < k; j++) {
      uint16_t b = distro__bf16_from_float(cv[j]);
      rput(&w, b >> 15, 1);
      rput(&w, b & 0x7f, 7);
      rrice(&w, (uint64_t)(emax - bexp(b)), param);
    }
  }
  return rbytes(&w);
}

/* Smallest positive bf16 s with s * qmax >= amax (exact), 0 for amax 0. */
static uint16_t ref_scale(double amax, int qmax) {
  if (amax == 0) return 0;
  uint32_t lo = 0, hi = 0x7f7f; /* positive finite patterns are ordered */
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if ((double)distro__bf16_to_float((uint16_t)mid) * qmax >= amax) hi = mid;
    else lo = mid + 1;
  }
  return (uint16_t)lo;
}

/* Reference INT8/INT4 section: all scales (u16), then every q. */
static size_t ref_int(const float *v, int64_t nchunks, int64_t k, int qmax, int bits, uint8_t *out, size_t cap,
                      int *q) {
  rbits w;
  rinit(&w, out, cap);
  uint16_t *sc = malloc(sizeof(uint16_t) * (size_t)nchunks);
  cr_assert(sc);
  for (int64_t c = 0; c < nchunks; c++) {
    double amax = 0;
    for (int64_t j = 0; j < k; j++) amax = fmax(amax, fabs((double)v[c * k + j]));
    sc[c] = ref_scale(amax, qmax);
    rput(&w, sc[c], 16);
  }
  for (int64_t c = 0; c < nchunks; c++) {
    const float s = distro__bf16_to_float(sc[c]);
    for (int64_t j = 0; j < k; j++) {
      long qq = s == 0.0f ? 0 : lrintf(v[c * k + j] / s);
      cr_assert(qq >= -qmax && qq <= qmax, "reference q %ld outside +-%d", qq, qmax);
      q[c * k + j] = (int)qq;
      rput(&w, (uint64_t)qq & mask64(bits), bits);
    }
  }
  free(sc);
  return rbytes(&w);
}

Test(codecs, values_f32_sign1_exact) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int s = 0; s < NVSHAPE; s++)
    for (int kind = 0; kind < 5; kind++) {
      const int64_t nchunks = vshape[s][0], k = vshape[s][1], count = nchunks * k;
      float *v = malloc(sizeof(float) * (size_t)count), *back = malloc(sizeof(float) * (size_t)count);
      uint8_t *buf = malloc((size_t)count * 4 + 8), *ref = malloc((size_t)count * 4 + 8);
      cr_assert(v && back && buf && ref);
      for (int64_t j = 0; j < count; j++) v[j] = value_of(&r, kind);
      /* F32: the bytes of the floats. */
      int param = -1;
      cr_assert_eq(distro__val_plan(DISTRO_VALUES_F32, v, nchunks, k, &param), (size_t)count * 4);
      cr_assert_eq(param, 0);
      /* (A failed encode may leave the buffer cleared: check it first.) */
      cr_assert_eq(distro__val_encode(DISTRO_VALUES_F32, 0, v, nchunks, k, buf, (size_t)count * 4 - 1), 0);
      cr_assert_eq(distro__val_encode(DISTRO_VALUES_F32, 0, v, nchunks, k, buf, (size_t)count * 4), (size_t)count * 4);
      cr_assert_eq(memcmp(buf, v, (size_t)count * 4), 0);
      cr_assert_eq(distro__val_decode(DISTRO_VALUES_F32, 0, buf, (size_t)count * 4, nchunks, k, back).kind,
                   DISTRO__CODEC_OK);
      for (int64_t j = 0; j < count; j++) cr_assert_eq(f2u(back[j]), f2u(v[j]), "F32 value %lld", (long long)j);
      cr_assert_eq(distro__val_decode(DISTRO_VALUES_F32, 0, buf, (size_t)count * 4 - 1, nchunks, k, back).kind,
                   DISTRO__CODEC_VALUES);
      cr_assert_eq(distro__val_decode(DISTRO_VALUES_F32, 0, buf, (size_t)count * 4 + 1, nchunks, k, back).kind,
                   DISTRO__CODEC_VALUES);
      const uint32_t nonfinite[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffffffffu};
      for (int b = 0; b < 4; b++) {
        int64_t j = (int64_t)(tu_next(&r) % (uint64_t)count);
        memcpy(buf + 4 * j, &nonfinite[b], 4);
        cr_assert_eq(distro__val_decode(DISTRO_VALUES_F32, 0, buf, (size_t)count * 4, nchunks, k, back).kind,
                     DISTRO__CODEC_VALUES, "F32 non-finite 0x%08x accepted", nonfinite[b]);
        memcpy(buf + 4 * j, &v[j], 4);
      }
      /* SIGN1: one bit per value (signbit), LSB first; padding zero. */
      const size_t sb = (size_t)(count + 7) / 8;
      cr_assert_eq(distro__val_plan(DISTRO_VALUES_SIGN1, v, nchunks, k, &param), sb);
      cr_assert_eq(distro__val_encode(DISTRO_VALUES_SIGN1, 0, v, nchunks, k, buf, sb), sb);
      rbits w;
      rinit(&w, ref, sb);
      for (int64_t j = 0; j < count; j++) rput(&w, signbit(v[j]) ? 1 : 0, 1);
      cr_assert_eq(memcmp(buf, ref, sb), 0, "SIGN1 bytes (seed %llu)", SEED);
      cr_assert_eq(distro__val_decode(DISTRO_VALUES_SIGN1, 0, buf, sb, nchunks, k, back).kind, DISTRO__CODEC_OK);
      for (int64_t j = 0; j < count; j++)
        cr_assert_eq(f2u(back[j]), f2u(signbit(v[j]) ? -1.0f : 1.0f), "SIGN1 value %lld", (long long)j);
      cr_assert_eq(distro__val_decode(DISTRO_VALUES_SIGN1, 0, buf, sb + 1, nchunks, k, back).kind,
                   DISTRO__CODEC_VALUES);
      if (sb > 1)
        cr_assert_eq(distro__val_decode(DISTRO_VALUES_SIGN1, 0, buf, sb - 1, nchunks, k, back).kind,
                     DISTRO__CODEC_VALUES);
      for (int bit = (int)(count % 8); count % 8 && bit < 8; bit++) {
        buf[sb - 1] ^= (uint8_t)(1u << bit);
        cr_assert_eq(distro__val_decode(DISTRO_VALUES_SIGN1, 0, buf, sb, nchunks, k, back).kind, DISTRO__CODEC_VALUES,
                     "SIGN1 padding bit %d", bit);
        buf[sb - 1] ^= (uint8_t)(1u << bit);
      }
      free(v);
      free(back);
      free(buf);
      free(ref);
    }
}

/* Bits of the exponent-coded BF16 section with Rice parameter b. */
static uint64_t bf16_exp_bits(const float *v, int64_t nchunks, int64_t k, int b) {
  uint64_t bits = 0;
  for (int64_t c = 0; c < nchunks; c++) {
    int emax = 0;
    for (int64_t j = 0; j < k; j++)
      if (bexp(distro__bf16_from_float(v[c * k + j])) > emax) emax = bexp(distro__bf16_from_float(v[c * k + j]));
    bits += 8;
    for (int64_t j = 0; j < k; j++)
      bits += 8 + ((uint64_t)(emax - bexp(distro__bf16_from_float(v[c * k + j]))) >> b) + 1 + (uint64_t)b;
  }
  return bits;
}

Test(codecs, values_bf16_lossless_every_param) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  int picked_exp = 0, picked_raw = 0;
  for (int s = 0; s < NVSHAPE; s++)
    for (int kind = 0; kind < 5; kind++) {
      const int64_t nchunks = vshape[s][0], k = vshape[s][1], count = nchunks * k;
      float *v = malloc(sizeof(float) * (size_t)count), *back = malloc(sizeof(float) * (size_t)count);
      const size_t cap = (size_t)count * 64 + 64;
      uint8_t *buf = malloc(cap + 8), *ref = malloc(cap);
      cr_assert(v && back && buf && ref);
      for (int64_t j = 0; j < count; j++) v[j] = value_of(&r, kind);
      /* Every parameter: reference bytes, exact decode, framing checks. */
      const int params[5] = {0, 1, 2, 3, DISTRO__BF16_RAW};
      uint64_t best = 16 * (uint64_t)count;
      int best_p = DISTRO__BF16_RAW;
      for (int p = 0; p < 5; p++) {
        const uint64_t bits = params[p] == DISTRO__BF16_RAW ? 16 * (uint64_t)count : bf16_exp_bits(v, nchunks, k, params[p]);
        const size_t want = (size_t)((bits + 7) / 8);
        if (bits < best) { /* raw words on a tie, then the smallest parameter */
          best = bits;
          best_p = params[p];
        }
        cr_assert_eq(ref_bf16(v, nchunks, k, params[p], ref, cap), want);
        cr_assert_eq(distro__val_encode(DISTRO_VALUES_BF16, params[p], v, nchunks, k, buf, want - 1), 0);
        size_t got = distro__val_encode(DISTRO_VALUES_BF16, params[p], v, nchunks, k, buf, want);
        cr_assert_eq(got, want, "BF16 param %d kind %d: %zu bytes, want %zu", params[p], kind, got, want);
        cr_assert_eq(memcmp(buf, ref, want), 0, "BF16 param %d kind %d: bytes differ (seed %llu)", params[p], kind, SEED);
        cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, params[p], buf, want, nchunks, k, back).kind,
                     DISTRO__CODEC_OK, "BF16 param %d kind %d rejected its own section (seed %llu)", params[p], kind,
                     SEED);
        for (int64_t j = 0; j < count; j++)
          cr_assert_eq(f2u(back[j]), (uint32_t)distro__bf16_from_float(v[j]) << 16,
                       "BF16 param %d value %a -> %a (seed %llu)", params[p], (double)v[j], (double)back[j], SEED);
        cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, params[p], buf, want - 1, nchunks, k, back).kind,
                     DISTRO__CODEC_VALUES);
        buf[want] = 0;
        cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, params[p], buf, want + 1, nchunks, k, back).kind,
                     DISTRO__CODEC_VALUES);
        for (int bit = (int)(bits % 8); bits % 8 && bit < 8; bit++) {
          buf[want - 1] ^= (uint8_t)(1u << bit);
          cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, params[p], buf, want, nchunks, k, back).kind,
                       DISTRO__CODEC_VALUES, "BF16 param %d padding bit %d", params[p], bit);
          buf[want - 1] ^= (uint8_t)(1u << bit);
        }
      }
      /* The plan takes the smallest. */
      int param = -1;
      size_t plan = distro__val_plan(DISTRO_VALUES_BF16, v, nchunks, k, &param);
      cr_assert_eq(param, best_p, "BF16 plan kind %d shape %d: param %d, smallest is %d", kind, s, param, best_p);
      cr_assert_eq(plan, (size_t)((best + 7) / 8));
      if (param == DISTRO__BF16_RAW) picked_raw++;
      else picked_exp++;
      free(v);
      free(back);
      free(buf);
      free(ref);
    }
  cr_assert_gt(picked_exp, 5);
  cr_assert_gt(picked_raw, 2);
}

Test(codecs, values_bf16_malformed) {
  uint8_t buf[64];
  float back[4];
  /* One chunk of 2: emax 255 decodes to Inf/NaN. */
  rbits w;
  rinit(&w, buf, sizeof buf);
  rput(&w, 255, 8);
  for (int j = 0; j < 2; j++) {
    rput(&w, 0, 1);
    rput(&w, j, 7);
    rrice(&w, 0, 0);
  }
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, 0, buf, rbytes(&w), 1, 2, back).kind, DISTRO__CODEC_VALUES,
               "emax 255");
  /* Distance below the chunk's exponent larger than the exponent. */
  rinit(&w, buf, sizeof buf);
  rput(&w, 3, 8);
  rput(&w, 0, 1);
  rput(&w, 5, 7);
  rrice(&w, 4, 1);
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, 1, buf, rbytes(&w), 1, 1, back).kind, DISTRO__CODEC_VALUES,
               "distance > emax");
  /* The same with distance 3 is the smallest subnormal-range value. */
  rinit(&w, buf, sizeof buf);
  rput(&w, 3, 8);
  rput(&w, 1, 1);
  rput(&w, 5, 7);
  rrice(&w, 3, 1);
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, 1, buf, rbytes(&w), 1, 1, back).kind, DISTRO__CODEC_OK);
  cr_assert_eq(f2u(back[0]), 0x80050000u);
  /* Parameters 4..14 and above 15 do not exist. */
  for (int p = 4; p < 256; p++) {
    if (p == DISTRO__BF16_RAW) continue;
    cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, p, buf, rbytes(&w), 1, 1, back).kind, DISTRO__CODEC_VALUES,
                 "param %d", p);
  }
  /* Raw words: Inf and NaN patterns. */
  const uint16_t bad[] = {0x7f80, 0xff80, 0x7fc0, 0xffff};
  for (int b = 0; b < 4; b++) {
    uint8_t raw[4] = {0x80, 0x3f, (uint8_t)bad[b], (uint8_t)(bad[b] >> 8)};
    cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, DISTRO__BF16_RAW, raw, 4, 1, 2, back).kind,
                 DISTRO__CODEC_VALUES, "raw 0x%04x", bad[b]);
  }
  /* A runaway unary distance is a malformed section, not a crash. */
  memset(buf, 0xff, sizeof buf);
  buf[0] = 10;
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_BF16, 0, buf, sizeof buf, 1, 4, back).kind, DISTRO__CODEC_VALUES);
}

static void check_int(distro_values codec, uint64_t seed) {
  tu_rng r = {seed};
  const int qmax = codec == DISTRO_VALUES_INT8 ? 127 : 7, bits = codec == DISTRO_VALUES_INT8 ? 8 : 4;
  for (int s = 0; s < NVSHAPE; s++)
    for (int kind = 0; kind < 4; kind++) { /* normal-range values (the scale bound is relative) */
      const int64_t nchunks = vshape[s][0], k = vshape[s][1], count = nchunks * k;
      float *v = malloc(sizeof(float) * (size_t)count), *back = malloc(sizeof(float) * (size_t)count);
      int *q = malloc(sizeof(int) * (size_t)count);
      const size_t want = (size_t)nchunks * 2 + ((size_t)count * (size_t)bits + 7) / 8;
      uint8_t *buf = malloc(want + 8), *ref = malloc(want + 8);
      cr_assert(v && back && q && buf && ref);
      for (int64_t j = 0; j < count; j++) {
        v[j] = kind == 1 ? (float)(tu_normal(&r) * ldexp(1.0, (int)(tu_next(&r) % 60) - 30)) : value_of(&r, kind);
        if (kind == 0 && j % 9 == 4) v[j] = -v[j - 1]; /* a value and its negative: both ends of the range */
      }
      if (nchunks > 2) /* an all-zero chunk and a one-value chunk */
        for (int64_t j = 0; j < k; j++) {
          v[k + j] = j % 2 ? -0.0f : 0.0f;
          v[2 * k + j] = j == k / 2 ? -3.0f : 0.0f;
        }
      int param = -1;
      cr_assert_eq(distro__val_plan(codec, v, nchunks, k, &param), want);
      size_t rb = ref_int(v, nchunks, k, qmax, bits, ref, want + 8, q);
      cr_assert_eq(rb, want);
      cr_assert_eq(distro__val_encode(codec, param, v, nchunks, k, buf, want - 1), 0);
      size_t got = distro__val_encode(codec, param, v, nchunks, k, buf, want);
      cr_assert_eq(got, want);
      cr_assert_eq(memcmp(buf, ref, want), 0, "codec %d shape %d kind %d: bytes differ from the reference (seed %llu)",
                   codec, s, kind, SEED);
      cr_assert_eq(distro__val_decode(codec, param, buf, want, nchunks, k, back).kind, DISTRO__CODEC_OK);
      for (int64_t c = 0; c < nchunks; c++) {
        double amax = 0;
        for (int64_t j = 0; j < k; j++) amax = fmax(amax, fabs((double)v[c * k + j]));
        const double sc = distro__bf16_to_float((uint16_t)(buf[2 * c] | buf[2 * c + 1] << 8));
        if (amax == 0) {
          cr_assert_eq(sc, 0.0, "all-zero chunk has scale 0");
        } else {
          cr_assert_geq(sc * qmax, amax, "scale too small: |q| would exceed %d", qmax);
          cr_assert_leq(sc, amax / qmax * (1 + ldexp(1, -7)), "scale %g more than one bf16 step above %g", sc,
                        amax / qmax);
        }
        for (int64_t j = 0; j < k; j++) {
          const double x = v[c * k + j], d = back[c * k + j];
          cr_assert_eq(d, (double)q[c * k + j] * sc, "decoded value is q * scale");
          cr_assert_leq(fabs(x - d), sc / 2 * (1 + ldexp(1, -15)), "codec %d: |%a - %a| > scale/2 = %a (seed %llu)",
                        codec, x, d, sc / 2, SEED);
          cr_assert(isfinite(d));
        }
      }
      /* Malformed: wrong length, padding, -qmax-1, bad scales. */
      cr_assert_eq(distro__val_decode(codec, param, buf, want - 1, nchunks, k, back).kind, DISTRO__CODEC_VALUES);
      buf[want] = 0;
      cr_assert_eq(distro__val_decode(codec, param, buf, want + 1, nchunks, k, back).kind, DISTRO__CODEC_VALUES);
      cr_assert_eq(distro__val_decode(codec, param, buf, (size_t)nchunks * 2 - 1, nchunks, k, back).kind,
                   DISTRO__CODEC_VALUES);
      const uint64_t vbits = (uint64_t)count * (uint64_t)bits;
      for (int bit = (int)(vbits % 8); vbits % 8 && bit < 8; bit++) {
        buf[want - 1] ^= (uint8_t)(1u << bit);
        cr_assert_eq(distro__val_decode(codec, param, buf, want, nchunks, k, back).kind, DISTRO__CODEC_VALUES,
                     "padding bit %d", bit);
        buf[want - 1] ^= (uint8_t)(1u << bit);
      }
      for (int trial = 0; trial < 8; trial++) {
        memcpy(ref, buf, want);
        const int64_t j = (int64_t)(tu_next(&r) % (uint64_t)count);
        rbits w = {ref, want, (size_t)nchunks * 16 + (size_t)j * (size_t)bits};
        for (int b = 0; b < bits; b++) ref[(w.pos + (size_t)b) / 8] &= (uint8_t) ~(1u << ((w.pos + (size_t)b) % 8));
        rput(&w, (uint64_t)(-qmax - 1) & mask64(bits), bits); /* -128 / -8 */
        cr_assert_eq(distro__val_decode(codec, param, ref, want, nchunks, k, back).kind, DISTRO__CODEC_VALUES,
                     "q = %d accepted", -qmax - 1);
      }
      const uint16_t bad_scales[] = {0x7f80, 0xff80, 0x7fc0, 0x8001, 0xbf80};
      for (int b = 0; b < 5; b++) {
        memcpy(ref, buf, want);
        const int64_t c = (int64_t)(tu_next(&r) % (uint64_t)nchunks);
        ref[2 * c] = (uint8_t)bad_scales[b];
        ref[2 * c + 1] = (uint8_t)(bad_scales[b] >> 8);
        cr_assert_eq(distro__val_decode(codec, param, ref, want, nchunks, k, back).kind, DISTRO__CODEC_VALUES,
                     "scale 0x%04x accepted", bad_scales[b]);
      }
      free(v);
      free(back);
      free(q);
      free(buf);
      free(ref);
    }
}

Test(codecs, values_int8_int4_error_bound) {
  uint64_t seed = tu_seed();
  check_int(DISTRO_VALUES_INT8, seed);
  check_int(DISTRO_VALUES_INT4, seed + 1);
}

/* Regression test (bug found by this suite, fixed): distro__val_decode (src/compress/value_codec.c, the
 * INT8/INT4 branch) used to check that each scale was finite but not that q * scale
 * was: scale 0x7f7f (the largest finite bf16) with q = 127 decodes to +Inf,
 * which then reaches the aggregate. A CRC-valid payload from a faulty or
 * hostile peer can therefore inject Inf; the header promises "-1 when the
 * section is malformed (... a non-finite value or scale)". */
Test(codecs, values_int_product_overflow_rejected) {
  float back[2];
  /* INT8: one chunk of 1, scale 0x7f7f, q = 127. */
  const uint8_t s8[3] = {0x7f, 0x7f, 0x7f};
  cr_expect_eq(distro__val_decode(DISTRO_VALUES_INT8, 0, s8, 3, 1, 1, back).kind, DISTRO__CODEC_VALUES,
               "INT8 scale 0x7f7f * 127 = %g accepted", (double)back[0]);
  /* INT4: one chunk of 2, scale 2^127 (0x7f00), q = 7 and -7. */
  const uint8_t s4[3] = {0x00, 0x7f, 0x97};
  cr_expect_eq(distro__val_decode(DISTRO_VALUES_INT4, 0, s4, 3, 1, 2, back).kind, DISTRO__CODEC_VALUES,
               "INT4 2^127 * 7 = %g accepted", (double)back[0]);
  /* The encoder's own sections decode finitely, up to the largest floats:
   * for INT4 and |v| = FLT_MAX the scale rounds up to 0x7e13, whose product
   * with 7 overflows (quant_scale accepts s * qmax = Inf as ">= amax"), and
   * q = 7 then decodes to Inf. */
  for (int c = 0; c < 2; c++) {
    const distro_values codec = c ? DISTRO_VALUES_INT4 : DISTRO_VALUES_INT8;
    const float tops[] = {3.0e38f, 3.39e38f, 3.4e38f, FLT_MAX};
    for (int t = 0; t < 4; t++) {
      float hv[2] = {tops[t], -tops[t]};
      uint8_t buf[8];
      int param;
      size_t n = distro__val_plan(codec, hv, 1, 2, &param);
      cr_assert_eq(distro__val_encode(codec, param, hv, 1, 2, buf, n), n);
      const distro__codec_fault rc = distro__val_decode(codec, param, buf, n, 1, 2, back);
      cr_expect(rc.kind == DISTRO__CODEC_OK && isfinite(back[0]) && isfinite(back[1]),
                "codec %d: encoding +-%a decodes to %a, %a (fault %d)", (int)codec, (double)tops[t], (double)back[0],
                (double)back[1], (int)rc.kind);
    }
  }
}

