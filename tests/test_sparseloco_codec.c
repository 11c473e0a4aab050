/* Sparse DiLoCo outer gradients (SparseLoCo), the pieces on the wire: the
 * INT2 value codec (error within half a scale, no decode of what no encoder
 * writes), the chunk views and the payload format (round trip, rejections).
 * The compressor and the outer step are in test_sparseloco_reference.c and
 * test_sparseloco_runs.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distro/distro.h>

#include "compress/outer_sparse.h"
#include "compress/value_codec.h"
#include "testutil.h"
#include "wire_ref.h"

/* ---- the INT2 value codec ------------------------------------------------------ */

Test(sparseloco, int2_codec_error_within_half_a_scale) {
  const uint64_t seed = tu_seed();
  tu_rng rng = {seed};
  enum { NC = 37, K = 13 };
  float val[NC * K], dec[NC * K];
  uint8_t buf[2 * NC + (NC * K + 3) / 4 + 8];
  for (int round = 0; round < 50; round++) {
    for (int c = 0; c < NC; c++) {
      const double mag = pow(10.0, -30 + 60 * tu_uniform(&rng)); /* every chunk its own magnitude */
      for (int j = 0; j < K; j++) val[c * K + j] = (float)(mag * tu_normal(&rng));
      if (c == 3) memset(val + c * K, 0, sizeof(float) * K); /* an all-zero chunk */
    }
    int param = -1;
    const size_t plan = distro__val_plan(DISTRO_VALUES_INT2, val, NC, K, &param);
    cr_assert_eq(plan, (size_t)(2 * NC + (NC * K + 3) / 4), "2 scale bytes per chunk and 2 bits per value");
    cr_assert_eq(param, 0);
    cr_assert_eq(distro__val_encode(DISTRO_VALUES_INT2, 0, val, NC, K, buf, sizeof buf), plan);
    cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, buf, plan, NC, K, dec).kind, DISTRO__CODEC_OK);
    for (int c = 0; c < NC; c++) {
      double amax = 0;
      for (int j = 0; j < K; j++) amax = fmax(amax, fabs((double)val[c * K + j]));
      /* The scale, from the bytes: the bf16 at or just above amax / 2. */
      const uint32_t sb = (uint32_t)(buf[2 * c] | buf[2 * c + 1] << 8) << 16;
      float s;
      memcpy(&s, &sb, 4);
      cr_assert(s >= amax / 2 && s <= amax / 2 * (1 + ldexp(1, -7)) + ldexp(1, -133),
                "chunk %d: scale %g for amax %g (DISTRO_TEST_SEED=%llu)", c, (double)s, amax, (unsigned long long)seed);
      for (int j = 0; j < K; j++) {
        const double x = val[c * K + j], y = dec[c * K + j];
        const double lvl = y / s + 1.5; /* the code */
        cr_assert(s == 0 ? y == 0 : (lvl == 0 || lvl == 1 || lvl == 2 || lvl == 3),
                  "chunk %d value %d decodes to %g, not a level of scale %g", c, j, y, (double)s);
        cr_assert(fabs(x - y) <= s / 2 * (1 + 1e-6), "chunk %d value %d: %g -> %g, error above s/2 = %g (seed %llu)",
                  c, j, x, y, (double)s / 2, (unsigned long long)seed);
        if (fabs(x) > s) cr_assert(x * y > 0, "a value beyond one scale keeps its sign");
      }
    }
  }
}

Test(sparseloco, int2_decoder_rejects_what_no_encoder_writes) {
  float val[8] = {1, -2, 3, -4, 0, 0, 0, 0}, dec[8];
  uint8_t buf[16];
  const size_t n = distro__val_encode(DISTRO_VALUES_INT2, 0, val, 2, 4, buf, sizeof buf);
  cr_assert_eq(n, 2 * 2 + 2);
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, buf, n, 2, 4, dec).kind, DISTRO__CODEC_OK);
  cr_assert_eq(dec[5], 0.0f, "a zero-scale chunk decodes to 0");
  uint8_t b[16];
  memcpy(b, buf, n);
  b[1] |= 0x80; /* negative scale */
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, b, n, 2, 4, dec).kind, DISTRO__CODEC_VALUES);
  memcpy(b, buf, n);
  b[0] = 0x80, b[1] = 0x7f; /* scale +Inf */
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, b, n, 2, 4, dec).kind, DISTRO__CODEC_VALUES);
  memcpy(b, buf, n);
  b[0] = 0x7f, b[1] = 0x7f; /* finite, but 2s overflows */
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, b, n, 2, 4, dec).kind, DISTRO__CODEC_VALUES);
  memcpy(b, buf, n);
  b[5] ^= 0x01; /* the zero-scale chunk's first code is not 2 */
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, b, n, 2, 4, dec).kind, DISTRO__CODEC_VALUES);
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, buf, n - 1, 2, 4, dec).kind, DISTRO__CODEC_VALUES,
               "short section accepted");
  uint8_t longer[17];
  memcpy(longer, buf, n);
  longer[n] = 0;
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, longer, n + 1, 2, 4, dec).kind, DISTRO__CODEC_VALUES,
               "long section accepted");
  /* 3 values: 6 bits used, the top two must be zero. */
  const size_t n3 = distro__val_encode(DISTRO_VALUES_INT2, 0, val, 1, 3, buf, sizeof buf);
  cr_assert_eq(n3, 3);
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, buf, n3, 1, 3, dec).kind, DISTRO__CODEC_OK);
  buf[2] |= 0x80;
  cr_assert_eq(distro__val_decode(DISTRO_VALUES_INT2, 0, buf, n3, 1, 3, dec).kind, DISTRO__CODEC_VALUES,
               "padding bits accepted");
}

