/* Internal: little-endian bit streams (LSB first) for the v2 codecs. The
 * reader never reads past its end: it reports an error flag instead. */
#ifndef DISTRO_COMPRESS_BITS_H
#define DISTRO_COMPRESS_BITS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  uint8_t *buf;
  size_t cap;   /* bytes */
  size_t pos;   /* bits written */
  int overflow; /* set when a write did not fit */
} distro__bitw;

typedef struct {
  const uint8_t *buf;
  size_t len; /* bytes */
  size_t pos; /* bits read */
  int error;  /* set when a read ran past the end */
} distro__bitr;

static inline void distro__bitw_init(distro__bitw *w, uint8_t *buf, size_t cap) {
  w->buf = buf;
  w->cap = cap;
  w->pos = 0;
  w->overflow = 0;
  if (cap) memset(buf, 0, cap);
}

/* The stream is LSB first, so 8 bytes of it are one little-endian word. */
static inline uint64_t distro__le64_load(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static inline void distro__le64_store(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  memcpy(p, &v, 8);
}

/* Writes the low n (<= 57) bits of v. */
static inline void distro__bitw_put(distro__bitw *w, uint64_t v, int n) {
  if (n == 0) return;
  if ((w->pos + (size_t)n + 7) / 8 > w->cap) {
    w->overflow = 1;
    return;
  }
  v &= n == 64 ? ~0ULL : ((1ULL << n) - 1);
  size_t byte = w->pos >> 3;
  int shift = (int)(w->pos & 7);
  if (byte + 8 <= w->cap) { /* one word: n + shift <= 64 bits */
    distro__le64_store(w->buf + byte, distro__le64_load(w->buf + byte) | v << shift);
    w->pos += (size_t)n;
    return;
  }
  /* Up to 57 + 7 = 64 bits touched: at most 8 bytes. */
  for (int done = -shift; done < n; done += 8, byte++) {
    uint8_t part = (uint8_t)(done < 0 ? v << -done : v >> done);
    w->buf[byte] |= part;
  }
  w->pos += (size_t)n;
}

static inline void distro__bitw_put_long(distro__bitw *w, unsigned __int128 v, int n) {
  while (n > 0) {
    int m = n < 48 ? n : 48;
    distro__bitw_put(w, (uint64_t)v & ((1ULL << m) - 1), m);
    v >>= m;
    n -= m;
  }
}

static inline size_t distro__bitw_bytes(const distro__bitw *w) { return (w->pos + 7) / 8; }

static inline void distro__bitr_init(distro__bitr *r, const uint8_t *buf, size_t len) {
  r->buf = buf;
  r->len = len;
  r->pos = 0;
  r->error = 0;
}

static inline uint64_t distro__bitr_get(distro__bitr *r, int n) {
  if (n == 0) return 0;
  if (r->pos + (size_t)n > r->len * 8) {
    r->error = 1;
    r->pos = r->len * 8;
    return 0;
  }
  uint64_t v = 0;
  size_t byte = r->pos >> 3;
  int shift = (int)(r->pos & 7), got = 0;
  if (n <= 57 && byte + 8 <= r->len) { /* one word */
    v = distro__le64_load(r->buf + byte) >> shift;
    r->pos += (size_t)n;
    return v & ((1ULL << n) - 1);
  }
  while (got < n) {
    uint64_t part = (uint64_t)(r->buf[byte++] >> shift);
    v |= part << got;
    got += 8 - shift;
    shift = 0;
  }
  r->pos += (size_t)n;
  return n == 64 ? v : v & ((1ULL << n) - 1);
}

static inline unsigned __int128 distro__bitr_get_long(distro__bitr *r, int n) {
  unsigned __int128 v = 0;
  int at = 0;
  while (n > 0) {
    int m = n < 48 ? n : 48;
    v |= (unsigned __int128)distro__bitr_get(r, m) << at;
    at += m;
    n -= m;
  }
  return v;
}

/* Unary count of 1s terminated by a 0, at most `limit` (error beyond). */
static inline uint64_t distro__bitr_unary(distro__bitr *r, uint64_t limit) {
  uint64_t q = 0;
  while (!r->error && (r->pos >> 3) + 8 <= r->len) { /* a word at a time: count its trailing ones */
    const int shift = (int)(r->pos & 7), avail = 64 - shift;
    const uint64_t zeros = ~(distro__le64_load(r->buf + (r->pos >> 3)) >> shift);
    const int ones = zeros ? __builtin_ctzll(zeros) : 64;
    if (ones < avail) { /* the terminating zero is in this word */
      q += (uint64_t)ones;
      r->pos += (size_t)ones + 1;
      if (q > limit) r->error = 1;
      return q;
    }
    q += (uint64_t)avail;
    r->pos += (size_t)avail;
    if (q > limit) {
      r->error = 1;
      return q;
    }
  }
  while (!r->error) {
    if (r->pos >= r->len * 8) {
      r->error = 1;
      break;
    }
    int bit = (r->buf[r->pos >> 3] >> (r->pos & 7)) & 1;
    r->pos++;
    if (!bit) return q;
    if (++q > limit) {
      r->error = 1;
      break;
    }
  }
  return q;
}

/* Rice code: q = v >> b in unary (q ones, a zero), then b low bits. */
static inline void distro__bitw_rice(distro__bitw *w, uint64_t v, int b) {
  uint64_t q = v >> b;
  while (q >= 32) {
    distro__bitw_put(w, 0xffffffffULL, 32);
    q -= 32;
  }
  distro__bitw_put(w, (1ULL << q) - 1, (int)q + 1); /* q ones then a zero */
  distro__bitw_put(w, v, b);
}

static inline uint64_t distro__bitr_rice(distro__bitr *r, int b, uint64_t max_q) {
  uint64_t q = distro__bitr_unary(r, max_q);
  return (q << b) | distro__bitr_get(r, b);
}

#endif
