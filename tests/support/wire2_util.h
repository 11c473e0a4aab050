/* Shared by the payload wire format v2 suites (tests/test_wire2_*.c): random
 * payloads encoded by the library, decoding into scratch arrays, the
 * rejection check, and an independent payload writer built from the document
 * (docs/wire-format.md, "Wire format v2"). Functions are static inline so a
 * suite that uses only some of them does not warn. */
#ifndef DISTRO_TESTS_WIRE2_UTIL_H
#define DISTRO_TESTS_WIRE2_UTIL_H

#include <criterion/criterion.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
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
static inline void one_thread(void) { omp_set_num_threads(1); }
#define HEAD(n) (40 + 40 * (size_t)(n))

/* ---------------------------------------------------------------- helpers */

static inline void reseal(uint8_t *buf, size_t size) { wr32(buf + size - 4, ref_crc32c(buf, size - 4)); }

/* Does `hay` name exactly `what` followed by a non-digit ("rank 3" is not in
 * "rank 31")? */
static inline int names(const char *hay, const char *what, int num) {
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

static inline int64_t count_of(const distro__tiling *t) { return t->nchunks * t->k; }

static inline void sample_sorted(tu_rng *r, int64_t n, int64_t k, uint32_t *out) {
  int64_t got = 0;
  for (int64_t j = 0; j < n && got < k; j++)
    if ((double)(n - j) * tu_uniform(r) < (double)(k - got)) out[got++] = (uint32_t)j;
  cr_assert_eq(got, k);
}

/* Uniform selections, or (clustered) ones at the low indices, as the
 * low-frequency DCT coefficients of smooth gradients are. */
static inline void random_selection(tu_rng *r, int64_t n, int64_t k, int clustered, uint32_t *out) {
  int64_t span = clustered ? 2 * k + 1 : n;
  sample_sorted(r, span < n ? span : n, k, out);
}

static inline float random_value(tu_rng *r) {
  uint64_t u = tu_next(r);
  switch (u % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    default: return (float)(tu_normal(r) * ldexp(1.0, (int)((u >> 8) % 41) - 20));
  }
}

static inline void setup_tensors(payload *p, const spec *s, int n) {
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
static inline void build(payload *p, const spec *s, int n, distro_values codec, tu_rng *r) {
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

static inline void destroy(payload *p) {
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

static inline outs outs_new(const payload *p) {
  outs o = {p->n, calloc((size_t)(p->n ? p->n : 1), sizeof(uint32_t *)), calloc((size_t)(p->n ? p->n : 1), sizeof(float *))};
  cr_assert(o.idx && o.val);
  for (int i = 0; i < p->n; i++) {
    o.idx[i] = malloc(sizeof(uint32_t) * (size_t)count_of(&p->ts[i].t));
    o.val[i] = malloc(sizeof(float) * (size_t)count_of(&p->ts[i].t));
    cr_assert(o.idx[i] && o.val[i]);
  }
  return o;
}
static inline void outs_free(outs *o) {
  for (int i = 0; i < o->n; i++) {
    free(o->idx[i]);
    free(o->val[i]);
  }
  free(o->idx);
  free(o->val);
}

static inline distro_status decode(const payload *p, const uint8_t *buf, size_t size, int peer, int *aborted,
                                   uint32_t *st, uint32_t *te) {
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

/* ---- an independent payload writer, from the document ------------------- */

typedef struct {
  int icodec, iparam, vparam;
  const uint8_t *isec, *vsec;
  size_t ib, vb;
} section;

/* Header | descriptors | sections | CRC, from p's geometry and `sec`. */
static inline size_t assemble(uint8_t *out, size_t cap, const payload *p, const section *sec, uint32_t flags) {
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
static inline void split(const payload *p, section *sec) {
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

#endif
