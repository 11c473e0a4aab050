/* Internal: Decoupled DiLoCo runtime shared by the syncer and the learner
 * (docs/protocol.md). */
#ifndef DISTRO_SYNC_INTERNAL_H
#define DISTRO_SYNC_INTERNAL_H

#include "common/bytes.h"
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>
#include <distro/sync.h>

#include "optim/fragment.h"

/* ---------------------------------------------------------- messages */

#define DISTRO__SY_MAGIC 0x31595344u /* "DSY1" little-endian */
/* 3: HELLO c declares the learner's tokens per step; a learner sends a
 * HEARTBEAT with the report's step right before every REPORT. */
#define DISTRO__SY_PROTOCOL 3
#define DISTRO__SY_HEADER 72
#define DISTRO__SY_NONE 0xffffffffu

/* Caps (docs/protocol.md, "Limits"). Every size a peer sends is checked
 * against them before anything is allocated or summed. A job's state must
 * fit one message whose length is a u32: 8 P + 4 N bytes. */
#define DISTRO__SY_MAX_NUMEL ((int64_t)1 << 29)   /* parameters of a job */
#define DISTRO__SY_MAX_TENSORS 65536
#define DISTRO__SY_MAX_FRAGMENTS 4096
#define DISTRO__SY_MAX_UNITS ((int64_t)1 << 22)   /* fragment blocks; and blocks x P <= 2^31 */
#define DISTRO__SY_MAX_BLOCK (1 << 20)            /* codec block */
#define DISTRO__SY_MAX_TAU (1 << 20)
#define DISTRO__SY_MAX_PEERS 4                    /* peers a WELCOME names */
#define DISTRO__SY_MAX_ERROR 1024                 /* ERROR reason text */
#define DISTRO__SY_MAX_ENDPOINT 255
#define DISTRO__SY_HELLO_MAX \
  (4 + 12 * DISTRO__SY_MAX_TENSORS + 4 + 8 * DISTRO__SY_MAX_FRAGMENTS + 2 + DISTRO__SY_MAX_ENDPOINT + 2 + 40)
/* WELCOME: fixed part, P x (u64 version + 2 SHA-256), peers. */
#define DISTRO__SY_WELCOME_MAX \
  (28 + 72 * DISTRO__SY_MAX_FRAGMENTS + 4 + DISTRO__SY_MAX_PEERS * (4 + 2 + DISTRO__SY_MAX_ENDPOINT + 2 + 40))

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

/* Flag bits; any other bit set is malformed. */
#define DISTRO__SY_HELLO_HAS_STATE 1u /* HELLO b */
#define DISTRO__SY_HB_READY 1u        /* HEARTBEAT b (learner -> syncer) */
#define DISTRO__SY_WELCOME_SEED 1u    /* WELCOME b */
#define DISTRO__SY_WELCOME_SEEDED 2u
#define DISTRO__SY_WELCOME_FETCH 4u

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
/* Cheap checks first, without touching the payload: header size, magic,
 * protocol, type, payload length against the frame. Fills m. Returns a
 * distro_sync_error (0 on success) and a reason in `why`. */
int distro__sy_peek(const uint8_t *hdr, size_t hdr_bytes, size_t payload_bytes, distro__sy_msg *m, char *why,
                    size_t why_n);
/* Then, once the receiver has checked the type and the payload size: the
 * CRC and the finiteness of e. */
int distro__sy_verify(const uint8_t *hdr, const void *payload, size_t payload_bytes, const distro__sy_msg *m,
                      char *why, size_t why_n);
/* Both in one call (no size cap). */
int distro__sy_decode(const uint8_t *hdr, size_t hdr_bytes, const void *payload, size_t payload_bytes,
                      distro__sy_msg *m, char *why, size_t why_n);

/* A parsed HELLO body (pointers into the payload). */
typedef struct distro__sy_hello {
  uint32_t nt;
  const uint8_t *tensors;  /* nt x (u64 numel, u32 flags), checked */
  int64_t total;
  uint32_t nver;
  const uint8_t *versions; /* nver x u64 */
  char endpoint[DISTRO__SY_MAX_ENDPOINT + 1];
  char key[41];            /* Z85, "" without CURVE */
} distro__sy_hello;
int distro__sy_parse_hello(const uint8_t *pl, size_t pn, distro__sy_hello *h, char *why, size_t why_n);

/* A parsed WELCOME body. */
typedef struct distro__sy_peer {
  uint32_t id;
  char endpoint[DISTRO__SY_MAX_ENDPOINT + 1];
  char key[41];
} distro__sy_peer;
typedef struct distro__sy_welcome {
  uint32_t P, codec, block, fragmenting, tau;
  int64_t max_block;
  const uint8_t *versions; /* P x u64 */
  const uint8_t *hashes;   /* P x 64: SHA-256 of fragment p at versions[p], then at versions[p] - 1 (zeros: none) */
  int npeers;
  distro__sy_peer peer[DISTRO__SY_MAX_PEERS];
} distro__sy_welcome;
int distro__sy_parse_welcome(const uint8_t *pl, size_t pn, distro__sy_welcome *w, char *why, size_t why_n);

