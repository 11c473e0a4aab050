/* Payload wire format v2 (docs/wire-format.md, "Wire format v2"), part 2:
 * every rejection the decoder applies, each returning DISTRO_ERR_PAYLOAD with
 * a message naming the peer: sizes, magic and version, any flipped byte,
 * codecs, header and descriptor mismatches, flags, section sizes and
 * malformed sections. Layout, round trips and abort payloads are in
 * test_wire2_layout.c.
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

static void expect_valid(const payload *p, const uint8_t *buf, size_t size, uint64_t seed, const char *what) {
  int ab = 7;
  uint32_t st, te;
  distro_status s = decode(p, buf, size, 1, &ab, &st, &te);
  cr_assert_eq(s, DISTRO_OK, "%s: %s (seed %llu)", what, distro_last_error(), SEED);
  cr_assert_eq(ab, 0, "%s: aborted set", what);
}

/* ---------------------------------------------------------------- rejections */

Test(wire2, reject_size, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_BF16, &r);
  const size_t head = HEAD(NMIXED);
  const size_t shorts[] = {0, 3, 4, 40, head, head + 3};
  for (int i = 0; i < 6; i++)
    EXPECT_REJECT(&p, p.buf, shorts[i], 3, "too short", seed, "%zu bytes", shorts[i]);
  /* Cut or extended: the CRC is read from the wrong place. */
  EXPECT_REJECT(&p, p.buf, p.size - 1, 3, "CRC32C", seed, "short by one");
  p.buf[p.size] = 0;
  EXPECT_REJECT(&p, p.buf, p.size + 1, 3, "CRC32C", seed, "long by one");
  /* Extended and resealed: the header's total disagrees. */
  uint8_t *ext = malloc(p.size + 8);
  memcpy(ext, p.buf, p.size - 4);
  memset(ext + p.size - 4, 0, 8);
  reseal(ext, p.size + 4);
  EXPECT_REJECT(&p, ext, p.size + 4, 3, "header disagrees", seed, "extended, resealed");
  /* ... and with the total fixed: the sections no longer fill the payload. */
  wr64(ext + 24, p.size + 4);
  reseal(ext, p.size + 4);
  EXPECT_REJECT(&p, ext, p.size + 4, 3, "do not fill", seed, "extended, total fixed");
  free(ext);
  destroy(&p);
}

Test(wire2, reject_bad_magic_and_version, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (int b = 0; b < 4; b++)
      for (int resealed = 0; resealed < 2; resealed++) {
        uint8_t save = p.buf[b];
        p.buf[b] ^= (uint8_t)(1 + tu_next(&r) % 255);
        if (resealed) reseal(p.buf, p.size);
        EXPECT_REJECT(&p, p.buf, p.size, 11, "bad magic", seed, "magic byte %d", b);
        p.buf[b] = save;
        reseal(p.buf, p.size);
      }
    const uint16_t versions[] = {0, 1, 3, 0x102, 0x200, 0xffff};
    for (int v = 0; v < 6; v++) {
      p.buf[4] = (uint8_t)versions[v];
      p.buf[5] = (uint8_t)(versions[v] >> 8);
      reseal(p.buf, p.size);
      EXPECT_REJECT(&p, p.buf, p.size, 0, "unsupported wire version", seed, "version 0x%x", versions[v]);
    }
    p.buf[4] = 2;
    p.buf[5] = 0;
    reseal(p.buf, p.size);
    expect_valid(&p, p.buf, p.size, seed, "restored");
    destroy(&p);
  }
  /* A v1 payload of the same tensor list, and v2 to the v1 validator. */
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_F32, &r);
  distro__tiling t[NMIXED];
  for (int i = 0; i < NMIXED; i++) t[i] = p.ts[i].t;
  distro__wire_layout l;
  cr_assert_eq(distro__wire_layout_init(&l, t, NMIXED, DISTRO_VALUES_F32), DISTRO_OK);
  uint8_t *v1 = calloc(1, l.total);
  distro__wire_write_header(v1, &l, t, 0, 1, 2, 0, 0);
  for (int i = 0; i < NMIXED; i++) distro__wire_write_tensor(v1, &l, t, i, p.idx[i], p.val[i]);
  distro__wire_seal(v1, &l);
  EXPECT_REJECT(&p, v1, l.total, 7, "unsupported wire version", seed, "v1 payload");
  int ab;
  uint32_t st, te;
  cr_assert_eq(distro__wire_validate(p.buf, p.size, &l, t, 7, &ab, &st, &te), DISTRO_ERR_PAYLOAD,
               "the v1 validator must reject a v2 payload");
  cr_assert_eq(distro__wire_validate(v1, l.total, &l, t, 7, &ab, &st, &te), DISTRO_OK, "%s", distro_last_error());
  free(v1);
  distro__wire_layout_destroy(&l);
  destroy(&p);
}

