/* Wire v2 section codecs (docs/wire-format.md, "Wire format v2"), part 1: the
 * LSB-first bit streams (compress/bits.h) against an independent bit-by-bit
 * reference writer, and the document's worked examples of every index and
 * value section. The index codecs are in test_codecs_index.c, the value
 * codecs in test_codecs_values.c.
 *
 * Inputs are fresh random each run (DISTRO_TEST_SEED reproduces one); the seed
 * is in every failure message. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs_util.h"
#include "compress/bits.h"
#include "compress/index_codec.h"
#include "compress/value_codec.h"
#include "compress/wire.h"
#include "testutil.h"
#include "wire_ref.h"

/* ================================================================ bits.h */

Test(codecs, bits_fields_at_every_alignment) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  enum { CAP = 1200 };
  uint8_t lib[CAP + 8], ref[CAP];
  uint64_t vals[200];
  int widths[200];
  for (int trial = 0; trial < 400; trial++) {
    const int lead = trial % 64; /* every start alignment, then further */
    int nf = 0;
    size_t total = (size_t)lead;
    while (nf < 200) {
      int wdt = (int)(tu_next(&r) % 58); /* 0..57 */
      if (total + (size_t)wdt > 8 * (size_t)CAP - 8) break;
      widths[nf] = wdt;
      vals[nf] = tu_next(&r) & (tu_next(&r) % 4 ? mask64(wdt) : ~0ULL); /* sometimes bits above n set */
      total += (size_t)wdt;
      nf++;
    }
    memset(lib, 0xee, sizeof lib);
    distro__bitw w;
    distro__bitw_init(&w, lib, CAP);
    rbits rw;
    rinit(&rw, ref, CAP);
    distro__bitw_put(&w, 0, lead);
    rput(&rw, 0, lead);
    for (int f = 0; f < nf; f++) {
      distro__bitw_put(&w, vals[f], widths[f]);
      rput(&rw, vals[f], widths[f]);
    }
    cr_assert_eq(w.overflow, 0);
    cr_assert_eq(w.pos, total, "trial %d (seed %llu)", trial, SEED);
    cr_assert_eq(distro__bitw_bytes(&w), (total + 7) / 8);
    cr_assert_eq(memcmp(lib, ref, CAP), 0, "trial %d lead %d: bytes differ from LSB-first reference (seed %llu)",
                 trial, lead, SEED);
    for (int i = CAP; i < CAP + 8; i++) cr_assert_eq(lib[i], 0xee, "wrote past the buffer");
    /* Read back from a buffer of exactly the written bytes. */
    const size_t len = (total + 7) / 8;
    distro__bitr rd;
    distro__bitr_init(&rd, lib, len);
    cr_assert_eq(distro__bitr_get(&rd, lead), 0);
    for (int f = 0; f < nf; f++) {
      uint64_t got = distro__bitr_get(&rd, widths[f]);
      cr_assert_eq(got, vals[f] & mask64(widths[f]), "trial %d field %d width %d (seed %llu)", trial, f, widths[f],
                   SEED);
    }
    cr_assert_eq(rd.error, 0);
    cr_assert_eq(rd.pos, total);
    /* The padding bits are readable (zero); one bit more is an error. */
    const size_t pad = 8 * len - total;
    cr_assert_eq(distro__bitr_get(&rd, (int)pad), 0);
    cr_assert_eq(rd.error, 0);
    cr_assert_eq(distro__bitr_get(&rd, 1), 0);
    cr_assert_eq(rd.error, 1);
    cr_assert_eq(rd.pos, 8 * len, "an overrun leaves the reader at its end");
  }
}

