/* Payload wire format v2 (docs/wire-format.md, "Wire format v2"), part 1:
 * header and descriptor bytes at the documented offsets, encode -> decode
 * round trips for every values codec, payloads assembled independently from
 * the document (any valid codec choice must decode; the encoder's choice must
 * match byte for byte), the documented sizes and abort payloads. The
 * decoder's rejections are in test_wire2_reject.c.
 *
 * Inputs are fresh random each run (DISTRO_TEST_SEED reproduces one); the
 * seed is in every failure message. */
#include <criterion/criterion.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/error.h"
#include "compress/bits.h"
#include "compress/chunk.h"
#include "compress/index_codec.h"
#include "compress/value_codec.h"
#include "compress/wire.h"
#include "compress/wire2.h"
#include "testutil.h"
#include "wire2_util.h"
#include "wire_ref.h"

/* ---------------------------------------------------------------- helpers */

/* Decodes p's own payload and compares with what was encoded. */
static void expect_decodes(const payload *p, uint64_t seed) {
  outs o = outs_new(p);
  int ab = 7;
  uint32_t st, te;
  distro_status s = distro__wire2_decode(p->buf, p->size, p->ts, p->n, p->codec, 5, &ab, &st, &te, o.idx, o.val);
  cr_assert_eq(s, DISTRO_OK, "%s (seed %llu)", distro_last_error(), SEED);
  cr_assert_eq(ab, 0);
  for (int i = 0; i < p->n; i++) {
    const distro__tiling *t = &p->ts[i].t;
    cr_assert_eq(memcmp(o.idx[i], p->idx[i], sizeof(uint32_t) * (size_t)count_of(t)), 0,
                 "tensor %d: indices differ (codec %d, seed %llu)", i, (int)p->codec, SEED);
    const int qmax = p->codec == DISTRO_VALUES_INT8 ? 127 : 7;
    for (int64_t c = 0; c < t->nchunks; c++) {
      double amax = 0;
      for (int64_t j = c * t->k; j < (c + 1) * t->k; j++) amax = fmax(amax, fabs((double)p->val[i][j]));
      for (int64_t j = c * t->k; j < (c + 1) * t->k; j++) {
        const float in = p->val[i][j], got = o.val[i][j];
        switch (p->codec) {
          case DISTRO_VALUES_F32:
            cr_assert_eq(f2u(got), f2u(in), "tensor %d coef %lld: F32 %a -> %a", i, (long long)j, (double)in, (double)got);
            break;
          case DISTRO_VALUES_BF16:
            cr_assert_eq(f2u(got), (uint32_t)distro__bf16_from_float(in) << 16, "tensor %d coef %lld: BF16 %a -> %a", i,
                         (long long)j, (double)in, (double)got);
            break;
          case DISTRO_VALUES_SIGN1:
            cr_assert_eq(f2u(got), f2u(signbit(in) ? -1.0f : 1.0f), "tensor %d coef %lld: SIGN1", i, (long long)j);
            break;
          default: {
            /* scale <= (amax/qmax)(1 + 2^-7) (+ 2^-133 among subnormals);
             * error <= scale/2 */
            const double bound = (amax / qmax * (1 + ldexp(1, -7)) + ldexp(1, -133)) / 2 * (1 + ldexp(1, -15));
            cr_assert_leq(fabs((double)in - got), bound, "tensor %d coef %lld codec %d: %a -> %a (seed %llu)", i,
                          (long long)j, (int)p->codec, (double)in, (double)got, SEED);
            if (amax == 0) cr_assert_eq(got, 0.0f);
            break;
          }
        }
      }
    }
  }
  outs_free(&o);
}

/* ---------------------------------------------------------------- layout */

/* Every header and descriptor field at its documented offset; the sections
 * are what the section codecs produce for the tensor alone; CRC32C. */
