/* ZeroMQ helpers: whole multipart messages without blocking or copying,
 * ERROR replies, socket limits, the monotonic clock. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/clock.h"
#include "sync/sync_internal.h"

double distro__sy_now(void) { return distro__now(); }

void distro__sy_frames_free(distro__sy_frames *f) {
  for (int i = 0; i < f->n; i++) zmq_msg_close(&f->msg[i]);
  f->n = 0;
  f->truncated = 0;
}

int distro__sy_recv(void *sock, distro__sy_frames *f) {
  f->n = 0;
  f->truncated = 0;
  f->user[0] = 0;
  for (;;) {
    zmq_msg_t extra; /* frames past the last slot are drained and dropped */
    zmq_msg_t *msg = f->n < DISTRO__SY_MAX_FRAMES ? &f->msg[f->n] : &extra;
    zmq_msg_init(msg);
    if (zmq_msg_recv(msg, sock, f->n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      const int e = errno;
      zmq_msg_close(msg);
      if (f->n == 0 && e == EAGAIN) return 0;
      distro__sy_frames_free(f);
      return -1;
    }
    const int more = zmq_msg_more(msg);
    if (msg == &extra) {
      zmq_msg_close(&extra);
      f->truncated = 1;
    } else {
      if (!f->user[0]) {
        /* Set by the ZAP handler (distro__sy_zap_serve) for CURVE clients;
         * a ROUTER's routing-id frame carries no metadata, the others do. */
        const char *u = zmq_msg_gets(msg, "User-Id");
        if (u && strlen(u) == 40) memcpy(f->user, u, 41);
      }
      f->data[f->n] = zmq_msg_data(msg);
      f->size[f->n] = zmq_msg_size(msg);
      f->n++;
    }
    if (!more) return 1;
  }
}

int distro__sy_send(void *sock, const void *id, size_t id_n, const distro__sy_msg *m, const void *payload) {
  uint8_t hdr[DISTRO__SY_HEADER];
  distro__sy_encode(m, payload, hdr);
  const int has_payload = m->payload_bytes > 0;
  if (id && zmq_send(sock, id, id_n, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) return -1;
  if (zmq_send(sock, hdr, sizeof hdr, ZMQ_DONTWAIT | (has_payload ? ZMQ_SNDMORE : 0)) < 0) return -1;
  if (has_payload && zmq_send(sock, payload, m->payload_bytes, ZMQ_DONTWAIT) < 0) return -1;
  return 0;
}

distro__sy_msg distro__sy_state_msg(uint32_t learner, int P, size_t n) {
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_STATE;
  m.learner = learner;
  m.fragment = DISTRO__SY_NONE;
  m.a = (uint64_t)P;
  m.payload_bytes = (uint32_t)n;
  return m;
}

int distro__sy_send_error(void *sock, const void *id, size_t id_n, uint64_t epoch, uint32_t learner, int code,
                          int offending_type, const char *msg) {
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_ERROR;
  m.learner = learner;
  m.fragment = DISTRO__SY_NONE;
  m.epoch = epoch;
  m.a = (uint64_t)code;
  m.b = (uint64_t)offending_type;
  const size_t n = strlen(msg);
  m.payload_bytes = (uint32_t)(n < DISTRO__SY_MAX_ERROR ? n : DISTRO__SY_MAX_ERROR);
  return distro__sy_send(sock, id, id_n, &m, msg);
}

void distro__sy_sockopts(void *sock, int hwm, int64_t max_msg) {
  int linger = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
}
