/* The syncer's messages from learners: the event loop, every type's checks
 * and effect (docs/protocol.md). A message is checked in the order of its
 * cost: header fields, the type, its payload size against the type's cap,
 * then the CRC and the body; a bad one gets an ERROR reply and a log line
 * and changes nothing. Rounds and merges are rounds.c. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "compress/outer_codec.h"
#include "sync/bounds.h"
#include "sync/rounds.h"
#include "sync/syncer_state.h"

/* Where a message came from: its connection's ZeroMQ routing id. */
typedef struct {
  const uint8_t *rid;
  size_t rid_n;
} route;

/* At most this many reject lines per second; the rest are counted. */
#define REJECT_LOG_PER_S 20

static void reject(distro_syncer *s, route r, uint32_t learner, int code, int type, uint32_t frag, uint64_t round,
                   const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static void reject(distro_syncer *s, route r, uint32_t learner, int code, int type, uint32_t frag, uint64_t round,
                   const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  const double now = distro__sy_now();
  if (now - s->log_t >= 1.0) {
    if (s->log_dropped)
      distro__syncer_log(s, "%llu more messages rejected in the last second (log lines rate-limited)",
                         (unsigned long long)s->log_dropped);
    s->log_t = now;
    s->log_n = 0;
    s->log_dropped = 0;
  }
  if (s->log_n++ < REJECT_LOG_PER_S)
    distro__syncer_log(s, "reject learner=%u type=%s reason=%s: %s", (unsigned)learner, distro__sy_type_name(type),
                       distro_sync_error_name(code), why);
  else
    s->log_dropped++;
  if (r.rid) {
    distro__sy_msg m = {0};
    m.type = DISTRO__SY_ERROR;
    m.learner = learner;
    m.fragment = frag;
    m.epoch = s->epoch;
    m.a = (uint64_t)code;
    m.b = (uint64_t)type;
    m.c = round;
    m.payload_bytes = (uint32_t)strlen(why);
    distro__sy_send(s->router, r.rid, r.rid_n, &m, why);
  }
  pthread_mutex_lock(&s->mu);
  s->rejected++;
  pthread_mutex_unlock(&s->mu);
}

/* A step time a learner claimed (REPORT or HEARTBEAT e, seconds; 0: none):
 * its latest, and its fastest, which bounds its claimed steps (bounds.c). */
static void note_step_time(sy_learner *l, double e) {
  if (!(e > 0)) return;
  l->step_s = e;
  if (l->step_min <= 0 || e < l->step_min) l->step_min = e;
}

/* The learner a message claims to come from, if that connection owns it. */
static sy_learner *authenticate(distro_syncer *s, route r, const distro__sy_msg *m) {
  if (m->learner >= DISTRO__SY_MAX_LEARNERS) return NULL;
  sy_learner *l = s->learners[m->learner];
  if (!l || !l->alive || l->rid_n != r.rid_n || memcmp(l->rid, r.rid, r.rid_n) != 0) return NULL;
  return l;
}

/* ------------------------------------------------------------ joins */

/* SHA-256 of fragment p at version v (its current one or the previous),
 * all zeros when that version's values are gone. Cached per version. */
static void digest(distro_syncer *s, int p, uint64_t v, uint8_t out[32]) {
  sy_fragment *F = &s->frag[p];
  sy_digest *d = &F->digest[v == F->version ? 0 : 1];
  if (!(d->valid && d->version == v)) {
    const float *x = v == F->version ? F->global : distro__syncer_history(s, F, v);
    d->valid = 0;
    if (x) {
      distro__sy_hash(x, s->L.frags.numel[p], d->hash);
      d->version = v;
      d->valid = 1;
    }
  }
  if (d->valid && d->version == v) memcpy(out, d->hash, 32);
  else memset(out, 0, 32);
}

/* Up to DISTRO__SY_MAX_PEERS healthy peers (alive, ready, serving), heard
 * from most recently first. */
static int choose_peers(distro_syncer *s, uint32_t self, int *peers) {
  int n = 0;
  uint8_t taken[DISTRO__SY_MAX_LEARNERS] = {0};
  for (; n < DISTRO__SY_MAX_PEERS; n++) {
    int best = -1;
    for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++) {
      const sy_learner *l = s->learners[i];
      if (!l || !l->alive || !l->ready || (uint32_t)i == self || !l->endpoint[0] || taken[i]) continue;
      if (best < 0 || l->last_seen > s->learners[best]->last_seen) best = i;
    }
    if (best < 0) break;
    taken[best] = 1;
    peers[n] = best;
  }
  return n;
}

