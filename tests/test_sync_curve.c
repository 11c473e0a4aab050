/* CURVE: a learner with an allowed key joins and merges; a learner with a
 * key the syncer does not allow, and one without CURVE, are refused. A
 * learner id stays with the key that holds it, a HELLO must advertise its
 * connection's own key, and a learner's state endpoint serves only the keys
 * it allows (issue 15). */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include <zmq.h>

#include "sync/syncer_state.h"
#include "sync_harness.h"
#include "sync_rogue.h"

static distro_status try_join(const char *ep, int id, const char *server_pub, const char *keypair) {
  static float theta[64];
  distro_learner_options o = distro_learner_options_default();
  o.syncer = ep;
  o.learner_id = id;
  o.curve_server_key = server_pub;
  o.curve_keypair = keypair;
  o.join_timeout_s = 2.0;
  distro_learner *l = NULL;
  distro_status st = distro_learner_create(&o, &l);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "w", theta, 48, 0);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "b", theta + 48, 16, 0);
  if (st == DISTRO_OK) st = distro_learner_start(l);
  distro_learner_free(l);
  return st;
}

Test(sync_curve, wrong_key_refused_right_key_trains) {
  sh_syncer h;
  memset(&h, 0, sizeof h);
  sh_tmpdir(h.dir, sizeof h.dir);
  char ep[300], skey[300], spub[300], akey[300], apub[300], bkey[300];
  snprintf(ep, sizeof ep, "ipc://%s/s.ipc", h.dir);
  snprintf(skey, sizeof skey, "%s/syncer.key", h.dir);
  snprintf(spub, sizeof spub, "%s/syncer.key.pub", h.dir);
  snprintf(akey, sizeof akey, "%s/a.key", h.dir);
  snprintf(apub, sizeof apub, "%s/a.key.pub", h.dir);
  snprintf(bkey, sizeof bkey, "%s/b.key", h.dir);
  cr_assert_eq(distro_sync_keygen(skey), DISTRO_OK, "%s", distro_last_error());
  cr_assert_eq(distro_sync_keygen(akey), DISTRO_OK);
  cr_assert_eq(distro_sync_keygen(bkey), DISTRO_OK);
  distro_syncer_options o = distro_syncer_options_default();
  o.endpoint = ep;
  o.interval_s = 0.05;
  o.curve_keypair = skey;
  o.curve_allowed = apub; /* only learner A's public key */
  cr_assert_eq(sh_start(&h, &o), DISTRO_OK, "%s", distro_last_error());
  /* Refused: B's key is not allowed; C speaks plain text; D has A's key but the wrong server key. */
  cr_assert_eq(try_join(ep, 1, spub, bkey), DISTRO_ERR_TIMEOUT);
  cr_assert_eq(try_join(ep, 2, NULL, NULL), DISTRO_ERR_TIMEOUT);
  cr_assert_eq(try_join(ep, 3, apub, akey), DISTRO_ERR_TIMEOUT);
  distro_syncer_stats st;
  distro_syncer_get_stats(h.s, &st);
  cr_assert_eq(st.initialized, 0, "no refused learner reached the syncer");
  /* Accepted: A with the syncer's public key. */
  sh_learner a;
  sh_learner_init(&a, ep, 0, 64, 1.0, 5);
  a.server_key = spub;
  a.keypair = akey;
  cr_assert_eq(sh_learner_run(&a), 0);
  const double t0 = sh_now();
  while (sh_merges(&h) < 3 && sh_now() - t0 < 15) sh_sleep(0.05);
  cr_assert_eq(a.start_status, DISTRO_OK, "%s", a.start_error);
  cr_assert_geq(sh_merges(&h), 3, "the allowed learner trains over CURVE");
  sh_learner_join(&a);
  sh_stop(&h);
}
/* Keys: the syncer's and learners A, B, C in dir; allowed (at the syncer)
 * lists A, B and C, only_a lists A. */
typedef struct keys {
  char dir[256], s[300], s_pub[300], a[300], a_pub[300], b[300], b_pub[300], c[300], allowed[300], only_a[300];
} keys;