/* ---- views and the payload ----------------------------------------------------- */

Test(sparseloco, views_follow_the_chunk_rule) {
  distro__tiling t[2];
  int matrix;
  const int64_t m[2] = {64, 48}, v[1] = {600}, odd[2] = {33, 7};
  cr_assert_eq(distro__sparse_views(2, m, 0, 64 * 48, 16, 0.05, t, &matrix), 1);
  cr_assert(matrix && t[0].h == 16 && t[0].w == 16 && t[0].nchunks == 12 && t[0].k == 13);
  cr_assert_eq(distro__sparse_views(2, m, 96, 48 * 10, 16, 0.05, t, &matrix), 1, "whole rows 2..11");
  cr_assert(matrix && t[0].rows == 10 && t[0].h == 10 && t[0].w == 16);
  cr_assert_eq(distro__sparse_views(2, m, 5, 600, 16, 0.05, t, &matrix), 2, "part rows: runs of 256 and the rest");
  cr_assert(!matrix && t[0].w == 256 && t[0].nchunks == 2 && t[1].w == 88 && t[1].nchunks == 1 && t[1].k == 4);
  cr_assert_eq(distro__sparse_views(1, v, 0, 600, 16, 0.05, t, &matrix), 2);
  cr_assert_eq(distro__sparse_views(1, v, 0, 512, 16, 0.05, t, &matrix), 1, "no empty remainder");
  cr_assert_eq(distro__sparse_views(2, odd, 0, 231, 16, 0.05, t, &matrix), 1);
  cr_assert(t[0].h == 11 && t[0].w == 7 && t[0].k == 4);
  cr_assert_eq(distro__sparse_views(1, v, 0, 600, 16, 1.0, t, &matrix), 2);
  cr_assert(t[0].k == 256 && t[1].k == 88, "density 1 keeps everything");
  cr_assert_eq(distro__sparse_views(1, v, 0, 600, 16, 1e-9, t, &matrix), 2);
  cr_assert(t[0].k == 1, "at least one per chunk");
  cr_assert_eq(distro__sparse_views(1, v, 0, 600, 257, 0.05, t, &matrix), -1);
  cr_assert_eq(distro__sparse_k(4096, 0.02), 82);
}

/* Sections of a small fragment and a selection for them. */
typedef struct {
  distro__sparse_section s[4];
  int n;
  int64_t nsel;
  distro__enum_table et[4];
} sections;

static void sections_make(sections *x, double density) {
  const int64_t m[2] = {64, 48}, v[1] = {600};
  distro__tiling t[2];
  int matrix, n = 0;
  int64_t elem = 0;
  memset(x, 0, sizeof *x);
  const int nv1 = distro__sparse_views(2, m, 0, 64 * 48, 16, density, t, &matrix);
  for (int i = 0; i < nv1; i++, n++) {
    x->s[n] = (distro__sparse_section){elem, t[i].rows * t[i].cols, 0, t[i], 0, NULL, 0};
    elem += x->s[n].count;
  }
  const int nv2 = distro__sparse_views(1, v, 0, 600, 16, density, t, &matrix);
  for (int i = 0; i < nv2; i++, n++) {
    x->s[n] = (distro__sparse_section){elem, t[i].rows * t[i].cols, 1, t[i], 0, NULL, 0};
    elem += x->s[n].count;
  }
  for (int i = 0; i < n; i++) {
    distro__enum_table_init(&x->et[i], x->s[i].t.chunk_elems, x->s[i].t.k);
    x->s[i].et = x->et[i].c ? &x->et[i] : NULL;
  }
  x->n = n;
  x->nsel = distro__sparse_layout(x->s, n);
}
static void sections_free(sections *x) {
  for (int i = 0; i < x->n; i++) distro__enum_table_destroy(&x->et[i]);
}

static void random_selection(tu_rng *r, const sections *x, uint32_t *idx, float *val) {
  for (int i = 0; i < x->n; i++) {
    const distro__tiling *t = &x->s[i].t;
    for (int64_t c = 0; c < t->nchunks; c++) {
      uint32_t *ci = idx + x->s[i].sel + c * t->k;
      int64_t got = 0;
      for (int64_t e = 0; e < t->chunk_elems && got < t->k; e++) /* k of n uniformly, in order */
        if ((double)(t->k - got) > tu_uniform(r) * (double)(t->chunk_elems - e)) ci[got++] = (uint32_t)e;
      for (int64_t j = 0; j < t->k; j++) val[x->s[i].sel + c * t->k + j] = (float)tu_normal(r);
    }
  }
}

