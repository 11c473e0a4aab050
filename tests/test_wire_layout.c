/* Payload wire format v1 (docs/wire-format.md), part 1: CRC32C, bf16
 * rounding, byte layout, encode -> validate -> decode round trips and abort
 * payloads. The receiver's rejections are in test_wire_reject.c. Inputs are
 * fresh random each run (DISTRO_TEST_SEED reproduces one); the seed is in
 * every failure message. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/error.h"
#include "compress/chunk.h"
#include "compress/wire.h"
#include "testutil.h"
#include "wire_ref.h"
#include "wire_util.h"

/* ---------------------------------------------------------------- helpers */

/* Exact value of a bf16 pattern with an unbounded exponent: the pattern just
 * above the largest finite one (0x7f80) reads as 2^128, which lets the
 * reference decide rounding before declaring overflow. */
static double bf16_magnitude(uint32_t b) {
  uint32_t e = (b >> 7) & 0x1ff, m = b & 0x7f; /* 9 bits: e may reach 255 */
  if (e == 0) return ldexp((double)m, -133);
  return ldexp((double)(128 + m), (int)e - 134);
}

/* float64 reference: round-to-nearest-even to 8 significant bits; results
 * beyond the largest finite bf16 saturate to it (the encoder never emits
 * Inf, which receivers reject). Finite inputs only. */
static uint16_t ref_bf16(float x) {
  uint32_t u = f2u(x), sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  double ax = fabs((double)x);
  uint32_t lo = mag >> 16, hi = lo + 1;
  double dlo = bf16_magnitude(lo), dhi = bf16_magnitude(hi);
  double below = ax - dlo, above = dhi - ax; /* exact in double */
  uint32_t pick = below < above ? lo : above < below ? hi : ((lo & 1) ? hi : lo);
  if (pick == 0x7f80u) pick = 0x7f7fu;
  return (uint16_t)((sign >> 16) | pick);
}

/* Decode every coefficient and compare with what was encoded. */
static void expect_decodes(const payload *p, uint64_t seed) {
  for (int i = 0; i < p->n; i++) {
    const distro__tiling *t = &p->t[i];
    const uint8_t *is = p->buf + p->l.idx_off[i], *vs = p->buf + p->l.val_off[i];
    for (int64_t j = 0; j < count_of(t); j++) {
      uint32_t ix = distro__wire_index(is, p->l.idx_width[i], j);
      cr_assert_eq(ix, p->idx[i][j], "tensor %d coef %lld: index %u != %u (seed %llu)", i, (long long)j, ix,
                   p->idx[i][j], (unsigned long long)seed);
      float got = distro__wire_value(vs, p->codec, j), in = p->val[i][j];
      uint32_t want;
      switch (p->codec) {
        case DISTRO_VALUES_F32: want = f2u(in); break;
        case DISTRO_VALUES_BF16: want = (uint32_t)ref_bf16(in) << 16; break;
        default: want = f2u(signbit(in) ? -1.0f : 1.0f); break;
      }
      cr_assert_eq(f2u(got), want, "tensor %d coef %lld codec %d: %a -> %a, want %a (seed %llu)", i, (long long)j,
                   (int)p->codec, (double)in, (double)got, (double)u2f(want), (unsigned long long)seed);
    }
  }
}

/* ---------------------------------------------------------------- CRC32C */

Test(wire, crc32c_known_vectors) {
  cr_assert_eq(distro__crc32c("123456789", 9), 0xe3069283u);
  cr_assert_eq(distro__crc32c("", 0), 0u);
  /* RFC 3720 (iSCSI) B.4 vectors. */
  uint8_t b[32];
  memset(b, 0, 32);
  cr_assert_eq(distro__crc32c(b, 32), 0x8a9136aau);
  memset(b, 0xff, 32);
  cr_assert_eq(distro__crc32c(b, 32), 0x62a8ab43u);
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
  cr_assert_eq(distro__crc32c(b, 32), 0x46dd794eu);
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
  cr_assert_eq(distro__crc32c(b, 32), 0x113fdb5cu);
}