static void put_str(uint8_t **b, const char *str) {
  const size_t n = strlen(str);
  (*b)[0] = (uint8_t)n, (*b)[1] = (uint8_t)(n >> 8);
  memcpy(*b + 2, str, n);
  *b += 2 + n;
}

/* WELCOME (docs/protocol.md). Digests only for a learner that will pull
 * the state from a peer (they cost a pass over the parameters). */
static void send_welcome(distro_syncer *s, const sy_learner *l, uint32_t learner, unsigned flags, const int *peers,
                         int npeers) {
  const int P = s->L.P;
  uint8_t *buf = calloc(1, 28 + 72 * (size_t)P + 4 + (size_t)DISTRO__SY_MAX_PEERS * (8 + 2 * 256)), *b = buf;
  if (!buf) return;
  distro__put_u32(b, (uint32_t)P), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.codec), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.codec_block), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.fragmenting), b += 4;
  distro__put_u64(b, (uint64_t)s->opt.max_block), b += 8;
  distro__put_u32(b, (uint32_t)s->opt.overlap), b += 4;
  for (int p = 0; p < P; p++) distro__put_u64(b, s->initialized ? s->frag[p].version : 0), b += 8;
  for (int p = 0; p < P; p++, b += 64)
    if (s->initialized && npeers > 0) {
      const uint64_t v = s->frag[p].version;
      digest(s, p, v, b);
      if (v > 0) digest(s, p, v - 1, b + 32);
    }
  distro__put_u32(b, (uint32_t)npeers), b += 4;
  for (int k = 0; k < npeers; k++) {
    const sy_learner *q = s->learners[peers[k]];
    distro__put_u32(b, (uint32_t)peers[k]), b += 4;
    put_str(&b, q->endpoint);
    put_str(&b, q->pubkey);
  }
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_WELCOME;
  m.learner = learner;
  m.fragment = DISTRO__SY_NONE;
  m.b = flags;
  m.payload_bytes = (uint32_t)(b - buf);
  distro__syncer_send_to(s, l, &m, buf);
  free(buf);
}

static sy_learner *enroll(distro_syncer *s, route r, const distro__sy_msg *m, const distro__sy_hello *h,
                          double now) {
  const uint32_t id = m->learner;
  sy_learner *l = s->learners[id];
  const int fresh = !l;
  if (!l) {
    l = calloc(1, sizeof *l);
    if (!l) return NULL;
    s->learners[id] = l;
  }
  distro__syncer_hello_claims(s, l, fresh, (m->b & DISTRO__SY_HELLO_HAS_STATE) != 0, m->c, now);
  const int moved = l->alive && (l->rid_n != r.rid_n || memcmp(l->rid, r.rid, r.rid_n) != 0);
  if (moved) distro__syncer_log(s, "learner %u says hello from a new connection (replaces the old one)", (unsigned)id);
  if (!l->alive) l->last_fetch = 0;
  if (!l->alive || moved) l->hb_steps = 0; /* a new process counts its steps from 0 */
  memcpy(l->rid, r.rid, r.rid_n);
  l->rid_n = r.rid_n;
  l->alive = 1;
  l->last_seen = now;
  snprintf(l->endpoint, sizeof l->endpoint, "%s", h->endpoint);
  snprintf(l->pubkey, sizeof l->pubkey, "%s", h->key);
  return l;
}

static int same_layout(const distro_syncer *s, const distro__sy_msg *m, const distro__sy_hello *h) {
  if (m->a != s->L.signature || (int)h->nt != s->L.nt) return 0;
  for (uint32_t i = 0; i < h->nt; i++)
    if ((int64_t)distro__get_u64(h->tensors + 12 * i) != s->L.numel[i] ||
        distro__get_u32(h->tensors + 12 * i + 8) != s->L.tflags[i])
      return 0;
  return 1;
}

