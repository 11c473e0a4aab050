/* Bad input to a running syncer: every malformed or refused message type
 * gets an ERROR reply naming the reason, nothing is applied, and the job of
 * a healthy learner keeps merging throughout. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include <zmq.h>

#include "common/crc32c.h"
#include "sync/syncer_state.h"
#include "sync_harness.h"

static void *raw;
static int expect(const char *what, int code) {
  zmq_pollitem_t it = {raw, 0, ZMQ_POLLIN, 0};
  const double t0 = sh_now();
  while (sh_now() - t0 < 5) {
    zmq_poll(&it, 1, 100);
    distro__sy_frames f;
    while (distro__sy_recv(raw, &f) > 0) {
      distro__sy_msg m;
      char why[200];
      const int ok = f.n >= 1 &&
                     distro__sy_decode(f.data[0], f.size[0], f.n == 2 ? f.data[1] : NULL, f.n == 2 ? f.size[1] : 0, &m,
                                       why, sizeof why) == 0;
      distro__sy_frames_free(&f);
      if (ok && m.type == DISTRO__SY_ERROR) {
        cr_assert_eq((int)m.a, code, "%s: got error %s, want %s", what, distro_sync_error_name((int)m.a),
                     distro_sync_error_name(code));
        return 1;
      }
    }
  }
  cr_assert_fail("%s: no ERROR reply", what);
  return 0;
}

static void send_raw(const distro__sy_msg *m, const void *payload) { distro__sy_send(raw, NULL, 0, m, payload); }

Test(sync_badinput, every_bad_message_rejected_job_keeps_merging) {
  sh_syncer h;
  memset(&h, 0, sizeof h);
  sh_tmpdir(h.dir, sizeof h.dir);
  char ep[300];
  snprintf(ep, sizeof ep, "ipc://%s/s.ipc", h.dir);
  distro_syncer_options o = distro_syncer_options_default();
  o.endpoint = ep;
  o.fragments = 2;
  o.interval_s = 0.05;
  o.max_staleness = 1;
  o.timeout_s = 1.0;
  o.heartbeat_s = 0.1;
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  sh_learner good;
  sh_learner_init(&good, ep, 0, 256, 1.0, 5);
  cr_assert_eq(sh_learner_run(&good), 0);
  const double t0 = sh_now();
  while (sh_merges(&h) < 6 && sh_now() - t0 < 20) sh_sleep(0.05);
  cr_assert_geq(sh_merges(&h), 6, "the healthy job merges (%s)", good.start_error);
  const int merges_before = sh_merges(&h);

  void *ctx = zmq_ctx_new();
  raw = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(raw, ZMQ_LINGER, &linger, sizeof linger);
  cr_assert_eq(zmq_connect(raw, ep), 0);
  const distro__sy_layout *L = &h.s->L; /* read-only: fixed once the job is laid out */
  int nbad = 0;

  /* 1. a 10-byte frame; 2. three frames; 3. bad magic. */
  zmq_send(raw, "0123456789", 10, 0);
  nbad += expect("short header", DISTRO_SYNC_E_MALFORMED);
  zmq_send(raw, "a", 1, ZMQ_SNDMORE), zmq_send(raw, "b", 1, ZMQ_SNDMORE), zmq_send(raw, "c", 1, 0);
  nbad += expect("three frames", DISTRO_SYNC_E_MALFORMED);
  distro__sy_msg m = {0};
  uint8_t hdr[DISTRO__SY_HEADER];
  m.type = DISTRO__SY_HEARTBEAT;
  m.learner = 9;
  distro__sy_encode(&m, NULL, hdr);
  hdr[0] ^= 0xff;
  zmq_send(raw, hdr, sizeof hdr, 0);
  nbad += expect("bad magic", DISTRO_SYNC_E_MALFORMED);
  /* 4. corrupt CRC (a flipped payload byte of a type that has a payload). */
  uint8_t pl[16] = {1, 2, 3};
  m.type = DISTRO__SY_HELLO;
  m.payload_bytes = 16;
  distro__sy_encode(&m, pl, hdr);
  pl[5] ^= 4;
  zmq_send(raw, hdr, sizeof hdr, ZMQ_SNDMORE), zmq_send(raw, pl, 16, 0);
  nbad += expect("crc", DISTRO_SYNC_E_CRC);
  /* 4b. a payload on a type that has none: refused before its CRC is read. */
  m.type = DISTRO__SY_HEARTBEAT;
  distro__sy_encode(&m, pl, hdr);
  zmq_send(raw, hdr, sizeof hdr, ZMQ_SNDMORE), zmq_send(raw, pl, 16, 0);
  nbad += expect("heartbeat payload", DISTRO_SYNC_E_MALFORMED);
  /* 5. another protocol version with a valid CRC. */
  m.payload_bytes = 0;
  distro__sy_encode(&m, NULL, hdr);
  hdr[4] = DISTRO__SY_PROTOCOL + 1;
  distro__put_u32(hdr + 68, distro__crc32c(hdr, 68));
  zmq_send(raw, hdr, sizeof hdr, 0);
  nbad += expect("protocol version", DISTRO_SYNC_E_PROTOCOL);
  /* 6. unknown type. */
  distro__sy_encode(&m, NULL, hdr);
  hdr[6] = 99;
  distro__put_u32(hdr + 68, distro__crc32c(hdr, 68));
  zmq_send(raw, hdr, sizeof hdr, 0);
  nbad += expect("unknown type", DISTRO_SYNC_E_MALFORMED);
  /* 7. REPORT from a learner that never joined; 8. from the healthy
   * learner's id over another connection; 9. HEARTBEAT, FETCH, UPLOAD, SEED
   * from an unknown learner. */
  m = (distro__sy_msg){0};
  m.type = DISTRO__SY_REPORT;
  m.learner = 7;
  m.a = 1;
  send_raw(&m, NULL);
  nbad += expect("unknown learner", DISTRO_SYNC_E_UNKNOWN);
  m.learner = 0;
  send_raw(&m, NULL);
  nbad += expect("identity of another connection", DISTRO_SYNC_E_UNKNOWN);
  const int types[4] = {DISTRO__SY_HEARTBEAT, DISTRO__SY_FETCH, DISTRO__SY_UPLOAD, DISTRO__SY_SEED};
  for (int k = 0; k < 4; k++) {
    m.type = (uint16_t)types[k];
    m.learner = 8;
    send_raw(&m, NULL);
    nbad += expect(distro__sy_type_name(types[k]), DISTRO_SYNC_E_UNKNOWN);
  }
  /* 10. messages only the syncer sends. */
  const int stypes[5] = {DISTRO__SY_WELCOME, DISTRO__SY_REQUEST, DISTRO__SY_FRAGMENT, DISTRO__SY_ERROR,
                         DISTRO__SY_STATE};
  for (int k = 0; k < 5; k++) {
    m.type = (uint16_t)stypes[k];
    send_raw(&m, NULL);
    nbad += expect(distro__sy_type_name(stypes[k]), DISTRO_SYNC_E_MALFORMED);
  }
  /* 11. HELLO with another model signature; 12. a body that does not parse. */
  uint8_t hello[64];
  size_t hn = 0;
  distro__put_u32(hello, 2), hn = 4;
  distro__put_u64(hello + hn, 192), distro__put_u32(hello + hn + 8, 0), hn += 12;
  distro__put_u64(hello + hn, 64), distro__put_u32(hello + hn + 8, 0), hn += 12;
  distro__put_u32(hello + hn, 0), hn += 4;
  hello[hn++] = 0, hello[hn++] = 0, hello[hn++] = 0, hello[hn++] = 0;
  m = (distro__sy_msg){0};
  m.type = DISTRO__SY_HELLO;
  m.learner = 5;
  m.a = L->signature ^ 1;
  m.payload_bytes = (uint32_t)hn;
  send_raw(&m, hello);
  nbad += expect("wrong signature", DISTRO_SYNC_E_SIGNATURE);
  m.payload_bytes = 3;
  send_raw(&m, hello);
  nbad += expect("hello body", DISTRO_SYNC_E_MALFORMED);
  /* Join as learner 5 with the right layout, then send bad reports. */
  m.a = L->signature;
  m.payload_bytes = (uint32_t)hn;
  send_raw(&m, hello);
  sh_sleep(0.3);
  for (distro__sy_frames f; distro__sy_recv(raw, &f) > 0;) distro__sy_frames_free(&f);
  const size_t fb = L->frag_bytes[0];
  uint8_t *rep = calloc(fb, 1);
  uint64_t v[2];
  distro_syncer_versions(h.s, v, 2);
  cr_assert_geq(v[0], 2, "enough merges for a stale version");
  m = (distro__sy_msg){0};
  m.type = DISTRO__SY_REPORT;
  m.learner = 5;
  m.fragment = 0;
  m.a = 1;
  m.b = 0; /* base version 0: more than max_staleness behind */
  m.c = 100, m.d = 1;
  m.payload_bytes = (uint32_t)fb;
  send_raw(&m, rep);
  nbad += expect("stale version", DISTRO_SYNC_E_STALE);
  m.b = v[0];
  m.payload_bytes = (uint32_t)fb - 1;
  send_raw(&m, rep);
  nbad += expect("wrong report size", DISTRO_SYNC_E_MALFORMED);
  m.payload_bytes = (uint32_t)fb;
  memset(rep + L->frag_bytes[0] - 8, 0x88, 8); /* INT4 code -8: never written by an encoder */
  send_raw(&m, rep);
  nbad += expect("bad INT4 codes", DISTRO_SYNC_E_PAYLOAD);
  memset(rep, 0, fb);
  float nanscale = NAN;
  memcpy(rep, &nanscale, 4);
  send_raw(&m, rep);
  nbad += expect("NaN scale", DISTRO_SYNC_E_PAYLOAD);
  memset(rep, 0, fb);
  m.a = 1000000;
  send_raw(&m, rep);
  nbad += expect("round never opened", DISTRO_SYNC_E_ROUND);
  m.a = 1;
  m.fragment = 9;
  send_raw(&m, rep);
  nbad += expect("no such fragment", DISTRO_SYNC_E_MALFORMED);
  m.fragment = 0;
  m.b = v[0] + 50;
  send_raw(&m, rep);
  nbad += expect("future version", DISTRO_SYNC_E_MALFORMED);
  /* Unknown flag bits: a HEARTBEAT from learner 5, a HELLO. */
  m = (distro__sy_msg){0};
  m.type = DISTRO__SY_HEARTBEAT;
  m.learner = 5;
  m.fragment = DISTRO__SY_NONE;
  m.b = 1u | 4u;
  send_raw(&m, NULL);
  nbad += expect("heartbeat flag bits", DISTRO_SYNC_E_MALFORMED);
  m.type = DISTRO__SY_HELLO;
  m.a = L->signature;
  m.b = 2;
  m.payload_bytes = (uint32_t)hn;
  send_raw(&m, hello);
  nbad += expect("hello flag bits", DISTRO_SYNC_E_MALFORMED);

  /* The healthy job kept merging and nothing from learner 5 or 7 was applied. */
  const int target = sh_merges(&h) + 4;
  while (sh_merges(&h) < target && sh_now() - t0 < 40) sh_sleep(0.05);
  cr_assert_geq(sh_merges(&h), target, "merges continue after the bad input");
  cr_assert_gt(sh_merges(&h), merges_before);
  distro_syncer_stats st;
  distro_syncer_get_stats(h.s, &st);
  cr_assert_eq((int)st.rejected, nbad, "every bad message counted once (%d vs %d)", (int)st.rejected, nbad);
  for (int k = 0; k < sh_merges(&h); k++)
    cr_assert_eq(h.m[k].participant_mask, 1u, "merge %d took reports from mask 0x%x", k, h.m[k].participant_mask);
  cr_assert_eq(good.last.errors, 0, "the healthy learner saw no error");
  float *g = malloc(sizeof(float) * 256);
  cr_assert_eq(distro_syncer_get_global(h.s, g, 256, NULL, 0), DISTRO_OK);
  for (int i = 0; i < 256; i++) cr_assert(isfinite(g[i]));
  cr_log_info("%d bad messages rejected while %d merges ran", nbad, sh_merges(&h));
  free(g);
  free(rep);
  zmq_close(raw);
  zmq_ctx_term(ctx);
  sh_learner_join(&good);
  sh_stop(&h);
}
#else
Test(sync_badinput, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
