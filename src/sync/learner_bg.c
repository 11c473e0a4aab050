/* The learner's background thread: it owns every ZeroMQ socket (the DEALER
 * to the syncer, the ROUTER serving this learner's state to joining peers,
 * a DEALER to a peer while joining) and exchanges data with the training
 * thread through buffers under the learner's mutex (docs/protocol.md).
 *
 * What it takes from the network is checked before use: the header and a
 * per-type size cap before the CRC, the body's fields, finite values; and a
 * peer's state only where it matches the syncer's SHA-256 digest of that
 * fragment and version (else the peer is refused and the next one, or the
 * syncer, asked). Its state endpoint answers at most a few requests per
 * second with a bounded send queue. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "sync/learner_bg.h"
#include "sync/learner_state.h"

/* The state endpoint: burst and refill (answers per second). */
#define SERVE_BURST 2.0
#define SERVE_RATE 0.5
/* Seconds a join step (a peer's answer, the syncer's STATE) may take: a
 * third of the learner's join_timeout_s, so a dead peer and then the syncer
 * both fit in it, but never under 3 s. A fixed 3 s failed every join over
 * 10 Mbit/s links once the state passed ~3 MB (bench/wan). */
#define JOIN_STEP_MIN_S 3.0
static double join_step_s(const distro_learner *l) {
  return fmax(JOIN_STEP_MIN_S, l->opt.join_timeout_s / 3.0);
}

typedef struct bg {
  distro_learner *l;
  void *ctx, *dealer, *server, *peer, *zap;
  char pub[41], sec[41], server_pub[41];
  int curve;
  char serve_ep[256];
  uint64_t epoch;
  double last_heard, next_hb, t_join_step, next_hello;
  int has_state; /* joined once: hellos carry the versions */
  /* The join from peers: the WELCOME's versions and digests, its peers,
   * which one is asked, which fragments hold checked values. */
  uint64_t *w_version;
  uint8_t *w_hash, *have;
  distro__sy_peer peers[DISTRO__SY_MAX_PEERS];
  int npeers, peer_k, peer_answered;
  /* The state endpoint's rate limit; stall reports. */
  double srv_tokens, srv_t;
  double gap_ema, next_stall_log;
} bg;

static void set_join(distro_learner *l, int state, distro_status st, const char *msg) {
  pthread_mutex_lock(&l->mu);
  l->join_state = state;
  l->join_st = st;
  if (msg) snprintf(l->join_msg, sizeof l->join_msg, "%s", msg);
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static void set_state(distro_learner *l, int state) {
  pthread_mutex_lock(&l->mu);
  l->join_state = state;
  pthread_mutex_unlock(&l->mu);
}

static void send_syncer(bg *b, distro__sy_msg *m, const void *payload) {
  m->learner = (uint32_t)b->l->opt.learner_id;
  m->epoch = b->epoch;
  if (distro__sy_send(b->dealer, NULL, 0, m, payload) == 0) {
    pthread_mutex_lock(&b->l->mu);
    b->l->bytes_up += DISTRO__SY_HEADER + m->payload_bytes;
    pthread_mutex_unlock(&b->l->mu);
  }
}

static void send_hello(bg *b, double now) {
  distro_learner *l = b->l;
  const int P = b->has_state ? l->L.P : 0;
  const size_t el = strlen(b->serve_ep), kl = b->curve ? 40 : 0;
  const size_t n = 4 + 12 * (size_t)l->nt + 4 + 8 * (size_t)P + 2 + el + 2 + kl;
  uint8_t *buf = malloc(n), *p = buf;
  if (!buf) return;
  distro__put_u32(p, (uint32_t)l->nt), p += 4;
  for (int i = 0; i < l->nt; i++) {
    distro__put_u64(p, (uint64_t)l->t[i].numel), p += 8;
    distro__put_u32(p, l->t[i].flags), p += 4;
  }
  distro__put_u32(p, (uint32_t)P), p += 4;
  pthread_mutex_lock(&l->mu);
  for (int k = 0; k < P; k++) distro__put_u64(p, l->in_version[k]), p += 8;
  pthread_mutex_unlock(&l->mu);
  p[0] = (uint8_t)el, p[1] = (uint8_t)(el >> 8), p += 2;
  memcpy(p, b->serve_ep, el), p += el;
  p[0] = (uint8_t)kl, p[1] = 0, p += 2;
  if (kl) memcpy(p, b->pub, kl);
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_HELLO;
  m.fragment = DISTRO__SY_NONE;
  m.a = l->signature;
  m.b = b->has_state ? DISTRO__SY_HELLO_HAS_STATE : 0u;
  m.c = l->opt.tokens_per_step;
  m.payload_bytes = (uint32_t)n;
  send_syncer(b, &m, buf);
  free(buf);
  b->next_hello = now + 1.0;
}

static int all_finite(const uint8_t *p, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    float v;
    memcpy(&v, p + 4 * j, 4);
    if (!isfinite(v)) return 0;
  }
  return 1;
}