static void make_keys(keys *k) {
  sh_tmpdir(k->dir, sizeof k->dir);
  snprintf(k->s, sizeof k->s, "%s/s.key", k->dir);
  snprintf(k->s_pub, sizeof k->s_pub, "%s/s.key.pub", k->dir);
  snprintf(k->a, sizeof k->a, "%s/a.key", k->dir);
  snprintf(k->a_pub, sizeof k->a_pub, "%s/a.key.pub", k->dir);
  snprintf(k->b, sizeof k->b, "%s/b.key", k->dir);
  snprintf(k->b_pub, sizeof k->b_pub, "%s/b.key.pub", k->dir);
  snprintf(k->c, sizeof k->c, "%s/c.key", k->dir);
  snprintf(k->allowed, sizeof k->allowed, "%s/allowed", k->dir);
  snprintf(k->only_a, sizeof k->only_a, "%s/only_a", k->dir);
  const char *all[4] = {k->s, k->a, k->b, k->c};
  for (int i = 0; i < 4; i++) cr_assert_eq(distro_sync_keygen(all[i]), DISTRO_OK, "%s", distro_last_error());
  char cmd[2000];
  snprintf(cmd, sizeof cmd, "cat %s.pub %s.pub %s.pub > %s && cat %s.pub > %s", k->a, k->b, k->c, k->allowed, k->a,
           k->only_a);
  cr_assert_eq(system(cmd), 0);
}

/* A CURVE DEALER with the keypair in `keyfile`. */
static void *curve_dealer(void *ctx, const char *ep, const keys *k, const char *keyfile) {
  char pub[41], sec[41], spub[41];
  cr_assert_eq(distro__sy_read_key(keyfile, pub, sec), DISTRO_OK);
  cr_assert_eq(distro__sy_read_key(k->s_pub, spub, NULL), DISTRO_OK);
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, spub, 41);
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 41);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 41);
  cr_assert_eq(zmq_connect(s, ep), 0);
  return s;
}

/* HELLO as learner id with the harness layout, advertising the public key
 * of `advertised`; returns the first reply (sr_first_reply). */
static int curve_hello(void *s, uint32_t id, uint64_t sig, const char *advertised) {
  char pub[41];
  cr_assert_eq(distro__sy_read_key(advertised, pub, NULL), DISTRO_OK);
  uint8_t b[128];
  size_t n = 0;
  distro__put_u32(b, 2), n = 4;
  distro__put_u64(b + n, 48), distro__put_u32(b + n + 8, 0), n += 12;
  distro__put_u64(b + n, 16), distro__put_u32(b + n + 8, 0), n += 12;
  distro__put_u32(b + n, 0), n += 4;
  b[n++] = 0, b[n++] = 0;
  b[n++] = 40, b[n++] = 0;
  memcpy(b + n, pub, 40), n += 40;
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_HELLO;
  m.learner = id;
  m.fragment = DISTRO__SY_NONE;
  m.a = sig;
  m.b = DISTRO__SY_HELLO_HAS_STATE;
  m.payload_bytes = (uint32_t)n;
  distro__sy_send(s, NULL, 0, &m, b);
  return sr_first_reply(s, 5);
}

/* A CURVE syncer allowing A, B and C, and learner A (id 0, not started). */
static void curve_job(sh_syncer *h, char *ep, size_t n, const keys *k, sh_learner *a) {
  sh_init(h, ep, n);
  distro_syncer_options o;
  sh_options(&o, ep, 1);
  o.curve_keypair = k->s;
  o.curve_allowed = k->allowed;
  cr_assert_eq(sh_start(h, &o), DISTRO_OK, "%s", distro_last_error());
  sh_learner_init(a, ep, 0, 64, 1.0, 5);
  a->server_key = k->s_pub;
  a->keypair = k->a;
}

