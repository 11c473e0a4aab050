/* Protocol messages: header encoding, decoding and checks, the HELLO and
 * WELCOME bodies, endpoint syntax (docs/protocol.md). Everything here reads
 * bytes a peer chose, so every length is checked before it is used. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "compress/outer_codec.h"
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
    case DISTRO_SYNC_E_REFUSED: return "refused";
  }
  return "unknown-error";
}

distro_status distro_sync_error_status(int code) {
  switch (code) {
    case DISTRO_SYNC_E_NONE: return DISTRO_OK;
    case DISTRO_SYNC_E_SIGNATURE: return DISTRO_ERR_SHAPE;
    case DISTRO_SYNC_E_MALFORMED:
    case DISTRO_SYNC_E_CRC:
    case DISTRO_SYNC_E_PAYLOAD: return DISTRO_ERR_PAYLOAD;
    case DISTRO_SYNC_E_NOT_READY: return DISTRO_ERR_TIMEOUT;
    default: return DISTRO_ERR_INVALID; /* protocol, unknown learner, stale, round, refused, unknown codes */
  }
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

int distro__sy_peek(const uint8_t *h, size_t hn, size_t pn, distro__sy_msg *m, char *why, size_t why_n) {
  if (hn != DISTRO__SY_HEADER) {
    snprintf(why, why_n, "header frame of %zu bytes (want %d)", hn, DISTRO__SY_HEADER);
    return DISTRO_SYNC_E_MALFORMED;
  }
  if (distro__get_u32(h) != DISTRO__SY_MAGIC) {
    snprintf(why, why_n, "bad magic 0x%08x", (unsigned)distro__get_u32(h));
    return DISTRO_SYNC_E_MALFORMED;
  }
  if (get_u16(h + 4) != DISTRO__SY_PROTOCOL) {
    snprintf(why, why_n, "protocol version %u (this side speaks %d)", (unsigned)get_u16(h + 4), DISTRO__SY_PROTOCOL);
    return DISTRO_SYNC_E_PROTOCOL;
  }
  const uint32_t plen = distro__get_u32(h + 64);
  if (plen != pn) {
    snprintf(why, why_n, "payload frame of %zu bytes, header says %u", pn, (unsigned)plen);
    return DISTRO_SYNC_E_MALFORMED;
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
  m->payload_bytes = plen;
  return DISTRO_SYNC_E_NONE;
}

int distro__sy_verify(const uint8_t *h, const void *payload, size_t pn, const distro__sy_msg *m, char *why,
                      size_t why_n) {
  uint32_t crc = distro__crc32c(h, 68);
  if (pn) crc = distro__crc32c_update(crc, payload, pn);
  if (crc != distro__get_u32(h + 68)) {
    snprintf(why, why_n, "CRC32C mismatch (computed 0x%08x, message says 0x%08x)", (unsigned)crc,
             (unsigned)distro__get_u32(h + 68));
    return DISTRO_SYNC_E_CRC;
  }
  if (!isfinite(m->e)) {
    snprintf(why, why_n, "non-finite field e in %s", distro__sy_type_name(m->type));
    return DISTRO_SYNC_E_MALFORMED;
  }
  return DISTRO_SYNC_E_NONE;
}

int distro__sy_decode(const uint8_t *h, size_t hn, const void *payload, size_t pn, distro__sy_msg *m, char *why,
                      size_t why_n) {
  const int code = distro__sy_peek(h, hn, pn, m, why, why_n);
  return code ? code : distro__sy_verify(h, payload, pn, m, why, why_n);
}

/* ----------------------------------------------------------- bodies */

/* A u16 length and that many bytes of a printable string into out (cap
 * bytes, NUL added). Advances *off; -1 when it does not fit. */
static int get_str(const uint8_t *pl, size_t pn, size_t *off, char *out, size_t cap) {
  if (pn - *off < 2) return -1;
  const size_t len = get_u16(pl + *off);
  *off += 2;
  if (len >= cap || pn - *off < len) return -1;
  for (size_t i = 0; i < len; i++)
    if (pl[*off + i] < 0x21 || pl[*off + i] > 0x7e) return -1; /* no spaces, controls or NULs */
  memcpy(out, pl + *off, len);
  out[len] = 0;
  *off += len;
  return 0;
}

int distro__sy_is_z85_key(const char *s) {
  static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (strlen(s) != 40) return 0;
  for (int i = 0; i < 40; i++)
    if (!strchr(z85, s[i]) || !s[i]) return 0;
  return 1;
}

/* An advertised peer endpoint: something a joiner can connect to, and a
 * key that is a key (or none). */
static int check_peer(const char *ep, const char *key, char *why, size_t why_n) {
  char sub[160];
  if (ep[0] && distro__sy_endpoint_check(ep, 0, sub, sizeof sub) < 0) {
    snprintf(why, why_n, "endpoint: %s", sub);
    return -1;
  }
  if (key[0] && !distro__sy_is_z85_key(key)) {
    snprintf(why, why_n, "public key is not 40 Z85 characters");
    return -1;
  }
  return 0;
}

/* u32 nt | nt x (u64 numel, u32 flags) | u32 nver | nver x u64 | u16 len,
 * endpoint | u16 len, key */
int distro__sy_parse_hello(const uint8_t *pl, size_t pn, distro__sy_hello *h, char *why, size_t why_n) {
  size_t off = 0;
  memset(h, 0, sizeof *h);
  if (pn < 4) goto short_body;
  h->nt = distro__get_u32(pl);
  off = 4;
  if (h->nt < 1 || h->nt > DISTRO__SY_MAX_TENSORS) {
    snprintf(why, why_n, "HELLO with %u tensors (1..%d)", (unsigned)h->nt, DISTRO__SY_MAX_TENSORS);
    return DISTRO_SYNC_E_MALFORMED;
  }
  if ((pn - off) / 12 < h->nt) goto short_body;
  h->tensors = pl + off;
  for (uint32_t i = 0; i < h->nt; i++) {
    const uint64_t n = distro__get_u64(pl + off);
    const uint32_t fl = distro__get_u32(pl + off + 8);
    if (n < 1 || n > (uint64_t)DISTRO__SY_MAX_NUMEL || (int64_t)n > DISTRO__SY_MAX_NUMEL - h->total) {
      snprintf(why, why_n, "HELLO tensor %u of %llu elements: a job holds 1..%lld parameters", (unsigned)i,
               (unsigned long long)n, (long long)DISTRO__SY_MAX_NUMEL);
      return DISTRO_SYNC_E_MALFORMED;
    }
    if (fl & ~DISTRO_DILOCO_PLAIN_MERGE) {
      snprintf(why, why_n, "HELLO tensor %u has unknown flag bits 0x%x", (unsigned)i, (unsigned)fl);
      return DISTRO_SYNC_E_MALFORMED;
    }
    h->total += (int64_t)n;
    off += 12;
  }
  if (pn - off < 4) goto short_body;
  h->nver = distro__get_u32(pl + off);
  off += 4;
  if (h->nver > DISTRO__SY_MAX_FRAGMENTS || (pn - off) / 8 < h->nver) goto short_body;
  h->versions = pl + off;
  off += 8 * (size_t)h->nver;
  if (get_str(pl, pn, &off, h->endpoint, sizeof h->endpoint) || get_str(pl, pn, &off, h->key, sizeof h->key))
    goto short_body;
  if (off != pn) {
    snprintf(why, why_n, "HELLO body has %zu bytes after its end", pn - off);
    return DISTRO_SYNC_E_MALFORMED;
  }
  char sub[200];
  if (check_peer(h->endpoint, h->key, sub, sizeof sub)) {
    snprintf(why, why_n, "HELLO %s", sub);
    return DISTRO_SYNC_E_MALFORMED;
  }
  return DISTRO_SYNC_E_NONE;
short_body:
  snprintf(why, why_n, "HELLO body of %zu bytes does not parse", pn);
  return DISTRO_SYNC_E_MALFORMED;
}

/* u32 P, codec, block, fragmenting | u64 max_block | u32 tau | P x u64
 * versions | P x 64 hashes | u32 npeers | npeers x (u32 id, u16 len +
 * endpoint, u16 len + key) */
int distro__sy_parse_welcome(const uint8_t *pl, size_t pn, distro__sy_welcome *w, char *why, size_t why_n) {
  size_t off = 28;
  memset(w, 0, sizeof *w);
  if (pn < 28) goto bad;
  w->P = distro__get_u32(pl);
  w->codec = distro__get_u32(pl + 4);
  w->block = distro__get_u32(pl + 8);
  w->fragmenting = distro__get_u32(pl + 12);
  w->max_block = (int64_t)distro__get_u64(pl + 16);
  w->tau = distro__get_u32(pl + 24);
  if (w->P < 1 || w->P > DISTRO__SY_MAX_FRAGMENTS || w->block < 1 || w->block > DISTRO__SY_MAX_BLOCK ||
      w->tau > DISTRO__SY_MAX_TAU || w->fragmenting > (uint32_t)DISTRO_FRAG_SEQUENTIAL ||
      !distro__outer_codec_known((int)w->codec)) {
    snprintf(why, why_n, "WELCOME settings out of range (P %u, codec %u, block %u, fragmenting %u, tau %u)",
             (unsigned)w->P, (unsigned)w->codec, (unsigned)w->block, (unsigned)w->fragmenting, (unsigned)w->tau);
    return DISTRO_SYNC_E_MALFORMED;
  }
  if ((pn - off) / 72 < w->P) goto bad;
  w->versions = pl + off;
  off += 8 * (size_t)w->P;
  w->hashes = pl + off;
  off += 64 * (size_t)w->P;
  if (pn - off < 4) goto bad;
  const uint32_t np = distro__get_u32(pl + off);
  off += 4;
  if (np > DISTRO__SY_MAX_PEERS) goto bad;
  for (uint32_t k = 0; k < np; k++) {
    distro__sy_peer *q = &w->peer[k];
    if (pn - off < 4) goto bad;
    q->id = distro__get_u32(pl + off);
    off += 4;
    if (get_str(pl, pn, &off, q->endpoint, sizeof q->endpoint) || get_str(pl, pn, &off, q->key, sizeof q->key))
      goto bad;
    char sub[200];
    if (!q->endpoint[0] || check_peer(q->endpoint, q->key, sub, sizeof sub)) {
      snprintf(why, why_n, "WELCOME peer %u: %s", (unsigned)k, q->endpoint[0] ? sub : "no endpoint");
      return DISTRO_SYNC_E_MALFORMED;
    }
  }
  w->npeers = (int)np;
  if (off != pn) goto bad;
  return DISTRO_SYNC_E_NONE;
bad:
  snprintf(why, why_n, "WELCOME body of %zu bytes does not parse", pn);
  return DISTRO_SYNC_E_MALFORMED;
}

/* --------------------------------------------------------- endpoints */

static int all_digits(const char *s, size_t n) {
  if (!n) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return 0;
  return 1;
}

/* A dotted IPv4 address in 127.0.0.0/8. */
static int ipv4_loopback(const char *h, size_t n) {
  int parts = 0;
  unsigned v[4];
  size_t i = 0;
  while (i < n && parts < 4) {
    size_t j = i;
    while (j < n && h[j] != '.') j++;
    if (!all_digits(h + i, j - i) || j - i > 3) return 0;
    v[parts] = (unsigned)atoi(h + i); /* at most 3 digits */
    if (v[parts] > 255) return 0;
    parts++;
    i = j + 1;
    if (j == n) break;
  }
  return parts == 4 && i >= n && v[0] == 127;
}

int distro__sy_endpoint_check(const char *ep, int bind, char *why, size_t why_n) {
  if (!ep) {
    snprintf(why, why_n, "endpoint is NULL");
    return -1;
  }
  const size_t len = strlen(ep);
  if (len > DISTRO__SY_MAX_ENDPOINT) {
    snprintf(why, why_n, "endpoint of %zu characters (at most %d)", len, DISTRO__SY_MAX_ENDPOINT);
    return -1;
  }
  for (size_t i = 0; i < len; i++)
    if (ep[i] < 0x21 || ep[i] > 0x7e) {
      snprintf(why, why_n, "endpoint '%s' has a space or control character", ep);
      return -1;
    }
  if (strncmp(ep, "ipc://", 6) == 0) {
    /* A socket file: 107 bytes fit sockaddr_un; "*" picks a name. */
    if (len == 6 || len - 6 > 107 || (!bind && strcmp(ep + 6, "*") == 0)) {
      snprintf(why, why_n, "ipc endpoint '%s' needs a path of 1..107 characters", ep);
      return -1;
    }
    return 1;
  }
  if (strncmp(ep, "inproc://", 9) == 0) {
    if (len == 9) {
      snprintf(why, why_n, "inproc endpoint '%s' has no name", ep);
      return -1;
    }
    return 1;
  }
  if (strncmp(ep, "tcp://", 6) != 0) {
    snprintf(why, why_n, "endpoint '%s': want tcp://HOST:PORT, ipc://PATH or inproc://NAME", ep);
    return -1;
  }
  const char *host = ep + 6, *colon = strrchr(host, ':');
  if (!colon || colon == host || strchr(host, ';')) {
    snprintf(why, why_n, "tcp endpoint '%s' needs HOST:PORT", ep);
    return -1;
  }
  const char *port = colon + 1;
  const size_t hn = (size_t)(colon - host), pl = strlen(port);
  if (!(bind && strcmp(port, "*") == 0) && !(all_digits(port, pl) && pl <= 5 && atoi(port) >= 1 && atoi(port) <= 65535)) {
    snprintf(why, why_n, "tcp endpoint '%s': port must be 1..65535%s", ep, bind ? " or *" : "");
    return -1;
  }
  if (host[0] == '[' ? host[hn - 1] != ']' || hn < 3 : memchr(host, ':', hn) != NULL) {
    snprintf(why, why_n, "tcp endpoint '%s': an IPv6 host goes in brackets", ep);
    return -1;
  }
  for (size_t i = 0; i < hn; i++)
    if (!isalnum((unsigned char)host[i]) && !strchr(".-_[]:*", host[i])) {
      snprintf(why, why_n, "tcp endpoint '%s': bad host", ep);
      return -1;
    }
  if ((hn == 9 && strncmp(host, "localhost", 9) == 0) || (hn == 5 && strncmp(host, "[::1]", 5) == 0) ||
      (hn == 2 && strncmp(host, "lo", 2) == 0) || ipv4_loopback(host, hn))
    return 1;
  return 0;
}