/* The join finished: source 1 peer, 2 syncer, 3 seeded. */
static void joined(bg *b, int source, double now) {
  pthread_mutex_lock(&b->l->mu);
  b->l->join_source = source;
  b->l->t_last_merge = now;
  pthread_mutex_unlock(&b->l->mu);
  b->has_state = 1;
  if (b->peer) zmq_close(b->peer);
  b->peer = NULL;
  set_join(b->l, J_DONE, DISTRO_OK, NULL);
  distro__ln_log(b->l, "joined (%s)",
                 source == 1 ? "state pulled from a peer, checked against the syncer's digests"
                 : source == 2 ? "state fetched from the syncer"
                               : "seeded the syncer");
}

/* Copies the fragments of a STATE body marked in `use` (NULL: all) that
 * this learner lacks or holds at an older version. */
static void copy_state(distro_learner *l, bg *b, const uint8_t *pl, size_t pn, const uint8_t *use) {
  const int P = l->L.P;
  pthread_mutex_lock(&l->mu);
  for (int p = 0; p < P; p++) {
    const uint64_t v = distro__get_u64(pl + 8 * (size_t)p);
    if ((use && !use[p]) || (b->have[p] && l->in_version[p] >= v)) continue;
    memcpy(l->incoming + l->L.frag_off[p], pl + 8 * (size_t)P + 4 * (size_t)l->L.frag_off[p],
           4 * (size_t)l->L.frags.numel[p]);
    l->in_version[p] = v;
    b->have[p] = 1;
  }
  l->bytes_down += pn + DISTRO__SY_HEADER;
  pthread_mutex_unlock(&l->mu);
}

/* STATE from the syncer (FETCH): the whole copy, finite. */
static int take_syncer_state(distro_learner *l, bg *b, const uint8_t *pl, size_t pn) {
  const int P = l->L.P;
  if (pn != 8 * (size_t)P + 4 * (size_t)l->L.total || !all_finite(pl + 8 * (size_t)P, l->L.total)) return -1;
  copy_state(l, b, pl, pn, NULL);
  return 0;
}

static int have_all(const bg *b) {
  for (int p = 0; p < b->l->L.P; p++)
    if (!b->have[p]) return 0;
  return 1;
}

static const uint8_t zero32[32];

/* A peer's STATE: every value finite, and every fragment whose version the
 * WELCOME has a digest for (the syncer's current or previous) equal to it.
 * Fragments at a version the digests do not cover (merged since the
 * WELCOME) are left to the FRAGMENT the syncer sends us. Returns 0, or -1
 * with the reason: the whole state is then refused. */
static int take_peer_state(distro_learner *l, bg *b, const uint8_t *pl, size_t pn, char *why, size_t why_n) {
  const int P = l->L.P;
  if (pn != 8 * (size_t)P + 4 * (size_t)l->L.total) {
    snprintf(why, why_n, "STATE of %zu bytes, want %zu", pn, 8 * (size_t)P + 4 * (size_t)l->L.total);
    return -1;
  }
  if (!all_finite(pl + 8 * (size_t)P, l->L.total)) {
    snprintf(why, why_n, "non-finite values");
    return -1;
  }
  uint8_t *use = calloc((size_t)P, 1);
  if (!use) {
    snprintf(why, why_n, "out of memory");
    return -1;
  }
  for (int p = 0; p < P; p++) {
    const uint64_t v = distro__get_u64(pl + 8 * (size_t)p);
    const uint8_t *want = NULL;
    if (v == b->w_version[p]) want = b->w_hash + 64 * (size_t)p;
    else if (v + 1 == b->w_version[p]) want = b->w_hash + 64 * (size_t)p + 32;
    if (want && memcmp(want, zero32, 32) == 0) want = NULL;
    if (!want) continue; /* not checkable: the syncer's FRAGMENT will bring it */
    uint8_t got[32];
    distro__sy_hash((const float *)(const void *)(pl + 8 * (size_t)P + 4 * (size_t)l->L.frag_off[p]),
                    l->L.frags.numel[p], got);
    if (memcmp(got, want, 32) != 0) {
      snprintf(why, why_n, "fragment %d version %llu does not match the syncer's digest", p, (unsigned long long)v);
      free(use);
      return -1;
    }
    use[p] = 1;
  }
  copy_state(l, b, pl, pn, use);
  free(use);
  return 0;
}

