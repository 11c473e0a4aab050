/* The syncer service: options, lifecycle and the thread-safe queries. The
 * event loop is serve.c (messages) and rounds.c (schedule, rounds, merges);
 * docs/protocol.md, docs/algorithms.md. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "compress/outer_codec.h"
#include "sync/bounds.h"
#include "sync/checkpoint.h"
#include "sync/syncer_state.h"

distro_syncer_options distro_syncer_options_default(void) {
  distro_syncer_options o;
  memset(&o, 0, sizeof o);
  o.version = DISTRO_SYNCER_OPTIONS_VERSION;
  o.endpoint = "tcp://127.0.0.1:*";
  o.fragments = 1;
  o.fragmenting = DISTRO_FRAG_BALANCED;
  o.codec = DISTRO_OUTER_INT4;
  o.codec_block = 64;
  o.merge = DISTRO_MERGE_RADIAL_TOKENS;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  o.nesterov = 1;
  o.quorum = 1;
  o.grace_gamma = 0.8;
  o.overlap = 2;
  o.H = 24;
  o.max_staleness = 2;
  o.heartbeat_s = 0.2;
  o.timeout_s = 2.0;
  o.checkpoint_every = 10;
  o.resume = 1;
  o.max_params = (int64_t)1 << 26;
  o.robust = DISTRO_SYNC_ROBUST_NONE;
  o.out_of_bound = DISTRO_SYNC_BOUND_CLIP;
  o.clip_multiple = 4;
  o.report_max_rel = 100;
  o.step_max_rel = 100;
  o.weight_cap = 2;
  o.quarantine_after = 3;
  o.quarantine_s = 60;
  return o;
}

static distro_status check_options(const distro_syncer_options *o) {
  distro_status st = DISTRO_OK;
  if (!o->endpoint) return distro__fail(DISTRO_ERR_INVALID, "syncer options: endpoint is NULL");
  if (o->fragments < 1 || o->fragments > DISTRO__SY_MAX_FRAGMENTS)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: fragments %d not in [1, %d]", o->fragments,
                        DISTRO__SY_MAX_FRAGMENTS);
  if (!distro__outer_codec_known(o->codec) || o->codec_block < 1 || o->codec_block > DISTRO__SY_MAX_BLOCK)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: unknown codec %d or block %d not in [1, %d]",
                        (int)o->codec, o->codec_block, DISTRO__SY_MAX_BLOCK);
  if ((int)o->merge < 0 || (int)o->merge > DISTRO_MERGE_RADIAL_TOKENS)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: unknown merge %d", (int)o->merge);
  if ((int)o->fragmenting < 0 || (int)o->fragmenting > DISTRO_FRAG_SEQUENTIAL)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: unknown fragmenting %d", (int)o->fragmenting);
  if (!(o->outer_lr >= 0) || !isfinite(o->outer_lr) || !(o->outer_momentum >= 0 && o->outer_momentum < 1))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: outer lr %g or momentum %g out of range",
                        (double)o->outer_lr, (double)o->outer_momentum);
  if (o->quorum < 1) return distro__fail(DISTRO_ERR_INVALID, "syncer options: quorum %d < 1", o->quorum);
  if (!(o->grace_gamma >= 0 && o->grace_gamma <= 1))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: grace_gamma %g not in [0, 1]", o->grace_gamma);
  if (o->overlap < 0 || o->overlap > DISTRO__SY_MAX_TAU || o->H < 1 || o->max_staleness < 0 || o->max_staleness > 64)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: overlap %d, H %d or max_staleness %d out of range",
                        o->overlap, o->H, o->max_staleness);
  if (!(o->interval_s >= 0) || !isfinite(o->interval_s) || !(o->heartbeat_s > 0) || !(o->timeout_s > o->heartbeat_s) ||
      !isfinite(o->timeout_s) || !(o->round_timeout_s >= 0) || !isfinite(o->round_timeout_s))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: need finite interval_s >= 0, heartbeat_s > 0, "
                                            "timeout_s > heartbeat_s and round_timeout_s >= 0");
  if (o->max_params < 1 || o->max_params > DISTRO__SY_MAX_NUMEL)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: max_params %lld not in [1, %lld]",
                        (long long)o->max_params, (long long)DISTRO__SY_MAX_NUMEL);
  DISTRO_CHECK(distro__syncer_check_bounds(o));
  if (o->checkpoint && o->checkpoint_every < 1)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: checkpoint_every %d < 1", o->checkpoint_every);
  if (o->curve_allowed && !o->curve_keypair)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: curve_allowed needs curve_keypair (allowed keys are "
                                            "checked in the CURVE handshake)");
  char why[300];
  const int local = distro__sy_endpoint_check(o->endpoint, 1, why, sizeof why);
  if (local < 0) return distro__fail(DISTRO_ERR_INVALID, "syncer options: %s", why);
  if (!local && !o->curve_keypair && !o->insecure)
    return distro__fail(DISTRO_ERR_INVALID,
                        "syncer options: refusing to serve '%s' without CURVE: anyone who reaches it could join, "
                        "download the model and send reports (give curve_keypair, or set insecure)",
                        o->endpoint);
  /* Fail now, not at the first checkpoint an hour later. */
  if (o->checkpoint && distro__afile_check(o->checkpoint) != DISTRO_OK)
    return distro__fail(DISTRO_ERR_IO, "syncer options: checkpoint: %s", distro_last_error());
