/* Wire v2 section codecs (docs/wire-format.md, "Wire format v2"), part 2: the
 * four index codecs (FIXED, PACK12, RICE, ENUM) and the encoder's choice among
 * them. Every section is checked against an independent bit-by-bit reference
 * writer built from the document, round-tripped, and mutated to check that
 * the decoder rejects it. Bit streams and the document's examples are in
 * test_codecs_bits.c, the value codecs in test_codecs_values.c.
 *
 * Inputs are fresh random each run (DISTRO_TEST_SEED reproduces one); the seed
 * is in every failure message. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs_util.h"
#include "compress/bits.h"
#include "compress/index_codec.h"
#include "compress/wire.h"
#include "testutil.h"
#include "wire_ref.h"

/* ---------------------------------------------------------------- helpers */

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
