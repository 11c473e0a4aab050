/* Payload wire format v2 (docs/wire-format.md, "Wire format v2"): header and
 * descriptor bytes at the documented offsets, encode -> decode round trips
 * for every values codec, payloads assembled independently from the document
 * (any valid codec choice must decode; the encoder's choice must match byte
 * for byte), abort payloads, and every rejection the decoder applies, each
 * returning DISTRO_ERR_PAYLOAD with a message naming the peer.
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
#include "wire_ref.h"

#define SEED (unsigned long long)seed

/* The rejection tests decode hundreds of small payloads; each decode enters
 * OpenMP regions, whose spinning threads cost far more than the work on a
 * busy machine. They run on one thread (Criterion runs each test in its own
 * process); the round trips and first_bad_tensor_is_reported keep several. */
static void one_thread(void) { omp_set_num_threads(1); }
#define HEAD(n) (40 + 40 * (size_t)(n))

/* ---------------------------------------------------------------- helpers */

static void reseal(uint8_t *buf, size_t size) { wr32(buf + size - 4, ref_crc32c(buf, size - 4)); }

/* Does `hay` name exactly `what` followed by a non-digit ("rank 3" is not in
 * "rank 31")? */
static int names(const char *hay, const char *what, int num) {
  char needle[48];
  snprintf(needle, sizeof needle, "%s %d", what, num);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
    char nx = p[strlen(needle)];
    if (nx < '0' || nx > '9') return 1;
  }
  return 0;
}

typedef struct {
  int ndim;
  int64_t shape[4];
  int64_t target, topk;
} spec;

/* One sender's payload and the selection it encodes. */
typedef struct {
  int n;
  distro_values codec;
  distro__wire2_tensor *ts;
  distro__enum_table *et;
  uint32_t **idx;
  float **val;
  uint8_t *buf;
  size_t cap, size;
  uint32_t sender;
  uint64_t step;
} payload;

static int64_t count_of(const distro__tiling *t) { return t->nchunks * t->k; }

static void sample_sorted(tu_rng *r, int64_t n, int64_t k, uint32_t *out) {
  int64_t got = 0;
  for (int64_t j = 0; j < n && got < k; j++)
    if ((double)(n - j) * tu_uniform(r) < (double)(k - got)) out[got++] = (uint32_t)j;
  cr_assert_eq(got, k);
}

/* Uniform selections, or (clustered) ones at the low indices, as the
 * low-frequency DCT coefficients of smooth gradients are. */
static void random_selection(tu_rng *r, int64_t n, int64_t k, int clustered, uint32_t *out) {
  int64_t span = clustered ? 2 * k + 1 : n;
  sample_sorted(r, span < n ? span : n, k, out);
}

static float random_value(tu_rng *r) {
  uint64_t u = tu_next(r);
  switch (u % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    default: return (float)(tu_normal(r) * ldexp(1.0, (int)((u >> 8) % 41) - 20));
  }
}

static void setup_tensors(payload *p, const spec *s, int n) {
  p->n = n;
  p->ts = calloc((size_t)(n ? n : 1), sizeof *p->ts);
  p->et = calloc((size_t)(n ? n : 1), sizeof *p->et);
  cr_assert(p->ts && p->et);
  for (int i = 0; i < n; i++) {
    cr_assert_eq(distro__tiling_init(&p->ts[i].t, s[i].ndim, s[i].shape, s[i].target, s[i].topk), DISTRO_OK, "%s",
                 distro_last_error());
    distro__enum_table_init(&p->et[i], p->ts[i].t.chunk_elems, p->ts[i].t.k);
    p->ts[i].et = p->et[i].c ? &p->et[i] : NULL;
  }
}

