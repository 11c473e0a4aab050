/* Wire v2 section codecs (docs/wire-format.md, "Wire format v2"): the LSB-first
 * bit streams, the four index codecs (FIXED, PACK12, RICE, ENUM) and the five
 * value codecs (F32, BF16, SIGN1, INT8, INT4). Every section is checked
 * against an independent bit-by-bit reference writer built from the document,
 * round-tripped, and mutated to check that the decoders reject it.
 *
 * Inputs are fresh random each run (DISTRO_TEST_SEED reproduces one); the seed
 * is in every failure message. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/bits.h"
#include "compress/index_codec.h"
#include "compress/value_codec.h"
#include "compress/wire.h"
#include "testutil.h"
#include "wire_ref.h"

typedef unsigned __int128 u128;
#define SEED (unsigned long long)seed

/* ---------------------------------------------------------------- helpers */

static uint64_t mask64(int n) { return n >= 64 ? ~0ULL : (1ULL << n) - 1; }

/* Reference bit writer: bit p of the stream is bit p % 8 of byte p / 8. */
typedef struct {
  uint8_t *b;
  size_t cap, pos;
} rbits;

static void rinit(rbits *w, uint8_t *b, size_t cap) {
  w->b = b;
  w->cap = cap;
  w->pos = 0;
  memset(b, 0, cap);
}
static void rput(rbits *w, uint64_t v, int n) {
  for (int i = 0; i < n; i++, w->pos++) {
    cr_assert_lt(w->pos / 8, w->cap, "reference writer overflow");
    if ((v >> i) & 1) w->b[w->pos / 8] |= (uint8_t)(1u << (w->pos % 8));
  }
}
static void rput128(rbits *w, u128 v, int n) {
  for (int i = 0; i < n; i++) rput(w, (uint64_t)(v >> i) & 1, 1);
}
static void rrice(rbits *w, uint64_t v, int b) {
  for (uint64_t q = v >> b; q; q--) rput(w, 1, 1);
  rput(w, 0, 1);
  rput(w, v & mask64(b), b);
}
static size_t rbytes(const rbits *w) { return (w->pos + 7) / 8; }

/* 1 when a section decoder's fault is `kind` at `chunk`. */
static int fault_is(distro__codec_fault f, distro__codec_fault_kind kind, int64_t chunk) {
  return f.kind == kind && f.chunk == chunk;
}

/* ---- exact binomials: little 256-bit integers ---------------------------- */

typedef struct {
  uint32_t w[8];
} big;

static void big_one(big *a) {
  memset(a, 0, sizeof *a);
  a->w[0] = 1;
}
static void big_mul(big *a, uint32_t m) {
  uint64_t carry = 0;
  for (int i = 0; i < 8; i++) {
    uint64_t t = (uint64_t)a->w[i] * m + carry;
    a->w[i] = (uint32_t)t;
    carry = t >> 32;
  }
  cr_assert_eq(carry, 0, "big overflow");
}
static void big_div(big *a, uint32_t d) {
  uint64_t rem = 0;
  for (int i = 7; i >= 0; i--) {
    uint64_t t = rem << 32 | a->w[i];
    a->w[i] = (uint32_t)(t / d);
    rem = t % d;
  }
  cr_assert_eq(rem, 0, "inexact binomial step");
}
static int big_bitlen(const big *a) {
  for (int i = 7; i >= 0; i--)
    if (a->w[i]) return 32 * i + 32 - __builtin_clz(a->w[i]);
  return 0;
}

/* C(n, k) when it is below 2^127 (returns 1 and sets *out), else 0. */
static int ref_binom(int64_t n, int64_t k, u128 *out) {
  *out = 0;
  if (k < 0 || k > n) return 1;
  if (k > n - k) k = n - k;
  big c;
  big_one(&c);
  for (int64_t i = 0; i < k; i++) {
    big_mul(&c, (uint32_t)(n - i));
    big_div(&c, (uint32_t)(i + 1));
    if (big_bitlen(&c) > 200) return 0; /* C(n, i) only grows up to n/2 */
  }
  if (big_bitlen(&c) > 127) return 0;
  *out = (u128)c.w[0] | (u128)c.w[1] << 32 | (u128)c.w[2] << 64 | (u128)c.w[3] << 96;
  return 1;
}
static int bits_below(u128 count) { /* ceil(log2 count): bits to code [0, count) */
  int b = 0;
  for (u128 m = count - 1; m; m >>= 1) b++;
  return b;
}