Test(wire2, header_and_descriptors) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    const uint8_t *b = p.buf;
    cr_assert_eq(memcmp(b, "DTRO", 4), 0);
    cr_assert_eq(rd32(b), 0x4f525444u);
    cr_assert_eq(b[4], 2);
    cr_assert_eq(b[5], 0);
    cr_assert_eq(b[6], (uint8_t)codecs[c]);
    cr_assert_eq(b[7], 0);
    cr_assert_eq(rd32(b + 8), (uint32_t)NMIXED);
    cr_assert_eq(rd32(b + 12), p.sender);
    cr_assert_eq(rd64(b + 16), p.step);
    cr_assert_eq(rd64(b + 24), p.size);
    cr_assert_eq(rd32(b + 32), 0);
    cr_assert_eq(rd32(b + 36), 0);
    size_t at = HEAD(NMIXED);
    for (int i = 0; i < NMIXED; i++) {
      const uint8_t *d = b + 40 + 40 * i;
      const distro__tiling *t = &p.ts[i].t;
      cr_assert_eq(rd32(d), (uint32_t)t->h);
      cr_assert_eq(rd32(d + 4), (uint32_t)t->w);
      cr_assert_eq(rd32(d + 8), (uint32_t)t->k);
      cr_assert_eq(d[15], 0, "reserved byte");
      cr_assert_eq(rd64(d + 16), (uint64_t)t->nchunks);
      /* Index section: the chooser's codec, parameter and size. */
      distro__idx_codec ic;
      int ip;
      size_t ib = distro__idx_choose(p.idx[i], t->nchunks, t->k, t->chunk_elems, p.ts[i].et, &ic, &ip);
      cr_assert_eq(d[12], (uint8_t)ic, "tensor %d index codec", i);
      cr_assert_eq(d[13], (uint8_t)ip, "tensor %d index parameter", i);
      cr_assert_eq(rd64(d + 24), ib, "tensor %d index bytes", i);
      uint8_t *sec = malloc(ib + 1);
      cr_assert_eq(distro__idx_encode(p.idx[i], t->nchunks, t->k, t->chunk_elems, p.ts[i].et, ic, ip, sec, ib), ib);
      cr_assert_eq(memcmp(b + at, sec, ib), 0, "tensor %d index section", i);
      free(sec);
      at += ib;
      /* Value section. */
      int vp;
      size_t vb = distro__val_plan(codecs[c], p.val[i], t->nchunks, t->k, &vp);
      cr_assert_eq(d[14], (uint8_t)vp, "tensor %d value parameter", i);
      cr_assert_eq(rd64(d + 32), vb, "tensor %d value bytes", i);
      sec = malloc(vb + 1);
      cr_assert_eq(distro__val_encode(codecs[c], vp, p.val[i], t->nchunks, t->k, sec, vb), vb);
      cr_assert_eq(memcmp(b + at, sec, vb), 0, "tensor %d value section", i);
      free(sec);
      at += vb;
    }
    cr_assert_eq(at + 4, p.size, "sections tile the payload");
    cr_assert_eq(rd32(b + at), ref_crc32c(b, at), "CRC32C of everything before it");
    for (size_t j = p.size; j < p.cap; j++) cr_assert_eq(p.buf[j], 0xa5, "wrote past the payload");
    destroy(&p);
  }
}

/* A payload assembled from the document with the encoder's codec choices is
 * the encoder's payload, byte for byte. */
Test(wire2, independent_writer_matches, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int rep = 0; rep < 4; rep++)
    for (int c = 0; c < 5; c++) {
      payload p;
      build(&p, mixed, NMIXED, codecs[c], &r);
      section sec[NMIXED];
      split(&p, sec);
      uint8_t *mine = malloc(p.cap);
      size_t n = assemble(mine, p.cap, &p, sec, 0);
      cr_assert_eq(n, p.size);
      cr_assert_eq(memcmp(mine, p.buf, n), 0, "codec %d: assembled payload differs (seed %llu)", c, SEED);
      free(mine);
      destroy(&p);
    }
}

/* ---------------------------------------------------------------- round trips */

static void round_trip(const spec *s, int n, uint64_t seed, int reps) {
  tu_rng r = {seed};
  for (int rep = 0; rep < reps; rep++)
    for (int c = 0; c < 5; c++) {
      payload p;
      build(&p, s, n, codecs[c], &r);
      expect_decodes(&p, seed);
      destroy(&p);
    }
}

Test(wire2, round_trip_mixed) {
  uint64_t seed = tu_seed();
  round_trip(mixed, NMIXED, seed, 4);
  for (int i = 0; i < NMIXED; i++) round_trip(&mixed[i], 1, seed + (uint64_t)i, 2);
}

Test(wire2, round_trip_gpt2_shapes) {
  const spec s[] = {{2, {768, 768}, 64, 32}, {1, {768}, 64, 32}, {2, {3072, 768}, 64, 4}, {2, {50257, 64}, 64, 8}};
  round_trip(s, 4, tu_seed(), 1);
}