fail:
  return st;
}

static int zap_setup(distro_syncer *s) {
  s->zap = zmq_socket(s->ctx, ZMQ_REP);
  if (!s->zap) return -1;
  return zmq_bind(s->zap, "inproc://zeromq.zap.01");
}

distro_status distro_syncer_create(const distro_syncer_options *o, distro_syncer **out) {
  distro_status st = DISTRO_OK;
  distro_syncer *s = NULL;
  char sec[41] = "";
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_syncer_create: out is NULL");
  *out = NULL;
  if (!o || o->version < 1 || o->version > DISTRO_SYNCER_OPTIONS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: NULL or version %d (want 1 to %d)", o ? o->version : -1,
                        DISTRO_SYNCER_OPTIONS_VERSION);
  distro_syncer_options oo = distro_syncer_options_default();
  /* Version 1 ends before `insecure`, version 2 before `robust`, version 3
   * before `min_step_s`. */
  memcpy(&oo, o, o->version == 1   ? offsetof(distro_syncer_options, insecure)
                 : o->version == 2 ? offsetof(distro_syncer_options, robust)
                 : o->version == 3 ? offsetof(distro_syncer_options, min_step_s)
                                   : sizeof oo);
  if (oo.max_params == 0) oo.max_params = distro_syncer_options_default().max_params;
  o = &oo;
  DISTRO_CHECK(check_options(o));
  s = calloc(1, sizeof *s);
  if (!s) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  s->opt = *o;
  s->mu_init = pthread_mutex_init(&s->mu, NULL) == 0;
  if (!s->mu_init) DISTRO_FAIL(DISTRO_ERR_NOMEM, "pthread_mutex_init failed");
  if (o->checkpoint) {
    s->ckpt_path = strdup(o->checkpoint);
    if (!s->ckpt_path) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    s->opt.checkpoint = s->ckpt_path;
  }
  s->opt.endpoint = NULL;
  s->opt.curve_keypair = NULL;
  s->opt.curve_allowed = NULL;
  s->epoch = 1;
  s->seeder = -1;
  if (o->checkpoint && o->resume) {
    int found = 0;
    DISTRO_CHECK(distro__syncer_ckpt_load(s, &found));
    if (found) s->epoch++;
  }
  s->ctx = zmq_ctx_new();
  if (!s->ctx) DISTRO_FAIL(DISTRO_ERR_COMM, "zmq_ctx_new: %s", zmq_strerror(errno));
  if (o->curve_keypair) {
    char pub[41];
    DISTRO_CHECK(distro__sy_read_key(o->curve_keypair, pub, sec));
    if (o->curve_allowed) DISTRO_CHECK(distro__sy_load_allowed(o->curve_allowed, &s->allowed, &s->nallowed));
    /* The ZAP handler vouches for every client's key, which ties learner ids to keys. */
    if (zap_setup(s) != 0) DISTRO_FAIL(DISTRO_ERR_COMM, "ZAP handler: %s", zmq_strerror(errno));
  }
  s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
  if (!s->router) DISTRO_FAIL(DISTRO_ERR_COMM, "zmq_socket: %s", zmq_strerror(errno));
  if (o->curve_keypair) {
    int one = 1;
    if (zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, sec, 41) != 0)
      DISTRO_FAIL(DISTRO_ERR_UNSUPPORTED, "CURVE server: %s", zmq_strerror(errno));
    s->curve = 1;
  }
  /* The largest message a learner sends is SEED (8 P + 4 N bytes) or HELLO;
   * ZeroMQ drops a connection that announces more, before allocating it. */
  distro__sy_sockopts(s->router, 1000, 8 * (int64_t)o->fragments + 4 * o->max_params + DISTRO__SY_HELLO_MAX);
  if (zmq_bind(s->router, o->endpoint) != 0)
    DISTRO_FAIL(DISTRO_ERR_COMM, "cannot bind '%s': %s", o->endpoint, zmq_strerror(errno));
  size_t len = sizeof s->endpoint;
  if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &len) != 0)
    snprintf(s->endpoint, sizeof s->endpoint, "%s", o->endpoint);
  if (!s->curve) {
    char why[160];
    if (distro__sy_endpoint_check(o->endpoint, 1, why, sizeof why) > 0)
      distro__syncer_log(s, "warning: serving %s without CURVE: any local process can join as a learner, download "
                            "the model and send reports (docs/protocol.md, Threat model)",
                         s->endpoint);
    else
      distro__syncer_log(s, "warning: serving %s without CURVE (insecure): anyone who reaches it can join as a "
                            "learner, download the model and send reports",
                         s->endpoint);
  }
  {
    char b[600];
    distro__syncer_describe_bounds(o, b, sizeof b);
    distro__syncer_log(s, "hostile learners: %s", b);
  }
  memset(sec, 0, sizeof sec);
  *out = s;
  return DISTRO_OK;