static distro_status propose_layout(distro_syncer *s, const distro__sy_msg *m, const distro__sy_hello *h) {
  distro_status st = DISTRO_ERR_NOMEM;
  int64_t *numel = malloc(sizeof *numel * h->nt);
  unsigned *flags = malloc(sizeof *flags * h->nt);
  if (numel && flags) {
    for (uint32_t i = 0; i < h->nt; i++) {
      numel[i] = (int64_t)distro__get_u64(h->tensors + 12 * i);
      flags[i] = distro__get_u32(h->tensors + 12 * i + 8);
    }
    st = distro__sy_layout_build(&s->L, (int)h->nt, numel, flags, m->a, s->opt.fragments, s->opt.fragmenting,
                                 s->opt.max_block, s->opt.codec, s->opt.codec_block);
  } else {
    distro__fail(st, "out of memory");
  }
  free(numel);
  free(flags);
  return st;
}

static void on_hello(distro_syncer *s, route r, const distro__sy_msg *m, const uint8_t *pl, size_t pn,
                     const char *user, double now) {
  const uint32_t id = m->learner;
  char why[300];
  distro__sy_hello h;
  if (id >= DISTRO__SY_MAX_LEARNERS) {
    reject(s, r, id, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0, "learner id %u >= %d", (unsigned)id,
           DISTRO__SY_MAX_LEARNERS);
    return;
  }
  if (m->b & ~(uint64_t)DISTRO__SY_HELLO_HAS_STATE) {
    reject(s, r, id, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0, "HELLO with unknown flag bits 0x%llx",
           (unsigned long long)m->b);
    return;
  }
  int code = distro__sy_parse_hello(pl, pn, &h, why, sizeof why);
  if (code) {
    reject(s, r, id, code, m->type, DISTRO__SY_NONE, 0, "%s", why);
    return;
  }
  if (s->curve) {
    /* The key a joiner will trust for this learner's state must be the one
     * this connection proved it holds, and an id stays with its key. */
    if (strcmp(h.key, user) != 0) {
      reject(s, r, id, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0,
             "HELLO advertises public key '%s', the connection authenticated with '%s'", h.key, user);
      return;
    }
    const sy_learner *cur = s->learners[id];
    if (cur && cur->alive && strcmp(cur->pubkey, user) != 0) {
      reject(s, r, id, DISTRO_SYNC_E_UNKNOWN, m->type, DISTRO__SY_NONE, 0,
             "learner id %u is held by a learner with another key", (unsigned)id);
      return;
    }
  }
  if (s->opt.signature && m->a != s->opt.signature) {
    reject(s, r, id, DISTRO_SYNC_E_SIGNATURE, m->type, DISTRO__SY_NONE, 0,
           "model signature %016llx is not the one the syncer was given (%016llx)", (unsigned long long)m->a,
           (unsigned long long)s->opt.signature);
    return;
  }
  if (h.total > s->opt.max_params) {
    reject(s, r, id, DISTRO_SYNC_E_SIGNATURE, m->type, DISTRO__SY_NONE, 0,
           "a model of %lld parameters is more than the syncer's max_params %lld", (long long)h.total,
           (long long)s->opt.max_params);
    return;
  }
  /* Tokens per step (c): fixed for the job per learner id. */
  if (m->c > (1ull << 53)) {
    reject(s, r, id, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0,
           "HELLO declares %llu tokens per step (> 2^53)", (unsigned long long)m->c);
    return;
  }
  if (distro__syncer_hello_tokens(s, (int)id, m->c, why, sizeof why)) {
    reject(s, r, id, DISTRO_SYNC_E_REFUSED, m->type, DISTRO__SY_NONE, 0, "%s", why);
    return;
  }
  const int has_state = (m->b & DISTRO__SY_HELLO_HAS_STATE) != 0;
  if (s->have_layout && !same_layout(s, m, &h)) {
    const int seeder_alive = s->seeder >= 0 && s->learners[s->seeder] && s->learners[s->seeder]->alive;
    if (!s->provisional) {
      reject(s, r, id, DISTRO_SYNC_E_SIGNATURE, m->type, DISTRO__SY_NONE, 0,
             "model signature %016llx with %u tensors differs from the job's %016llx with %d tensors",
             (unsigned long long)m->a, (unsigned)h.nt, (unsigned long long)s->L.signature, s->L.nt);
      return;
    }
    if (seeder_alive && (uint32_t)s->seeder != id) {
      /* Nothing is fixed until a seed arrives: not a refusal, a wait. */
      reject(s, r, id, DISTRO_SYNC_E_NOT_READY, m->type, DISTRO__SY_NONE, 0,
             "learner %d is seeding the global copy (another layout until it seeds); say hello again", s->seeder);
      return;
    }
    distro__syncer_log(s, "layout proposed by learner %d dropped (it did not seed)", s->seeder);
    distro__syncer_free_state(s);
    s->seeder = -1;
  }
  if (!s->have_layout) {
    if (propose_layout(s, m, &h) != DISTRO_OK) {
      reject(s, r, id, DISTRO_SYNC_E_SIGNATURE, m->type, DISTRO__SY_NONE, 0, "cannot lay out the model: %s",
             distro_last_error());
      return;
    }
    pthread_mutex_lock(&s->mu);
    s->have_layout = 1;
    s->provisional = 1;
    pthread_mutex_unlock(&s->mu);
    s->seeder = -1;
    distro__syncer_log(s, "layout proposed by learner %u: %u tensors, %lld parameters, %d fragments", (unsigned)id,
                       (unsigned)h.nt, (long long)s->L.total, s->L.P);
  }
  if (!s->initialized) {
    if (s->seeder >= 0 && (uint32_t)s->seeder != id && s->learners[s->seeder] && s->learners[s->seeder]->alive) {
      reject(s, r, id, DISTRO_SYNC_E_NOT_READY, m->type, DISTRO__SY_NONE, 0,
             "learner %d is seeding the global copy; say hello again", s->seeder);
      return;
    }
    sy_learner *l = enroll(s, r, m, &h, now);
    if (!l) return;
    s->seeder = (int)id;
    s->t_seed_asked = now;
    l->ready = 0;
    distro__syncer_log(s, "learner %u seeds the global copy", (unsigned)id);
    send_welcome(s, l, id, DISTRO__SY_WELCOME_SEED, NULL, 0);
    return;
  }
  sy_learner *l = enroll(s, r, m, &h, now);
  if (!l) return;
  l->ready = has_state;
  l->rejoined = has_state;
  int peers[DISTRO__SY_MAX_PEERS], np = has_state ? 0 : choose_peers(s, id, peers);
  distro__syncer_log(s, "learner %u joins (%s)%s%s", (unsigned)id, has_state ? "has state" : "new",
                     has_state ? "" : np > 0 ? ", pulls state from learner " : ", fetches state from the syncer",
                     !has_state && np > 0 ? s->learners[peers[0]]->endpoint : "");
  send_welcome(s, l, id, has_state || np > 0 ? 0u : DISTRO__SY_WELCOME_FETCH, peers, np);
  distro__syncer_reasked(s, (int)id, has_state);
}