Test(wire, crc32c_matches_bitwise_reference_and_incremental) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  uint8_t *buf = malloc(4096 + 16);
  cr_assert(buf);
  for (int trial = 0; trial < 300; trial++) {
    size_t off = tu_next(&r) % 16, n = tu_next(&r) % 4097; /* misaligned starts, all tail lengths */
    uint8_t *p = buf + off;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)tu_next(&r);
    uint32_t whole = distro__crc32c(p, n);
    cr_assert_eq(whole, ref_crc32c(p, n), "n=%zu off=%zu (seed %llu)", n, off, (unsigned long long)seed);
    /* Split into random pieces, some empty. */
    uint32_t c = 0;
    size_t at = 0;
    while (at < n) {
      size_t piece = tu_next(&r) % (n - at + 1);
      c = distro__crc32c_update(c, p + at, piece);
      at += piece;
    }
    c = distro__crc32c_update(c, p + n, 0);
    cr_assert_eq(c, whole, "incremental n=%zu (seed %llu)", n, (unsigned long long)seed);
  }
  free(buf);
}

/* ---------------------------------------------------------------- bf16 */

Test(wire, bf16_round_to_nearest_even_random) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int trial = 0; trial < 2000000; trial++) {
    uint32_t u = (uint32_t)tu_next(&r);
    switch (trial % 4) {
      case 1: u = (u & 0xffff0000u) | 0x8000u; break;                         /* exact ties */
      case 2: u = (u & 0xffff0000u) | (trial & 8 ? 0x7fffu : 0x8001u); break; /* either side of a tie */
      case 3: u &= 0x807fffffu; break;                                         /* subnormals and zeros */
      default: break;
    }
    if ((u & 0x7f800000u) == 0x7f800000u) continue; /* finite inputs only */
    float x = u2f(u);
    uint16_t got = distro__bf16_from_float(x), want = ref_bf16(x);
    cr_assert_eq(got, want, "bf16(%a = 0x%08x) = 0x%04x, want 0x%04x (seed %llu)", (double)x, u, got, want,
                 (unsigned long long)seed);
  }
}

Test(wire, bf16_edges) {
  cr_assert_eq(distro__bf16_from_float(1.0f), 0x3f80);
  cr_assert_eq(distro__bf16_from_float(-2.0f), 0xc000);
  cr_assert_eq(distro__bf16_from_float(0.0f), 0x0000);
  cr_assert_eq(distro__bf16_from_float(-0.0f), 0x8000);
  /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1) wins; 1 + 3*2^-8
   * ties between odd 1+2^-7 and even 1+2^-6: the latter wins. */
  cr_assert_eq(distro__bf16_from_float(u2f(0x3f808000u)), 0x3f80);
  cr_assert_eq(distro__bf16_from_float(u2f(0x3f818000u)), 0x3f82);
  cr_assert_eq(distro__bf16_from_float(u2f(0x3f808001u)), 0x3f81);
  /* Largest finite bf16; what IEEE RNE would round to Inf saturates. */
  cr_assert_eq(distro__bf16_from_float(u2f(0x7f7f7fffu)), 0x7f7f);
  cr_assert_eq(distro__bf16_from_float(u2f(0x7f7f8000u)), 0x7f7f);
  cr_assert_eq(distro__bf16_from_float(u2f(0xff7fffffu)), 0xff7f);
  cr_assert_eq(distro__bf16_from_float(u2f(0x7f800000u)), 0x7f80, "Inf stays Inf");
  /* Every non-NaN bf16 survives a round trip through float. */
  for (uint32_t b = 0; b < 65536; b++) {
    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) continue;
    float x = distro__bf16_to_float((uint16_t)b);
    cr_assert_eq(f2u(x), b << 16);
    cr_assert_eq(distro__bf16_from_float(x), b, "0x%04x", b);
  }
}

/* ---------------------------------------------------------------- layout */

