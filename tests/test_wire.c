/* Payload wire format v1 (docs/wire-format.md): CRC32C, bf16 rounding,
 * byte layout, encode -> validate -> decode round trips and every rejection
 * the receiver applies. Inputs are fresh random each run (DISTRO_TEST_SEED
 * reproduces one); the seed is in every failure message. */
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

/* Is `hay` a message naming exactly rank `peer`? */
static int names_rank(const char *hay, int peer) {
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d", peer);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
    char nx = p[strlen(needle)];
    if (nx < '0' || nx > '9') return 1;
  }
  return 0;
}

/* A tensor for a layout: shape, chunk target and top-k. */
typedef struct {
  int ndim;
  int64_t shape[4];
  int64_t target, topk;
} spec;

/* One sender's payload, with the selection it encodes. */
typedef struct {
  int n;
  distro_values codec;
  distro__tiling *t;
  distro__wire_layout l;
  uint32_t **idx;
  float **val;
  uint8_t *buf; /* l.total bytes plus 8 spare, for the oversize test */
  uint32_t sender;
  uint64_t step;
} payload;

static int64_t count_of(const distro__tiling *t) { return t->nchunks * t->k; }

/* Selection sampling (Knuth's algorithm S): k distinct sorted indices in [0, n). */
static void random_selection(tu_rng *r, int64_t n, int64_t k, uint32_t *out) {
  int64_t got = 0;
  for (int64_t j = 0; j < n && got < k; j++)
    if ((double)(n - j) * tu_uniform(r) < (double)(k - got)) out[got++] = (uint32_t)j;
  cr_assert_eq(got, k);
}

/* Random values over many binades, with signed zeros mixed in. */
static float random_value(tu_rng *r) {
  uint64_t u = tu_next(r);
  switch (u % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    default: return (float)(tu_normal(r) * ldexp(1.0, (int)((u >> 8) % 41) - 20));
  }
}

static void build(payload *p, const spec *s, int n, distro_values codec, tu_rng *r) {
  memset(p, 0, sizeof *p);
  p->n = n;
  p->codec = codec;
  p->t = calloc((size_t)n, sizeof *p->t);
  p->idx = calloc((size_t)n, sizeof *p->idx);
  p->val = calloc((size_t)n, sizeof *p->val);
  cr_assert(p->t && p->idx && p->val);
  for (int i = 0; i < n; i++)
    cr_assert_eq(distro__tiling_init(&p->t[i], s[i].ndim, s[i].shape, s[i].target, s[i].topk), DISTRO_OK, "%s",
                 distro_last_error());
  cr_assert_eq(distro__wire_layout_init(&p->l, p->t, n, codec), DISTRO_OK);
  p->buf = malloc(p->l.total + 8);
  cr_assert(p->buf);
  memset(p->buf, 0xa5, p->l.total + 8); /* every byte must be written */
  p->sender = (uint32_t)(tu_next(r) % 1000);
  p->step = tu_next(r);
  distro__wire_write_header(p->buf, &p->l, p->t, 0, p->sender, p->step, 0, 0);
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &p->t[i];
    p->idx[i] = malloc(sizeof(uint32_t) * (size_t)count_of(t));
    p->val[i] = malloc(sizeof(float) * (size_t)count_of(t));
    cr_assert(p->idx[i] && p->val[i]);
    for (int64_t c = 0; c < t->nchunks; c++) random_selection(r, t->chunk_elems, t->k, p->idx[i] + c * t->k);
    for (int64_t j = 0; j < count_of(t); j++) p->val[i][j] = random_value(r);
    distro__wire_write_tensor(p->buf, &p->l, p->t, i, p->idx[i], p->val[i]);
  }
  distro__wire_seal(p->buf, &p->l);
}

static void destroy(payload *p) {
  for (int i = 0; i < p->n; i++) {
    free(p->idx[i]);
    free(p->val[i]);
  }
  free(p->idx);
  free(p->val);
  free(p->t);
  free(p->buf);
  distro__wire_layout_destroy(&p->l);
}

static distro_status validate(const payload *p, const uint8_t *buf, size_t size, int peer, int *aborted) {
  uint32_t st = 0xdead, te = 0xbeef;
  return distro__wire_validate(buf, size, &p->l, p->t, peer, aborted, &st, &te);
}

/* The payload must be rejected with DISTRO_ERR_PAYLOAD, by the check whose
 * message contains `why`, naming `peer`. */
#define EXPECT_REJECT(p, buf, size, peer, why, seed, ...)                                                          \
  do {                                                                                                              \
    int ab_ = 7;                                                                                                    \
    distro_status s_ = validate((p), (buf), (size), (peer), &ab_);                                                  \
    char ctx_[256];                                                                                                 \
    snprintf(ctx_, sizeof ctx_, __VA_ARGS__);                                                                       \
    cr_assert_eq(s_, DISTRO_ERR_PAYLOAD, "%s: status %d (seed %llu)", ctx_, (int)s_, (unsigned long long)(seed)); \
    cr_assert(names_rank(distro_last_error(), (peer)), "%s: message does not name rank %d: %s (seed %llu)", ctx_,  \
              (peer), distro_last_error(), (unsigned long long)(seed));                                             \
    cr_assert(strstr(distro_last_error(), (why)) != NULL, "%s: expected '%s', got: %s (seed %llu)", ctx_, (why),    \
              distro_last_error(), (unsigned long long)(seed));                                                     \
    cr_assert_eq(ab_, 0, "%s: aborted set on a rejected payload", ctx_);                                          \
  } while (0)

static void expect_valid(const payload *p, uint64_t seed, const char *what) {
  int ab = 7;
  distro_status s = validate(p, p->buf, p->l.total, 1, &ab);
  cr_assert_eq(s, DISTRO_OK, "%s: %s (seed %llu)", what, distro_last_error(), (unsigned long long)seed);
  cr_assert_eq(ab, 0, "%s: aborted set", what);
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

/* Index j of tensor i, rewritten in place at the tensor's width. */
static void put_index(payload *p, int i, int64_t j, uint32_t v) {
  uint8_t *is = p->buf + p->l.idx_off[i];
  int w = p->l.idx_width[i];
  for (int b = 0; b < w; b++) is[w * j + b] = (uint8_t)(v >> (8 * b));
}
static uint32_t get_index(const payload *p, int i, int64_t j) {
  return distro__wire_index(p->buf + p->l.idx_off[i], p->l.idx_width[i], j);
}

static void reseal(payload *p) { distro__wire_seal(p->buf, &p->l); }

static const distro_values codecs[3] = {DISTRO_VALUES_F32, DISTRO_VALUES_BF16, DISTRO_VALUES_SIGN1};

/* A mixed layout: u8 2-D, 1-D, prime dims (1x1 chunks), 3-D, u16, full k,
 * odd coefficient counts (SIGN1 padding). */
static const spec mixed[] = {
    {2, {30, 40}, 8, 5},        /* 6x8 chunks, 48 elems, u8 */
    {1, {1000}, 64, 7},         /* 1-D: 1x50 chunks, u8 */
    {2, {97, 101}, 16, 3},      /* primes: 1x1 chunks, k clamped to 1 */
    {3, {3, 12, 20}, 8, 4},     /* 3-D: rows 36, 6x5 chunks */
    {2, {40, 48}, 20, 9},       /* 20x16 = 320 elems, u16 */
    {2, {4, 4}, 4, 100},        /* k clamped to 16: every coefficient */
    {1, {13}, 64, 5},           /* 1-D shorter than the chunk: one chunk */
};
#define NMIXED ((int)(sizeof mixed / sizeof mixed[0]))

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
