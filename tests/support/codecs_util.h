/* Shared by the wire v2 section codec suites (tests/test_codecs_*.c): an
 * independent LSB-first reference bit writer, built from the document, that
 * the library's sections are compared with byte for byte. static inline so
 * that a suite not using one of them does not warn. */
#ifndef DISTRO_TESTS_CODECS_UTIL_H
#define DISTRO_TESTS_CODECS_UTIL_H

#include <criterion/criterion.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;
#define SEED (unsigned long long)seed

static inline uint64_t mask64(int n) { return n >= 64 ? ~0ULL : (1ULL << n) - 1; }

/* Reference bit writer: bit p of the stream is bit p % 8 of byte p / 8. */
typedef struct {
  uint8_t *b;
  size_t cap, pos;
} rbits;

static inline void rinit(rbits *w, uint8_t *b, size_t cap) {
  w->b = b;
  w->cap = cap;
  w->pos = 0;
  memset(b, 0, cap);
}
static inline void rput(rbits *w, uint64_t v, int n) {
  for (int i = 0; i < n; i++, w->pos++) {
    cr_assert_lt(w->pos / 8, w->cap, "reference writer overflow");
    if ((v >> i) & 1) w->b[w->pos / 8] |= (uint8_t)(1u << (w->pos % 8));
  }
}
static inline void rput128(rbits *w, u128 v, int n) {
  for (int i = 0; i < n; i++) rput(w, (uint64_t)(v >> i) & 1, 1);
}
static inline void rrice(rbits *w, uint64_t v, int b) {
  for (uint64_t q = v >> b; q; q--) rput(w, 1, 1);
  rput(w, 0, 1);
  rput(w, v & mask64(b), b);
}
static inline size_t rbytes(const rbits *w) { return (w->pos + 7) / 8; }

#endif
