/* CURVE: a learner with an allowed key joins and merges; a learner with a
 * key the syncer does not allow, and one without CURVE, are refused. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#ifdef DISTRO_WITH_SYNC
#include "sync_harness.h"

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
#else
Test(sync_curve, skipped) { cr_skip_test("built without libzmq (no syncer)"); }
#endif