/* Random selection and values, encoded by the library. */
static void build(payload *p, const spec *s, int n, distro_values codec, tu_rng *r) {
  memset(p, 0, sizeof *p);
  setup_tensors(p, s, n);
  p->codec = codec;
  p->idx = calloc((size_t)(n ? n : 1), sizeof *p->idx);
  p->val = calloc((size_t)(n ? n : 1), sizeof *p->val);
  cr_assert(p->idx && p->val);
  const int clustered = (int)(tu_next(r) % 3 == 0);
  for (int i = 0; i < n; i++) {
    const distro__tiling *t = &p->ts[i].t;
    p->idx[i] = malloc(sizeof(uint32_t) * (size_t)count_of(t));
    p->val[i] = malloc(sizeof(float) * (size_t)count_of(t));
    cr_assert(p->idx[i] && p->val[i]);
    for (int64_t c = 0; c < t->nchunks; c++)
      random_selection(r, t->chunk_elems, t->k, clustered, p->idx[i] + c * t->k);
    for (int64_t j = 0; j < count_of(t); j++) p->val[i][j] = random_value(r);
  }
  p->cap = distro__wire2_bound(p->ts, n, codec) + 64;
  p->buf = malloc(p->cap);
  cr_assert(p->buf);
  memset(p->buf, 0xa5, p->cap);
  p->sender = (uint32_t)(tu_next(r) % 1000);
  p->step = tu_next(r);
  p->size = distro__wire2_encode(p->buf, p->cap, p->ts, n, codec, p->sender, p->step, p->idx, p->val);
  cr_assert_gt(p->size, 0, "encode failed");
  cr_assert_leq(p->size, distro__wire2_bound(p->ts, n, codec), "payload larger than its bound");
}

static void destroy(payload *p) {
  for (int i = 0; i < p->n; i++) {
    if (p->idx) free(p->idx[i]);
    if (p->val) free(p->val[i]);
    distro__enum_table_destroy(&p->et[i]);
  }
  free(p->idx);
  free(p->val);
  free(p->ts);
  free(p->et);
  free(p->buf);
}

/* Output arrays for a decode of p's tensor list. */
typedef struct {
  int n;
  uint32_t **idx;
  float **val;
} outs;

static outs outs_new(const payload *p) {
  outs o = {p->n, calloc((size_t)(p->n ? p->n : 1), sizeof(uint32_t *)), calloc((size_t)(p->n ? p->n : 1), sizeof(float *))};
  cr_assert(o.idx && o.val);
  for (int i = 0; i < p->n; i++) {
    o.idx[i] = malloc(sizeof(uint32_t) * (size_t)count_of(&p->ts[i].t));
    o.val[i] = malloc(sizeof(float) * (size_t)count_of(&p->ts[i].t));
    cr_assert(o.idx[i] && o.val[i]);
  }
  return o;
}
static void outs_free(outs *o) {
  for (int i = 0; i < o->n; i++) {
    free(o->idx[i]);
    free(o->val[i]);
  }
  free(o->idx);
  free(o->val);
}

static distro_status decode(const payload *p, const uint8_t *buf, size_t size, int peer, int *aborted, uint32_t *st,
                            uint32_t *te) {
  outs o = outs_new(p);
  distro_status s = distro__wire2_decode(buf, size, p->ts, p->n, p->codec, peer, aborted, st, te, o.idx, o.val);
  outs_free(&o);
  return s;
}

#define EXPECT_REJECT(p, buf, size, peer, why, seed, ...)                                                          \
  do {                                                                                                              \
    int ab_ = 7;                                                                                                    \
    uint32_t st_ = 0, te_ = 0;                                                                                      \
    distro_status s_ = decode((p), (buf), (size), (peer), &ab_, &st_, &te_);                                        \
    char ctx_[256];                                                                                                 \
    snprintf(ctx_, sizeof ctx_, __VA_ARGS__);                                                                       \
    cr_assert_eq(s_, DISTRO_ERR_PAYLOAD, "%s: status %d (seed %llu)", ctx_, (int)s_, (unsigned long long)(seed)); \
    cr_assert(names(distro_last_error(), "rank", (peer)), "%s: message does not name rank %d: %s (seed %llu)",      \
              ctx_, (peer), distro_last_error(), (unsigned long long)(seed));                                       \
    cr_assert(strstr(distro_last_error(), (why)) != NULL, "%s: expected '%s', got: %s (seed %llu)", ctx_, (why),    \
              distro_last_error(), (unsigned long long)(seed));                                                     \
    cr_assert_eq(ab_, 0, "%s: aborted set on a rejected payload", ctx_);                                          \
  } while (0)

static void expect_valid(const payload *p, const uint8_t *buf, size_t size, uint64_t seed, const char *what) {
  int ab = 7;
  uint32_t st, te;
  distro_status s = decode(p, buf, size, 1, &ab, &st, &te);
  cr_assert_eq(s, DISTRO_OK, "%s: %s (seed %llu)", what, distro_last_error(), SEED);
  cr_assert_eq(ab, 0, "%s: aborted set", what);
}

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