static void on_seed(distro_syncer *s, route r, sy_learner *l, const distro__sy_msg *m, const uint8_t *pl, size_t pn,
                    double now) {
  const int P = s->L.P;
  if (s->initialized || !s->have_layout || s->seeder != (int)m->learner) {
    reject(s, r, m->learner, DISTRO_SYNC_E_ROUND, m->type, DISTRO__SY_NONE, 0, "not asked to seed");
    return;
  }
  const size_t want = 8 * (size_t)P + 4 * (size_t)s->L.total;
  if (pn != want) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0, "SEED of %zu bytes, want %zu", pn,
           want);
    return;
  }
  for (int64_t j = 0; j < s->L.total; j++) {
    float v;
    memcpy(&v, pl + 8 * (size_t)P + 4 * (size_t)j, 4);
    if (!isfinite(v)) {
      reject(s, r, m->learner, DISTRO_SYNC_E_PAYLOAD, m->type, DISTRO__SY_NONE, 0, "non-finite value at %lld",
             (long long)j);
      return;
    }
  }
  if (distro__syncer_alloc_state(s) != DISTRO_OK) {
    distro__syncer_log(s, "cannot hold the seeded state: %s", distro_last_error());
    return;
  }
  pthread_mutex_lock(&s->mu);
  for (int p = 0; p < P; p++) {
    sy_fragment *F = &s->frag[p];
    memcpy(F->global, pl + 8 * (size_t)P + 4 * (size_t)s->L.frag_off[p], 4 * (size_t)s->L.frags.numel[p]);
    F->version = distro__get_u64(pl + 8 * (size_t)p);
  }
  s->initialized = 1;
  s->provisional = 0;
  pthread_mutex_unlock(&s->mu);
  s->seeder = -1;
  s->t_progress = now;
  l->ready = 1;
  distro__syncer_log(s, "learner %u seeded %lld parameters; the layout is fixed", (unsigned)m->learner,
                     (long long)s->L.total);
  send_welcome(s, l, m->learner, DISTRO__SY_WELCOME_SEEDED, NULL, 0);
}