Test(wire2, empty_tensor_list) {
  payload p;
  memset(&p, 0, sizeof p);
  setup_tensors(&p, NULL, 0);
  p.codec = DISTRO_VALUES_F32;
  cr_assert_eq(distro__wire2_bound(p.ts, 0, DISTRO_VALUES_F32), 44);
  uint8_t b[44];
  cr_assert_eq(distro__wire2_encode(b, sizeof b, p.ts, 0, DISTRO_VALUES_F32, 3, 4, NULL, NULL), 44);
  int ab;
  uint32_t st, te;
  cr_assert_eq(distro__wire2_decode(b, 44, p.ts, 0, DISTRO_VALUES_F32, 0, &ab, &st, &te, NULL, NULL), DISTRO_OK);
  cr_assert_eq(distro__wire2_encode(b, 43, p.ts, 0, DISTRO_VALUES_F32, 3, 4, NULL, NULL), 0, "cap below 44");
  destroy(&p);
}

/* Any valid choice of index codec and parameter, and of BF16 parameter,
 * decodes: the receiver must not assume the encoder's choice. */
Test(wire2, any_valid_codec_choice_decodes, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int rep = 0; rep < 6; rep++)
    for (int c = 0; c < 5; c++) {
      payload p;
      build(&p, mixed, NMIXED, codecs[c], &r);
      section sec[NMIXED];
      uint8_t *isec[NMIXED], *vsec[NMIXED];
      for (int i = 0; i < NMIXED; i++) {
        const distro__tiling *t = &p.ts[i].t;
        const int64_t n = t->chunk_elems;
        int choices[4], nc = 0;
        choices[nc++] = DISTRO__IDX_FIXED;
        if (n <= 4096) choices[nc++] = DISTRO__IDX_PACK12;
        choices[nc++] = DISTRO__IDX_RICE;
        if (p.ts[i].et) choices[nc++] = DISTRO__IDX_ENUM;
        sec[i].icodec = choices[tu_next(&r) % (uint64_t)nc];
        sec[i].iparam = sec[i].icodec == DISTRO__IDX_RICE ? (int)(tu_next(&r) % 13) : 0;
        const size_t icap = (size_t)count_of(t) * (size_t)(((uint64_t)n >> sec[i].iparam) + 40) / 8 + 64;
        isec[i] = malloc(icap);
        sec[i].ib = distro__idx_encode(p.idx[i], t->nchunks, t->k, n, p.ts[i].et, (distro__idx_codec)sec[i].icodec,
                                       sec[i].iparam, isec[i], icap);
        cr_assert_gt(sec[i].ib, 0);
        sec[i].isec = isec[i];
        const int bf[5] = {0, 1, 2, 3, DISTRO__BF16_RAW};
        sec[i].vparam = codecs[c] == DISTRO_VALUES_BF16 ? bf[tu_next(&r) % 5] : 0;
        const size_t vcap = (size_t)count_of(t) * 64 + 64;
        vsec[i] = malloc(vcap);
        sec[i].vb = distro__val_encode(codecs[c], sec[i].vparam, p.val[i], t->nchunks, t->k, vsec[i], vcap);
        cr_assert_gt(sec[i].vb, 0);
        sec[i].vsec = vsec[i];
      }
      size_t cap = HEAD(NMIXED) + 4;
      for (int i = 0; i < NMIXED; i++) cap += sec[i].ib + sec[i].vb;
      free(p.buf);
      p.buf = malloc(cap);
      p.cap = cap;
      p.size = assemble(p.buf, cap, &p, sec, 0);
      expect_decodes(&p, seed);
      for (int i = 0; i < NMIXED; i++) {
        free(isec[i]);
        free(vsec[i]);
      }
      destroy(&p);
    }
}

/* ---------------------------------------------------------------- sizes */

/* The deterministic figures of the document's worked example: one
 * (2048, 2048) tensor at chunk 64 (1024 chunks of 4096 elements). */