fail:
  memset(sec, 0, sizeof sec);
  distro_syncer_free(s);
  return st;
}

distro_status distro_syncer_set_merge_callback(distro_syncer *s, distro_sync_merge_fn fn, void *ctx) {
  if (!s) return distro__fail(DISTRO_ERR_INVALID, "syncer is NULL");
  s->merge_fn = fn;
  s->merge_ctx = ctx;
  return DISTRO_OK;
}

const char *distro_syncer_endpoint(const distro_syncer *s) { return s ? s->endpoint : ""; }

void distro_syncer_stop(distro_syncer *s) {
  if (s) atomic_store(&s->stop, 1);
}

void distro_syncer_free(distro_syncer *s) {
  if (!s) return;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i]) free(s->learners[i]->win), free(s->learners[i]);
  if (s->router) zmq_close(s->router);
  if (s->zap) zmq_close(s->zap);
  if (s->ctx) zmq_ctx_term(s->ctx);
  distro__syncer_free_state(s);
  free(s->allowed);
  free(s->ckpt_path);
  if (s->mu_init) pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ------------------------------------------------------------ queries */

distro_status distro_syncer_get_stats(distro_syncer *s, distro_syncer_stats *st) {
  DISTRO__NONNULL("distro_syncer_get_stats", s);
  DISTRO__NONNULL("distro_syncer_get_stats", st);
  pthread_mutex_lock(&s->mu);
  memset(st, 0, sizeof *st);
  st->merges = s->merges;
  st->abandoned = s->abandoned;
  st->no_merge_s = s->initialized && s->live_now > 0 && s->t_progress > 0 ? distro__sy_now() - s->t_progress : 0;
  st->rejected = s->rejected;
  st->reports = s->reports;
  st->live = s->live_now;
  st->initialized = s->initialized;
  st->epoch = s->epoch;
  st->checkpoints = s->checkpoints;
  st->numel = s->initialized ? s->L.total : 0;
  st->fragments = s->initialized ? s->L.P : s->opt.fragments;
  st->merge_s_max = s->merge_s_max;
  st->merge_s_mean = s->merges_here ? s->merge_s_sum / (double)s->merges_here : 0;
  st->clipped = s->clipped;
  st->refused = s->refused;
  st->capped = s->capped;
  st->steps_skipped = s->steps_skipped;
  st->quarantines = s->quarantines;
  pthread_mutex_unlock(&s->mu);
  return DISTRO_OK;
}

distro_status distro_syncer_versions(distro_syncer *s, uint64_t *v, int P) {
  distro_status st = DISTRO_OK;
  DISTRO__NONNULL("distro_syncer_versions", s);
  DISTRO__NONNULL("distro_syncer_versions", v);
  pthread_mutex_lock(&s->mu);
  if (!s->initialized) DISTRO_FAIL(DISTRO_ERR_INVALID, "syncer has no global copy yet");
  if (P != s->L.P) DISTRO_FAIL(DISTRO_ERR_SHAPE, "P = %d, syncer has %d fragments", P, s->L.P);
  for (int p = 0; p < P; p++) v[p] = s->frag[p].version;
fail:
  pthread_mutex_unlock(&s->mu);
  return st;
}

distro_status distro_syncer_get_global(distro_syncer *s, float *out, int64_t numel, uint64_t *v, int P) {
  distro_status st = DISTRO_OK;
  DISTRO__NONNULL("distro_syncer_get_global", s);
  DISTRO__NONNULL("distro_syncer_get_global", out);
  pthread_mutex_lock(&s->mu);
  if (!s->initialized) DISTRO_FAIL(DISTRO_ERR_INVALID, "syncer has no global copy yet");
  if (numel != s->L.total || (v && P != s->L.P))
    DISTRO_FAIL(DISTRO_ERR_SHAPE, "numel %lld / P %d, syncer has %lld / %d", (long long)numel, P,
                (long long)s->L.total, s->L.P);
  {
    float **tp = malloc(sizeof *tp * (size_t)s->L.nt);
    if (!tp) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->L.nt; i++) tp[i] = out + s->L.toff[i];
    for (int p = 0; p < s->L.P; p++) {
      distro__sy_scatter(&s->L, p, s->frag[p].global, tp);
      if (v) v[p] = s->frag[p].version;
    }
    free(tp);
  }
fail:
  pthread_mutex_unlock(&s->mu);
  return st;
}

distro_status distro_syncer_checkpoint(distro_syncer *s) {
  if (!s) return distro__fail(DISTRO_ERR_INVALID, "syncer is NULL");
  if (!s->opt.checkpoint) return distro__fail(DISTRO_ERR_INVALID, "no checkpoint path set");
  pthread_mutex_lock(&s->mu);
  distro_status st = s->initialized ? distro__syncer_ckpt_save(s) : DISTRO_OK;
  if (st == DISTRO_OK && s->initialized) s->checkpoints++;
  pthread_mutex_unlock(&s->mu);
  return st;
}