/* The document's ENUM rule: k <= n/2, C(n, k) < 2^127, n <= 65536. */
static int ref_enum_applies(int64_t n, int64_t k, u128 *c) {
  *c = 0;
  if (k < 1 || 2 * k > n || n > 65536) return 0;
  return ref_binom(n, k, c);
}

/* ---- selections -------------------------------------------------------- */

enum { SEL_UNIFORM, SEL_EDGES, SEL_LOW };

/* k distinct sorted indices in [lo, lo + n) (Knuth's algorithm S). */
static void sample_sorted(tu_rng *r, int64_t lo, int64_t n, int64_t k, uint32_t *out) {
  int64_t got = 0;
  for (int64_t j = 0; j < n && got < k; j++)
    if ((double)(n - j) * tu_uniform(r) < (double)(k - got)) out[got++] = (uint32_t)(lo + j);
  cr_assert_eq(got, k);
}

/* One chunk's selection: uniform; uniform with 0 and n-1 forced in; or
 * clustered at the low indices (as low-frequency DCT coefficients are). */
static void selection(tu_rng *r, int kind, int64_t n, int64_t k, uint32_t *out) {
  if (kind == SEL_UNIFORM || k == n) {
    sample_sorted(r, 0, n, k, out);
  } else if (kind == SEL_EDGES) {
    if (k == 1) {
      out[0] = (uint32_t)(n - 1);
    } else {
      out[0] = 0;
      sample_sorted(r, 1, n - 2, k - 2, out + 1);
      out[k - 1] = (uint32_t)(n - 1);
    }
  } else {
    int64_t span = k + k / 2 + 1;
    sample_sorted(r, 0, span < n ? span : n, k, out);
  }
}

/* ---- reference index sections ------------------------------------------ */

static int ref_fixed_width(int64_t n) { return n <= 256 ? 8 : n <= 65536 ? 16 : 32; }

static uint64_t ref_gap(const uint32_t *ci, int64_t j) { return j ? (uint64_t)ci[j] - ci[j - 1] - 1 : ci[0]; }

static uint64_t ref_rice_bits(const uint32_t *idx, int64_t nchunks, int64_t k, int b) {
  uint64_t bits = 0;
  for (int64_t c = 0; c < nchunks; c++)
    for (int64_t j = 0; j < k; j++) bits += (ref_gap(idx + c * k, j) >> b) + 1 + (uint64_t)b;
  return bits;
}

/* Writes the section with the reference writer; returns its bytes. */
static size_t ref_idx_encode(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, distro__idx_codec codec,
                             int param, int enum_bits, uint8_t *out, size_t cap) {
  rbits w;
  rinit(&w, out, cap);
  for (int64_t c = 0; c < nchunks; c++) {
    const uint32_t *ci = idx + c * k;
    if (codec == DISTRO__IDX_ENUM) {
      u128 rank = 0, t;
      for (int64_t j = 0; j < k; j++) {
        cr_assert(ref_binom(ci[j], j + 1, &t));
        rank += t;
      }
      rput128(&w, rank, enum_bits);
      continue;
    }
    for (int64_t j = 0; j < k; j++) {
      if (codec == DISTRO__IDX_FIXED) rput(&w, ci[j], ref_fixed_width(n));
      else if (codec == DISTRO__IDX_PACK12) rput(&w, ci[j], 12);
      else rrice(&w, ref_gap(ci, j), param);
    }
  }
  return rbytes(&w);
}

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

/* ========================================================== index codecs */

static const int64_t grid_n[] = {1, 2, 48, 64, 256, 257, 4096, 4097, 65536, 90000};
#define GRID_N ((int)(sizeof grid_n / sizeof grid_n[0]))

/* k values for chunk size n: small ones, ENUM's edges, n/2 +- 1 and above, n,
 * and two random ones. Returns how many (duplicates removed). */
static int grid_k(int64_t n, tu_rng *r, int64_t *ks) {
  const int64_t cand[] = {1, 2, 3, 4, 5, 8, 9, 10, 12, 16, 31, 32, 33, n / 2, n / 2 + 1, n - 1, n,
                          1 + (int64_t)(tu_next(r) % (uint64_t)n), 1 + (int64_t)(tu_next(r) % (uint64_t)n)};
  int m = 0;
  for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
    int64_t k = cand[i];
    if (k < 1 || k > n) continue;
    int dup = 0;
    for (int j = 0; j < m; j++) dup |= ks[j] == k;
    if (!dup) ks[m++] = k;
  }
  return m;
}