/* Any single corrupted byte, anywhere, is caught (CRC, or the magic/version
 * checks that run before it). */
Test(wire2, reject_any_flipped_byte, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const spec small[] = {mixed[0], mixed[1], mixed[2], mixed[3], mixed[5], mixed[7], mixed[10]};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, small, 7, codecs[c], &r);
    for (size_t at = 0; at < p.size; at++) {
      uint8_t mask = (uint8_t)(1 + tu_next(&r) % 255);
      p.buf[at] ^= mask;
      const char *why = at < 4 ? "bad magic" : at < 6 ? "unsupported wire version" : "CRC32C";
      EXPECT_REJECT(&p, p.buf, p.size, 12, why, seed, "codec %d byte %zu ^ 0x%02x", c, at, mask);
      p.buf[at] ^= mask;
    }
    expect_valid(&p, p.buf, p.size, seed, "restored");
    destroy(&p);
  }
  const spec big = {2, {768, 768}, 64, 32};
  payload p;
  build(&p, &big, 1, DISTRO_VALUES_BF16, &r);
  for (int trial = 0; trial < 2000; trial++) {
    size_t at = 6 + tu_next(&r) % (p.size - 6);
    uint8_t mask = (uint8_t)(1 + tu_next(&r) % 255);
    p.buf[at] ^= mask;
    EXPECT_REJECT(&p, p.buf, p.size, 12, "CRC32C", seed, "big byte %zu ^ 0x%02x", at, mask);
    p.buf[at] ^= mask;
  }
  destroy(&p);
}

Test(wire2, reject_wrong_codec, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (int o = 0; o < 256; o++) {
      if (o == c) continue;
      p.buf[6] = (uint8_t)o;
      reseal(p.buf, p.size);
      EXPECT_REJECT(&p, p.buf, p.size, 4, "values codec", seed, "codec %d as %d", c, o);
    }
    destroy(&p);
  }
}

Test(wire2, reject_header_disagreeing_with_tensor_list, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_INT4, &r);
  const uint32_t counts[] = {0, NMIXED - 1, NMIXED + 1, 0xffffffffu, NMIXED + 0x100u};
  for (int i = 0; i < 5; i++) {
    wr32(p.buf + 8, counts[i]);
    reseal(p.buf, p.size);
    EXPECT_REJECT(&p, p.buf, p.size, 6, "header disagrees", seed, "tensor count %u", counts[i]);
  }
  wr32(p.buf + 8, NMIXED);
  const uint64_t totals[] = {0, p.size - 1, p.size + 1, (uint64_t)p.size | 1ull << 32, ~0ull};
  for (int i = 0; i < 5; i++) {
    wr64(p.buf + 24, totals[i]);
    reseal(p.buf, p.size);
    EXPECT_REJECT(&p, p.buf, p.size, 6, "header disagrees", seed, "total %llu", (unsigned long long)totals[i]);
  }
  wr64(p.buf + 24, p.size);
  reseal(p.buf, p.size);
  expect_valid(&p, p.buf, p.size, seed, "restored");
  /* A payload for one tensor fewer. */
  payload q;
  build(&q, mixed, NMIXED - 1, DISTRO_VALUES_INT4, &r);
  EXPECT_REJECT(&p, q.buf, q.size, 6, "header disagrees", seed, "other tensor list");
  destroy(&q);
  destroy(&p);
}