static distro__sparse_head head_for(distro_values v, uint32_t learner, uint32_t flags) {
  distro__sparse_head h = {{DISTRO__SPARSE_VERSION, (unsigned)v, learner, 2, 77, 1000, 5, 64 * 48 + 600, flags, 16},
                           0.05f};
  return h;
}

Test(sparseloco, payload_round_trip_and_rejections) {
  const uint64_t seed = tu_seed();
  tu_rng rng = {seed};
  sections x;
  sections_make(&x, 0.05);
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)x.nsel), *didx = malloc(sizeof(uint32_t) * (size_t)x.nsel);
  float *val = malloc(sizeof(float) * (size_t)x.nsel), *dval = malloc(sizeof(float) * (size_t)x.nsel);
  const distro_values codecs[5] = {DISTRO_VALUES_INT2, DISTRO_VALUES_INT4, DISTRO_VALUES_INT8, DISTRO_VALUES_BF16,
                                   DISTRO_VALUES_F32};
  for (int c = 0; c < 5; c++) {
    random_selection(&rng, &x, idx, val);
    const distro__sparse_head h = head_for(codecs[c], 1, 0);
    const uint64_t cap = distro__sparse_bound(x.s, x.n, codecs[c]);
    uint8_t *buf = malloc(cap);
    const size_t n = distro__sparse_encode(buf, cap, x.s, x.n, &h, idx, val);
    cr_assert(n > DISTRO__SPARSE_HEADER && n <= cap, "codec %d: size %zu, bound %llu", c, n, (unsigned long long)cap);
    distro__dlc_head got;
    int bad;
    cr_assert_eq(distro__sparse_decode(buf, n, 1, x.s, x.n, &h, &got, &bad, didx, dval), DISTRO_OK, "%s",
                 distro_last_error());
    cr_assert(got.tokens == 1000 && got.steps == 5);
    cr_assert_eq(memcmp(idx, didx, sizeof(uint32_t) * (size_t)x.nsel), 0, "indices differ after a round trip");
    if (codecs[c] == DISTRO_VALUES_F32) cr_assert_eq(memcmp(val, dval, sizeof(float) * (size_t)x.nsel), 0);
    /* Any flipped byte is caught (the CRC, or the checks behind it). */
    for (size_t at = 0; at < n; at += 1 + n / 97) {
      buf[at] ^= 0x20;
      cr_assert_eq(distro__sparse_decode(buf, n, 1, x.s, x.n, &h, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD,
                   "byte %zu flipped and accepted", at);
      cr_assert(strstr(distro_last_error(), "learner 1") != NULL, "%s", distro_last_error());
      buf[at] ^= 0x20;
    }
    /* Well-formed, resealed, but wrong: slot, fragment, density, size. */
    cr_assert_eq(distro__sparse_decode(buf, n, 2, x.s, x.n, &h, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD);
    distro__sparse_head other = h;
    other.dlc.fragment = 3;
    cr_assert_eq(distro__sparse_decode(buf, n, 1, x.s, x.n, &other, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD);
    other = h;
    other.density = 0.04f;
    cr_assert_eq(distro__sparse_decode(buf, n, 1, x.s, x.n, &other, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD);
    cr_assert_eq(distro__sparse_decode(buf, n - 1, 1, x.s, x.n, &h, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD);
    if (codecs[c] == DISTRO_VALUES_F32) { /* a NaN value behind a valid CRC */
      const uint8_t *d = buf + DISTRO__SPARSE_HEADER;
      const size_t vat = DISTRO__SPARSE_HEADER + (size_t)x.n * DISTRO__SPARSE_DESC + rd32(d + 4);
      const float nan = NAN;
      memcpy(buf + vat, &nan, 4);
      wr32(buf + n - 4, ref_crc32c(buf, n - 4));
      cr_assert_eq(distro__sparse_decode(buf, n, 1, x.s, x.n, &h, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD);
      cr_assert_eq(bad, 0, "the bad section is named");
      cr_assert(strstr(distro_last_error(), "non-finite") != NULL, "%s", distro_last_error());
    }
    free(buf);
  }
  /* An abort payload: header and empty sections, rejected with its reason. */
  uint8_t ab[256];
  const distro__sparse_head h = head_for(DISTRO_VALUES_INT2, 0, DISTRO__DLC_FLAG_ABORT);
  const size_t n = distro__sparse_encode(ab, sizeof ab, x.s, x.n, &h, NULL, NULL);
  cr_assert_eq(n, DISTRO__SPARSE_HEADER + (size_t)x.n * DISTRO__SPARSE_DESC + 4);
  distro__dlc_head got;
  int bad;
  distro__sparse_head want = h;
  want.dlc.flags = 0;
  cr_assert_eq(distro__sparse_decode(ab, n, 0, x.s, x.n, &want, &got, &bad, didx, dval), DISTRO_ERR_PAYLOAD);
  cr_assert(strstr(distro_last_error(), "not finite") != NULL, "%s", distro_last_error());
  free(idx);
  free(didx);
  free(val);
  free(dval);
  sections_free(&x);
}
