/* The framing both payload wire versions share. See frame.h. */
#include "compress/frame.h"

#include <string.h>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/error.h"

uint16_t distro__bf16_from_float(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
  /* Finite values just below FLT_MAX would round to Inf, which receivers
   * reject; saturate to the largest finite bf16 instead. */
  if ((r & 0x7f800000u) == 0x7f800000u && (u & 0x7f800000u) != 0x7f800000u)
    return (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
  return (uint16_t)(r >> 16);
}

float distro__bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

int distro__wire_index_width(int64_t chunk_elems) {
  if (chunk_elems <= 256) return 1;
  if (chunk_elems <= 65536) return 2;
  return 4;
}

void distro__wire_put_header(uint8_t *buf, unsigned version, distro_values v, uint32_t flags, int ntensors,
                             uint32_t sender, uint64_t step, uint64_t total, uint32_t abort_status,
                             uint32_t abort_tensor) {
  memset(buf, 0, DISTRO__WIRE_HEADER);
  distro__put_u32(buf + 0, DISTRO__WIRE_MAGIC);
  distro__put_u16(buf + 4, (uint16_t)version);
  buf[6] = (uint8_t)v;
  buf[7] = (uint8_t)flags;
  distro__put_u32(buf + 8, (uint32_t)ntensors);
  distro__put_u32(buf + 12, sender);
  distro__put_u64(buf + 16, step);
  distro__put_u64(buf + 24, total);
  distro__put_u32(buf + 32, abort_status);
  distro__put_u32(buf + 36, abort_tensor);
}

void distro__wire_read_origin(const uint8_t *buf, uint32_t *sender, uint64_t *step) {
  *sender = distro__get_u32(buf + 12);
  *step = distro__get_u64(buf + 16);
}

distro_status distro__wire_check_header(const uint8_t *buf, size_t size, unsigned version, distro_values v, int ntensors,
                                        int peer, int *aborted, uint32_t *abort_status, uint32_t *abort_tensor) {
  if (distro__get_u32(buf) != DISTRO__WIRE_MAGIC)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: bad magic 0x%08x", peer, distro__get_u32(buf));
  if (distro__get_u16(buf + 4) != version)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: unsupported wire version %u", peer,
                        distro__get_u16(buf + 4));
  const uint32_t crc = distro__crc32c(buf, size - 4);
  if (crc != distro__get_u32(buf + size - 4))
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: CRC32C mismatch (0x%08x != 0x%08x)", peer, crc,
                        distro__get_u32(buf + size - 4));
  if (buf[6] != (uint8_t)v)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: values codec %u, expected %d", peer, buf[6], (int)v);
  if (distro__get_u32(buf + 8) != (uint32_t)ntensors || distro__get_u64(buf + 24) != (uint64_t)size)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: header disagrees with the tensor list", peer);
  const unsigned known = DISTRO__WIRE_FLAG_ABORT;
  if (buf[7] & ~known)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: unknown flags 0x%02x", peer, buf[7]);
  if (buf[7] & DISTRO__WIRE_FLAG_ABORT) {
    *aborted = 1;
    *abort_status = distro__get_u32(buf + 32);
    *abort_tensor = distro__get_u32(buf + 36);
    return DISTRO_OK;
  }
  if (distro__get_u32(buf + 32) != 0 || distro__get_u32(buf + 36) != 0)
    return distro__fail(DISTRO_ERR_PAYLOAD, "payload from rank %d: abort fields set without the ABORT flag", peer);
  return DISTRO_OK;
}