Test(wire2, reject_unknown_flags_and_abort_fields, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_SIGN1, &r);
  for (int f = 2; f < 256; f++) {
    if (!(f & ~1)) continue;
    p.buf[7] = (uint8_t)f;
    reseal(p.buf, p.size);
    EXPECT_REJECT(&p, p.buf, p.size, 17, "unknown flags", seed, "flags 0x%02x", f);
  }
  p.buf[7] = 0;
  const int fields[] = {32, 33, 35, 36, 39};
  for (int i = 0; i < 5; i++) {
    uint8_t save = p.buf[fields[i]];
    p.buf[fields[i]] = (uint8_t)(1 + tu_next(&r) % 255);
    reseal(p.buf, p.size);
    EXPECT_REJECT(&p, p.buf, p.size, 18, "abort fields set without the ABORT flag", seed, "byte %d", fields[i]);
    p.buf[fields[i]] = save;
  }
  reseal(p.buf, p.size);
  expect_valid(&p, p.buf, p.size, seed, "restored");
  destroy(&p);
}

Test(wire2, reject_descriptor_mismatch, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_F32, &r);
  const int fields[] = {0, 3, 4, 7, 8, 11, 15, 16, 19, 23}; /* h, w, k, reserved, nchunks (low, high bytes) */
  for (int i = 0; i < NMIXED; i++)
    for (int f = 0; f < 10; f++) {
      uint8_t *d = p.buf + 40 + 40 * i + fields[f];
      uint8_t save = *d;
      *d ^= (uint8_t)(1u << (tu_next(&r) % 8));
      reseal(p.buf, p.size);
      EXPECT_REJECT(&p, p.buf, p.size, 8, "descriptor disagrees", seed, "tensor %d byte %d", i, fields[f]);
      cr_assert(names(distro_last_error(), "tensor", i), "names tensor %d: %s", i, distro_last_error());
      *d = save;
    }
  reseal(p.buf, p.size);
  expect_valid(&p, p.buf, p.size, seed, "restored");
  destroy(&p);
  /* Same counts, other geometry: (8,32)/8/k4 and (16,16)/16/k16 both keep 16. */
  const spec a = {2, {8, 32}, 8, 4}, b = {2, {16, 16}, 16, 16};
  payload pa, pb;
  build(&pa, &a, 1, DISTRO_VALUES_F32, &r);
  build(&pb, &b, 1, DISTRO_VALUES_F32, &r);
  EXPECT_REJECT(&pb, pa.buf, pa.size, 9, "descriptor disagrees", seed, "other geometry");
  destroy(&pa);
  destroy(&pb);
}