/* FETCH: the whole state, rate-limited (each answer is 4 N bytes): one
 * per learner per second, four per second in all. */
static void on_fetch(distro_syncer *s, route r, sy_learner *l, uint32_t learner, double now) {
  s->fetch_tokens += (now - s->fetch_t) * 1.0;
  if (s->fetch_tokens > 4) s->fetch_tokens = 4;
  s->fetch_t = now;
  if (s->fetch_tokens < 1 || (l->last_fetch > 0 && now - l->last_fetch < 1.0)) {
    reject(s, r, learner, DISTRO_SYNC_E_NOT_READY, DISTRO__SY_FETCH, DISTRO__SY_NONE, 0,
           "state requests are rate-limited; retry in a second");
    return;
  }
  s->fetch_tokens -= 1;
  l->last_fetch = now;
  const int P = s->L.P;
  const size_t n = 8 * (size_t)P + 4 * (size_t)s->L.total;
  uint8_t *buf = malloc(n);
  if (!buf) return;
  for (int p = 0; p < P; p++) {
    distro__put_u64(buf + 8 * (size_t)p, s->frag[p].version);
    memcpy(buf + 8 * (size_t)P + 4 * (size_t)s->L.frag_off[p], s->frag[p].global, 4 * (size_t)s->L.frags.numel[p]);
  }
  distro__sy_msg m = distro__sy_state_msg(learner, P, n);
  distro__syncer_send_to(s, l, &m, buf);
  free(buf);
}

/* UPLOAD: after a restart from a checkpoint, a rejoining learner hands
 * back fragments merged since that checkpoint (at most checkpoint_every
 * merges ahead). A syncer without checkpoints never needs one. */
static void on_upload(distro_syncer *s, route r, const sy_learner *l, const distro__sy_msg *m, const uint8_t *pl,
                      size_t pn) {
  const uint32_t p = m->fragment;
  if (!s->opt.checkpoint || !l->rejoined) {
    reject(s, r, m->learner, DISTRO_SYNC_E_ROUND, m->type, p, 0,
           "UPLOAD is only taken after a restart from a checkpoint, from a learner that rejoined with its state");
    return;
  }
  if (p >= (uint32_t)s->L.P || pn != 4 * (size_t)s->L.frags.numel[p]) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, p, 0, "UPLOAD of fragment %u with %zu bytes",
           (unsigned)p, pn);
    return;
  }
  sy_fragment *F = &s->frag[p];
  if (m->b <= F->version) {
    reject(s, r, m->learner, DISTRO_SYNC_E_STALE, m->type, p, 0, "UPLOAD of version %llu, syncer has %llu",
           (unsigned long long)m->b, (unsigned long long)F->version);
    return;
  }
  if (m->b - F->version > (uint64_t)s->opt.checkpoint_every) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, p, 0,
           "UPLOAD of version %llu, more than checkpoint_every (%d) merges ahead of the syncer's %llu",
           (unsigned long long)m->b, s->opt.checkpoint_every, (unsigned long long)F->version);
    return;
  }
  for (size_t j = 0; j < pn / 4; j++) {
    float v;
    memcpy(&v, pl + 4 * j, 4);
    if (!isfinite(v)) {
      reject(s, r, m->learner, DISTRO_SYNC_E_PAYLOAD, m->type, p, 0, "non-finite value at %zu", j);
      return;
    }
  }
  pthread_mutex_lock(&s->mu);
  memcpy(F->global, pl, pn);
  const uint64_t old = F->version;
  F->version = m->b;
  pthread_mutex_unlock(&s->mu);
  for (int k = 0; k < s->opt.max_staleness; k++) F->hist[k].valid = 0;
  F->digest[0].valid = F->digest[1].valid = 0;
  distro__syncer_log(s, "fragment %u: adopted version %llu from learner %u (had %llu)", (unsigned)p,
                     (unsigned long long)m->b, (unsigned)m->learner, (unsigned long long)old);
}