Test(wire, index_width_rule) {
  cr_assert_eq(distro__wire_index_width(1), 1);
  cr_assert_eq(distro__wire_index_width(256), 1);
  cr_assert_eq(distro__wire_index_width(257), 2);
  cr_assert_eq(distro__wire_index_width(4096), 2);
  cr_assert_eq(distro__wire_index_width(65536), 2);
  cr_assert_eq(distro__wire_index_width(65537), 4);
  cr_assert_eq(distro__wire_value_bytes(DISTRO_VALUES_F32, 9), 36);
  cr_assert_eq(distro__wire_value_bytes(DISTRO_VALUES_BF16, 9), 18);
  cr_assert_eq(distro__wire_value_bytes(DISTRO_VALUES_SIGN1, 8), 1);
  cr_assert_eq(distro__wire_value_bytes(DISTRO_VALUES_SIGN1, 9), 2);
  cr_assert_eq(distro__wire_value_bytes(DISTRO_VALUES_SIGN1, 0), 0);
}

/* The worked example of docs/wire-format.md. */
Test(wire, documented_sizes) {
  const int64_t shape[2] = {768, 768};
  distro__tiling t;
  cr_assert_eq(distro__tiling_init(&t, 2, shape, 64, 32), DISTRO_OK);
  cr_assert_eq(t.nchunks, 144);
  cr_assert_eq(t.chunk_elems, 4096);
  const size_t want[3] = {27716, 18500, 9860};
  for (int c = 0; c < 3; c++) {
    distro__wire_layout l;
    cr_assert_eq(distro__wire_layout_init(&l, &t, 1, codecs[c]), DISTRO_OK);
    cr_assert_eq(l.idx_width[0], 2);
    cr_assert_eq(l.idx_off[0], 64);
    cr_assert_eq(l.val_off[0], 64 + 9216);
    cr_assert_eq(l.total, want[c], "codec %d: %zu", c, l.total);
    distro__wire_layout_destroy(&l);
  }
  /* GPT-2 wte (50257, 768): 50257 = 29 * 1733, so 29x64 chunks, 1733*12 of them. */
  const int64_t wte[2] = {50257, 768};
  cr_assert_eq(distro__tiling_init(&t, 2, wte, 64, 32), DISTRO_OK);
  cr_assert_eq(t.h, 29);
  cr_assert_eq(t.nchunks, 1733 * 12);
  cr_assert_eq(t.chunk_elems, 1856);
  cr_assert_eq(distro__wire_index_width(t.chunk_elems), 2);
}

Test(wire, unknown_codec_rejected_by_layout) {
  const int64_t shape[1] = {8};
  distro__tiling t;
  cr_assert_eq(distro__tiling_init(&t, 1, shape, 8, 2), DISTRO_OK);
  distro__wire_layout l;
  cr_assert_eq(distro__wire_layout_init(&l, &t, 1, (distro_values)3), DISTRO_ERR_INVALID);
  distro__wire_layout_destroy(&l);
}