static int64_t chunks_for(int64_t n, int64_t k) {
  int64_t c = 120000 / (n + 4 * k);
  return c < 1 ? 1 : c > 24 ? 24 : c;
}

/* Encodes with (codec, param) at exactly the reference size, compares with
 * the reference bytes, decodes, and checks a one-byte-short buffer fails. */
static size_t check_codec(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, const distro__enum_table *et,
                          distro__idx_codec codec, int param, uint64_t seed, const char *what) {
  const uint64_t count = (uint64_t)nchunks * (uint64_t)k;
  uint64_t bits = 0;
  switch (codec) {
    case DISTRO__IDX_FIXED: bits = count * (uint64_t)ref_fixed_width(n); break;
    case DISTRO__IDX_PACK12: bits = count * 12; break;
    case DISTRO__IDX_RICE: bits = ref_rice_bits(idx, nchunks, k, param); break;
    case DISTRO__IDX_ENUM: bits = (uint64_t)nchunks * (uint64_t)et->bits; break;
  }
  const size_t want = (size_t)((bits + 7) / 8);
  uint8_t *lib = malloc(want + 8), *ref = malloc(want + 1);
  uint32_t *back = malloc(sizeof(uint32_t) * count);
  cr_assert(lib && ref && back);
  size_t got = distro__idx_encode(idx, nchunks, k, n, et, codec, param, lib, want);
  cr_assert_eq(got, want, "%s codec %d param %d n %lld k %lld: %zu bytes, want %zu (seed %llu)", what, codec, param,
               (long long)n, (long long)k, got, want, SEED);
  size_t rb = ref_idx_encode(idx, nchunks, k, n, codec, param, et ? et->bits : 0, ref, want + 1);
  cr_assert_eq(rb, want);
  cr_assert_eq(memcmp(lib, ref, want), 0, "%s codec %d param %d n %lld k %lld: bytes differ from the reference (seed %llu)",
               what, codec, param, (long long)n, (long long)k, SEED);
  memset(back, 0xab, sizeof(uint32_t) * count);
  const distro__codec_fault rc = distro__idx_decode(lib, want, nchunks, k, n, et, codec, param, back);
  cr_assert_eq(rc.kind, DISTRO__CODEC_OK, "%s codec %d param %d n %lld k %lld: fault %d at chunk %lld (seed %llu)",
               what, codec, param, (long long)n, (long long)k, (int)rc.kind, (long long)rc.chunk, SEED);
  cr_assert_eq(memcmp(back, idx, sizeof(uint32_t) * count), 0, "%s codec %d n %lld k %lld: indices differ (seed %llu)",
               what, codec, (long long)n, (long long)k, SEED);
  if (want > 0)
    cr_assert_eq(distro__idx_encode(idx, nchunks, k, n, et, codec, param, lib, want - 1), 0,
                 "%s codec %d: a buffer one byte short must fail", what, codec);
  free(lib);
  free(ref);
  free(back);
  return want;
}

