/* Payload wire format v1 (docs/wire-format.md), part 2: every rejection the
 * receiver applies, each returning DISTRO_ERR_PAYLOAD with a message naming
 * the peer. CRC32C, bf16, layout and round trips are in test_wire_layout.c.
 * Inputs are fresh random each run (DISTRO_TEST_SEED reproduces one); the
 * seed is in every failure message. */
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

/* ---------------------------------------------------------------- rejections */

Test(wire, reject_wrong_size) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_BF16, &r);
  size_t n = p.l.total;
  EXPECT_REJECT(&p, p.buf, n - 1, 3, "bytes, expected", seed, "short by one");
  EXPECT_REJECT(&p, p.buf, n + 1, 3, "bytes, expected", seed, "long by one");
  EXPECT_REJECT(&p, p.buf, n + 8, 3, "bytes, expected", seed, "long by eight");
  EXPECT_REJECT(&p, p.buf, 0, 3, "bytes, expected", seed, "empty");
  EXPECT_REJECT(&p, p.buf, 4, 3, "bytes, expected", seed, "CRC only");
  /* A payload for a different tensor list (one tensor fewer). */
  payload q;
  build(&q, mixed, NMIXED - 1, DISTRO_VALUES_BF16, &r);
  EXPECT_REJECT(&p, q.buf, q.l.total, 3, "bytes, expected", seed, "other tensor list");
  destroy(&q);
  destroy(&p);
}

Test(wire, reject_bad_magic_and_version) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 3; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (int b = 0; b < 4; b++)
      for (int resealed = 0; resealed < 2; resealed++) {
        uint8_t save = p.buf[b];
        p.buf[b] ^= (uint8_t)(1 + tu_next(&r) % 255);
        if (resealed) reseal(&p);
        EXPECT_REJECT(&p, p.buf, p.l.total, 11, "bad magic", seed, "magic byte %d", b);
        p.buf[b] = save;
        reseal(&p);
      }
    const uint16_t versions[] = {0, 2, 0x100, 0xffff};
    for (int v = 0; v < 4; v++) {
      p.buf[4] = (uint8_t)versions[v];
      p.buf[5] = (uint8_t)(versions[v] >> 8);
      reseal(&p);
      EXPECT_REJECT(&p, p.buf, p.l.total, 11, "wire version", seed, "version %u", versions[v]);
    }
    p.buf[4] = 1;
    p.buf[5] = 0;
    reseal(&p);
    expect_valid(&p, seed, "restored");
    destroy(&p);
  }
}

Test(wire, reject_wrong_codec) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 3; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    const uint8_t others[] = {(uint8_t)((c + 1) % 3), (uint8_t)((c + 2) % 3), 3, 0xff};
    for (int o = 0; o < 4; o++) {
      p.buf[6] = others[o];
      reseal(&p);
      EXPECT_REJECT(&p, p.buf, p.l.total, 4, "values codec", seed, "codec %d as %d", c, others[o]);
    }
    destroy(&p);
  }
}

Test(wire, reject_wrong_tensor_count_and_total) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_F32, &r);
  const uint32_t counts[] = {0, NMIXED - 1, NMIXED + 1, 0xffffffffu, NMIXED + 0x100u};
  for (int i = 0; i < 5; i++) {
    wr32(p.buf + 8, counts[i]);
    reseal(&p);
    EXPECT_REJECT(&p, p.buf, p.l.total, 6, "header disagrees", seed, "tensor count %u", counts[i]);
  }
  wr32(p.buf + 8, NMIXED);
  const uint64_t totals[] = {0, p.l.total - 1, p.l.total + 1, (uint64_t)p.l.total | 1ull << 32};
  for (int i = 0; i < 4; i++) {
    wr64(p.buf + 24, totals[i]);
    reseal(&p);
    EXPECT_REJECT(&p, p.buf, p.l.total, 6, "header disagrees", seed, "total %llu", (unsigned long long)totals[i]);
  }
  wr64(p.buf + 24, p.l.total);
  reseal(&p);
  expect_valid(&p, seed, "restored");
  destroy(&p);
}