/* Every byte of a small payload, at the offsets the document gives. */
Test(wire, byte_layout) {
  const int64_t s0[1] = {10}, s1[2] = {20, 20};
  distro__tiling t[2];
  cr_assert_eq(distro__tiling_init(&t[0], 1, s0, 8, 2), DISTRO_OK);  /* 1x5 chunks, 2 of them, k 2 */
  cr_assert_eq(distro__tiling_init(&t[1], 2, s1, 20, 3), DISTRO_OK); /* one 20x20 chunk, 400 elems, u16 */
  cr_assert_eq(t[0].w, 5);
  cr_assert_eq(t[0].nchunks, 2);
  const uint32_t idx0[4] = {1, 4, 0, 3}, idx1[3] = {7, 300, 399};
  const float val0[4] = {1.0f, -2.0f, 0.5f, -0.0f}, val1[3] = {3.0f, -1.5f, 0.25f};
  for (int c = 0; c < 3; c++) {
    distro__wire_layout l;
    cr_assert_eq(distro__wire_layout_init(&l, t, 2, codecs[c]), DISTRO_OK);
    size_t vb0 = distro__wire_value_bytes(codecs[c], 4), vb1 = distro__wire_value_bytes(codecs[c], 3);
    size_t total = 40 + 2 * 24 + 4 * 1 + vb0 + 3 * 2 + vb1 + 4;
    cr_assert_eq(l.total, total);
    uint8_t *b = calloc(1, total);
    distro__wire_write_header(b, &l, t, 0, 0x01020304u, 0x1122334455667788ull, 0, 0);
    distro__wire_write_tensor(b, &l, t, 0, idx0, val0);
    distro__wire_write_tensor(b, &l, t, 1, idx1, val1);
    distro__wire_seal(b, &l);
    cr_assert_eq(memcmp(b, "DTRO", 4), 0);
    cr_assert_eq(b[4], 1);
    cr_assert_eq(b[5], 0);
    cr_assert_eq(b[6], c);
    cr_assert_eq(b[7], 0);
    cr_assert_eq(rd32(b + 8), 2);
    cr_assert_eq(rd32(b + 12), 0x01020304u);
    cr_assert_eq(rd64(b + 16), 0x1122334455667788ull);
    cr_assert_eq(rd64(b + 24), total);
    cr_assert_eq(rd32(b + 32), 0);
    cr_assert_eq(rd32(b + 36), 0);
    const uint8_t *d = b + 40;
    cr_assert_eq(rd32(d + 0), 1);
    cr_assert_eq(rd32(d + 4), 5);
    cr_assert_eq(rd32(d + 8), 2);
    cr_assert_eq(rd32(d + 12), 1);
    cr_assert_eq(rd64(d + 16), 2);
    d += 24;
    cr_assert_eq(rd32(d + 0), 20);
    cr_assert_eq(rd32(d + 4), 20);
    cr_assert_eq(rd32(d + 8), 3);
    cr_assert_eq(rd32(d + 12), 2);
    cr_assert_eq(rd64(d + 16), 1);
    const uint8_t *p = b + 88;
    cr_assert_eq(l.idx_off[0], 88);
    cr_assert(p[0] == 1 && p[1] == 4 && p[2] == 0 && p[3] == 3);
    p += 4;
    cr_assert_eq(l.val_off[0], 92);
    if (codecs[c] == DISTRO_VALUES_F32) {
      for (int j = 0; j < 4; j++) cr_assert_eq(rd32(p + 4 * j), f2u(val0[j]));
    } else if (codecs[c] == DISTRO_VALUES_BF16) {
      const uint8_t want[8] = {0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f, 0x00, 0x80};
      cr_assert_eq(memcmp(p, want, 8), 0);
    } else {
      cr_assert_eq(p[0], 0x0a); /* coefs 1 (-2) and 3 (-0) negative; padding zero */
    }
    p += vb0;
    cr_assert_eq((size_t)(p - b), l.idx_off[1]);
    cr_assert(p[0] == 7 && p[1] == 0 && p[2] == 0x2c && p[3] == 0x01 && p[4] == 0x8f && p[5] == 0x01);
    p += 6;
    cr_assert_eq((size_t)(p - b), l.val_off[1]);
    if (codecs[c] == DISTRO_VALUES_SIGN1) cr_assert_eq(p[0], 0x02);
    p += vb1;
    cr_assert_eq((size_t)(p - b), total - 4);
    cr_assert_eq(rd32(p), ref_crc32c(b, total - 4));
    int ab;
    uint32_t st, te;
    cr_assert_eq(distro__wire_validate(b, total, &l, t, 0, &ab, &st, &te), DISTRO_OK, "%s", distro_last_error());
    free(b);
    distro__wire_layout_destroy(&l);
  }
}

/* ---------------------------------------------------------------- round trips */

static void round_trip(const spec *s, int n, uint64_t seed, int reps) {
  tu_rng r = {seed};
  for (int rep = 0; rep < reps; rep++)
    for (int c = 0; c < 3; c++) {
      payload p;
      build(&p, s, n, codecs[c], &r);
      cr_assert_eq(rd32(p.buf + 12), p.sender);
      cr_assert_eq(rd64(p.buf + 16), p.step);
      expect_valid(&p, seed, "round trip");
      expect_decodes(&p, seed);
      destroy(&p);
    }
}

