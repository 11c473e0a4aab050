/* The syncer service: one thread, one ROUTER socket, every fragment's round
 * driven by the clock (docs/protocol.md, ALGORITHMS.md section 4).
 *
 * Per fragment p the syncer opens a round every P intervals: it asks every
 * live learner to REPORT its outer gradient, waits for a quorum of
 * min(K, live) reports, then for the adaptive grace window
 * max(0, gamma (tau step - t_quorum - t_sync)) (moving averages) or until
 * every learner asked has answered, merges everything it holds for p (late
 * reports of earlier rounds included, re-anchored at the current copy),
 * takes a Nesterov outer step and sends the new fragment to every live
 * learner. Rounds of different fragments overlap in time. Bad messages get
 * an ERROR reply and a log line and change nothing. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "compress/outer_codec.h"
#include "sync/syncer_internal.h"

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
  return o;
}

void distro__syncer_log(distro_syncer *s, const char *fmt, ...) {
  if (!s->opt.log) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->opt.log(s->opt.log_ctx, line);
}

static distro_status check_options(const distro_syncer_options *o) {
  if (!o || o->version != DISTRO_SYNCER_OPTIONS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: NULL or version %d (want %d)", o ? o->version : -1,
                        DISTRO_SYNCER_OPTIONS_VERSION);
  if (!o->endpoint) return distro__fail(DISTRO_ERR_INVALID, "syncer options: endpoint is NULL");
  if (o->fragments < 1 || o->fragments > 4096)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: fragments %d not in [1, 4096]", o->fragments);
  if (!distro__outer_codec_known(o->codec) || o->codec_block < 1)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: unknown codec %d or block %d", (int)o->codec,
                        o->codec_block);
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
  if (o->overlap < 0 || o->H < 1 || o->max_staleness < 0 || o->max_staleness > 64)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: overlap %d, H %d or max_staleness %d out of range",
                        o->overlap, o->H, o->max_staleness);
  if (!(o->interval_s >= 0) || !(o->heartbeat_s > 0) || !(o->timeout_s > o->heartbeat_s))
    return distro__fail(DISTRO_ERR_INVALID,
                        "syncer options: need interval_s >= 0, heartbeat_s > 0 and timeout_s > heartbeat_s");
  if (o->checkpoint && o->checkpoint_every < 1)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: checkpoint_every %d < 1", o->checkpoint_every);
  return DISTRO_OK;
}

static void free_state(distro_syncer *s) {
  if (s->frag) {
    for (int p = 0; p < s->L.P; p++) {
      sy_fragment *F = &s->frag[p];
      free(F->global);
      free(F->mom);
      if (F->hist) {
        for (int k = 0; k < s->opt.max_staleness; k++) free(F->hist[k].data);
        free(F->hist);
      }
      for (int i = 0; i < F->nrep; i++) free(F->rep[i].enc);
      free(F->rep);
    }
    free(s->frag);
    s->frag = NULL;
  }
  free(s->scratch);
  s->scratch = NULL;
  free(s->deltas);
  s->deltas = NULL;
  s->deltas_cap = 0;
  distro__sy_layout_destroy(&s->L);
  s->have_layout = 0;
  s->initialized = 0;
}

distro_status distro__syncer_alloc_state(distro_syncer *s) {
  distro_status st = DISTRO_OK;
  const int P = s->L.P;
  int64_t maxf = 1;
  s->frag = calloc((size_t)P, sizeof *s->frag);
  if (!s->frag) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  for (int p = 0; p < P; p++) {
    sy_fragment *F = &s->frag[p];
    const int64_t n = s->L.frags.numel[p];
    if (n > maxf) maxf = n;
    F->global = calloc((size_t)n, sizeof(float));
    F->mom = calloc((size_t)n, sizeof(float));
    if (s->opt.max_staleness > 0) F->hist = calloc((size_t)s->opt.max_staleness, sizeof *F->hist);
    if (!F->global || !F->mom || (s->opt.max_staleness > 0 && !F->hist))
      DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  }
  s->maxf = maxf;
  s->scratch = malloc(sizeof(float) * (size_t)maxf * 3); /* merged gradient, momentum, previous global */
  if (!s->scratch) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  return DISTRO_OK;
fail:
  free_state(s);
  return st;
}

static int zap_setup(distro_syncer *s) {
  s->zap = zmq_socket(s->ctx, ZMQ_REP);
  if (!s->zap) return -1;
  return zmq_bind(s->zap, "inproc://zeromq.zap.01");
}