static void send_state_to(bg *b, const void *rid, size_t rid_n, uint32_t to, double now) {
  distro_learner *l = b->l;
  const int P = l->L.P;
  pthread_mutex_lock(&l->mu);
  const int ready = l->have_layout && l->join_state == J_DONE;
  pthread_mutex_unlock(&l->mu);
  if (!ready) {
    distro__sy_send_error(b->server, rid, rid_n, 0, to, DISTRO_SYNC_E_NOT_READY, DISTRO__SY_GET_STATE,
                          "this learner has not joined yet");
    return;
  }
  /* Each answer is 4 N bytes: a few per second, whoever asks. */
  b->srv_tokens += (now - b->srv_t) * SERVE_RATE;
  if (b->srv_tokens > SERVE_BURST) b->srv_tokens = SERVE_BURST;
  b->srv_t = now;
  if (b->srv_tokens < 1) {
    distro__sy_send_error(b->server, rid, rid_n, 0, to, DISTRO_SYNC_E_NOT_READY, DISTRO__SY_GET_STATE,
                          "busy: state requests are rate-limited; ask another peer or the syncer");
    return;
  }
  b->srv_tokens -= 1;
  const size_t n = 8 * (size_t)P + 4 * (size_t)l->L.total;
  uint8_t *buf = malloc(n);
  if (!buf) return;
  pthread_mutex_lock(&l->mu);
  for (int p = 0; p < P; p++) distro__put_u64(buf + 8 * (size_t)p, l->in_version[p]);
  memcpy(buf + 8 * (size_t)P, l->incoming, 4 * (size_t)l->L.total);
  pthread_mutex_unlock(&l->mu);
  const distro__sy_msg m = distro__sy_state_msg(to, P, n);
  distro__sy_send(b->server, rid, rid_n, &m, buf);
  free(buf);
  distro__ln_log(l, "served its state to learner %u", (unsigned)to);
}

static void *connect_dealer(bg *b, const char *ep, const char *server_pub, int64_t max_msg) {
  void *s = zmq_socket(b->ctx, ZMQ_DEALER);
  if (!s) return NULL;
  int ivl = 100;
  distro__sy_sockopts(s, 1000, max_msg);
  zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
  if (b->curve) {
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_pub, 41);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, b->pub, 41);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, b->sec, 41);
  }
  if (zmq_connect(s, ep) != 0) {
    zmq_close(s);
    return NULL;
  }
  return s;
}

/* Asks the syncer itself for the global copy. */
static void start_fetch(bg *b, double now) {
  distro__sy_msg f = {0};
  f.type = DISTRO__SY_FETCH;
  f.fragment = DISTRO__SY_NONE;
  send_syncer(b, &f, NULL);
  b->t_join_step = now;
  set_state(b->l, J_FETCH);
}

/* The next peer of the WELCOME (from b->peer_k), else the syncer. */
static void next_peer(bg *b, double now) {
  distro_learner *l = b->l;
  if (b->peer) zmq_close(b->peer);
  b->peer = NULL;
  for (; b->peer_k < b->npeers; b->peer_k++) {
    const distro__sy_peer *q = &b->peers[b->peer_k];
    if (b->curve != (q->key[0] != 0)) continue; /* never plain text in a CURVE job, nor the reverse */
    b->peer = connect_dealer(b, q->endpoint, q->key, 8 * (int64_t)l->L.P + 4 * l->L.total + DISTRO__SY_MAX_ERROR + 64);
    if (!b->peer) continue;
    distro__sy_msg g = {0};
    g.type = DISTRO__SY_GET_STATE;
    g.learner = (uint32_t)l->opt.learner_id;
    g.fragment = DISTRO__SY_NONE;
    distro__sy_send(b->peer, NULL, 0, &g, NULL);
    b->t_join_step = now;
    b->peer_answered = 0;
    set_state(l, J_PEER);
    distro__ln_log(l, "pulls the state from learner %u at %s", (unsigned)q->id, q->endpoint);
    b->peer_k++;
    return;
  }
  start_fetch(b, now);
}

static void seed(bg *b, uint32_t P) {
  /* The parameters (first join, the training thread waits in start()) or
   * the global copy held (rejoin). */
  distro_learner *l = b->l;
  const size_t n = 8 * (size_t)P + 4 * (size_t)l->L.total;
  uint8_t *buf = malloc(n);
  if (!buf) return;
  pthread_mutex_lock(&l->mu);
  for (uint32_t p = 0; p < P; p++) {
    distro__put_u64(buf + 8 * (size_t)p, b->has_state ? l->in_version[p] : 0);
    if (b->has_state)
      memcpy(buf + 8 * (size_t)P + 4 * (size_t)l->L.frag_off[p], l->incoming + l->L.frag_off[p],
             4 * (size_t)l->L.frags.numel[p]);
    else
      distro__sy_gather(&l->L, (int)p, l->tp, (float *)(void *)(buf + 8 * (size_t)P + 4 * (size_t)l->L.frag_off[p]));
  }
  pthread_mutex_unlock(&l->mu);
  distro__sy_msg s = {0};
  s.type = DISTRO__SY_SEED;
  s.fragment = DISTRO__SY_NONE;
  s.payload_bytes = (uint32_t)n;
  send_syncer(b, &s, buf);
  free(buf);
  if (!b->has_state) set_state(l, J_SEEDING);
  distro__ln_log(l, "seeds the syncer");
}