/* Round trip of every codec on every (n, k) of the grid, and the ENUM rule. */
Test(codecs, index_round_trip_grid) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  int enum_cases = 0, rice_cases = 0;
  for (int a = 0; a < GRID_N; a++) {
    const int64_t n = grid_n[a];
    int64_t ks[24];
    const int nk = grid_k(n, &r, ks);
    for (int ik = 0; ik < nk; ik++) {
      const int64_t k = ks[ik], nchunks = chunks_for(n, k);
      distro__enum_table et;
      const int has = distro__enum_table_init(&et, n, k);
      u128 c;
      const int want_has = ref_enum_applies(n, k, &c);
      cr_assert_eq(has, want_has, "n %lld k %lld: ENUM %s, the rule says %s", (long long)n, (long long)k,
                   has ? "on" : "off", want_has ? "on" : "off");
      cr_assert_eq(has, et.c != NULL);
      if (has) cr_assert_eq(et.bits, bits_below(c), "n %lld k %lld: ENUM bits", (long long)n, (long long)k);
      uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)(nchunks * k));
      cr_assert(idx);
      for (int kind = SEL_UNIFORM; kind <= SEL_LOW; kind++) {
        for (int64_t ch = 0; ch < nchunks; ch++) selection(&r, kind, n, k, idx + ch * k);
        check_codec(idx, nchunks, k, n, NULL, DISTRO__IDX_FIXED, 0, seed, "fixed");
        if (n <= 4096) check_codec(idx, nchunks, k, n, NULL, DISTRO__IDX_PACK12, 0, seed, "pack12");
        const int bs[4] = {0, (int)(tu_next(&r) % 31), 30, (int)(tu_next(&r) % 14)};
        for (int i = 0; i < 4; i++) check_codec(idx, nchunks, k, n, NULL, DISTRO__IDX_RICE, bs[i], seed, "rice");
        rice_cases++;
        if (has) {
          check_codec(idx, nchunks, k, n, &et, DISTRO__IDX_ENUM, 0, seed, "enum");
          enum_cases++;
        }
        /* The chooser's pick encodes to exactly its prediction and decodes. */
        distro__idx_codec cc;
        int cp;
        size_t pred = distro__idx_choose(idx, nchunks, k, n, has ? &et : NULL, &cc, &cp);
        size_t got = check_codec(idx, nchunks, k, n, has ? &et : NULL, cc, cp, seed, "chosen");
        cr_assert_eq(got, pred, "n %lld k %lld: chose codec %d param %d predicting %zu bytes, encoded %zu", (long long)n,
                     (long long)k, cc, cp, pred, got);
        cr_assert(cc != DISTRO__IDX_PACK12 || n <= 4096);
        cr_assert(cc != DISTRO__IDX_ENUM || has);
      }
      free(idx);
      distro__enum_table_destroy(&et);
    }
  }
  cr_assert_gt(enum_cases, 100);
  cr_assert_gt(rice_cases, 300);
}

/* Smallest possible section of any codec and any parameter. */
static uint64_t best_bits(const uint32_t *idx, int64_t nchunks, int64_t k, int64_t n, const distro__enum_table *et,
                          char *what, size_t what_len) {
  const uint64_t count = (uint64_t)nchunks * (uint64_t)k;
  uint64_t best = count * (uint64_t)ref_fixed_width(n);
  snprintf(what, what_len, "fixed");
  if (n <= 4096 && count * 12 < best) {
    best = count * 12;
    snprintf(what, what_len, "pack12");
  }
  if (et && (uint64_t)nchunks * (uint64_t)et->bits < best) {
    best = (uint64_t)nchunks * (uint64_t)et->bits;
    snprintf(what, what_len, "enum");
  }
  for (int b = 0; b <= 30; b++) {
    uint64_t bits = ref_rice_bits(idx, nchunks, k, b);
    if (bits < best) {
      best = bits;
      snprintf(what, what_len, "rice b=%d", b);
    }
  }
  return best;
}

static void choose_is_smallest(int kind, uint64_t seed) {
  tu_rng r = {seed};
  int cases = 0, worse = 0;
  char first[512] = "";
  for (int a = 0; a < GRID_N; a++) {
    const int64_t n = grid_n[a];
    int64_t ks[24];
    const int nk = grid_k(n, &r, ks);
    for (int ik = 0; ik < nk; ik++) {
      const int64_t k = ks[ik], nchunks = chunks_for(n, k);
      distro__enum_table et;
      const int has = distro__enum_table_init(&et, n, k);
      uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)(nchunks * k));
      cr_assert(idx);
      for (int64_t ch = 0; ch < nchunks; ch++) selection(&r, kind, n, k, idx + ch * k);
      distro__idx_codec cc;
      int cp;
      size_t pred = distro__idx_choose(idx, nchunks, k, n, has ? &et : NULL, &cc, &cp);
      char what[32];
      uint64_t best = best_bits(idx, nchunks, k, n, has ? &et : NULL, what, sizeof what);
      cases++;
      if (pred != (size_t)((best + 7) / 8)) {
        if (!worse++)
          snprintf(first, sizeof first,
                   "n %lld k %lld x %lld chunks: chose codec %d param %d at %zu bytes, but %s takes %llu",
                   (long long)n, (long long)k, (long long)nchunks, cc, cp, pred,
                   what, (unsigned long long)((best + 7) / 8));
      }
      free(idx);
      distro__enum_table_destroy(&et);
    }
  }
  cr_expect_eq(worse, 0, "selection kind %d: %d of %d choices are not the smallest; first: %s (seed %llu)", kind,
               worse, cases, first, SEED);
}

/* "The encoder picks, per tensor, whichever gives the fewest bytes." */
Test(codecs, choose_smallest_uniform_selections) {
  uint64_t seed = tu_seed();
  choose_is_smallest(SEL_UNIFORM, seed);
  choose_is_smallest(SEL_EDGES, seed + 1);
}