static distro_status load_allowed(distro_syncer *s, const char *path) {
  distro_status st = DISTRO_OK;
  FILE *f = fopen(path, "r");
  char line[256];
  if (!f) return distro__fail(DISTRO_ERR_IO, "cannot open allowed-keys file '%s': %s", path, strerror(errno));
  while (fgets(line, sizeof line, f)) {
    char *k = line;
    while (*k == ' ' || *k == '\t') k++;
    if (*k == '#' || *k == '\n' || *k == 0) continue;
    if (strncmp(k, "public", 6) == 0) {
      k += 6;
      while (*k == ' ' || *k == '\t') k++;
      if (*k == '=') k++;
      while (*k == ' ' || *k == '\t') k++;
    }
    size_t n = 0;
    while (k[n] && k[n] != '\n' && k[n] != '\r' && k[n] != ' ') n++;
    if (n != 40) DISTRO_FAIL(DISTRO_ERR_IO, "allowed-keys file '%s': a key is not 40 Z85 characters", path);
    k[40] = 0;
    uint8_t *nk = realloc(s->allowed, (size_t)(s->nallowed + 1) * 32);
    if (!nk) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
    s->allowed = nk;
    if (!zmq_z85_decode(s->allowed + 32 * s->nallowed, k))
      DISTRO_FAIL(DISTRO_ERR_IO, "allowed-keys file '%s': bad Z85 key", path);
    s->nallowed++;
  }
fail:
  fclose(f);
  return st;
}

distro_status distro_syncer_create(const distro_syncer_options *o, distro_syncer **out) {
  distro_status st = DISTRO_OK;
  distro_syncer *s = NULL;
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_syncer_create: out is NULL");
  *out = NULL;
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
  if (o->checkpoint && o->resume) {
    int found = 0;
    DISTRO_CHECK(distro__syncer_ckpt_load(s, &found));
    if (found) s->epoch++;
  }
  s->ctx = zmq_ctx_new();
  if (!s->ctx) DISTRO_FAIL(DISTRO_ERR_COMM, "zmq_ctx_new: %s", zmq_strerror(errno));
  if (o->curve_keypair) {
    char pub[41], sec[41];
    DISTRO_CHECK(distro__sy_read_key(o->curve_keypair, pub, sec));
    if (o->curve_allowed) DISTRO_CHECK(load_allowed(s, o->curve_allowed));
    if (zap_setup(s) != 0) DISTRO_FAIL(DISTRO_ERR_COMM, "ZAP handler: %s", zmq_strerror(errno));
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    if (!s->router) DISTRO_FAIL(DISTRO_ERR_COMM, "zmq_socket: %s", zmq_strerror(errno));
    int one = 1;
    if (zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, sec, 41) != 0)
      DISTRO_FAIL(DISTRO_ERR_UNSUPPORTED, "CURVE server: %s", zmq_strerror(errno));
    s->curve = 1;
  } else {
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    if (!s->router) DISTRO_FAIL(DISTRO_ERR_COMM, "zmq_socket: %s", zmq_strerror(errno));
  }
  int linger = 0, hwm = 10000;
  zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(s->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s->router, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (zmq_bind(s->router, o->endpoint) != 0)
    DISTRO_FAIL(DISTRO_ERR_COMM, "cannot bind '%s': %s", o->endpoint, zmq_strerror(errno));
  size_t len = sizeof s->endpoint;
  if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &len) != 0)
    snprintf(s->endpoint, sizeof s->endpoint, "%s", o->endpoint);
  *out = s;
  return DISTRO_OK;
fail:
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
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++) free(s->learners[i]);
  if (s->router) zmq_close(s->router);
  if (s->zap) zmq_close(s->zap);
  if (s->ctx) zmq_ctx_term(s->ctx);
  free_state(s);
  free(s->allowed);
  free(s->ckpt_path);
  if (s->mu_init) pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ------------------------------------------------------------ queries */

distro_status distro_syncer_get_stats(distro_syncer *s, distro_syncer_stats *st) {
  if (!s || !st) return distro__fail(DISTRO_ERR_INVALID, "distro_syncer_get_stats: NULL argument");
  pthread_mutex_lock(&s->mu);
  memset(st, 0, sizeof *st);
  st->merges = s->merges;
  st->rejected = s->rejected;
  st->reports = s->reports;
  st->live = s->live_now;
  st->initialized = s->initialized;
  st->epoch = s->epoch;
  st->checkpoints = s->checkpoints;
  st->numel = s->have_layout ? s->L.total : 0;
  st->fragments = s->have_layout ? s->L.P : s->opt.fragments;
  st->merge_s_max = s->merge_s_max;
  st->merge_s_mean = s->merges_here ? s->merge_s_sum / (double)s->merges_here : 0;
  pthread_mutex_unlock(&s->mu);
  return DISTRO_OK;
}

distro_status distro_syncer_versions(distro_syncer *s, uint64_t *v, int P) {
  distro_status st = DISTRO_OK;
  if (!s || !v) return distro__fail(DISTRO_ERR_INVALID, "distro_syncer_versions: NULL argument");
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
  if (!s || !out) return distro__fail(DISTRO_ERR_INVALID, "distro_syncer_get_global: NULL argument");
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
