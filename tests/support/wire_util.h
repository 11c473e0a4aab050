/* Shared by the payload wire format v1 suites (tests/test_wire_*.c): random
 * payloads written by the library, the validation and rejection checks, and
 * in-place index edits. Functions are static inline so a suite that uses only
 * some of them does not warn. */
#ifndef DISTRO_TESTS_WIRE_UTIL_H
#define DISTRO_TESTS_WIRE_UTIL_H

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compress/chunk.h"
#include "compress/wire.h"
#include "testutil.h"

/* Is `hay` a message naming exactly rank `peer`? */
static inline int names_rank(const char *hay, int peer) {
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

static inline int64_t count_of(const distro__tiling *t) { return t->nchunks * t->k; }

/* Selection sampling (Knuth's algorithm S): k distinct sorted indices in [0, n). */
static inline void random_selection(tu_rng *r, int64_t n, int64_t k, uint32_t *out) {
  int64_t got = 0;
  for (int64_t j = 0; j < n && got < k; j++)
    if ((double)(n - j) * tu_uniform(r) < (double)(k - got)) out[got++] = (uint32_t)j;
  cr_assert_eq(got, k);
}

/* Random values over many binades, with signed zeros mixed in. */
static inline float random_value(tu_rng *r) {
  uint64_t u = tu_next(r);
  switch (u % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    default: return (float)(tu_normal(r) * ldexp(1.0, (int)((u >> 8) % 41) - 20));
  }
}

static inline void build(payload *p, const spec *s, int n, distro_values codec, tu_rng *r) {
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

static inline void destroy(payload *p) {
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

static inline distro_status validate(const payload *p, const uint8_t *buf, size_t size, int peer, int *aborted) {
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

static inline void expect_valid(const payload *p, uint64_t seed, const char *what) {
  int ab = 7;
  distro_status s = validate(p, p->buf, p->l.total, 1, &ab);
  cr_assert_eq(s, DISTRO_OK, "%s: %s (seed %llu)", what, distro_last_error(), (unsigned long long)seed);
  cr_assert_eq(ab, 0, "%s: aborted set", what);
}

/* Index j of tensor i, rewritten in place at the tensor's width. */
static inline void put_index(payload *p, int i, int64_t j, uint32_t v) {
  uint8_t *is = p->buf + p->l.idx_off[i];
  int w = p->l.idx_width[i];
  for (int b = 0; b < w; b++) is[w * j + b] = (uint8_t)(v >> (8 * b));
}
static inline uint32_t get_index(const payload *p, int i, int64_t j) {
  return distro__wire_index(p->buf + p->l.idx_off[i], p->l.idx_width[i], j);
}

static inline void reseal(payload *p) { distro__wire_seal(p->buf, &p->l); }

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

#endif