Test(wire, reject_descriptor_mismatch) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_SIGN1, &r);
  const int fields[] = {0, 4, 8, 12, 16, 19, 23}; /* h, w, k, width, nchunks (low, high bytes) */
  for (int i = 0; i < NMIXED; i++)
    for (int f = 0; f < 7; f++) {
      uint8_t *d = p.buf + 40 + 24 * i + fields[f];
      uint8_t save = *d;
      *d ^= (uint8_t)(1u << (tu_next(&r) % 8));
      reseal(&p);
      EXPECT_REJECT(&p, p.buf, p.l.total, 8, "descriptor disagrees", seed, "tensor %d field %d", i, fields[f]);
      *d = save;
    }
  reseal(&p);
  expect_valid(&p, seed, "restored");
  destroy(&p);
  /* Same size, different geometry: (8,32)/8/k4 vs (16,16)/16/k16: both
   * 16 u8 indices, but 4 chunks of 8x8 against one of 16x16. */
  const spec a = {2, {8, 32}, 8, 4}, b = {2, {16, 16}, 16, 16};
  payload pa, pb;
  build(&pa, &a, 1, DISTRO_VALUES_F32, &r);
  build(&pb, &b, 1, DISTRO_VALUES_F32, &r);
  cr_assert_eq(pa.l.total, pb.l.total);
  EXPECT_REJECT(&pb, pa.buf, pa.l.total, 9, "descriptor disagrees", seed, "other geometry");
  destroy(&pa);
  destroy(&pb);
}

/* Any single corrupted byte, anywhere, is caught (CRC, or the magic/version
 * checks that run before it). */
Test(wire, reject_any_flipped_byte) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 3; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (size_t at = 0; at < p.l.total; at++) {
      uint8_t mask = (uint8_t)(1 + tu_next(&r) % 255);
      p.buf[at] ^= mask;
      const char *why = at < 4 ? "bad magic" : at < 6 ? "wire version" : "CRC32C";
      EXPECT_REJECT(&p, p.buf, p.l.total, 12, why, seed, "codec %d byte %zu ^ 0x%02x", c, at, mask);
      p.buf[at] ^= mask;
    }
    expect_valid(&p, seed, "restored");
    destroy(&p);
  }
  /* A larger payload, sampled, with multi-bit bursts. */
  const spec big = {2, {768, 768}, 64, 32};
  payload p;
  build(&p, &big, 1, DISTRO_VALUES_F32, &r);
  for (int trial = 0; trial < 3000; trial++) {
    size_t at = 6 + tu_next(&r) % (p.l.total - 6);
    uint8_t mask = (uint8_t)(1 + tu_next(&r) % 255);
    p.buf[at] ^= mask;
    EXPECT_REJECT(&p, p.buf, p.l.total, 12, "CRC32C", seed, "big byte %zu ^ 0x%02x", at, mask);
    p.buf[at] ^= mask;
  }
  destroy(&p);
}

Test(wire, reject_out_of_range_index) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const spec s[] = {
      {2, {30, 40}, 8, 5},      /* u8, 48 elems */
      {2, {40, 48}, 20, 9},     /* u16, 320 elems */
      {2, {300, 300}, 300, 4},  /* u32, 90000 elems */
      {1, {1000}, 64, 7},       /* 1-D u8, 50 elems */
      {2, {97, 101}, 16, 3},    /* 1-elem chunks: any index but 0 is out */
  };
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < 5; i++) {
      payload p;
      build(&p, s, 5, codecs[c], &r);
      const distro__tiling *t = &p.t[i];
      const uint32_t wmax = p.l.idx_width[i] == 4 ? 0xffffffffu : (1u << (8 * p.l.idx_width[i])) - 1;
      const uint32_t bad[] = {(uint32_t)t->chunk_elems, (uint32_t)t->chunk_elems + 1, wmax};
      for (int b = 0; b < 3; b++) {
        int64_t ch = (int64_t)(tu_next(&r) % (uint64_t)t->nchunks), j = (ch + 1) * t->k - 1; /* last of a chunk */
        uint32_t save = get_index(&p, i, j);
        put_index(&p, i, j, bad[b]);
        reseal(&p);
        EXPECT_REJECT(&p, p.buf, p.l.total, 13, "out of range or order", seed, "codec %d tensor %d chunk %lld idx %u",
                      c, i, (long long)ch, bad[b]);
        put_index(&p, i, j, save);
      }
      reseal(&p);
      expect_valid(&p, seed, "restored");
      destroy(&p);
    }
}

