/* Protocol messages: header encoding, decoding and checks (docs/protocol.md). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/crc32c.h"
#include "sync/sync_internal.h"

const char *distro__sy_type_name(int type) {
  static const char *const names[] = {"?",      "HELLO", "WELCOME", "SEED",  "REQUEST", "REPORT",   "FRAGMENT",
                                      "HEARTBEAT", "ERROR", "FETCH", "STATE", "UPLOAD", "BYE", "GET_STATE"};
  return type >= 1 && type <= DISTRO__SY_TYPE_MAX ? names[type] : "?";
}

const char *distro_sync_error_name(int code) {
  switch (code) {
    case DISTRO_SYNC_E_NONE: return "none";
    case DISTRO_SYNC_E_MALFORMED: return "malformed";
    case DISTRO_SYNC_E_CRC: return "crc";
    case DISTRO_SYNC_E_PROTOCOL: return "protocol";
    case DISTRO_SYNC_E_UNKNOWN: return "unknown-learner";
    case DISTRO_SYNC_E_SIGNATURE: return "signature";
    case DISTRO_SYNC_E_STALE: return "stale";
    case DISTRO_SYNC_E_PAYLOAD: return "payload";
    case DISTRO_SYNC_E_NOT_READY: return "not-ready";
    case DISTRO_SYNC_E_ROUND: return "round";
  }
  return "unknown-error";
}

static void put_u16(uint8_t *b, uint16_t v) {
  b[0] = (uint8_t)v;
  b[1] = (uint8_t)(v >> 8);
}
static uint16_t get_u16(const uint8_t *b) { return (uint16_t)(b[0] | (b[1] << 8)); }

void distro__sy_encode(const distro__sy_msg *m, const void *payload, uint8_t out[DISTRO__SY_HEADER]) {
  uint64_t ebits;
  memcpy(&ebits, &m->e, 8);
  distro__put_u32(out, DISTRO__SY_MAGIC);
  put_u16(out + 4, DISTRO__SY_PROTOCOL);
  put_u16(out + 6, m->type);
  distro__put_u32(out + 8, m->learner);
  distro__put_u32(out + 12, m->fragment);
  distro__put_u64(out + 16, m->epoch);
  distro__put_u64(out + 24, m->a);
  distro__put_u64(out + 32, m->b);
  distro__put_u64(out + 40, m->c);
  distro__put_u64(out + 48, m->d);
  distro__put_u64(out + 56, ebits);
  distro__put_u32(out + 64, m->payload_bytes);
  uint32_t crc = distro__crc32c(out, 68);
  if (m->payload_bytes) crc = distro__crc32c_update(crc, payload, m->payload_bytes);
  distro__put_u32(out + 68, crc);
}

int distro__sy_decode(const uint8_t *h, size_t hn, const void *payload, size_t pn, distro__sy_msg *m, char *why,
                      size_t why_n) {
  if (hn != DISTRO__SY_HEADER) {
    snprintf(why, why_n, "header frame of %zu bytes (want %d)", hn, DISTRO__SY_HEADER);
    return DISTRO_SYNC_E_MALFORMED;
  }
  if (distro__get_u32(h) != DISTRO__SY_MAGIC) {
    snprintf(why, why_n, "bad magic 0x%08x", (unsigned)distro__get_u32(h));
    return DISTRO_SYNC_E_MALFORMED;
  }
  const uint32_t plen = distro__get_u32(h + 64);
  if (plen != pn) {
    snprintf(why, why_n, "payload frame of %zu bytes, header says %u", pn, (unsigned)plen);
    return DISTRO_SYNC_E_MALFORMED;
  }
  uint32_t crc = distro__crc32c(h, 68);
  if (pn) crc = distro__crc32c_update(crc, payload, pn);
  if (crc != distro__get_u32(h + 68)) {
    snprintf(why, why_n, "CRC32C mismatch (computed 0x%08x, message says 0x%08x)", (unsigned)crc,
             (unsigned)distro__get_u32(h + 68));
    return DISTRO_SYNC_E_CRC;
  }
  if (get_u16(h + 4) != DISTRO__SY_PROTOCOL) {
    snprintf(why, why_n, "protocol version %u (this side speaks %d)", (unsigned)get_u16(h + 4), DISTRO__SY_PROTOCOL);
    return DISTRO_SYNC_E_PROTOCOL;
  }
  m->type = get_u16(h + 6);
  if (m->type < 1 || m->type > DISTRO__SY_TYPE_MAX) {
    snprintf(why, why_n, "unknown message type %u", (unsigned)m->type);
    return DISTRO_SYNC_E_MALFORMED;
  }
  m->learner = distro__get_u32(h + 8);
  m->fragment = distro__get_u32(h + 12);
  m->epoch = distro__get_u64(h + 16);
  m->a = distro__get_u64(h + 24);
  m->b = distro__get_u64(h + 32);
  m->c = distro__get_u64(h + 40);
  m->d = distro__get_u64(h + 48);
  uint64_t ebits = distro__get_u64(h + 56);
  memcpy(&m->e, &ebits, 8);
  if (!isfinite(m->e)) {
    snprintf(why, why_n, "non-finite field e in %s", distro__sy_type_name(m->type));
    return DISTRO_SYNC_E_MALFORMED;
  }
  m->payload_bytes = plen;
  return DISTRO_SYNC_E_NONE;
}