Test(wire, round_trip_mixed_u8_u16) {
  uint64_t seed = tu_seed();
  round_trip(mixed, NMIXED, seed, 20);
  /* And each tensor alone. */
  for (int i = 0; i < NMIXED; i++) round_trip(&mixed[i], 1, seed + (uint64_t)i, 3);
}

Test(wire, round_trip_index_width_boundaries) {
  const spec s[] = {
      {2, {16, 16}, 16, 200},   /* 256 elems: u8, index 255 usable */
      {1, {257}, 257, 200},     /* 257 elems: u16 */
      {2, {256, 256}, 256, 40}, /* 65536 elems: u16, index 65535 usable */
      {1, {65537}, 65537, 30},  /* 65537 elems: u32 */
      {2, {300, 300}, 300, 17}, /* 90000 elems: u32 */
  };
  const int w[] = {1, 2, 2, 4, 4};
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int i = 0; i < 5; i++) {
    payload p;
    build(&p, &s[i], 1, DISTRO_VALUES_F32, &r);
    cr_assert_eq(p.l.idx_width[0], w[i], "spec %d", i);
    destroy(&p);
  }
  round_trip(s, 5, seed, 3);
  /* The largest index of each width decodes. */
  for (int i = 0; i < 3; i += 2) {
    payload p;
    build(&p, &s[i], 1, DISTRO_VALUES_BF16, &r);
    int64_t last = p.t[0].k - 1, n = p.t[0].chunk_elems;
    p.idx[0][last] = (uint32_t)(n - 1);
    put_index(&p, 0, last, (uint32_t)(n - 1));
    reseal(&p);
    expect_valid(&p, seed, "largest index");
    expect_decodes(&p, seed);
    destroy(&p);
  }
}

Test(wire, round_trip_gpt2_shape) {
  const spec s[] = {{2, {768, 768}, 64, 32}, {1, {768}, 64, 32}, {2, {3072, 768}, 64, 32}};
  round_trip(s, 3, tu_seed(), 1);
}

Test(wire, empty_tensor_list) {
  distro__wire_layout l;
  cr_assert_eq(distro__wire_layout_init(&l, NULL, 0, DISTRO_VALUES_F32), DISTRO_OK);
  cr_assert_eq(l.total, 44);
  uint8_t b[44];
  distro__wire_write_header(b, &l, NULL, 0, 0, 0, 0, 0);
  distro__wire_seal(b, &l);
  int ab;
  uint32_t st, te;
  cr_assert_eq(distro__wire_validate(b, 44, &l, NULL, 0, &ab, &st, &te), DISTRO_OK);
  distro__wire_layout_destroy(&l);
}

/* ---------------------------------------------------------------- abort */

Test(wire, abort_payload) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 3; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    distro__wire_write_header(p.buf, &p.l, p.t, DISTRO__WIRE_FLAG_ABORT, 5, 9, DISTRO_ERR_NONFINITE, 4);
    distro__wire_clear_body(p.buf, &p.l);
    distro__wire_seal(p.buf, &p.l);
    size_t start = 40 + 24 * (size_t)NMIXED;
    for (size_t i = start; i < p.l.total - 4; i++) cr_assert_eq(p.buf[i], 0);
    int ab = 0;
    uint32_t st = 0, te = 0;
    cr_assert_eq(distro__wire_validate(p.buf, p.l.total, &p.l, p.t, 2, &ab, &st, &te), DISTRO_OK, "%s",
                 distro_last_error());
    cr_assert_eq(ab, 1);
    cr_assert_eq(st, DISTRO_ERR_NONFINITE);
    cr_assert_eq(te, 4);
    /* An abort payload is still checked up to its flags. */
    p.buf[100] ^= 1;
    EXPECT_REJECT(&p, p.buf, p.l.total, 2, "CRC32C", seed, "abort, corrupt");
    p.buf[100] ^= 1;
    p.buf[6] = (uint8_t)((c + 1) % 3);
    reseal(&p);
    EXPECT_REJECT(&p, p.buf, p.l.total, 2, "values codec", seed, "abort, codec");
    destroy(&p);
  }
}