/* Rejoin (the syncer restarted or timed us out): upload what is newer. */
static void upload_newer(bg *b, const uint8_t *vers, uint32_t P) {
  distro_learner *l = b->l;
  for (uint32_t p = 0; p < P; p++) {
    const uint64_t sv = distro__get_u64(vers + 8 * (size_t)p);
    pthread_mutex_lock(&l->mu);
    const uint64_t mine = l->in_version[p];
    pthread_mutex_unlock(&l->mu);
    if (mine <= sv) continue;
    const size_t n = 4 * (size_t)l->L.frags.numel[p];
    float *buf = malloc(n);
    if (!buf) continue;
    pthread_mutex_lock(&l->mu);
    memcpy(buf, l->incoming + l->L.frag_off[p], n);
    pthread_mutex_unlock(&l->mu);
    distro__sy_msg u = {0};
    u.type = DISTRO__SY_UPLOAD;
    u.fragment = p;
    u.b = mine;
    u.payload_bytes = (uint32_t)n;
    send_syncer(b, &u, buf);
    free(buf);
    distro__ln_log(l, "uploads fragment %u version %llu (syncer has %llu)", (unsigned)p, (unsigned long long)mine,
                   (unsigned long long)sv);
  }
}

static void on_welcome(bg *b, const distro__sy_msg *m, const uint8_t *pl, size_t pn, double now) {
  distro_learner *l = b->l;
  distro__sy_welcome w;
  char why[300];
  if (distro__sy_parse_welcome(pl, pn, &w, why, sizeof why) != 0 ||
      (m->b & ~(uint64_t)(DISTRO__SY_WELCOME_SEED | DISTRO__SY_WELCOME_SEEDED | DISTRO__SY_WELCOME_FETCH))) {
    distro__ln_log(l, "dropped a WELCOME: %s", m->b > 7 ? "unknown flag bits" : why);
    return;
  }
  b->epoch = m->epoch;
  b->last_heard = now;
  const uint32_t P = w.P;
  if (!l->have_layout) {
    int64_t *numel = malloc(sizeof *numel * (size_t)l->nt);
    unsigned *flags = malloc(sizeof *flags * (size_t)l->nt);
    distro_status st = DISTRO_ERR_NOMEM;
    if (numel && flags) {
      for (int i = 0; i < l->nt; i++) numel[i] = l->t[i].numel, flags[i] = l->t[i].flags;
      pthread_mutex_lock(&l->mu);
      st = distro__sy_layout_build(&l->L, l->nt, numel, flags, l->signature, (int)P, (distro_fragmenting)w.fragmenting,
                                   w.max_block, (distro_outer_codec)w.codec, (int)w.block);
      if (st == DISTRO_OK) st = distro__ln_alloc_buffers(l);
      if (st == DISTRO_OK) l->have_layout = 1, l->tau = (int)w.tau, l->fr = (int)w.fragmenting, l->maxb = w.max_block;
      pthread_mutex_unlock(&l->mu);
    }
    free(numel);
    free(flags);
    if (st != DISTRO_OK) {
      snprintf(why, sizeof why, "cannot lay out the model with the syncer's settings: %s", distro_last_error());
      set_join(l, J_FAILED, DISTRO_ERR_SHAPE, why);
      return;
    }
    b->w_version = calloc(P, 8);
    b->w_hash = calloc(P, 64);
    b->have = calloc(P, 1);
    if (!b->w_version || !b->w_hash || !b->have) {
      set_join(l, J_FAILED, DISTRO_ERR_NOMEM, "out of memory");
      return;
    }
  } else if ((int)P != l->L.P || (int)w.codec != (int)l->L.codec || (int)w.block != l->L.block) {
    set_join(l, J_FAILED, DISTRO_ERR_SHAPE, "the syncer's fragment settings changed");
    return;
  }
  if (m->b & DISTRO__SY_WELCOME_SEED) {
    seed(b, P);
    return;
  }
  if (m->b & DISTRO__SY_WELCOME_SEEDED) {
    if (!b->has_state) {
      pthread_mutex_lock(&l->mu);
      for (uint32_t p = 0; p < P; p++) {
        l->in_version[p] = distro__get_u64(w.versions + 8 * (size_t)p);
        distro__sy_gather(&l->L, (int)p, l->tp, l->incoming + l->L.frag_off[p]);
      }
      pthread_mutex_unlock(&l->mu);
      joined(b, 3, now);
    }
    return;
  }
  if (b->has_state) {
    upload_newer(b, w.versions, P);
    distro__ln_log(l, "rejoined (syncer epoch %llu)", (unsigned long long)m->epoch);
    return;
  }
  /* A fresh join: remember what the syncer vouches for, then ask the peers in turn. */
  for (uint32_t p = 0; p < P; p++) b->w_version[p] = distro__get_u64(w.versions + 8 * (size_t)p);
  memcpy(b->w_hash, w.hashes, 64 * (size_t)P);
  b->npeers = (m->b & DISTRO__SY_WELCOME_FETCH) ? 0 : w.npeers;
  memcpy(b->peers, w.peer, sizeof w.peer);
  b->peer_k = 0;
  next_peer(b, now);
}