Test(wire, reject_duplicate_or_unsorted_indices) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 3; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (int i = 0; i < NMIXED; i++) {
      const distro__tiling *t = &p.t[i];
      if (t->k < 2) continue;
      for (int trial = 0; trial < 20; trial++) {
        int64_t ch = (int64_t)(tu_next(&r) % (uint64_t)t->nchunks);
        int64_t j = ch * t->k + (int64_t)(tu_next(&r) % (uint64_t)(t->k - 1));
        uint32_t a = get_index(&p, i, j), b = get_index(&p, i, j + 1);
        /* duplicate (either copy), then swapped neighbours */
        put_index(&p, i, j + 1, a);
        reseal(&p);
        EXPECT_REJECT(&p, p.buf, p.l.total, 14, "out of range or order", seed, "dup tensor %d j %lld", i,
                      (long long)j);
        put_index(&p, i, j + 1, b);
        put_index(&p, i, j, b);
        reseal(&p);
        EXPECT_REJECT(&p, p.buf, p.l.total, 14, "out of range or order", seed, "dup2 tensor %d j %lld", i,
                      (long long)j);
        put_index(&p, i, j + 1, a);
        reseal(&p);
        EXPECT_REJECT(&p, p.buf, p.l.total, 14, "out of range or order", seed, "swap tensor %d j %lld", i,
                      (long long)j);
        put_index(&p, i, j, a);
        put_index(&p, i, j + 1, b);
      }
    }
    reseal(&p);
    expect_valid(&p, seed, "restored");
    destroy(&p);
  }
  /* Order restarts at each chunk: a chunk may begin below where the previous ended. */
  const spec one = {1, {16}, 4, 2};
  payload p;
  build(&p, &one, 1, DISTRO_VALUES_F32, &r);
  const uint32_t idx[8] = {2, 3, 0, 1, 0, 3, 1, 2};
  for (int j = 0; j < 8; j++) put_index(&p, 0, j, idx[j]);
  reseal(&p);
  expect_valid(&p, seed, "chunk-local order");
  put_index(&p, 0, 7, 0); /* 1, 0 in the last chunk */
  reseal(&p);
  EXPECT_REJECT(&p, p.buf, p.l.total, 14, "chunk 3", seed, "last chunk unsorted");
  destroy(&p);
}

Test(wire, reject_nonfinite_values) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const uint32_t f32_bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu};
  const uint16_t bf_bad[] = {0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fff};
  for (int c = 0; c < 2; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (int i = 0; i < NMIXED; i++)
      for (int b = 0; b < 6; b++) {
        int64_t j = (int64_t)(tu_next(&r) % (uint64_t)count_of(&p.t[i]));
        uint8_t *v = p.buf + p.l.val_off[i] + (c == 0 ? 4 : 2) * j, save[4];
        memcpy(save, v, 4);
        if (c == 0) wr32(v, f32_bad[b]);
        else {
          v[0] = (uint8_t)bf_bad[b];
          v[1] = (uint8_t)(bf_bad[b] >> 8);
        }
        reseal(&p); /* so the CRC passes and the value check is what fails */
        EXPECT_REJECT(&p, p.buf, p.l.total, 15, "non-finite", seed, "codec %d tensor %d coef %lld pattern %d", c, i,
                      (long long)j, b);
        memcpy(v, save, c == 0 ? 4 : 2);
      }
    reseal(&p);
    expect_valid(&p, seed, "restored");
    destroy(&p);
  }
}

Test(wire, reject_sign1_padding_bits) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_SIGN1, &r);
  int tested = 0;
  for (int i = 0; i < NMIXED; i++) {
    int64_t count = count_of(&p.t[i]);
    if (count % 8 == 0) continue;
    uint8_t *last = p.buf + p.l.val_off[i] + count / 8;
    for (int bit = (int)(count % 8); bit < 8; bit++) {
      *last ^= (uint8_t)(1u << bit);
      reseal(&p);
      EXPECT_REJECT(&p, p.buf, p.l.total, 16, "padding", seed, "tensor %d count %lld bit %d", i, (long long)count,
                    bit);
      *last ^= (uint8_t)(1u << bit);
      tested++;
    }
  }
  cr_assert_gt(tested, 10);
  reseal(&p);
  expect_valid(&p, seed, "restored");
  destroy(&p);
}

Test(wire, reject_unknown_flags) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_F32, &r);
  for (int f = 2; f < 256; f++) { /* every flag byte but 0 and ABORT alone */
    p.buf[7] = (uint8_t)f;
    reseal(&p);
    EXPECT_REJECT(&p, p.buf, p.l.total, 17, "unknown flags", seed, "flags 0x%02x", f);
  }
  /* Abort fields in a normal payload are a contradiction. */
  p.buf[7] = 0;
  p.buf[32] = 6;
  reseal(&p);
  EXPECT_REJECT(&p, p.buf, p.l.total, 18, "abort fields", seed, "abort status without ABORT");
  p.buf[32] = 0;
  p.buf[36] = 1;
  reseal(&p);
  EXPECT_REJECT(&p, p.buf, p.l.total, 18, "abort fields", seed, "abort tensor without ABORT");
  destroy(&p);
}