/* Regression test (bug found by this suite, fixed): distro__idx_choose used to try only Rice parameters within
 * +-2 of log2 of the *uniform* mean gap (src/compress/index_codec.c, the
 * `b0` window in distro__idx_choose), so selections clustered at the low
 * indices, as low-frequency DCT coefficients are, get a Rice parameter many
 * times too large: e.g. 100 chunks of {0,1,2,3} in n = 4096 cost 400 bytes
 * (RICE b=7) where RICE b=0 takes 50. This test asserts the documented rule
 * (fewest bytes) and fails until the chooser searches the parameter. */
Test(codecs, choose_smallest_clustered_selections) {
  choose_is_smallest(SEL_LOW, tu_seed());
}

/* ENUM stops exactly where C(n, k) reaches 2^127. */
Test(codecs, enum_limit_is_two_to_the_127) {
  const int64_t ks[] = {9, 10, 12, 16, 20, 24, 32};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
    const int64_t k = ks[i];
    /* Largest n <= 65536 with C(n, k) < 2^127, by bisection on the reference. */
    int64_t lo = 2 * k, hi = 65536;
    u128 c;
    cr_assert(ref_binom(lo, k, &c));
    if (ref_binom(hi, k, &c)) {
      lo = hi;
    } else {
      while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (ref_binom(mid, k, &c)) lo = mid;
        else hi = mid;
      }
    }
    distro__enum_table et;
    cr_assert_eq(distro__enum_table_init(&et, lo, k), 1, "k %lld: n %lld has C < 2^127", (long long)k, (long long)lo);
    cr_assert(ref_binom(lo, k, &c));
    cr_assert_eq(et.bits, bits_below(c));
    cr_assert_leq(et.bits, 127);
    distro__enum_table_destroy(&et);
    if (lo < 65536) {
      cr_assert_eq(distro__enum_table_init(&et, lo + 1, k), 0, "k %lld: n %lld has C >= 2^127", (long long)k,
                   (long long)(lo + 1));
      cr_assert_null(et.c);
      distro__enum_table_destroy(&et);
    }
    /* Cross-check the exact count against lgamma. */
    long double lg = (lgammal((long double)lo + 1) - lgammal((long double)k + 1) - lgammal((long double)(lo - k) + 1)) /
                     logl(2.0L);
    cr_assert(ref_binom(lo, k, &c));
    cr_assert_lt(fabsl(lg - log2l((long double)c)), 1e-6L, "k %lld n %lld", (long long)k, (long long)lo);
  }
  /* k > n/2 never uses ENUM, even where C(n, k) is tiny. */
  distro__enum_table et;
  cr_assert_eq(distro__enum_table_init(&et, 10, 6), 0);
  cr_assert_eq(distro__enum_table_init(&et, 3, 2), 0);
  cr_assert_eq(distro__enum_table_init(&et, 1, 1), 0);
  cr_assert_eq(distro__enum_table_init(&et, 2, 1), 1);
  cr_assert_eq(et.bits, 1);
  distro__enum_table_destroy(&et);
}

/* ENUM: rank 0 is {0..k-1}, rank C-1 is {n-k..n-1}, each rank < C decodes to
 * the set whose rank it is; ranks >= C are rejected. */