Test(wire2, documented_sizes) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const spec s4 = {2, {2048, 2048}, 64, 4}, s32 = {2, {2048, 2048}, 64, 32};
  /* topk 4: 4096 kept; ENUM at ceil(log2 C(4096, 4)) = 44 bits per chunk. */
  const size_t want4[5] = {22100, 0, 6228, 11860, 9812};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, &s4, 1, codecs[c], &r);
    const uint8_t *d = p.buf + 40;
    cr_assert_eq(p.ts[0].t.nchunks, 1024);
    cr_assert_eq(p.ts[0].t.chunk_elems, 4096);
    cr_assert_not_null(p.ts[0].et);
    cr_assert_eq(p.et[0].bits, 44);
    if (d[12] == DISTRO__IDX_ENUM) { /* uniform selections: ENUM; clustered ones: RICE */
      cr_assert_eq(rd64(d + 24), 5632);
      if (want4[c]) cr_assert_eq(p.size, want4[c], "codec %d: %zu", c, p.size);
    }
    const size_t vb[5] = {16384, 0, 512, 6144, 4096};
    if (vb[c]) cr_assert_eq(rd64(d + 32), vb[c]);
    else cr_assert_leq(rd64(d + 32), 8192);
    destroy(&p);
  }
  /* topk 32: 32768 kept; C(4096, 32) > 2^127, so RICE or PACK12. */
  const size_t vb32[5] = {131072, 0, 4096, 34816, 18432};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, &s32, 1, codecs[c], &r);
    const uint8_t *d = p.buf + 40;
    cr_assert_null(p.ts[0].et);
    cr_assert_neq(d[12], DISTRO__IDX_ENUM);
    cr_assert_leq(rd64(d + 24), 49152, "never more than PACK12");
    if (vb32[c]) cr_assert_eq(rd64(d + 32), vb32[c]);
    destroy(&p);
  }
  /* Bounds: u16 indices (the largest the chooser can pick) and raw values. */
  payload p;
  memset(&p, 0, sizeof p);
  setup_tensors(&p, &s4, 1);
  cr_assert_eq(distro__wire2_bound(p.ts, 1, DISTRO_VALUES_F32), 84 + 8192 + 16384);
  cr_assert_eq(distro__wire2_bound(p.ts, 1, DISTRO_VALUES_BF16), 84 + 8192 + 8192);
  cr_assert_eq(distro__wire2_bound(p.ts, 1, DISTRO_VALUES_SIGN1), 84 + 8192 + 512);
  cr_assert_eq(distro__wire2_bound(p.ts, 1, DISTRO_VALUES_INT8), 84 + 8192 + 6144);
  cr_assert_eq(distro__wire2_bound(p.ts, 1, DISTRO_VALUES_INT4), 84 + 8192 + 4096);
  destroy(&p);
}

/* ---------------------------------------------------------------- abort */

Test(wire2, abort_payload, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    memset(p.buf, 0xa5, p.cap);
    size_t n = distro__wire2_encode_abort(p.buf, p.ts, NMIXED, codecs[c], 5, 9, DISTRO_ERR_NONFINITE, 4);
    cr_assert_eq(n, HEAD(NMIXED) + 4, "abort payload: header, descriptors, CRC");
    cr_assert_eq(memcmp(p.buf, "DTRO", 4), 0);
    cr_assert_eq(p.buf[4], 2);
    cr_assert_eq(p.buf[6], (uint8_t)codecs[c]);
    cr_assert_eq(p.buf[7], DISTRO__WIRE_FLAG_ABORT);
    cr_assert_eq(rd32(p.buf + 12), 5);
    cr_assert_eq(rd64(p.buf + 16), 9);
    cr_assert_eq(rd64(p.buf + 24), n);
    cr_assert_eq(rd32(p.buf + 32), DISTRO_ERR_NONFINITE);
    cr_assert_eq(rd32(p.buf + 36), 4);
    for (int i = 0; i < NMIXED; i++) {
      const uint8_t *d = p.buf + 40 + 40 * i;
      cr_assert_eq(rd32(d + 8), (uint32_t)p.ts[i].t.k);
      cr_assert_eq(rd64(d + 16), (uint64_t)p.ts[i].t.nchunks);
      cr_assert(d[12] == 0 && d[13] == 0 && d[14] == 0 && d[15] == 0);
      cr_assert(rd64(d + 24) == 0 && rd64(d + 32) == 0, "empty sections");
    }
    cr_assert_eq(rd32(p.buf + n - 4), ref_crc32c(p.buf, n - 4));
    int ab = 0;
    uint32_t st = 0, te = 0;
    cr_assert_eq(decode(&p, p.buf, n, 2, &ab, &st, &te), DISTRO_OK, "%s", distro_last_error());
    cr_assert_eq(ab, 1);
    cr_assert_eq(st, DISTRO_ERR_NONFINITE);
    cr_assert_eq(te, 4);
    /* Still checked up to its flags. */
    p.buf[50] ^= 1;
    EXPECT_REJECT(&p, p.buf, n, 2, "CRC32C", seed, "abort, corrupt");
    p.buf[50] ^= 1;
    p.buf[6] = (uint8_t)((c + 1) % 5);
    reseal(p.buf, n);
    EXPECT_REJECT(&p, p.buf, n, 2, "values codec", seed, "abort, codec");
    p.buf[6] = (uint8_t)codecs[c];
    p.buf[7] = 5;
    reseal(p.buf, n);
    EXPECT_REJECT(&p, p.buf, n, 2, "unknown flags", seed, "abort, flags 5");
    p.buf[7] = 1;
    reseal(p.buf, n);
    EXPECT_REJECT(&p, p.buf, n - 1, 2, "too short", seed, "abort, short");
    destroy(&p);
  }
}