/* At most this many reports are held per fragment (this round's and late
 * ones): a learner reports once per round, and merges empty the list. */
#define MAX_HELD 256

static void on_report(distro_syncer *s, route r, sy_learner *l, const distro__sy_msg *m, const uint8_t *pl,
                      size_t pn) {
  const uint32_t p = m->fragment;
  if (p >= (uint32_t)s->L.P) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, p, m->a, "fragment %u of %d", (unsigned)p, s->L.P);
    return;
  }
  sy_fragment *F = &s->frag[p];
  if (pn != s->L.frag_bytes[p]) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, p, m->a, "REPORT of %zu bytes, fragment %u needs %zu",
           pn, (unsigned)p, s->L.frag_bytes[p]);
    return;
  }
  if (m->a == 0 || m->a > F->round) {
    reject(s, r, m->learner, DISTRO_SYNC_E_ROUND, m->type, p, m->a, "round %llu of fragment %u was never opened",
           (unsigned long long)m->a, (unsigned)p);
    return;
  }
  if (m->b > F->version) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, p, m->a, "base version %llu ahead of the syncer's %llu",
           (unsigned long long)m->b, (unsigned long long)F->version);
    return;
  }
  if (m->b < F->version &&
      (F->version - m->b > (uint64_t)s->opt.max_staleness || !distro__syncer_history(s, F, m->b))) {
    reject(s, r, m->learner, DISTRO_SYNC_E_STALE, m->type, p, m->a,
           "base version %llu is %llu behind %llu (bound %d%s)", (unsigned long long)m->b,
           (unsigned long long)(F->version - m->b), (unsigned long long)F->version, s->opt.max_staleness,
           F->version - m->b <= (uint64_t)s->opt.max_staleness ? ", not in the history after a restart" : "");
    return;
  }
  if (!(m->c <= (1ull << 53)) || !(m->d <= (1ull << 53))) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, p, m->a, "token or step counter out of range");
    return;
  }
  const double now = distro__sy_now();
  if (distro__syncer_quarantined(s, (int)m->learner, now)) {
    pthread_mutex_lock(&s->mu);
    l->refused++;
    s->refused++;
    pthread_mutex_unlock(&s->mu);
    reject(s, r, m->learner, DISTRO_SYNC_E_REFUSED, m->type, p, m->a, "learner %u is quarantined for %.0f more s",
           (unsigned)m->learner, l->quarantined_until - now);
    return;
  }
  const distro__fragments *f = &s->L.frags;
  for (int q = f->start[p]; q < f->start[p + 1]; q++) {
    if (distro__outer_check(s->L.codec, pl + s->L.piece_byte[q], f->pieces[q].count, s->L.block) != DISTRO_OK) {
      char why[300];
      snprintf(why, sizeof why, "%s", distro_last_error());
      pthread_mutex_lock(&s->mu);
      l->refused++;
      s->refused++;
      pthread_mutex_unlock(&s->mu);
      reject(s, r, m->learner, DISTRO_SYNC_E_PAYLOAD, m->type, p, m->a, "%s", why);
      distro__syncer_strike(s, (int)m->learner, 1, now, why);
      return;
    }
  }
  const int late = !(F->open && m->a == F->round);
  /* An unmerged earlier report of this learner on the same base (its round
   * was abandoned) is contained in this one: it goes. */
  for (int i = 0; i < F->nrep;)
    if (F->rep[i].learner == (int)m->learner && F->rep[i].round < m->a && F->rep[i].base == m->b) {
      free(F->rep[i].enc);
      F->rep[i] = F->rep[--F->nrep];
    } else {
      i++;
    }
  int slot = -1;
  for (int i = 0; i < F->nrep; i++)
    if (F->rep[i].learner == (int)m->learner && F->rep[i].round == m->a) slot = i;
  if (slot < 0 && F->nrep == MAX_HELD) {
    /* Full: the oldest late report goes (there is one unless 256 learners answered this round). */
    int old = -1;
    for (int i = 0; i < F->nrep; i++)
      if (F->rep[i].late && (old < 0 || F->rep[i].round < F->rep[old].round)) old = i;
    if (old < 0) return;
    free(F->rep[old].enc);
    F->rep[old] = F->rep[--F->nrep];
  }
  if (slot < 0) {
    if (F->nrep == F->cap) {
      const int nc = F->cap ? 2 * F->cap : 8;
      sy_report *nr = realloc(F->rep, sizeof *nr * (size_t)nc);
      if (!nr) return;
      F->rep = nr;
      F->cap = nc;
    }
    slot = F->nrep++;
    F->rep[slot].enc = NULL;
  }
  sy_report *rp = &F->rep[slot];
  uint8_t *enc = realloc(rp->enc, pn);
  if (!enc) {
    F->rep[slot] = F->rep[--F->nrep];
    return;
  }
  memcpy(enc, pl, pn);
  rp->enc = enc;
  rp->learner = (int)m->learner;
  rp->round = m->a;
  rp->base = m->b;
  rp->tokens = (double)m->c;
  rp->steps = (double)m->d;
  rp->late = late;
  rp->max_steps = distro__syncer_steps_bound(s, l, (int)p, m->b, now, &rp->max_by_time);
  note_step_time(l, m->e);
  l->reports++;
  pthread_mutex_lock(&s->mu);
  s->reports++;
  pthread_mutex_unlock(&s->mu);
}