/* The largest payload of each type a learner takes from the syncer (0:
 * none); -1: not a type the syncer sends. */
static int64_t syncer_cap(const distro_learner *l, int type) {
  switch (type) {
    case DISTRO__SY_WELCOME: return DISTRO__SY_WELCOME_MAX;
    case DISTRO__SY_REQUEST:
    case DISTRO__SY_HEARTBEAT: return 0;
    case DISTRO__SY_ERROR: return DISTRO__SY_MAX_ERROR;
    case DISTRO__SY_FRAGMENT: return l->have_layout ? 4 * l->L.maxf : 0;
    case DISTRO__SY_STATE: return l->have_layout ? 8 * (int64_t)l->L.P + 4 * l->L.total : 0;
  }
  return -1;
}

/* Checks a message from the syncer or a peer: header, type, size cap, CRC. */
static int accept_msg(distro_learner *l, distro__sy_frames *fr, int from_peer, distro__sy_msg *m, char *why,
                      size_t why_n) {
  if (fr->n < 1 || fr->n > 2 || fr->truncated) {
    snprintf(why, why_n, "%d frames", fr->n + fr->truncated);
    return -1;
  }
  const size_t pn = fr->n == 2 ? fr->size[1] : 0;
  if (distro__sy_peek(fr->data[0], fr->size[0], pn, m, why, why_n) != 0) return -1;
  int64_t cap = syncer_cap(l, m->type);
  if (from_peer && m->type != DISTRO__SY_STATE && m->type != DISTRO__SY_ERROR) cap = -1;
  if (cap < 0 || (int64_t)pn > cap) {
    snprintf(why, why_n, "%s with %zu payload bytes is not accepted here", distro__sy_type_name(m->type), pn);
    return -1;
  }
  return distro__sy_verify(fr->data[0], fr->n == 2 ? fr->data[1] : NULL, pn, m, why, why_n) ? -1 : 0;
}

static void on_fragment(bg *b, const distro__sy_msg *m, const uint8_t *pl, size_t pn, double now) {
  distro_learner *l = b->l;
  if (!l->have_layout || m->fragment >= (uint32_t)l->L.P || pn != 4 * (size_t)l->L.frags.numel[m->fragment]) return;
  const uint32_t p = m->fragment;
  if (!all_finite(pl, l->L.frags.numel[p])) {
    distro__ln_log(l, "dropped fragment %u version %llu from the syncer: non-finite values", (unsigned)p,
                   (unsigned long long)m->b);
    return;
  }
  pthread_mutex_lock(&l->mu);
  if (m->b > l->in_version[p] || !b->have[p]) {
    memcpy(l->incoming + l->L.frag_off[p], pl, pn);
    l->in_version[p] = m->b;
    l->in_new[p] = 1;
    b->have[p] = 1;
    const double gap = now - l->t_last_merge;
    if (l->t_last_merge > 0) b->gap_ema = b->gap_ema > 0 ? 0.9 * b->gap_ema + 0.1 * gap : gap;
    l->t_last_merge = now;
  }
  if (m->d > l->in_newest[p]) l->in_newest[p] = m->d;
  l->bytes_down += pn + DISTRO__SY_HEADER;
  const int js = l->join_state;
  pthread_mutex_unlock(&l->mu);
  /* A join from a peer waits for the fragments merged since the WELCOME. */
  if (js == J_PEER && b->peer_answered && have_all(b)) joined(b, 1, now);
}

