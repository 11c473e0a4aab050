/* Test-side byte access, float bit casts and a bitwise CRC32C, written
 * independently of the library (src/common/bytes.h, crc32c.c) so the wire
 * tests do not check the library's encoding against itself. */
#ifndef DISTRO_TESTS_WIRE_REF_H
#define DISTRO_TESTS_WIRE_REF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static inline void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void wr64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t f2u(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* Bitwise CRC32C (reflected 0x82f63b78): no table, no SSE4.2. */
static inline uint32_t ref_crc32c(const uint8_t *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

#endif