/* ZeroMQ endpoint syntax: "tcp://HOST:PORT" (PORT "*" only when binding),
 * "ipc://PATH" or "inproc://NAME". Returns -1 (malformed, reason in why),
 * 0 (reachable from other machines) or 1 (this machine only: a loopback
 * address, ipc or inproc). */
int distro__sy_endpoint_check(const char *ep, int bind, char *why, size_t why_n);

/* -------------------------------------------------------- transport */

/* Up to 4 frames of one multipart message (ROUTER adds the identity),
 * received without copying. */
#define DISTRO__SY_MAX_FRAMES 4
typedef struct distro__sy_frames {
  int n;
  int truncated; /* more frames than DISTRO__SY_MAX_FRAMES (drained) */
  void *data[DISTRO__SY_MAX_FRAMES];
  size_t size[DISTRO__SY_MAX_FRAMES];
  zmq_msg_t msg[DISTRO__SY_MAX_FRAMES];
  char user[41]; /* the connection's CURVE client key (Z85) when a ZAP handler vouched for it, else "" */
} distro__sy_frames;

/* Non-blocking receive of one whole multipart message: 1 received, 0 none,
 * -1 error. Free with distro__sy_frames_free. */
int distro__sy_recv(void *sock, distro__sy_frames *f);
void distro__sy_frames_free(distro__sy_frames *f);
/* Sends [identity] header [payload] without blocking (dropped when the
 * peer's queue is full). Returns 0 on success. */
int distro__sy_send(void *sock, const void *id, size_t id_n, const distro__sy_msg *m, const void *payload);
/* The header of a STATE of P fragments, n payload bytes, to `learner`. */
distro__sy_msg distro__sy_state_msg(uint32_t learner, int P, size_t n);
/* Sends an ERROR (code, offending type, message). */
int distro__sy_send_error(void *sock, const void *id, size_t id_n, uint64_t epoch, uint32_t learner, int code,
                          int offending_type, const char *msg);
/* Socket options every distro socket gets: linger 0, send and receive
 * queues of `hwm` messages, no message over `max_msg` bytes (ZeroMQ drops
 * the connection of a peer that sends one, before allocating it). */
void distro__sy_sockopts(void *sock, int hwm, int64_t max_msg);
double distro__sy_now(void); /* CLOCK_MONOTONIC seconds */

/* -------------------------------------------------------- security */

/* CURVE key files: "public = Z85\nsecret = Z85\n" (secret may be absent).
 * A file read for its secret must be a regular file of mode 0600 or
 * stricter, and its public key must be the one its secret key gives. */
distro_status distro__sy_read_key(const char *path, char pub[41], char sec[41] /* may be NULL */);
/* A file of allowed public keys, one Z85 key per line (".pub" files work):
 * *keys gets n x 32 bytes. */
distro_status distro__sy_load_allowed(const char *path, uint8_t **keys, int *n);
/* A ZAP handler on the socket bound at inproc://zeromq.zap.01 of a context:
 * answers every pending request, accepting CURVE clients whose key is in
 * `allowed` (any key when n == 0) and vouching for the key as the User-Id.
 * Returns how many it refused. */
int distro__sy_zap_serve(void *zap, const uint8_t *allowed, int n);
/* 1 if s is 40 characters of the Z85 alphabet. */
int distro__sy_is_z85_key(const char *s);

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
  int64_t maxf;            /* elements of the largest fragment */
  size_t max_frag_bytes;   /* bytes of the largest report */
} distro__sy_layout;

/* Checks every size against the caps above (DISTRO_ERR_INVALID), so no
 * arithmetic on hostile sizes can overflow. */
distro_status distro__sy_layout_build(distro__sy_layout *L, int nt, const int64_t *numel, const unsigned *flags,
                                      uint64_t signature, int P, distro_fragmenting fr, int64_t max_block,
                                      distro_outer_codec codec, int block);
void distro__sy_layout_destroy(distro__sy_layout *L);
/* Gathers fragment p of parameters laid out tensor by tensor (params[i])
 * into dst (numel[p] floats), and back. */
void distro__sy_gather(const distro__sy_layout *L, int p, float *const *params, float *dst);
void distro__sy_scatter(const distro__sy_layout *L, int p, const float *src, float *const *params);
/* Digest of n floats as stored (little-endian binary32): a SHA-256 tree
 * with 1 MiB leaves, hashed on all cores (layout.c). */
void distro__sy_hash(const float *x, int64_t n, uint8_t out[32]);

/* ------------------------------------------------------------- merge */

/* out = merged outer gradient of fragment p from n decoded deltas (each
 * numel[p] floats), by optim/outer_merge.h's rules (weights from
 * distro__outer_weights, the outer step distro__outer_step). Scratch: coef
 * 2n floats, nrm n doubles. */
void distro__sy_merge(const distro__sy_layout *L, int p, distro_merge mode, int n, const float *const *delta,
                      const double *w, float *out, float *coef, double *nrm);
/* The robust merge: coordinate-wise trimmed mean of n reports dropping f
 * from each side (n >= 2f + 1), into out. */
void distro__sy_trimmed_mean(const distro__sy_layout *L, int p, int n, int f, const float *const *delta, float *out);

#endif