static void on_syncer_msg(bg *b, distro__sy_frames *fr, double now) {
  distro_learner *l = b->l;
  distro__sy_msg m;
  char why[256];
  if (accept_msg(l, fr, 0, &m, why, sizeof why) != 0) {
    distro__ln_log(l, "dropped a message from the syncer: %s", why);
    return;
  }
  const uint8_t *pl = fr->n == 2 ? fr->data[1] : NULL;
  const size_t pn = fr->n == 2 ? fr->size[1] : 0;
  b->last_heard = now;
  pthread_mutex_lock(&l->mu);
  l->connected = 1;
  pthread_mutex_unlock(&l->mu);
  if (m.type == DISTRO__SY_WELCOME) {
    on_welcome(b, &m, pl, pn, now);
    return;
  }
  if (b->has_state && m.type != DISTRO__SY_ERROR && b->epoch && m.epoch != b->epoch) {
    distro__ln_log(l, "syncer epoch changed %llu -> %llu: says hello again", (unsigned long long)b->epoch,
                   (unsigned long long)m.epoch);
    b->epoch = m.epoch;
    pthread_mutex_lock(&l->mu);
    l->rejoins++;
    pthread_mutex_unlock(&l->mu);
    send_hello(b, now);
    return;
  }
  switch (m.type) {
    case DISTRO__SY_REQUEST:
      if (b->has_state && m.fragment < (uint32_t)l->L.P && m.a > 0 && m.a < ((uint64_t)1 << 48)) {
        pthread_mutex_lock(&l->mu);
        l->req_round[m.fragment] = m.a;
        pthread_mutex_unlock(&l->mu);
      }
      break;
    case DISTRO__SY_FRAGMENT: on_fragment(b, &m, pl, pn, now); break;
    case DISTRO__SY_STATE:
      if (l->have_layout && l->join_state == J_FETCH) {
        if (take_syncer_state(l, b, pl, pn) == 0) joined(b, 2, now);
        else distro__ln_log(l, "dropped a STATE from the syncer of %zu bytes (size or non-finite values)", pn);
      }
      break;
    case DISTRO__SY_ERROR: {
      char msg[DISTRO__SY_MAX_ERROR + 1];
      for (size_t i = 0; i < pn; i++) msg[i] = pl[i] >= 0x20 && pl[i] < 0x7f ? (char)pl[i] : '?';
      msg[pn] = 0;
      pthread_mutex_lock(&l->mu);
      l->errors++;
      l->last_error = (int)m.a;
      if (m.b == DISTRO__SY_REPORT && l->have_layout && m.fragment < (uint32_t)l->L.P &&
          (m.a == DISTRO_SYNC_E_STALE || m.a == DISTRO_SYNC_E_ROUND || m.a == DISTRO_SYNC_E_PAYLOAD ||
           m.a == DISTRO_SYNC_E_REFUSED))
        l->rej_round[m.fragment] = m.c;
      const int js = l->join_state;
      pthread_mutex_unlock(&l->mu);
      distro__ln_log(l, "error reply %s to %s: %s", distro_sync_error_name((int)m.a), distro__sy_type_name((int)m.b), msg);
      /* Permanent while joining: saying hello again cannot change the answer. */
      const int model = m.a == DISTRO_SYNC_E_SIGNATURE;
      if (js != J_DONE && (model || ((m.a == DISTRO_SYNC_E_REFUSED || m.a == DISTRO_SYNC_E_PROTOCOL) &&
                                     m.b == DISTRO__SY_HELLO))) {
        char j[DISTRO__SY_MAX_ERROR + 64];
        snprintf(j, sizeof j, "the syncer refused this %s: %s", model ? "model" : "learner", msg);
        set_join(l, J_FAILED, distro_sync_error_status((int)m.a), j);
      } else if (m.a == DISTRO_SYNC_E_NOT_READY && js != J_DONE) {
        b->next_hello = now + 0.2;
        if (js == J_FETCH) b->t_join_step = now - join_step_s(l) + 1.0; /* rate-limited: hello again in 1 s */
      } else if (m.a == DISTRO_SYNC_E_UNKNOWN && b->has_state) {
        pthread_mutex_lock(&l->mu);
        l->rejoins++;
        pthread_mutex_unlock(&l->mu);
        send_hello(b, now);
      }
      break;
    }
    default: break;
  }
}

static void on_peer_msg(bg *b, distro__sy_frames *fr, double now) {
  distro_learner *l = b->l;
  distro__sy_msg m;
  char why[256];
  if (b->peer_answered) return;
  const int ok = accept_msg(l, fr, 1, &m, why, sizeof why) == 0;
  const uint8_t *pl = fr->n == 2 ? fr->data[1] : NULL;
  const size_t pn = fr->n == 2 ? fr->size[1] : 0;
  const distro__sy_peer *q = &b->peers[b->peer_k - 1];
  if (ok && m.type == DISTRO__SY_STATE && l->join_state == J_PEER) {
    if (take_peer_state(l, b, pl, pn, why, sizeof why) == 0) {
      b->peer_answered = 1;
      b->t_join_step = now; /* now waits for the FRAGMENTs it could not check, if any */
      if (have_all(b)) joined(b, 1, now);
      return;
    }
    pthread_mutex_lock(&l->mu);
    l->forged++;
    pthread_mutex_unlock(&l->mu);
    distro__ln_log(l, "refused the state of learner %u at %s: %s; asks the next peer", (unsigned)q->id, q->endpoint,
                   why);
  } else {
    distro__ln_log(l, "learner %u at %s did not serve its state (%s)", (unsigned)q->id, q->endpoint,
                   ok ? distro__sy_type_name(m.type) : why);
  }
  if (l->join_state == J_PEER) next_peer(b, now);
}