Test(codecs, enum_ranks) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const int64_t cases[][2] = {{2, 1}, {5, 2}, {48, 3}, {64, 32}, {100, 7}, {256, 16}, {4096, 4}, {4097, 10}, {65536, 9}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t n = cases[ci][0], k = cases[ci][1];
    distro__enum_table et;
    cr_assert_eq(distro__enum_table_init(&et, n, k), 1, "n %lld k %lld", (long long)n, (long long)k);
    u128 C;
    cr_assert(ref_binom(n, k, &C));
    const int bits = et.bits;
    const size_t len = (size_t)(bits + 7) / 8;
    uint8_t buf[16];
    uint32_t *got = malloc(sizeof(uint32_t) * 2 * (size_t)k);
    cr_assert(got);
    for (int t = 0; t < 60; t++) {
      u128 rank;
      if (t == 0) rank = 0;
      else if (t == 1) rank = C - 1;
      else rank = ((u128)tu_next(&r) << 64 | tu_next(&r)) % C;
      rbits w;
      rinit(&w, buf, sizeof buf);
      rput128(&w, rank, bits);
      cr_assert_eq(distro__idx_decode(buf, len, 1, k, n, &et, DISTRO__IDX_ENUM, 0, got).kind, DISTRO__CODEC_OK,
                   "n %lld k %lld rank #%d", (long long)n, (long long)k, t);
      u128 back = 0, c;
      for (int64_t j = 0; j < k; j++) {
        if (j) cr_assert_gt(got[j], got[j - 1]);
        cr_assert_lt(got[j], (uint32_t)n);
        cr_assert(ref_binom(got[j], j + 1, &c));
        back += c;
      }
      cr_assert(back == rank, "n %lld k %lld: the set does not have the rank it was decoded from", (long long)n,
                (long long)k);
      if (t == 0)
        for (int64_t j = 0; j < k; j++) cr_assert_eq(got[j], (uint32_t)j);
      if (t == 1)
        for (int64_t j = 0; j < k; j++) cr_assert_eq(got[j], (uint32_t)(n - k + j));
    }
    /* Ranks C .. 2^bits - 1 name no set. */
    const u128 top = bits == 128 ? ~(u128)0 : ((u128)1 << bits) - 1;
    for (int t = 0; t < 40 && C <= top; t++) {
      u128 span = top - C + 1, rank = C + (t == 0 ? 0 : t == 1 ? span - 1 : ((u128)tu_next(&r) << 64 | tu_next(&r)) % span);
      rbits w;
      rinit(&w, buf, sizeof buf);
      rput128(&w, rank, bits);
      cr_assert(
          fault_is(distro__idx_decode(buf, len, 1, k, n, &et, DISTRO__IDX_ENUM, 0, got), DISTRO__CODEC_INDEX_ORDER, 0),
          "n %lld k %lld: a rank >= C(n, k) must be rejected (seed %llu)", (long long)n, (long long)k, SEED);
    }
    /* In the second of two chunks, the error names chunk 1. */
    uint8_t two[32];
    rbits w;
    rinit(&w, two, sizeof two);
    rput128(&w, 0, bits);
    rput128(&w, C <= top ? C : 0, bits);
    if (C <= top)
      cr_assert(fault_is(distro__idx_decode(two, (size_t)(2 * bits + 7) / 8, 2, k, n, &et, DISTRO__IDX_ENUM, 0, got),
                         DISTRO__CODEC_INDEX_ORDER, 1));
    free(got);
    distro__enum_table_destroy(&et);
  }
}