/* ---- an independent payload writer, from the document ------------------- */

typedef struct {
  int icodec, iparam, vparam;
  const uint8_t *isec, *vsec;
  size_t ib, vb;
} section;

/* Header | descriptors | sections | CRC, from p's geometry and `sec`. */
static size_t assemble(uint8_t *out, size_t cap, const payload *p, const section *sec, uint32_t flags) {
  size_t total = HEAD(p->n) + 4;
  for (int i = 0; i < p->n; i++) total += sec[i].ib + sec[i].vb;
  cr_assert_leq(total, cap);
  memset(out, 0, total);
  memcpy(out, "DTRO", 4);
  out[4] = 2;
  out[5] = 0;
  out[6] = (uint8_t)p->codec;
  out[7] = (uint8_t)flags;
  wr32(out + 8, (uint32_t)p->n);
  wr32(out + 12, p->sender);
  wr64(out + 16, p->step);
  wr64(out + 24, total);
  size_t at = HEAD(p->n);
  for (int i = 0; i < p->n; i++) {
    uint8_t *d = out + 40 + 40 * (size_t)i;
    const distro__tiling *t = &p->ts[i].t;
    wr32(d, (uint32_t)t->h);
    wr32(d + 4, (uint32_t)t->w);
    wr32(d + 8, (uint32_t)t->k);
    d[12] = (uint8_t)sec[i].icodec;
    d[13] = (uint8_t)sec[i].iparam;
    d[14] = (uint8_t)sec[i].vparam;
    wr64(d + 16, (uint64_t)t->nchunks);
    wr64(d + 24, sec[i].ib);
    wr64(d + 32, sec[i].vb);
    memcpy(out + at, sec[i].isec, sec[i].ib);
    at += sec[i].ib;
    memcpy(out + at, sec[i].vsec, sec[i].vb);
    at += sec[i].vb;
  }
  wr32(out + at, ref_crc32c(out, at));
  return total;
}

/* The sections of a library payload (pointers into p->buf). */
static void split(const payload *p, section *sec) {
  size_t at = HEAD(p->n);
  for (int i = 0; i < p->n; i++) {
    const uint8_t *d = p->buf + 40 + 40 * (size_t)i;
    sec[i].icodec = d[12];
    sec[i].iparam = d[13];
    sec[i].vparam = d[14];
    sec[i].ib = rd64(d + 24);
    sec[i].vb = rd64(d + 32);
    sec[i].isec = p->buf + at;
    sec[i].vsec = p->buf + at + sec[i].ib;
    at += sec[i].ib + sec[i].vb;
  }
  cr_assert_eq(at + 4, p->size);
}

/* ---- tensor lists -------------------------------------------------------- */

/* u8 2-D, 1-D, primes (1x1 chunks), 3-D, u16, full k (k > n/2), short 1-D,
 * 4096-element chunks at topk 4 (ENUM) and 32 (RICE), u32 (90000). */
static const spec mixed[] = {
    {2, {30, 40}, 8, 5},        /* 6x8 chunks, 48 elems */
    {1, {1000}, 64, 7},         /* 1x50 chunks */
    {2, {97, 101}, 16, 3},      /* 1x1 chunks, k = 1 */
    {3, {3, 12, 20}, 8, 4},     /* 3-D: 6x5 chunks */
    {2, {40, 48}, 20, 9},       /* 20x16 = 320 elems: u16 */
    {2, {4, 4}, 4, 100},        /* k clamped to 16: every coefficient */
    {1, {13}, 64, 5},           /* one chunk of 13 */
    {2, {128, 128}, 64, 4},     /* 4 chunks of 4096, k 4 */
    {2, {64, 64}, 64, 32},      /* one chunk of 4096, k 32 */
    {2, {300, 300}, 300, 3},    /* one chunk of 90000: u32, no ENUM */
    {2, {8, 8}, 8, 40},         /* k 40 of 64: more than half */
};
#define NMIXED ((int)(sizeof mixed / sizeof mixed[0]))

static const distro_values codecs[5] = {DISTRO_VALUES_F32, DISTRO_VALUES_BF16, DISTRO_VALUES_SIGN1, DISTRO_VALUES_INT8,
                                        DISTRO_VALUES_INT4};

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
