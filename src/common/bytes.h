/* Little-endian integers in byte buffers (wire payloads, DiLoCo and syncer
 * messages, checkpoints): the same bytes whatever the host's order. */
#ifndef DISTRO_COMMON_BYTES_H
#define DISTRO_COMMON_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void distro__put_u16(uint8_t *b, uint16_t v) {
  b[0] = (uint8_t)v;
  b[1] = (uint8_t)(v >> 8);
}
static inline void distro__put_u32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static inline void distro__put_u64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t distro__get_u16(const uint8_t *b) { return (uint16_t)(b[0] | b[1] << 8); }
static inline uint32_t distro__get_u32(const uint8_t *b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
  return v;
}
static inline uint64_t distro__get_u64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}

/* IEEE-754 binary32 as its bit pattern, little-endian. */
static inline void distro__put_f32(uint8_t *b, float x) {
  uint32_t v;
  memcpy(&v, &x, sizeof v);
  distro__put_u32(b, v);
}
static inline float distro__get_f32(const uint8_t *b) {
  uint32_t v = distro__get_u32(b);
  float x;
  memcpy(&x, &v, sizeof x);
  return x;
}

#endif
