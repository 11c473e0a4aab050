#define _POSIX_C_SOURCE 200809L
#include "sync_rogue.h"

#include <string.h>
#include <zmq.h>

#include "sync_harness.h"

void *sr_dealer(void *ctx, const char *ep) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  zmq_connect(s, ep);
  return s;
}

int sr_hello(void *sock, uint32_t id, uint64_t signature, int has_state, const int64_t *numel, int nt,
             const char *serve_ep) {
  uint8_t b[512];
  size_t n = 0;
  distro__put_u32(b, (uint32_t)nt), n = 4;
  for (int i = 0; i < nt && n + 12 < 400; i++)
    distro__put_u64(b + n, (uint64_t)numel[i]), distro__put_u32(b + n + 8, 0), n += 12;
  distro__put_u32(b + n, 0), n += 4;
  const size_t el = strlen(serve_ep);
  b[n++] = (uint8_t)el, b[n++] = 0;
  memcpy(b + n, serve_ep, el), n += el;
  b[n++] = 0, b[n++] = 0;
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_HELLO;
  m.learner = id;
  m.fragment = DISTRO__SY_NONE;
  m.a = signature;
  m.b = has_state ? DISTRO__SY_HELLO_HAS_STATE : 0;
  m.payload_bytes = (uint32_t)n;
  return distro__sy_send(sock, NULL, 0, &m, b);
}

int sr_heartbeat(void *sock, uint32_t id, int ready) {
  distro__sy_msg hb = {0};
  hb.type = DISTRO__SY_HEARTBEAT;
  hb.learner = id;
  hb.fragment = DISTRO__SY_NONE;
  hb.b = ready ? DISTRO__SY_HB_READY : 0;
  hb.e = 0.005;
  return distro__sy_send(sock, NULL, 0, &hb, NULL);
}

void sr_drain(void *sock) {
  for (distro__sy_frames f; distro__sy_recv(sock, &f) > 0;) distro__sy_frames_free(&f);
}

int sr_first_reply(void *sock, double seconds) {
  int answer = 0;
  zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
  for (double t0 = sh_now(); !answer && sh_now() - t0 < seconds;) {
    zmq_poll(&it, 1, 100);
    distro__sy_frames f;
    while (distro__sy_recv(sock, &f) > 0) {
      distro__sy_msg x;
      char why[200];
      if (!answer && distro__sy_decode(f.data[0], f.size[0], f.n == 2 ? f.data[1] : NULL, f.n == 2 ? f.size[1] : 0,
                                       &x, why, sizeof why) == 0 && x.type != DISTRO__SY_HEARTBEAT)
        answer = x.type == DISTRO__SY_ERROR ? 100 + (int)x.a : x.type;
      distro__sy_frames_free(&f);
    }
  }
  return answer;
}