Test(codecs, bits_long_fields_rice_and_unary) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  uint8_t lib[4096], ref[4096];
  for (int lead = 0; lead < 16; lead++)
    for (int n = 1; n <= 127; n++) {
      u128 v = (u128)tu_next(&r) << 64 | tu_next(&r);
      u128 want = n == 128 ? v : v & (((u128)1 << n) - 1);
      distro__bitw w;
      distro__bitw_init(&w, lib, 64);
      rbits rw;
      rinit(&rw, ref, 64);
      distro__bitw_put(&w, 0, lead);
      rput(&rw, 0, lead);
      distro__bitw_put_long(&w, want, n);
      rput128(&rw, want, n);
      cr_assert_eq(memcmp(lib, ref, 64), 0, "long field lead %d width %d (seed %llu)", lead, n, SEED);
      distro__bitr rd;
      distro__bitr_init(&rd, lib, distro__bitw_bytes(&w));
      distro__bitr_get(&rd, lead);
      u128 got = distro__bitr_get_long(&rd, n);
      cr_assert(got == want && !rd.error, "long field lead %d width %d (seed %llu)", lead, n, SEED);
    }
  /* Rice codes: q ones, a zero, b low bits; long unary runs included. */
  for (int trial = 0; trial < 300; trial++) {
    const int b = (int)(tu_next(&r) % 31), lead = (int)(tu_next(&r) % 8);
    uint64_t v[40];
    distro__bitw w;
    distro__bitw_init(&w, lib, sizeof lib);
    rbits rw;
    rinit(&rw, ref, sizeof ref);
    distro__bitw_put(&w, 0, lead);
    rput(&rw, 0, lead);
    uint64_t maxq = 0;
    for (int i = 0; i < 40; i++) {
      uint64_t q = tu_next(&r) % (i % 5 == 0 ? 130 : 4);
      v[i] = q << b | (tu_next(&r) & mask64(b));
      if (q > maxq) maxq = q;
      distro__bitw_rice(&w, v[i], b);
      rrice(&rw, v[i], b);
    }
    cr_assert_eq(w.overflow, 0);
    cr_assert_eq(w.pos, rw.pos);
    cr_assert_eq(memcmp(lib, ref, rbytes(&rw)), 0, "rice b %d (seed %llu)", b, SEED);
    distro__bitr rd;
    distro__bitr_init(&rd, lib, rbytes(&rw));
    distro__bitr_get(&rd, lead);
    for (int i = 0; i < 40; i++) cr_assert_eq(distro__bitr_rice(&rd, b, maxq), v[i], "rice value %d b %d", i, b);
    cr_assert_eq(rd.error, 0);
    cr_assert_eq(rd.pos, rw.pos);
    /* A quotient limit below the largest quotient is an error. */
    if (maxq > 0) {
      distro__bitr_init(&rd, lib, rbytes(&rw));
      distro__bitr_get(&rd, lead);
      for (int i = 0; i < 40 && !rd.error; i++) distro__bitr_rice(&rd, b, maxq - 1);
      cr_assert_eq(rd.error, 1, "quotient limit %llu not enforced", (unsigned long long)(maxq - 1));
    }
  }
  /* Unary: L ones then a zero; limit L accepts, L - 1 rejects; no zero rejects. */
  for (uint64_t L = 0; L < 100; L++) {
    distro__bitw w;
    distro__bitw_init(&w, lib, 32);
    for (uint64_t i = 0; i < L; i++) distro__bitw_put(&w, 1, 1);
    distro__bitw_put(&w, 0, 1);
    distro__bitr rd;
    distro__bitr_init(&rd, lib, distro__bitw_bytes(&w));
    cr_assert_eq(distro__bitr_unary(&rd, L), L);
    cr_assert_eq(rd.error, 0);
    if (L > 0) {
      distro__bitr_init(&rd, lib, distro__bitw_bytes(&w));
      distro__bitr_unary(&rd, L - 1);
      cr_assert_eq(rd.error, 1);
    }
    memset(lib, 0xff, 32);
    distro__bitr_init(&rd, lib, 32);
    distro__bitr_unary(&rd, 1000);
    cr_assert_eq(rd.error, 1, "unterminated unary run");
    cr_assert_leq(rd.pos, 256);
  }
}

Test(codecs, bits_writer_overflow_and_reader_bounds) {
  uint8_t buf[16];
  memset(buf, 0xaa, sizeof buf);
  distro__bitw w;
  distro__bitw_init(&w, buf, 4);
  for (int i = 0; i < 4; i++) cr_assert_eq(buf[i], 0, "init clears the buffer");
  cr_assert_eq(buf[4], 0xaa);
  distro__bitw_put(&w, 0x7fffff, 23);
  distro__bitw_put(&w, 0x1ff, 9); /* exactly 32 bits */
  cr_assert_eq(w.overflow, 0);
  cr_assert_eq(w.pos, 32);
  distro__bitw_put(&w, 1, 1);
  cr_assert_eq(w.overflow, 1, "a write past cap sets overflow");
  cr_assert_eq(w.pos, 32, "and writes nothing");
  for (int i = 4; i < 16; i++) cr_assert_eq(buf[i], 0xaa, "byte %d written past cap", i);
  distro__bitw_init(&w, buf, 0);
  distro__bitw_put(&w, 0, 0);
  cr_assert_eq(w.overflow, 0, "empty writes fit an empty buffer");
  distro__bitw_put(&w, 0, 1);
  cr_assert_eq(w.overflow, 1);
  /* Reader: an overrun returns 0, sets error and stops at the end. */
  const uint8_t data[3] = {0xff, 0xff, 0xff};
  distro__bitr r;
  distro__bitr_init(&r, data, 3);
  cr_assert_eq(distro__bitr_get(&r, 20), 0xfffff);
  cr_assert_eq(distro__bitr_get(&r, 5), 0);
  cr_assert_eq(r.error, 1);
  cr_assert_eq(r.pos, 24);
  distro__bitr_init(&r, data, 0);
  cr_assert_eq(distro__bitr_get(&r, 0), 0);
  cr_assert_eq(r.error, 0);
  cr_assert_eq(distro__bitr_get(&r, 1), 0);
  cr_assert_eq(r.error, 1);
}