Test(sync_curve, learner_id_stays_with_its_key_and_hello_advertises_its_own) {
  static keys k;
  make_keys(&k);
  sh_syncer h;
  char ep[300];
  sh_learner a;
  curve_job(&h, ep, sizeof ep, &k, &a);
  cr_assert_eq(sh_learner_run(&a), 0);
  cr_assert_geq(sh_wait_merges(&h, 3, 15), 3, "%s", a.start_error);
  void *ctx = zmq_ctx_new();
  /* B (allowed at the syncer) claims A's id: refused, A keeps merging. */
  void *rb = curve_dealer(ctx, ep, &k, k.b);
  const int r1 = curve_hello(rb, 0, h.s->L.signature, k.b_pub);
  cr_assert_eq(r1, 100 + DISTRO_SYNC_E_UNKNOWN, "B took learner 0's id (reply %d)", r1);
  /* B advertises A's key for its own id: a joiner would trust the wrong key. */
  const int r2 = curve_hello(rb, 5, h.s->L.signature, k.a_pub);
  cr_assert_eq(r2, 100 + DISTRO_SYNC_E_MALFORMED, "B advertised A's key (reply %d)", r2);
  /* With its own key and id, B is welcome. */
  const int r3 = curve_hello(rb, 5, h.s->L.signature, k.b_pub);
  cr_assert_eq(r3, DISTRO__SY_WELCOME, "B with its own key and id (reply %d)", r3);
  const int before = sh_merges(&h);
  cr_assert_gt(sh_wait_merges(&h, before + 3, 10), before, "learner 0 keeps merging");
  cr_assert_eq(a.last.rejoins, 0, "learner 0 never lost its id");
  zmq_close(rb);
  zmq_ctx_term(ctx);
  sh_learner_join(&a);
  sh_stop(&h);
}

/* Learner A's state endpoint serves only A's own key (only_a): joiner C,
 * allowed at the syncer but not by A, cannot pull A's state and fetches
 * it from the syncer; joiner B pulls from A when A allows everyone. */
static int join_source(const char *ep, const keys *k, int id, const char *keypair) {
  static float theta[64];
  distro_learner_options lo = distro_learner_options_default();
  lo.syncer = ep;
  lo.learner_id = id;
  lo.curve_server_key = k->s_pub;
  lo.curve_keypair = keypair;
  lo.join_timeout_s = 15;
  distro_learner *l = NULL;
  distro_status st = distro_learner_create(&lo, &l);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "w", theta, 48, 0);
  if (st == DISTRO_OK) st = distro_learner_add_tensor(l, "b", theta + 48, 16, 0);
  if (st == DISTRO_OK) st = distro_learner_start(l);
  distro_learner_stats ls = {0};
  if (st == DISTRO_OK) distro_learner_get_stats(l, &ls);
  distro_learner_free(l);
  cr_assert_eq(st, DISTRO_OK, "learner %d: %s", id, distro_last_error());
  return ls.joined_from_peer;
}

Test(sync_curve, state_endpoint_serves_only_allowed_keys) {
  static keys k;
  make_keys(&k);
  sh_syncer h;
  char ep[300];
  sh_learner a;
  curve_job(&h, ep, sizeof ep, &k, &a);
  a.allowed = k.only_a;
  cr_assert_eq(sh_learner_run(&a), 0);
  cr_assert_geq(sh_wait_merges(&h, 3, 15), 3, "%s", a.start_error);
  for (double t0 = sh_now(); atomic_load(&a.done) < 20 && sh_now() - t0 < 10;) sh_sleep(0.02);
  const int src_c = join_source(ep, &k, 2, k.c);
  cr_assert_eq(src_c, 2, "C, not allowed by A, joined via %d (2 = from the syncer)", src_c);
  sh_learner_join(&a);
  /* A again, allowing any key that knows its public key. */
  sh_learner a2;
  sh_learner_init(&a2, ep, 0, 64, 1.0, 5);
  a2.server_key = k.s_pub;
  a2.keypair = k.a;
  cr_assert_eq(sh_learner_run(&a2), 0);
  for (double t0 = sh_now(); atomic_load(&a2.done) < 20 && sh_now() - t0 < 10;) sh_sleep(0.02);
  sh_sleep(0.5); /* its "ready" heartbeat */
  const int src_b = join_source(ep, &k, 3, k.b);
  cr_assert_eq(src_b, 1, "B joined via %d (1 = from a peer)", src_b);
  sh_learner_join(&a2);
  sh_stop(&h);
}
#else
Test(sync_curve, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