/* Section sizes that overrun or do not fill the payload. */
Test(wire2, reject_section_sizes, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    for (int i = 0; i < NMIXED; i++) {
      uint8_t *d = p.buf + 40 + 40 * i;
      const uint64_t ib = rd64(d + 24), vb = rd64(d + 32);
      /* One byte too many in either section: the last tensor overruns. */
      wr64(d + 24, ib + 1);
      reseal(p.buf, p.size);
      EXPECT_REJECT(&p, p.buf, p.size, 21, "sections overrun the payload", seed, "codec %d tensor %d ib+1", c, i);
      wr64(d + 24, ib);
      wr64(d + 32, vb + 1);
      reseal(p.buf, p.size);
      EXPECT_REJECT(&p, p.buf, p.size, 21, "sections overrun the payload", seed, "codec %d tensor %d vb+1", c, i);
      /* Sizes that wrap or exceed the payload outright. */
      const uint64_t huge[] = {p.size, p.size - 3, 1ull << 63, ~0ull, ~0ull - ib + 1};
      for (int h = 0; h < 5; h++) {
        wr64(d + 32, vb);
        wr64(d + 24, huge[h]);
        reseal(p.buf, p.size);
        EXPECT_REJECT(&p, p.buf, p.size, 21, "overrun", seed, "codec %d tensor %d ib %llu", c, i,
                      (unsigned long long)huge[h]);
      }
      wr64(d + 24, ib);
      /* One byte too few: the sections do not reach the CRC. */
      if (vb > 0) {
        wr64(d + 32, vb - 1);
        reseal(p.buf, p.size);
        EXPECT_REJECT(&p, p.buf, p.size, 22, "sections do not fill the payload", seed, "codec %d tensor %d vb-1", c, i);
      }
      wr64(d + 32, vb);
      /* A byte moved from the value section to the index section: the index
       * section now has a spare byte. */
      if (vb > 0) {
        wr64(d + 24, ib + 1);
        wr64(d + 32, vb - 1);
        reseal(p.buf, p.size);
        EXPECT_REJECT(&p, p.buf, p.size, 23, "malformed index section", seed, "codec %d tensor %d moved", c, i);
        cr_assert(names(distro_last_error(), "tensor", i), "names tensor %d: %s", i, distro_last_error());
        wr64(d + 24, ib);
        wr64(d + 32, vb);
      }
    }
    reseal(p.buf, p.size);
    expect_valid(&p, p.buf, p.size, seed, "restored");
    destroy(&p);
  }
}

/* Malformed sections in a payload whose framing and CRC are right: the
 * section checks are what fail, naming the tensor (and the chunk, for
 * indices out of range or order). */
static void expect_section_reject(payload *p, section *sec, int i, const char *why, int chunk, uint64_t seed,
                                  const char *what) {
  size_t cap = HEAD(p->n) + 4;
  for (int t = 0; t < p->n; t++) cap += sec[t].ib + sec[t].vb;
  uint8_t *buf = malloc(cap);
  size_t n = assemble(buf, cap, p, sec, 0);
  EXPECT_REJECT(p, buf, n, 31, why, seed, "%s (tensor %d)", what, i);
  cr_assert(names(distro_last_error(), "tensor", i), "%s: does not name tensor %d: %s", what, i, distro_last_error());
  if (chunk >= 0)
    cr_assert(names(distro_last_error(), "chunk", chunk), "%s: does not name chunk %d: %s", what, chunk,
              distro_last_error());
  free(buf);
}