/* The largest payload of each type the syncer accepts (0: none), checked
 * before the CRC is computed or anything is copied; -1: not a type the
 * syncer accepts. */
static int64_t payload_cap(const distro_syncer *s, int type) {
  const distro__sy_layout *L = &s->L;
  switch (type) {
    case DISTRO__SY_HELLO: return DISTRO__SY_HELLO_MAX;
    case DISTRO__SY_SEED: return s->have_layout ? 8 * (int64_t)L->P + 4 * L->total : 0;
    case DISTRO__SY_REPORT: return s->initialized ? (int64_t)L->max_frag_bytes : 0;
    case DISTRO__SY_UPLOAD: return s->initialized ? 4 * L->maxf : 0;
    case DISTRO__SY_HEARTBEAT:
    case DISTRO__SY_FETCH:
    case DISTRO__SY_BYE: return 0;
  }
  return -1;
}

static void handle(distro_syncer *s, distro__sy_frames *fr, double now) {
  route r = {fr->n > 0 ? fr->data[0] : NULL, fr->n > 0 ? fr->size[0] : 0};
  char why[256];
  distro__sy_msg m;
  if (fr->n < 2 || fr->n > 3 || fr->truncated || r.rid_n > 255) {
    reject(s, r, DISTRO__SY_NONE, DISTRO_SYNC_E_MALFORMED, 0, DISTRO__SY_NONE, 0, "%d frames (want header [payload])",
           fr->n - 1 + fr->truncated);
    return;
  }
  const uint8_t *hdr = fr->data[1], *pl = fr->n == 3 ? fr->data[2] : NULL;
  const size_t pn = fr->n == 3 ? fr->size[2] : 0;
  const uint32_t claimed = fr->size[1] >= 12 ? distro__get_u32(hdr + 8) : DISTRO__SY_NONE;
  int code = distro__sy_peek(hdr, fr->size[1], pn, &m, why, sizeof why);
  if (code) {
    reject(s, r, claimed, code, 0, DISTRO__SY_NONE, 0, "%s", why);
    return;
  }
  const int64_t cap = payload_cap(s, m.type);
  if (cap < 0) {
    reject(s, r, m.learner, DISTRO_SYNC_E_MALFORMED, m.type, DISTRO__SY_NONE, 0, "%s is not sent to the syncer",
           distro__sy_type_name(m.type));
    return;
  }
  if ((int64_t)pn > cap) {
    reject(s, r, m.learner, DISTRO_SYNC_E_MALFORMED, m.type, DISTRO__SY_NONE, 0,
           "%s payload of %zu bytes (at most %lld here)", distro__sy_type_name(m.type), pn, (long long)cap);
    return;
  }
  code = distro__sy_verify(hdr, pl, pn, &m, why, sizeof why);
  if (code) {
    reject(s, r, m.learner, code, m.type, DISTRO__SY_NONE, 0, "%s", why);
    return;
  }
  if (m.type == DISTRO__SY_HELLO) {
    on_hello(s, r, &m, pl, pn, fr->user, now);
    return;
  }
  sy_learner *l = authenticate(s, r, &m);
  if (m.type == DISTRO__SY_BYE) {
    if (l) {
      l->alive = 0;
      l->ready = 0;
      distro__syncer_log(s, "learner %u says goodbye", (unsigned)m.learner);
    }
    return;
  }
  if (!l) {
    reject(s, r, m.learner, DISTRO_SYNC_E_UNKNOWN, m.type, m.fragment, m.a,
           "learner %u has not joined, timed out, or belongs to another connection; say hello", (unsigned)m.learner);
    return;
  }
  l->last_seen = now;
  if (m.type == DISTRO__SY_SEED) {
    on_seed(s, r, l, &m, pl, pn, now);
    return;
  }
  if (!s->initialized) {
    reject(s, r, m.learner, DISTRO_SYNC_E_NOT_READY, m.type, m.fragment, m.a, "no global copy yet");
    return;
  }
  switch (m.type) {
    case DISTRO__SY_HEARTBEAT:
      if (m.b & ~(uint64_t)DISTRO__SY_HB_READY) {
        reject(s, r, m.learner, DISTRO_SYNC_E_MALFORMED, m.type, DISTRO__SY_NONE, 0,
               "HEARTBEAT with unknown flag bits 0x%llx", (unsigned long long)m.b);
        break;
      }
      note_step_time(l, m.e);
      if (m.a > l->hb_steps) l->hb_steps = m.a;
      if ((m.b & DISTRO__SY_HB_READY) && !l->ready) {
        l->ready = 1;
        distro__syncer_log(s, "learner %u is ready (serves its state at %s)", (unsigned)m.learner, l->endpoint);
      }
      break;
    case DISTRO__SY_FETCH: on_fetch(s, r, l, m.learner, now); break;
    case DISTRO__SY_UPLOAD: on_upload(s, r, l, &m, pl, pn); break;
    case DISTRO__SY_REPORT: on_report(s, r, l, &m, pl, pn); break;
    default: break;
  }
}