/* ======================================================= the document's examples */

static void expect_bytes(const uint8_t *got, size_t n, const uint8_t *want, size_t wn, const char *what) {
  cr_assert_eq(n, wn, "%s: %zu bytes, the document says %zu", what, n, wn);
  cr_assert_eq(memcmp(got, want, wn), 0, "%s: bytes differ from the document", what);
}

Test(codecs, documented_examples) {
  uint8_t b[32];
  /* Bit order: 5 in 3 bits, then 1 in 2 bits. */
  distro__bitw w;
  distro__bitw_init(&w, b, 1);
  distro__bitw_put(&w, 5, 3);
  distro__bitw_put(&w, 1, 2);
  cr_assert_eq(b[0], 0x0d);
  /* Index sections: one chunk of n = 48, k = 3, {2, 7, 40}. */
  const uint32_t idx[3] = {2, 7, 40};
  distro__enum_table et;
  cr_assert_eq(distro__enum_table_init(&et, 48, 3), 1);
  cr_assert_eq(et.bits, 15);
  const uint8_t fixed[] = {0x02, 0x07, 0x28}, pack[] = {0x02, 0x70, 0x00, 0x28, 0x00}, rice[] = {0x84, 0x0f},
                enm[] = {0xaf, 0x26};
  expect_bytes(b, distro__idx_encode(idx, 1, 3, 48, &et, DISTRO__IDX_FIXED, 0, b, sizeof b), fixed, 3, "FIXED");
  expect_bytes(b, distro__idx_encode(idx, 1, 3, 48, &et, DISTRO__IDX_PACK12, 0, b, sizeof b), pack, 5, "PACK12");
  expect_bytes(b, distro__idx_encode(idx, 1, 3, 48, &et, DISTRO__IDX_RICE, 3, b, sizeof b), rice, 2, "RICE b=3");
  expect_bytes(b, distro__idx_encode(idx, 1, 3, 48, &et, DISTRO__IDX_ENUM, 0, b, sizeof b), enm, 2, "ENUM");
  distro__idx_codec cc;
  int cp;
  cr_assert_eq(distro__idx_choose(idx, 1, 3, 48, &et, &cc, &cp), 2);
  distro__enum_table_destroy(&et);
  /* ENUM at chunk 64: 44 bits per chunk at topk 4; none at topk 32. */
  cr_assert_eq(distro__enum_table_init(&et, 4096, 4), 1);
  cr_assert_eq(et.bits, 44);
  distro__enum_table_destroy(&et);
  cr_assert_eq(distro__enum_table_init(&et, 4096, 32), 0);
  /* Value sections: one chunk of 0.75, -0.1875, 3.0, 1.5. */
  const float v[4] = {0.75f, -0.1875f, 3.0f, 1.5f};
  const uint8_t f32[] = {0x00, 0x00, 0x40, 0x3f, 0x00, 0x00, 0x40, 0xbe, 0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0xc0, 0x3f};
  const uint8_t raw[] = {0x40, 0x3f, 0x40, 0xbe, 0x40, 0x40, 0xc0, 0x3f}, exp0[] = {0x80, 0x80, 0x0b, 0x7c, 0x80, 0x00, 0x03};
  const uint8_t sign[] = {0x02}, i8[] = {0xc2, 0x3c, 0x20, 0xf8, 0x7f, 0x3f}, i4[] = {0xdc, 0x3e, 0x02, 0x37};
  int param;
  cr_assert_eq(distro__val_plan(DISTRO_VALUES_BF16, v, 1, 4, &param), 7);
  cr_assert_eq(param, 0, "the encoder picks b = 0");
  expect_bytes(b, distro__val_encode(DISTRO_VALUES_F32, 0, v, 1, 4, b, sizeof b), f32, 16, "F32");
  expect_bytes(b, distro__val_encode(DISTRO_VALUES_BF16, DISTRO__BF16_RAW, v, 1, 4, b, sizeof b), raw, 8, "BF16 raw");
  expect_bytes(b, distro__val_encode(DISTRO_VALUES_BF16, 0, v, 1, 4, b, sizeof b), exp0, 7, "BF16 b=0");
  expect_bytes(b, distro__val_encode(DISTRO_VALUES_SIGN1, 0, v, 1, 4, b, sizeof b), sign, 1, "SIGN1");
  expect_bytes(b, distro__val_encode(DISTRO_VALUES_INT8, 0, v, 1, 4, b, sizeof b), i8, 6, "INT8");
  expect_bytes(b, distro__val_encode(DISTRO_VALUES_INT4, 0, v, 1, 4, b, sizeof b), i4, 4, "INT4");
  float back[4];
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT4, 0, i4, 4, 1, 4, back).kind, DISTRO__CODEC_OK);
  cr_assert(back[0] == 2 * 0.4296875f && back[1] == 0.0f && back[2] == 7 * 0.4296875f && back[3] == 3 * 0.4296875f);
}