Test(wire2, reject_malformed_index_sections, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  int tried[4] = {0};
  for (int rep = 0; rep < 4; rep++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[rep % 5], &r);
    section sec[NMIXED];
    split(&p, sec);
    for (int i = 0; i < NMIXED; i++) {
      const distro__tiling *t = &p.ts[i].t;
      const int64_t n = t->chunk_elems, k = t->k, ch = (int64_t)(tu_next(&r) % (uint64_t)t->nchunks);
      section s = sec[i];
      const size_t cap = (size_t)count_of(t) * 64 + (size_t)n / 4 + 256; /* room for one gap of n in unary */
      uint8_t *mut = calloc(1, cap);
      uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)count_of(t));
      memcpy(idx, p.idx[i], sizeof(uint32_t) * (size_t)count_of(t));
      tried[s.icodec]++;
      /* Codec-specific damage that keeps the section's framing valid. */
      switch (s.icodec) {
        case DISTRO__IDX_FIXED:
        case DISTRO__IDX_PACK12: {
          const int width = s.icodec == DISTRO__IDX_PACK12 ? 12 : n <= 256 ? 8 : n <= 65536 ? 16 : 32;
          if (k >= 2) idx[ch * k + 1] = idx[ch * k]; /* duplicate */
          else if ((uint64_t)n <= ((1ull << width) - 1)) idx[ch * k] = (uint32_t)n;
          else break;
          distro__bitw w;
          distro__bitw_init(&w, mut, cap);
          for (int64_t j = 0; j < count_of(t); j++) distro__bitw_put(&w, idx[j], width);
          s.isec = mut;
          s.ib = distro__bitw_bytes(&w);
          sec[i] = s;
          expect_section_reject(&p, sec, i, "index out of range or order", (int)ch, seed, "fixed/pack12 duplicate");
          break;
        }
        case DISTRO__IDX_RICE: { /* the chunk's last gap runs past n */
          distro__bitw w;
          distro__bitw_init(&w, mut, cap);
          for (int64_t c = 0; c < t->nchunks; c++)
            for (int64_t j = 0; j < k; j++) {
              const uint32_t *ci = idx + c * k;
              uint64_t g = j ? (uint64_t)(ci[j] - ci[j - 1] - 1) : ci[0];
              if (c == ch && j == k - 1) g = (uint64_t)(n - 1 - (j ? (int64_t)ci[j - 1] : -1)); /* lands on n */
              distro__bitw_rice(&w, g, s.iparam);
            }
          cr_assert_eq(w.overflow, 0);
          s.isec = mut;
          s.ib = distro__bitw_bytes(&w);
          sec[i] = s;
          expect_section_reject(&p, sec, i, "index out of range or order", (int)ch, seed, "rice past n");
          break;
        }
        case DISTRO__IDX_ENUM: { /* chunk ch's rank = C(n, k) */
          const distro__enum_table *et = p.ts[i].et;
          const unsigned __int128 C = et->c[(k - 1) * n + n - 1] + et->c[k * n + n - 1];
          if (C >> et->bits) break; /* C = 2^bits: no invalid rank fits */
          memcpy(mut, s.isec, s.ib);
          distro__bitw w = {mut, s.ib, (size_t)ch * (size_t)et->bits, 0};
          for (int b = 0; b < et->bits; b++) mut[(w.pos + (size_t)b) / 8] &= (uint8_t) ~(1u << ((w.pos + (size_t)b) % 8));
          distro__bitw_put_long(&w, C, et->bits);
          s.isec = mut;
          sec[i] = s;
          expect_section_reject(&p, sec, i, "index out of range or order", (int)ch, seed, "enum rank C(n,k)");
          break;
        }
      }
      sec[i] = (section){0};
      split(&p, sec);
      /* Framing damage, any codec: truncated, extended, padding bit set. */
      s = sec[i];
      if (s.ib > 0) {
        s.ib--;
        sec[i] = s;
        expect_section_reject(&p, sec, i, "malformed index section", -1, seed, "truncated");
        memcpy(mut, sec[i].isec, sec[i].ib + 1);
        mut[sec[i].ib + 1] = 0;
        s.isec = mut;
        s.ib += 2;
        sec[i] = s;
        expect_section_reject(&p, sec, i, "malformed index section", -1, seed, "extended");
      }
      split(&p, sec);
      /* Codec numbers and parameters that cannot apply. */
      const int bad[][2] = {{4, 0}, {255, 0}, {DISTRO__IDX_RICE, 31}, {DISTRO__IDX_RICE, 200}};
      for (int b = 0; b < 4; b++) {
        sec[i].icodec = bad[b][0];
        sec[i].iparam = bad[b][1];
        expect_section_reject(&p, sec, i, "malformed index section", -1, seed, "bad codec/param");
      }
      if (n > 4096) {
        sec[i].icodec = DISTRO__IDX_PACK12;
        sec[i].iparam = 0;
        expect_section_reject(&p, sec, i, "malformed index section", -1, seed, "PACK12 over 4096");
      }
      if (!p.ts[i].et) {
        sec[i].icodec = DISTRO__IDX_ENUM;
        sec[i].iparam = 0;
        expect_section_reject(&p, sec, i, "malformed index section", -1, seed, "ENUM without a table");
      }
      split(&p, sec);
      free(mut);
      free(idx);
    }
    destroy(&p);
  }
  cr_assert_gt(tried[DISTRO__IDX_ENUM] + tried[DISTRO__IDX_RICE], 4);
}

