/* Internal: Decoupled DiLoCo runtime shared by the syncer and the learner
 * (docs/protocol.md). */
#ifndef DISTRO_SYNC_INTERNAL_H
#define DISTRO_SYNC_INTERNAL_H

#include "common/bytes.h"
#include <stddef.h>
#include <stdint.h>
#include <distro/sync.h>

#include "optim/fragment.h"

/* ---------------------------------------------------------- messages */

#define DISTRO__SY_MAGIC 0x31595344u /* "DSY1" little-endian */
#define DISTRO__SY_PROTOCOL 1
#define DISTRO__SY_HEADER 72
#define DISTRO__SY_MAX_PAYLOAD (1u << 30)
#define DISTRO__SY_NONE 0xffffffffu

enum {
  DISTRO__SY_HELLO = 1,
  DISTRO__SY_WELCOME = 2,
  DISTRO__SY_SEED = 3,
  DISTRO__SY_REQUEST = 4,
  DISTRO__SY_REPORT = 5,
  DISTRO__SY_FRAGMENT = 6,
  DISTRO__SY_HEARTBEAT = 7,
  DISTRO__SY_ERROR = 8,
  DISTRO__SY_FETCH = 9,
  DISTRO__SY_STATE = 10,
  DISTRO__SY_UPLOAD = 11,
  DISTRO__SY_BYE = 12,
  DISTRO__SY_GET_STATE = 13,
  DISTRO__SY_TYPE_MAX = 13
};

/* Header frame, little-endian (docs/protocol.md):
 *   0 u32 magic  4 u16 protocol  6 u16 type  8 u32 learner  12 u32 fragment
 *  16 u64 epoch  24 u64 a  32 u64 b  40 u64 c  48 u64 d  56 f64 e
 *  64 u32 payload bytes  68 u32 CRC32C of bytes 0..67 and the payload. */
typedef struct distro__sy_msg {
  uint16_t type;
  uint32_t learner, fragment;
  uint64_t epoch, a, b, c, d;
  double e;
  uint32_t payload_bytes;
} distro__sy_msg;

const char *distro__sy_type_name(int type);
void distro__sy_encode(const distro__sy_msg *m, const void *payload, uint8_t out[DISTRO__SY_HEADER]);
/* Checks sizes, magic, protocol, type and CRC. Returns a distro_sync_error
 * (0 on success) and a reason in `why`. */
int distro__sy_decode(const uint8_t *hdr, size_t hdr_bytes, const void *payload, size_t payload_bytes,
                      distro__sy_msg *m, char *why, size_t why_n);

/* -------------------------------------------------------- transport */

/* Up to 4 frames of one multipart message (ROUTER adds the identity). */
#define DISTRO__SY_MAX_FRAMES 4
typedef struct distro__sy_frames {
  int n;
  int truncated; /* more frames than DISTRO__SY_MAX_FRAMES (drained) */
  void *data[DISTRO__SY_MAX_FRAMES];
  size_t size[DISTRO__SY_MAX_FRAMES];
} distro__sy_frames;

/* Non-blocking receive of one whole multipart message: 1 received, 0 none,
 * -1 error. Free with distro__sy_frames_free. */
int distro__sy_recv(void *sock, distro__sy_frames *f);
void distro__sy_frames_free(distro__sy_frames *f);
/* Sends [identity] header [payload] without blocking (dropped when the
 * peer's queue is full). Returns 0 on success. */
int distro__sy_send(void *sock, const void *id, size_t id_n, const distro__sy_msg *m, const void *payload);
/* Sends an ERROR (code, offending type, message). */
int distro__sy_send_error(void *sock, const void *id, size_t id_n, uint64_t epoch, uint32_t learner, int code,
                          int offending_type, const char *msg);

/* CURVE key files: "public = Z85\nsecret = Z85\n" (secret may be absent). */
distro_status distro__sy_read_key(const char *path, char pub[41], char sec[41] /* may be NULL */);
double distro__sy_now(void); /* CLOCK_MONOTONIC seconds */

/* ------------------------------------------------------------ layout */

/* What both sides derive from the tensor list and the syncer's settings. */
typedef struct distro__sy_layout {
  int nt;
  int64_t *numel;          /* nt */
  unsigned *tflags;        /* nt */
  uint64_t signature;      /* FNV-1a of the learner's tensor names and sizes */
  int P;
  distro_outer_codec codec;
  int block;
  distro__fragments frags;
  int64_t *toff;           /* nt: first element of each tensor in parameter order */
  int64_t *piece_elem;     /* npieces: element offset within its fragment */
  size_t *piece_byte;      /* npieces: byte offset within an encoded fragment */
  size_t *frag_bytes;      /* P: encoded bytes of a report */
  int64_t *frag_off;       /* P: offset of fragment p in fragment-major order */
  int64_t total;
} distro__sy_layout;

distro_status distro__sy_layout_build(distro__sy_layout *L, int nt, const int64_t *numel, const unsigned *flags,
                                      uint64_t signature, int P, distro_fragmenting fr, int64_t max_block,
                                      distro_outer_codec codec, int block);
void distro__sy_layout_destroy(distro__sy_layout *L);
/* Gathers fragment p of parameters laid out tensor by tensor (params[i])
 * into dst (numel[p] floats), and back. */
void distro__sy_gather(const distro__sy_layout *L, int p, float *const *params, float *dst);
void distro__sy_scatter(const distro__sy_layout *L, int p, const float *src, float *const *params);

/* ------------------------------------------------------------- merge */

/* out = merged outer gradient of fragment p from n decoded deltas (each
 * numel[p] floats), by optim/outer_merge.h's rules (weights from
 * distro__outer_weights, the outer step distro__outer_step). Scratch: coef
 * 2n floats, nrm n doubles. */
void distro__sy_merge(const distro__sy_layout *L, int p, distro_merge mode, int n, const float *const *delta,
                      const double *w, float *out, float *coef, double *nrm);

#endif