/* Truncated, extended and padded sections; bad codec numbers. */
Test(codecs, index_decode_rejects_bad_framing) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const int64_t cases[][3] = {{48, 5, 7}, {256, 3, 9}, {257, 9, 5}, {4096, 4, 11}, {4096, 32, 3}, {90000, 3, 5}, {64, 40, 3}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t n = cases[ci][0], k = cases[ci][1], nchunks = cases[ci][2];
    distro__enum_table et;
    const int has = distro__enum_table_init(&et, n, k);
    uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)(nchunks * k)), *back = malloc(sizeof(uint32_t) * (size_t)(nchunks * k));
    uint8_t *buf = malloc((1 << 20) + 8);
    cr_assert(idx && back && buf);
    for (int64_t ch = 0; ch < nchunks; ch++) selection(&r, SEL_UNIFORM, n, k, idx + ch * k);
    for (int codec = 0; codec <= 3; codec++) {
      if (codec == DISTRO__IDX_PACK12 && n > 4096) continue;
      if (codec == DISTRO__IDX_ENUM && !has) continue;
      const int param = codec == DISTRO__IDX_RICE ? (int)(tu_next(&r) % 12) : 0;
      const distro__enum_table *e = has ? &et : NULL;
      size_t len = distro__idx_encode(idx, nchunks, k, n, e, (distro__idx_codec)codec, param, buf, 1 << 20);
      cr_assert_gt(len, 0);
      cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, e, (distro__idx_codec)codec, param, back).kind,
                   DISTRO__CODEC_OK);
      for (size_t cut = 1; cut <= 3 && cut <= len; cut++)
        cr_assert_eq(distro__idx_decode(buf, len - cut, nchunks, k, n, e, (distro__idx_codec)codec, param, back).kind,
                     DISTRO__CODEC_INDEX_SECTION, "codec %d n %lld: truncated by %zu accepted (seed %llu)", codec,
                     (long long)n, cut, SEED);
      for (int extra = 1; extra <= 2; extra++) {
        buf[len] = extra == 1 ? 0 : (uint8_t)(1 + tu_next(&r) % 255);
        buf[len + 1] = 0;
        cr_assert_eq(
            distro__idx_decode(buf, len + (size_t)extra, nchunks, k, n, e, (distro__idx_codec)codec, param, back).kind,
            DISTRO__CODEC_INDEX_SECTION, "codec %d n %lld: extra byte accepted (seed %llu)", codec, (long long)n, SEED);
      }
      /* Padding: every bit above the last coded bit must be zero. */
      uint64_t bits = codec == DISTRO__IDX_FIXED    ? (uint64_t)(nchunks * k) * (uint64_t)ref_fixed_width(n)
                      : codec == DISTRO__IDX_PACK12 ? (uint64_t)(nchunks * k) * 12
                      : codec == DISTRO__IDX_RICE   ? ref_rice_bits(idx, nchunks, k, param)
                                                    : (uint64_t)nchunks * (uint64_t)et.bits;
      for (int bit = (int)(bits % 8); bits % 8 && bit < 8; bit++) {
        buf[len - 1] ^= (uint8_t)(1u << bit);
        cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, e, (distro__idx_codec)codec, param, back).kind,
                     DISTRO__CODEC_INDEX_SECTION, "codec %d n %lld k %lld: padding bit %d accepted", codec,
                     (long long)n, (long long)k, bit);
        buf[len - 1] ^= (uint8_t)(1u << bit);
      }
      cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, e, (distro__idx_codec)codec, param, back).kind,
                   DISTRO__CODEC_OK);
    }
    /* Codec numbers and parameters the format does not have. */
    size_t len = distro__idx_encode(idx, nchunks, k, n, NULL, DISTRO__IDX_FIXED, 0, buf, 1 << 20);
    const int bad_codecs[] = {4, 5, 127, 255};
    for (int b = 0; b < 4; b++)
      cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, NULL, (distro__idx_codec)bad_codecs[b], 0, back).kind,
                   DISTRO__CODEC_INDEX_SECTION);
    cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, NULL, DISTRO__IDX_RICE, 31, back).kind,
                 DISTRO__CODEC_INDEX_SECTION);
    cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, NULL, DISTRO__IDX_RICE, 255, back).kind,
                 DISTRO__CODEC_INDEX_SECTION);
    cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, NULL, DISTRO__IDX_ENUM, 0, back).kind,
                 DISTRO__CODEC_INDEX_SECTION, "ENUM without a table");
    if (n > 4096)
      cr_assert_eq(distro__idx_decode(buf, len, nchunks, k, n, NULL, DISTRO__IDX_PACK12, 0, back).kind,
                   DISTRO__CODEC_INDEX_SECTION, "PACK12 for chunks over 4096 elements");
    free(idx);
    free(back);
    free(buf);
    distro__enum_table_destroy(&et);
  }
}