Test(wire2, reject_malformed_value_sections, .init = one_thread) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  for (int c = 0; c < 5; c++) {
    payload p;
    build(&p, mixed, NMIXED, codecs[c], &r);
    section sec[NMIXED];
    for (int i = 0; i < NMIXED; i++) {
      split(&p, sec);
      const distro__tiling *t = &p.ts[i].t;
      const int64_t count = count_of(t);
      section s = sec[i];
      uint8_t *mut = calloc(1, s.vb + 16);
      memcpy(mut, s.vsec, s.vb);
      s.vsec = mut;
      const int64_t j = (int64_t)(tu_next(&r) % (uint64_t)count);
      const char *what = "";
      switch (codecs[c]) {
        case DISTRO_VALUES_F32:
          wr32(mut + 4 * j, tu_next(&r) % 2 ? 0x7f800000u : 0xffc00001u);
          what = "F32 Inf/NaN";
          break;
        case DISTRO_VALUES_BF16:
          if (s.vparam == DISTRO__BF16_RAW) {
            mut[2 * j] = 0x80;
            mut[2 * j + 1] = 0x7f;
            what = "BF16 raw Inf";
          } else {
            mut[0] = 0xff; /* chunk 0's largest exponent 255 */
            what = "BF16 exponent 255";
          }
          break;
        case DISTRO_VALUES_SIGN1:
          if (count % 8) mut[s.vb - 1] |= 0x80;
          else s.vb++;
          what = "SIGN1 padding / extra byte";
          break;
        default: {
          const int64_t ch = j / t->k;
          mut[2 * ch] = 0x80; /* scale +Inf (0x7f80) */
          mut[2 * ch + 1] = 0x7f;
          what = "INT scale Inf";
          break;
        }
      }
      sec[i] = s;
      expect_section_reject(&p, sec, i, "malformed or non-finite values", -1, seed, what);
      /* Truncated and extended value sections. */
      split(&p, sec);
      const size_t vb = sec[i].vb;
      memcpy(mut, sec[i].vsec, vb);
      mut[vb] = 0;
      sec[i].vsec = mut;
      sec[i].vb = vb - 1;
      expect_section_reject(&p, sec, i, "malformed or non-finite values", -1, seed, "value section truncated");
      sec[i].vb = vb + 1;
      expect_section_reject(&p, sec, i, "malformed or non-finite values", -1, seed, "value section extended");
      /* BF16 parameters that do not exist. */
      if (codecs[c] == DISTRO_VALUES_BF16) {
        split(&p, sec);
        const int badp[] = {4, 9, 14, 16, 255};
        for (int b = 0; b < 5; b++) {
          sec[i].vparam = badp[b];
          expect_section_reject(&p, sec, i, "malformed or non-finite values", -1, seed, "BF16 param");
        }
      }
      free(mut);
    }
    destroy(&p);
  }
}

/* The first bad tensor is the one reported, whatever order threads finish. */
Test(wire2, first_bad_tensor_is_reported) {
  omp_set_num_threads(4); /* tensors decoded out of order */
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  payload p;
  build(&p, mixed, NMIXED, DISTRO_VALUES_F32, &r);
  for (int first = 0; first < NMIXED; first++) {
    section sec[NMIXED];
    split(&p, sec);
    uint8_t *mut[NMIXED];
    for (int i = 0; i < NMIXED; i++) {
      mut[i] = malloc(sec[i].vb);
      memcpy(mut[i], sec[i].vsec, sec[i].vb);
      if (i >= first) wr32(mut[i], 0x7fc00000u); /* NaN in tensor i >= first */
      sec[i].vsec = mut[i];
    }
    expect_section_reject(&p, sec, first, "non-finite", -1, seed, "first bad tensor");
    for (int i = 0; i < NMIXED; i++) free(mut[i]);
  }
  destroy(&p);
}
