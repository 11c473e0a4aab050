/* Test helpers for optimizer state files (distro_optim_save): read one
 * whole, checking its CRC32C trailer, and write a forged copy with the
 * trailer made right, so a test can lie in one field and nothing else.
 * Include after <criterion/criterion.h>. */
#ifndef DISTRO_TEST_STATE_FILE_H
#define DISTRO_TEST_STATE_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CRC32C, bit by bit (independent of src/common/crc32c.c). */
static inline uint32_t sf_crc32c(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

/* The whole file f (n bytes), its trailer checked. */
static inline unsigned char *sf_slurp(const char *f, long *n) {
  FILE *in = fopen(f, "rb");
  cr_assert(in, "cannot open %s", f);
  fseek(in, 0, SEEK_END);
  *n = ftell(in);
  fseek(in, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)*n);
  cr_assert(buf && *n >= 4 && fread(buf, 1, (size_t)*n, in) == (size_t)*n);
  fclose(in);
  uint32_t crc;
  memcpy(&crc, buf + *n - 4, 4);
  cr_assert_eq(crc, sf_crc32c(buf, (size_t)*n - 4), "the file's trailer is not the CRC32C of what precedes it");
  return buf;
}

/* Writes buf (n bytes, its CRC replaced) to f. */
static inline void sf_spill(const char *f, unsigned char *buf, long n) {
  const uint32_t crc = sf_crc32c(buf, (size_t)n - 4);
  memcpy(buf + n - 4, &crc, 4);
  FILE *out = fopen(f, "wb");
  cr_assert(out && fwrite(buf, 1, (size_t)n, out) == (size_t)n);
  fclose(out);
}

#endif