static void on_server_msg(bg *b, distro__sy_frames *fr, double now) {
  distro__sy_msg m;
  char why[256];
  if (fr->n != 2 || fr->truncated) return; /* GET_STATE is a header alone */
  if (distro__sy_decode(fr->data[1], fr->size[1], NULL, 0, &m, why, sizeof why) != 0) {
    distro__sy_send_error(b->server, fr->data[0], fr->size[0], 0, DISTRO__SY_NONE, DISTRO_SYNC_E_MALFORMED, 0, why);
    return;
  }
  if (m.type == DISTRO__SY_GET_STATE) send_state_to(b, fr->data[0], fr->size[0], m.learner, now);
}

static void flush_out(bg *b) {
  distro_learner *l = b->l;
  pthread_mutex_lock(&l->mu);
  ln_out *q = l->out_head;
  l->out_head = l->out_tail = NULL;
  pthread_mutex_unlock(&l->mu);
  while (q) {
    ln_out *next = q->next;
    if (q->m.type == DISTRO__SY_REPORT) {
      /* The syncer holds a report's steps to this learner's step counter
       * (docs/protocol.md, "Honest token weights"): the counter at the
       * report's own step goes first. */
      distro__sy_msg h = {0};
      h.type = DISTRO__SY_HEARTBEAT;
      h.fragment = DISTRO__SY_NONE;
      h.a = q->step;
      h.b = DISTRO__SY_HB_READY;
      pthread_mutex_lock(&l->mu);
      h.e = l->hb_step_s;
      pthread_mutex_unlock(&l->mu);
      send_syncer(b, &h, NULL);
    }
    send_syncer(b, &q->m, q->payload);
    free(q->payload);
    free(q);
    q = next;
  }
}

