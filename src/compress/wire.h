/* Internal: payload wire format v1 (docs/wire-format.md).
 *
 *   header (40 bytes) | per-tensor descriptors (24 bytes each) |
 *   per tensor: indices, then values | CRC32C (4 bytes)
 *
 * All integers little-endian. Every rank's payload for the same tensor list
 * and options has the same size, so the exchange is a plain all-gather. */
#ifndef DISTRO_COMPRESS_WIRE_H
#define DISTRO_COMPRESS_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <distro/optim.h>
#include "compress/chunk.h"
#include "compress/frame.h"

#define DISTRO__WIRE_VERSION 1
#define DISTRO__WIRE_DESC 24

/* Byte offsets of each tensor's sections, fixed by the tensor list. */
typedef struct distro__wire_layout {
  int ntensors;
  distro_values values;
  size_t total;            /* whole payload, CRC included */
  size_t *idx_off, *val_off;
  int *idx_width;          /* 1, 2 or 4 bytes */
} distro__wire_layout;

distro_status distro__wire_layout_init(distro__wire_layout *l, const distro__tiling *t, int n, distro_values v);
void distro__wire_layout_destroy(distro__wire_layout *l);

/* Bytes of a value section for one tensor. */
size_t distro__wire_value_bytes(distro_values v, int64_t count);

/* Writes header and descriptors (flags, sender, step, abort status/tensor). */
void distro__wire_write_header(uint8_t *buf, const distro__wire_layout *l, const distro__tiling *t, uint32_t flags,
                               uint32_t sender, uint64_t step, uint32_t abort_status, uint32_t abort_tensor);
/* Writes tensor i's indices (sorted within each chunk) and values. */
void distro__wire_write_tensor(uint8_t *buf, const distro__wire_layout *l, const distro__tiling *t, int i,
                               const uint32_t *idx, const float *val);
/* Zero-fills tensor sections (abort payloads) and stamps the CRC. */
void distro__wire_clear_body(uint8_t *buf, const distro__wire_layout *l);
void distro__wire_seal(uint8_t *buf, const distro__wire_layout *l);

/* Validates payload `buf` of `size` bytes from rank `peer` against our own
 * layout: size, magic, version, CRC, codec, flags, descriptors, index range
 * and order, finite values. On an abort payload returns OK with *aborted
 * set. Sender and step are the caller's to check (distro__wire_read_origin). */
distro_status distro__wire_validate(const uint8_t *buf, size_t size, const distro__wire_layout *l,
                                    const distro__tiling *t, int peer, int *aborted, uint32_t *abort_status,
                                    uint32_t *abort_tensor);

/* Decoding helpers for a validated payload. */
static inline uint32_t distro__wire_index(const uint8_t *sec, int width, int64_t j) {
  if (width == 1) return sec[j];
  if (width == 2) return (uint32_t)sec[2 * j] | (uint32_t)sec[2 * j + 1] << 8;
  const uint8_t *p = sec + 4 * j;
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
float distro__wire_value(const uint8_t *sec, distro_values v, int64_t j);

#endif