/* FIXED / PACK12: out-of-range, duplicate and unsorted indices name the chunk. */
Test(codecs, index_decode_rejects_bad_indices) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const int64_t cases[][3] = {{48, 5, 6}, {200, 9, 4}, {256, 3, 5}, {257, 4, 5}, {4096, 8, 4}, {4000, 2, 3}, {90000, 3, 3}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t n = cases[ci][0], k = cases[ci][1], nchunks = cases[ci][2];
    uint32_t idx[64], mut[64], back[64];
    uint8_t buf[512];
    for (int64_t ch = 0; ch < nchunks; ch++) selection(&r, SEL_UNIFORM, n, k, idx + ch * k);
    for (int codec = 0; codec <= 1; codec++) {
      if (codec == DISTRO__IDX_PACK12 && n > 4096) continue;
      const int width = codec ? 12 : ref_fixed_width(n);
      const uint64_t wmax = mask64(width);
      for (int trial = 0; trial < 60; trial++) {
        memcpy(mut, idx, sizeof(uint32_t) * (size_t)(nchunks * k));
        const int64_t ch = (int64_t)(tu_next(&r) % (uint64_t)nchunks);
        uint32_t *c = mut + ch * k;
        const int kind = trial % 4;
        if (kind == 0) { /* out of range: n, n+1 or the largest the width holds */
          uint64_t v = (uint64_t)n + tu_next(&r) % 2;
          if (v > wmax || trial % 8 == 0) v = wmax;
          if (v < (uint64_t)n) continue; /* the width cannot hold an out-of-range value */
          c[k - 1] = (uint32_t)v;
        } else if (k < 2) {
          continue;
        } else if (kind == 1) { /* duplicate */
          int64_t j = (int64_t)(tu_next(&r) % (uint64_t)(k - 1));
          c[j + 1] = c[j];
        } else if (kind == 2) { /* swapped neighbours */
          int64_t j = (int64_t)(tu_next(&r) % (uint64_t)(k - 1));
          uint32_t t = c[j];
          c[j] = c[j + 1];
          c[j + 1] = t;
        } else { /* descending */
          for (int64_t j = 0; j < k / 2; j++) {
            uint32_t t = c[j];
            c[j] = c[k - 1 - j];
            c[k - 1 - j] = t;
          }
        }
        rbits w;
        rinit(&w, buf, sizeof buf);
        for (int64_t j = 0; j < nchunks * k; j++) rput(&w, mut[j], width);
        const distro__codec_fault rc =
            distro__idx_decode(buf, rbytes(&w), nchunks, k, n, NULL, (distro__idx_codec)codec, 0, back);
        cr_assert(fault_is(rc, DISTRO__CODEC_INDEX_ORDER, ch),
                  "codec %d n %lld k %lld kind %d chunk %lld: got fault %d at chunk %lld (seed %llu)", codec,
                  (long long)n, (long long)k, kind, (long long)ch, (int)rc.kind, (long long)rc.chunk, SEED);
      }
    }
  }
  /* Each chunk's order starts afresh: {2,3},{0,1} is valid. */
  const uint32_t ok[4] = {2, 3, 0, 1};
  uint8_t buf[8];
  rbits w;
  rinit(&w, buf, sizeof buf);
  for (int j = 0; j < 4; j++) rput(&w, ok[j], 8);
  uint32_t back[4];
  cr_assert_eq(distro__idx_decode(buf, 4, 2, 2, 4, NULL, DISTRO__IDX_FIXED, 0, back).kind, DISTRO__CODEC_OK);
  cr_assert_eq(memcmp(back, ok, sizeof ok), 0);
}

/* RICE: gaps that run past the chunk are rejected. */
Test(codecs, index_decode_rejects_rice_overrun) {
  uint64_t seed = tu_seed();
  tu_rng r = {seed};
  const int64_t ns[] = {2, 48, 257, 4096, 90000};
  for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
    const int64_t n = ns[a];
    for (int trial = 0; trial < 40; trial++) {
      const int64_t k = 1 + (int64_t)(tu_next(&r) % (uint64_t)(n < 6 ? n : 6));
      const int b = (int)(tu_next(&r) % 12);
      const int64_t nchunks = 3, bad = (int64_t)(tu_next(&r) % 3);
      uint32_t idx[18];
      for (int64_t ch = 0; ch < nchunks; ch++) selection(&r, SEL_UNIFORM, n, k, idx + ch * k);
      uint8_t *buf = malloc(1 << 20);
      cr_assert(buf);
      rbits w;
      rinit(&w, buf, 1 << 20);
      int strict = 1;
      for (int64_t ch = 0; ch < nchunks; ch++)
        for (int64_t j = 0; j < k; j++) {
          uint64_t g = ref_gap(idx + ch * k, j);
          if (ch == bad && j == k - 1) {
            /* The last index lands at n, n + 1, ... or the gap alone is >= n. */
            int64_t prev = j ? (int64_t)idx[ch * k + j - 1] : -1;
            g = (uint64_t)(n - prev - 1) + tu_next(&r) % 3;
            if (trial % 5 == 0) g = (uint64_t)n + tu_next(&r) % 4;
            strict = (g >> b) <= ((uint64_t)n >> b);
          }
          rrice(&w, g, b);
        }
      uint32_t back[18];
      const distro__codec_fault rc =
          distro__idx_decode(buf, rbytes(&w), nchunks, k, n, NULL, DISTRO__IDX_RICE, b, back);
      /* The bad chunk is named, unless its quotient alone exceeds what any
       * gap in [0, n) can have, which is a malformed section. */
      cr_assert(fault_is(rc, DISTRO__CODEC_INDEX_ORDER, bad) || rc.kind == DISTRO__CODEC_INDEX_SECTION,
                "n %lld k %lld b %d: got fault %d at chunk %lld (seed %llu)", (long long)n, (long long)k, b,
                (int)rc.kind, (long long)rc.chunk, SEED);
      if (strict)
        cr_assert(fault_is(rc, DISTRO__CODEC_INDEX_ORDER, bad), "n %lld k %lld b %d (seed %llu)", (long long)n,
                  (long long)k, b, SEED);
      free(buf);
    }
  }
}

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