distro_status distro_syncer_run(distro_syncer *s) {
  if (!s) return distro__fail(DISTRO_ERR_INVALID, "syncer is NULL");
  zmq_pollitem_t items[2] = {{s->router, 0, ZMQ_POLLIN, 0}, {s->zap, 0, ZMQ_POLLIN, 0}};
  const int nitems = s->zap ? 2 : 1;
  s->next_hb = 0;
  s->next_open = distro__sy_now();
  s->t_progress = s->next_open;
  s->fetch_t = s->next_open;
  s->fetch_tokens = 4;
  distro__syncer_log(s, "syncer epoch %llu serving on %s%s", (unsigned long long)s->epoch, s->endpoint,
                     s->curve ? (s->nallowed ? " (CURVE, allowed keys only)" : " (CURVE)") : " (no CURVE)");
  while (!atomic_load(&s->stop)) {
    if (zmq_poll(items, nitems, 5) < 0 && zmq_errno() != EINTR)
      return distro__fail(DISTRO_ERR_COMM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
    if (s->zap) {
      const int refused = distro__sy_zap_serve(s->zap, s->allowed, s->nallowed);
      if (refused) distro__syncer_log(s, "refused %d connection(s): CURVE client key not allowed", refused);
    }
    double now = distro__sy_now();
    for (int budget = 0; budget < 256; budget++) {
      distro__sy_frames fr;
      const int got = distro__sy_recv(s->router, &fr);
      if (got <= 0) break;
      handle(s, &fr, now);
      distro__sy_frames_free(&fr);
    }
    distro__syncer_tick(s, distro__sy_now());
  }
  return DISTRO_OK;
}