static int bg_setup(bg *b) {
  distro_learner *l = b->l;
  b->ctx = zmq_ctx_new();
  if (!b->ctx) return distro__fail(DISTRO_ERR_COMM, "zmq_ctx_new failed"), -1;
  if (l->opt.curve_keypair) {
    if (distro__sy_read_key(l->opt.curve_keypair, b->pub, b->sec) != DISTRO_OK) return -1;
    if (distro__sy_read_key(l->opt.curve_server_key, b->server_pub, NULL) != DISTRO_OK) return -1;
    b->curve = 1;
    if (l->nallowed) {
      b->zap = zmq_socket(b->ctx, ZMQ_REP);
      if (!b->zap || zmq_bind(b->zap, "inproc://zeromq.zap.01") != 0)
        return distro__fail(DISTRO_ERR_COMM, "ZAP handler: %s", zmq_strerror(errno)), -1;
    }
  }
  /* From the syncer: WELCOME, FRAGMENT, STATE (8 P + 4 N), nothing larger. */
  b->dealer = connect_dealer(b, l->opt.syncer, b->server_pub,
                             DISTRO__SY_WELCOME_MAX + 8 * (int64_t)DISTRO__SY_MAX_FRAGMENTS + 4 * l->total);
  if (!b->dealer) return distro__fail(DISTRO_ERR_COMM, "cannot connect to '%s': %s", l->opt.syncer, zmq_strerror(errno)), -1;
  b->server = zmq_socket(b->ctx, ZMQ_ROUTER);
  if (!b->server) return distro__fail(DISTRO_ERR_COMM, "zmq_socket: %s", zmq_strerror(errno)), -1;
  /* Requests are bare headers; a couple of answers queue per client at most. */
  distro__sy_sockopts(b->server, 2, 1024);
  if (b->curve) {
    int one = 1;
    zmq_setsockopt(b->server, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(b->server, ZMQ_CURVE_SECRETKEY, b->sec, 41);
  }
  if (zmq_bind(b->server, l->opt.serve_endpoint) != 0)
    return distro__fail(DISTRO_ERR_COMM, "cannot bind '%s': %s", l->opt.serve_endpoint, zmq_strerror(errno)), -1;
  size_t len = sizeof b->serve_ep;
  if (zmq_getsockopt(b->server, ZMQ_LAST_ENDPOINT, b->serve_ep, &len) != 0) b->serve_ep[0] = 0;
  return 0;
}

/* No merged fragment for long (past what this job's merge rhythm makes
 * normal): the training goes on, but say so. */
static void stall_check(bg *b, double now) {
  distro_learner *l = b->l;
  pthread_mutex_lock(&l->mu);
  const double last = l->t_last_merge;
  const int connected = l->connected;
  pthread_mutex_unlock(&l->mu);
  if (!b->has_state || last <= 0 || !l->have_layout) return;
  const double by_rhythm = 3 * l->L.P * b->gap_ema, by_timeout = 5 * l->opt.timeout_s;
  const double bound = by_rhythm > by_timeout ? by_rhythm : by_timeout;
  if (now - last < bound || now < b->next_stall_log) return;
  distro__ln_log(l, "no merge for %.1f s (syncer %s); keeps training", now - last,
                 connected ? "reachable: its rounds do not complete" : "silent");
  b->next_stall_log = now + bound;
}

void *distro__ln_bg_main(void *arg) {
  bg b;
  memset(&b, 0, sizeof b);
  b.l = arg;
  distro_learner *l = b.l;
  if (bg_setup(&b) != 0) {
    set_join(l, J_FAILED, DISTRO_ERR_COMM, distro_last_error());
    goto out;
  }
  double now = distro__sy_now();
  b.last_heard = now;
  b.srv_t = now;
  b.srv_tokens = SERVE_BURST;
  send_hello(&b, now);
  set_state(l, J_HELLO);
  for (;;) {
    pthread_mutex_lock(&l->mu);
    const int stop = l->stop;
    const int js = l->join_state;
    pthread_mutex_unlock(&l->mu);
    if (stop) break;
    zmq_pollitem_t it[4] = {{b.dealer, 0, ZMQ_POLLIN, 0}, {b.server, 0, ZMQ_POLLIN, 0}, {b.zap, 0, ZMQ_POLLIN, 0},
                            {b.peer, 0, ZMQ_POLLIN, 0}};
    if (!b.zap) it[2] = it[3], it[3].socket = NULL;
    const int nit = 2 + (b.zap != NULL) + (b.peer != NULL);
    zmq_poll(it, nit, 5);
    now = distro__sy_now();
    if (b.zap) {
      const int refused = distro__sy_zap_serve(b.zap, l->allowed, l->nallowed);
      if (refused) distro__ln_log(l, "refused %d connection(s) to its state endpoint: key not allowed", refused);
    }
    distro__sy_frames fr;
    for (int k = 0; k < 256 && distro__sy_recv(b.dealer, &fr) > 0; k++) {
      on_syncer_msg(&b, &fr, now);
      distro__sy_frames_free(&fr);
    }
    for (int k = 0; k < 256 && distro__sy_recv(b.server, &fr) > 0; k++) {
      on_server_msg(&b, &fr, now);
      distro__sy_frames_free(&fr);
    }
    if (b.peer && distro__sy_recv(b.peer, &fr) > 0) {
      on_peer_msg(&b, &fr, now);
      distro__sy_frames_free(&fr);
    }
    flush_out(&b);
    /* Join progress: hello retries, the next peer, the syncer. */
    if ((js == J_HELLO && now >= b.next_hello) || (js == J_SEEDING && now >= b.next_hello + 2.0)) send_hello(&b, now);
    if (js == J_PEER && now - b.t_join_step > join_step_s(l)) {
      if (b.peer_answered) {
        distro__ln_log(l, "fragments merged since the join did not arrive; fetches the state from the syncer");
        start_fetch(&b, now);
      } else {
        distro__ln_log(l, "peer did not answer; asks the next one");
        next_peer(&b, now);
      }
    }
    if (js == J_FETCH && now - b.t_join_step > join_step_s(l)) {
      set_state(l, J_HELLO);
      send_hello(&b, now);
    }
    if (now >= b.next_hb) {
      pthread_mutex_lock(&l->mu);
      distro__sy_msg h = {0};
      h.type = DISTRO__SY_HEARTBEAT;
      h.fragment = DISTRO__SY_NONE;
      h.a = (uint64_t)l->hb_steps;
      h.b = l->join_state == J_DONE ? DISTRO__SY_HB_READY : 0u;
      h.e = l->hb_step_s;
      pthread_mutex_unlock(&l->mu);
      if (js != J_HELLO) send_syncer(&b, &h, NULL);
      b.next_hb = now + l->opt.heartbeat_s;
    }
    if (now - b.last_heard > l->opt.timeout_s) {
      pthread_mutex_lock(&l->mu);
      const int was = l->connected;
      l->connected = 0;
      pthread_mutex_unlock(&l->mu);
      if (was) distro__ln_log(l, "syncer silent for %.2f s; keeps training and says hello again", now - b.last_heard);
      if (b.has_state && now >= b.next_hello) {
        send_hello(&b, now);
        b.next_hello = now + l->opt.timeout_s;
      }
    }
    stall_check(&b, now);
  }
  {
    distro__sy_msg bye = {0};
    bye.type = DISTRO__SY_BYE;
    bye.fragment = DISTRO__SY_NONE;
    if (b.dealer && b.has_state) send_syncer(&b, &bye, NULL);
  }
out:
  if (b.peer) zmq_close(b.peer);
  if (b.server) zmq_close(b.server);
  if (b.dealer) zmq_close(b.dealer);
  if (b.zap) zmq_close(b.zap);
  if (b.ctx) zmq_ctx_term(b.ctx);
  free(b.w_version);
  free(b.w_hash);
  free(b.have);
  memset(b.sec, 0, sizeof b.sec);
  return NULL;
}
