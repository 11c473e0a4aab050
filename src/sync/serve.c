/* The syncer's event loop: messages from learners, liveness, the fragment
 * schedule, quorum and grace, merges (docs/protocol.md). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/error.h"
#include "compress/outer_codec.h"
#include "optim/outer_merge.h"
#include "sync/syncer_internal.h"

#define WELCOME_SEED 1u
#define WELCOME_SEEDED 2u
#define WELCOME_FETCH 4u

typedef struct {
  const uint8_t *rid;
  size_t rid_n;
} route;

static void reject(distro_syncer *s, route r, uint32_t learner, int code, int type, uint32_t frag, uint64_t round,
                   const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static void reject(distro_syncer *s, route r, uint32_t learner, int code, int type, uint32_t frag, uint64_t round,
                   const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  distro__syncer_log(s, "reject learner=%u type=%s reason=%s: %s", (unsigned)learner, distro__sy_type_name(type),
                     distro_sync_error_name(code), why);
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

static void send_to(distro_syncer *s, const sy_learner *l, distro__sy_msg *m, const void *payload) {
  m->epoch = s->epoch;
  distro__sy_send(s->router, l->rid, l->rid_n, m, payload);
}

/* The learner a message claims to come from, if that connection owns it. */
static sy_learner *authenticate(distro_syncer *s, route r, const distro__sy_msg *m) {
  if (m->learner >= DISTRO__SY_MAX_LEARNERS) return NULL;
  sy_learner *l = s->learners[m->learner];
  if (!l || !l->alive || l->rid_n != r.rid_n || memcmp(l->rid, r.rid, r.rid_n) != 0) return NULL;
  return l;
}

static int count_live(distro_syncer *s, int ready_only) {
  int n = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i] && s->learners[i]->alive && (!ready_only || s->learners[i]->ready)) n++;
  return n;
}

static uint32_t welcome_body(distro_syncer *s, uint8_t *buf, int peer) {
  const int P = s->L.P;
  uint8_t *b = buf;
  distro__put_u32(b, (uint32_t)P), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.codec), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.codec_block), b += 4;
  distro__put_u32(b, (uint32_t)s->opt.fragmenting), b += 4;
  distro__put_u64(b, (uint64_t)s->opt.max_block), b += 8;
  distro__put_u32(b, (uint32_t)s->opt.overlap), b += 4;
  for (int p = 0; p < P; p++) distro__put_u64(b, s->initialized ? s->frag[p].version : 0), b += 8;
  const sy_learner *pl = peer >= 0 ? s->learners[peer] : NULL;
  distro__put_u32(b, pl ? (uint32_t)peer : DISTRO__SY_NONE), b += 4;
  const size_t el = pl ? strlen(pl->endpoint) : 0, kl = pl ? strlen(pl->pubkey) : 0;
  b[0] = (uint8_t)el, b[1] = (uint8_t)(el >> 8), b += 2;
  if (el) memcpy(b, pl->endpoint, el), b += el;
  b[0] = (uint8_t)kl, b[1] = (uint8_t)(kl >> 8), b += 2;
  if (kl) memcpy(b, pl->pubkey, kl), b += kl;
  return (uint32_t)(b - buf);
}

static void send_welcome(distro_syncer *s, const sy_learner *l, uint32_t learner, unsigned flags, int peer) {
  uint8_t *buf = malloc(64 + 8 * (size_t)s->L.P + 600);
  if (!buf) return;
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_WELCOME;
  m.learner = learner;
  m.fragment = DISTRO__SY_NONE;
  m.b = flags;
  m.payload_bytes = welcome_body(s, buf, peer);
  send_to(s, l, &m, buf);
  free(buf);
}

/* A healthy peer to pull state from: alive, ready, heard from most recently. */
static int choose_peer(distro_syncer *s, uint32_t self) {
  int best = -1;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++) {
    const sy_learner *l = s->learners[i];
    if (!l || !l->alive || !l->ready || (uint32_t)i == self || !l->endpoint[0]) continue;
    if (best < 0 || l->last_seen > s->learners[best]->last_seen) best = i;
  }
  return best;
}

static sy_learner *enroll(distro_syncer *s, route r, uint32_t id, const char *ep, size_t el, const char *key,
                          size_t kl, double now) {
  sy_learner *l = s->learners[id];
  if (!l) {
    l = calloc(1, sizeof *l);
    if (!l) return NULL;
    s->learners[id] = l;
  }
  const int moved = l->alive && (l->rid_n != r.rid_n || memcmp(l->rid, r.rid, r.rid_n) != 0);
  if (moved) distro__syncer_log(s, "learner %u says hello from a new connection (replaces the old one)", (unsigned)id);
  memcpy(l->rid, r.rid, r.rid_n);
  l->rid_n = r.rid_n;
  l->alive = 1;
  l->last_seen = now;
  memcpy(l->endpoint, ep, el);
  l->endpoint[el] = 0;
  memcpy(l->pubkey, key, kl);
  l->pubkey[kl] = 0;
  return l;
}

static void on_hello(distro_syncer *s, route r, const distro__sy_msg *m, const uint8_t *pl, size_t pn, double now) {
  const uint32_t id = m->learner;
  if (id >= DISTRO__SY_MAX_LEARNERS) {
    reject(s, r, id, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0, "learner id %u >= %d", (unsigned)id,
           DISTRO__SY_MAX_LEARNERS);
    return;
  }
  /* u32 nt | nt x (u64 numel, u32 flags) | u32 nver | nver x u64 | u16 len, endpoint | u16 len, key */
  size_t off = 0;
  if (pn < 4) goto malformed;
  const uint32_t nt = distro__get_u32(pl);
  off = 4;
  if (nt < 1 || nt > (1u << 20) || (pn - off) / 12 < nt) goto malformed;
  const uint8_t *tens = pl + off;
  off += 12 * (size_t)nt;
  if (pn - off < 4) goto malformed;
  const uint32_t nver = distro__get_u32(pl + off);
  off += 4;
  if (nver > 4096 || (pn - off) / 8 < nver) goto malformed;
  off += 8 * (size_t)nver;
  if (pn - off < 2) goto malformed;
  const size_t el = (size_t)pl[off] | ((size_t)pl[off + 1] << 8);
  off += 2;
  if (el > 255 || pn - off < el) goto malformed;
  const char *ep = (const char *)pl + off;
  off += el;
  if (pn - off < 2) goto malformed;
  const size_t kl = (size_t)pl[off] | ((size_t)pl[off + 1] << 8);
  off += 2;
  if ((kl != 0 && kl != 40) || pn - off != kl) goto malformed;
  const char *key = (const char *)pl + off;
  const int has_state = (m->b & 1u) != 0;

  if (!s->have_layout) {
    int64_t *numel = malloc(sizeof *numel * nt);
    unsigned *flags = malloc(sizeof *flags * nt);
    distro_status st = DISTRO_ERR_NOMEM;
    if (numel && flags) {
      for (uint32_t i = 0; i < nt; i++) {
        numel[i] = (int64_t)distro__get_u64(tens + 12 * i);
        flags[i] = distro__get_u32(tens + 12 * i + 8);
      }
      st = distro__sy_layout_build(&s->L, (int)nt, numel, flags, m->a, s->opt.fragments, s->opt.fragmenting,
                                   s->opt.max_block, s->opt.codec, s->opt.codec_block);
      if (st == DISTRO_OK) st = distro__syncer_alloc_state(s);
    }
    free(numel);
    free(flags);
    if (st != DISTRO_OK) {
      reject(s, r, id, DISTRO_SYNC_E_SIGNATURE, m->type, DISTRO__SY_NONE, 0, "cannot lay out the model: %s",
             distro_last_error());
      distro__sy_layout_destroy(&s->L);
      return;
    }
    pthread_mutex_lock(&s->mu);
    s->have_layout = 1;
    pthread_mutex_unlock(&s->mu);
    s->seeder = -1;
    distro__syncer_log(s, "layout from learner %u: %u tensors, %lld parameters, %d fragments", (unsigned)id,
                       (unsigned)nt, (long long)s->L.total, s->L.P);
  } else {
    int same = m->a == s->L.signature && (int)nt == s->L.nt;
    for (uint32_t i = 0; same && i < nt; i++)
      same = (int64_t)distro__get_u64(tens + 12 * i) == s->L.numel[i] && distro__get_u32(tens + 12 * i + 8) == s->L.tflags[i];
    if (!same) {
      reject(s, r, id, DISTRO_SYNC_E_SIGNATURE, m->type, DISTRO__SY_NONE, 0,
             "model signature %016llx with %u tensors differs from the job's %016llx with %d tensors",
             (unsigned long long)m->a, (unsigned)nt, (unsigned long long)s->L.signature, s->L.nt);
      return;
    }
  }
  if (!s->initialized) {
    if (s->seeder >= 0 && (uint32_t)s->seeder != id && s->learners[s->seeder] && s->learners[s->seeder]->alive) {
      reject(s, r, id, DISTRO_SYNC_E_NOT_READY, m->type, DISTRO__SY_NONE, 0,
             "learner %d is seeding the global copy; say hello again", s->seeder);
      return;
    }
    sy_learner *l = enroll(s, r, id, ep, el, key, kl, now);
    if (!l) return;
    s->seeder = (int)id;
    l->ready = 0;
    distro__syncer_log(s, "learner %u seeds the global copy", (unsigned)id);
    send_welcome(s, l, id, WELCOME_SEED, -1);
    return;
  }
  sy_learner *l = enroll(s, r, id, ep, el, key, kl, now);
  if (!l) return;
  l->ready = has_state;
  const int peer = has_state ? -1 : choose_peer(s, id);
  distro__syncer_log(s, "learner %u joins (%s)%s%s", (unsigned)id, has_state ? "has state" : "new",
                     has_state ? "" : peer >= 0 ? ", pulls state from learner " : ", fetches state from the syncer",
                     !has_state && peer >= 0 ? s->learners[peer]->endpoint : "");
  send_welcome(s, l, id, has_state ? 0u : peer >= 0 ? 0u : WELCOME_FETCH, peer);
  return;
malformed:
  reject(s, r, id, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0, "HELLO body of %zu bytes does not parse", pn);
}

static void on_seed(distro_syncer *s, route r, sy_learner *l, const distro__sy_msg *m, const uint8_t *pl, size_t pn) {
  const int P = s->L.P;
  if (s->initialized || s->seeder != (int)m->learner) {
    reject(s, r, m->learner, DISTRO_SYNC_E_ROUND, m->type, DISTRO__SY_NONE, 0, "not asked to seed");
    return;
  }
  if (pn != 8 * (size_t)P + 4 * (size_t)s->L.total) {
    reject(s, r, m->learner, DISTRO_SYNC_E_MALFORMED, m->type, DISTRO__SY_NONE, 0, "SEED of %zu bytes, want %zu", pn,
           8 * (size_t)P + 4 * (size_t)s->L.total);
    return;
  }
  const float *vals = (const float *)(const void *)(pl + 8 * (size_t)P);
  for (int64_t j = 0; j < s->L.total; j++) {
    float v;
    memcpy(&v, pl + 8 * (size_t)P + 4 * (size_t)j, 4);
    if (!isfinite(v)) {
      reject(s, r, m->learner, DISTRO_SYNC_E_PAYLOAD, m->type, DISTRO__SY_NONE, 0, "non-finite value at %lld",
             (long long)j);
      return;
    }
  }
  (void)vals;
  pthread_mutex_lock(&s->mu);
  for (int p = 0; p < P; p++) {
    sy_fragment *F = &s->frag[p];
    memcpy(F->global, pl + 8 * (size_t)P + 4 * (size_t)s->L.frag_off[p], 4 * (size_t)s->L.frags.numel[p]);
    memset(F->mom, 0, 4 * (size_t)s->L.frags.numel[p]);
    F->version = distro__get_u64(pl + 8 * (size_t)p);
  }
  s->initialized = 1;
  pthread_mutex_unlock(&s->mu);
  s->seeder = -1;
  l->ready = 1;
  distro__syncer_log(s, "learner %u seeded %lld parameters", (unsigned)m->learner, (long long)s->L.total);
  send_welcome(s, l, m->learner, WELCOME_SEEDED, -1);
}

static void send_state(distro_syncer *s, const sy_learner *l, uint32_t learner) {
  const int P = s->L.P;
  const size_t n = 8 * (size_t)P + 4 * (size_t)s->L.total;
  uint8_t *buf = malloc(n);
  if (!buf) return;
  for (int p = 0; p < P; p++) {
    distro__put_u64(buf + 8 * (size_t)p, s->frag[p].version);
    memcpy(buf + 8 * (size_t)P + 4 * (size_t)s->L.frag_off[p], s->frag[p].global, 4 * (size_t)s->L.frags.numel[p]);
  }
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_STATE;
  m.learner = learner;
  m.fragment = DISTRO__SY_NONE;
  m.a = (uint64_t)P;
  m.payload_bytes = (uint32_t)n;
  send_to(s, l, &m, buf);
  free(buf);
}

static void on_upload(distro_syncer *s, route r, const distro__sy_msg *m, const uint8_t *pl, size_t pn) {
  const uint32_t p = m->fragment;
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
  distro__syncer_log(s, "fragment %u: adopted version %llu from learner %u (had %llu)", (unsigned)p,
                     (unsigned long long)m->b, (unsigned)m->learner, (unsigned long long)old);
}

static const float *history(const distro_syncer *s, const sy_fragment *F, uint64_t v) {
  const int S = s->opt.max_staleness;
  if (S == 0) return NULL;
  const sy_hist *h = &F->hist[v % (uint64_t)S];
  return h->valid && h->version == v ? h->data : NULL;
}

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
  if (m->b < F->version && (F->version - m->b > (uint64_t)s->opt.max_staleness || !history(s, F, m->b))) {
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
  const distro__fragments *f = &s->L.frags;
  for (int q = f->start[p]; q < f->start[p + 1]; q++) {
    if (distro__outer_check(s->L.codec, pl + s->L.piece_byte[q], f->pieces[q].count, s->L.block) != DISTRO_OK) {
      reject(s, r, m->learner, DISTRO_SYNC_E_PAYLOAD, m->type, p, m->a, "%s", distro_last_error());
      return;
    }
  }
  const int late = !(F->open && m->a == F->round);
  int slot = -1;
  for (int i = 0; i < F->nrep; i++)
    if (F->rep[i].learner == (int)m->learner && F->rep[i].round == m->a) slot = i;
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
    F->nrep--;
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
  if (m->e > 0) l->step_s = m->e;
  l->reports++;
  pthread_mutex_lock(&s->mu);
  s->reports++;
  pthread_mutex_unlock(&s->mu);
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
  const uint8_t *pl = fr->n == 3 ? fr->data[2] : NULL;
  const size_t pn = fr->n == 3 ? fr->size[2] : 0;
  int code = distro__sy_decode(fr->data[1], fr->size[1], pl, pn, &m, why, sizeof why);
  if (code) {
    reject(s, r, fr->size[1] >= 12 ? distro__get_u32((const uint8_t *)fr->data[1] + 8) : DISTRO__SY_NONE, code, 0,
           DISTRO__SY_NONE, 0, "%s", why);
    return;
  }
  if (m.type == DISTRO__SY_HELLO) {
    on_hello(s, r, &m, pl, pn, now);
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
  if (m.type != DISTRO__SY_SEED && m.type != DISTRO__SY_REPORT && m.type != DISTRO__SY_HEARTBEAT &&
      m.type != DISTRO__SY_FETCH && m.type != DISTRO__SY_UPLOAD) {
    reject(s, r, m.learner, DISTRO_SYNC_E_MALFORMED, m.type, DISTRO__SY_NONE, 0, "%s is not sent to the syncer",
           distro__sy_type_name(m.type));
    return;
  }
  if (!l) {
    reject(s, r, m.learner, DISTRO_SYNC_E_UNKNOWN, m.type, m.fragment, m.a,
           "learner %u has not joined, timed out, or belongs to another connection; say hello", (unsigned)m.learner);
    return;
  }
  l->last_seen = now;
  if (m.type == DISTRO__SY_SEED) {
    on_seed(s, r, l, &m, pl, pn);
    return;
  }
  if (!s->initialized) {
    reject(s, r, m.learner, DISTRO_SYNC_E_NOT_READY, m.type, m.fragment, m.a, "no global copy yet");
    return;
  }
  switch (m.type) {
    case DISTRO__SY_HEARTBEAT:
      if (m.e > 0) l->step_s = m.e;
      if ((m.b & 1u) && !l->ready) {
        l->ready = 1;
        distro__syncer_log(s, "learner %u is ready (serves its state at %s)", (unsigned)m.learner, l->endpoint);
      }
      break;
    case DISTRO__SY_FETCH: send_state(s, l, m.learner); break;
    case DISTRO__SY_UPLOAD: on_upload(s, r, &m, pl, pn); break;
    case DISTRO__SY_REPORT: on_report(s, r, l, &m, pl, pn); break;
    default: break;
  }
}

/* ------------------------------------------------------------- ZAP */

static void zap_serve(distro_syncer *s) {
  for (;;) {
    distro__sy_frames f;
    zmq_msg_t parts[8];
    int n = 0, more = 1;
    (void)f;
    while (more && n < 8) {
      zmq_msg_init(&parts[n]);
      if (zmq_msg_recv(&parts[n], s->zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(&parts[n]);
        if (n == 0) return;
        break;
      }
      more = zmq_msg_more(&parts[n]);
      n++;
    }
    int ok = 0;
    if (n >= 7 && zmq_msg_size(&parts[5]) == 5 && memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&parts[6]) == 32) {
      ok = s->nallowed == 0;
      for (int i = 0; i < s->nallowed && !ok; i++) ok = memcmp(s->allowed + 32 * i, zmq_msg_data(&parts[6]), 32) == 0;
    }
    if (!ok) distro__syncer_log(s, "refused a connection: CURVE client key not allowed");
    if (n >= 2) {
      zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
      zmq_send(s->zap, zmq_msg_data(&parts[1]), zmq_msg_size(&parts[1]), ZMQ_SNDMORE);
      zmq_send(s->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
      zmq_send(s->zap, ok ? "OK" : "key not allowed", ok ? 2 : 15, ZMQ_SNDMORE);
      zmq_send(s->zap, "", 0, ZMQ_SNDMORE);
      zmq_send(s->zap, "", 0, 0);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
  }
}

/* -------------------------------------------------- schedule and merges */

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_step(distro_syncer *s) {
  double v[DISTRO__SY_MAX_LEARNERS];
  int n = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i] && s->learners[i]->alive && s->learners[i]->ready && s->learners[i]->step_s > 0)
      v[n++] = s->learners[i]->step_s;
  if (!n) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double interval(distro_syncer *s) {
  if (s->opt.interval_s > 0) return s->opt.interval_s;
  const double st = median_step(s);
  return st > 0 ? s->opt.H * st / s->L.P : 0.25;
}

static void open_round(distro_syncer *s, int p, double now) {
  sy_fragment *F = &s->frag[p];
  int asked = 0;
  memset(F->asked, 0, sizeof F->asked);
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i] && s->learners[i]->alive && s->learners[i]->ready) F->asked[i] = 1, asked++;
  if (!asked) return;
  F->round++;
  F->open = 1;
  F->t_open = now;
  F->t_quorum = -1;
  F->grace = 0;
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_REQUEST;
  m.fragment = (uint32_t)p;
  m.a = F->round;
  m.b = F->version;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (F->asked[i]) {
      m.learner = (uint32_t)i;
      send_to(s, s->learners[i], &m, NULL);
    }
}

static void drop_reports(sy_fragment *F) {
  for (int i = 0; i < F->nrep; i++) free(F->rep[i].enc);
  F->nrep = 0;
}

static int ensure_deltas(distro_syncer *s, int n) {
  if (n <= s->deltas_cap) return 0;
  float **nd = realloc(s->deltas, sizeof *nd * (size_t)n);
  if (!nd) return -1;
  s->deltas = nd;
  for (int i = s->deltas_cap; i < n; i++) {
    nd[i] = malloc(sizeof(float) * (size_t)s->maxf);
    if (!nd[i]) return -1;
    s->deltas_cap = i + 1;
  }
  return 0;
}

static void merge(distro_syncer *s, int p, double now) {
  sy_fragment *F = &s->frag[p];
  const distro__fragments *f = &s->L.frags;
  const int64_t n = f->numel[p];
  const int nr = F->nrep;
  const double t0 = distro__sy_now();
  double tok[256], stp[256], w[256];
  if (nr > 256 || ensure_deltas(s, nr) != 0) {
    distro__syncer_log(s, "fragment %d: %d reports, cannot merge (memory)", p, nr);
    drop_reports(F);
    F->open = 0;
    return;
  }
  uint64_t bytes_in = 0, tokens = 0;
  uint32_t mask = 0;
  for (int i = 0; i < nr; i++) {
    const sy_report *rp = &F->rep[i];
    float *d = s->deltas[i];
    for (int q = f->start[p]; q < f->start[p + 1]; q++)
      distro__outer_decode(s->L.codec, rp->enc + s->L.piece_byte[q], f->pieces[q].count, s->L.block,
                           d + s->L.piece_elem[q]);
    if (rp->base < F->version) {
      /* Re-anchor at the current copy: Theta_now - theta_m = delta + (Theta_now - Theta_base). */
      const float *old = history(s, F, rp->base);
      if (old)
        for (int64_t j = 0; j < n; j++) d[j] += F->global[j] - old[j];
    }
    tok[i] = rp->tokens;
    tokens += (uint64_t)rp->tokens;
    stp[i] = rp->steps;
    bytes_in += s->L.frag_bytes[p] + DISTRO__SY_HEADER;
    if (rp->learner < 32) mask |= 1u << rp->learner;
  }
  distro__outer_weights(s->opt.merge, nr, tok, stp, w);
  float *g = s->scratch, *sm = s->scratch + s->maxf, *keep = s->scratch + 2 * s->maxf;
  float coef[2 * 256];
  double nrm[256];
  distro__sy_merge(&s->L, p, s->opt.merge, nr, (const float *const *)s->deltas, w, g, coef, nrm);
  memcpy(keep, F->global, sizeof(float) * (size_t)n);
  /* New global into g (in place), new momentum into sm; committed below. */
  const int ok = distro__outer_step(F->global, F->mom, g, n, s->opt.outer_lr, s->opt.outer_momentum, s->opt.nesterov,
                                    g, sm);
  pthread_mutex_lock(&s->mu);
  if (ok) {
    memcpy(F->mom, sm, sizeof(float) * (size_t)n);
    memcpy(F->global, g, sizeof(float) * (size_t)n);
    F->version++;
    s->merges++;
  }
  pthread_mutex_unlock(&s->mu);
  if (!ok) {
    distro__syncer_log(s, "fragment %d: merge dropped: the merged outer gradient or the outer step overflowed", p);
    drop_reports(F);
    F->open = 0;
    return;
  }
  if (s->opt.max_staleness > 0) {
    sy_hist *h = &F->hist[(F->version - 1) % (uint64_t)s->opt.max_staleness];
    if (!h->data) h->data = malloc(sizeof(float) * (size_t)s->maxf);
    if (h->data) {
      memcpy(h->data, keep, sizeof(float) * (size_t)n);
      h->version = F->version - 1;
      h->valid = 1;
    }
  }
  /* Send the new fragment to every live learner, telling each which of its
   * reports went in. */
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_FRAGMENT;
  m.fragment = (uint32_t)p;
  m.a = F->round;
  m.b = F->version;
  m.payload_bytes = (uint32_t)(4 * n);
  uint64_t bytes_out = 0;
  int live = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++) {
    sy_learner *l = s->learners[i];
    if (!l || !l->alive) continue;
    live++;
    uint64_t cnt = 0, newest = 0;
    for (int k = 0; k < nr; k++)
      if (F->rep[k].learner == i) {
        cnt++;
        if (F->rep[k].round + 1 > newest) newest = F->rep[k].round + 1;
      }
    l->merged += cnt;
    m.learner = (uint32_t)i;
    m.c = cnt;
    m.d = newest;
    send_to(s, l, &m, F->global);
    bytes_out += 4 * (uint64_t)n + DISTRO__SY_HEADER;
  }
  const double t1 = distro__sy_now();
  distro_sync_merge_info info;
  memset(&info, 0, sizeof info);
  info.fragment = p;
  info.version = F->version;
  info.round = F->round;
  int asked_live = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (F->asked[i] && s->learners[i] && s->learners[i]->alive) asked_live++;
  info.quorum = s->opt.quorum < asked_live ? s->opt.quorum : asked_live > 0 ? asked_live : 1;
  info.live = live;
  info.participants = nr;
  info.participant_mask = mask;
  info.time_to_quorum_s = F->t_quorum >= 0 ? F->t_quorum - F->t_open : 0;
  info.grace_s = F->grace;
  info.waited_s = now - F->t_open;
  info.merge_s = t1 - t0;
  info.bytes_in = bytes_in;
  info.bytes_out = bytes_out;
  info.tokens = tokens;
  char ids[160];
  size_t o = 0;
  ids[0] = 0;
  for (int k = 0; k < nr && o + 8 < sizeof ids; k++)
    o += (size_t)snprintf(ids + o, sizeof ids - o, "%s%d%s", k ? "," : "", F->rep[k].learner, F->rep[k].late ? "*" : "");
  distro__syncer_log(s,
                     "merge frag=%d version=%llu round=%llu quorum=%d live=%d participants=%d ids=%s "
                     "to_quorum=%.4f grace=%.4f waited=%.4f merge=%.5f bytes_in=%llu bytes_out=%llu tokens=%llu",
                     p, (unsigned long long)F->version, (unsigned long long)F->round, info.quorum, live, nr, ids,
                     info.time_to_quorum_s, info.grace_s, info.waited_s, info.merge_s,
                     (unsigned long long)bytes_in, (unsigned long long)bytes_out, (unsigned long long)tokens);
  if (s->merge_fn) s->merge_fn(s->merge_ctx, &info);
  drop_reports(F);
  F->open = 0;
  s->ema_sync = s->ema_n ? 0.8 * s->ema_sync + 0.2 * info.merge_s : info.merge_s;
  pthread_mutex_lock(&s->mu);
  s->merges_here++;
  s->merge_s_sum += info.merge_s;
  if (info.merge_s > s->merge_s_max) s->merge_s_max = info.merge_s;
  pthread_mutex_unlock(&s->mu);
  if (s->opt.checkpoint && s->merges % (uint64_t)s->opt.checkpoint_every == 0) {
    pthread_mutex_lock(&s->mu);
    distro_status cs = distro__syncer_ckpt_save(s);
    if (cs == DISTRO_OK) s->checkpoints++;
    pthread_mutex_unlock(&s->mu);
    if (cs != DISTRO_OK) distro__syncer_log(s, "checkpoint failed: %s", distro_last_error());
  }
}

static void rounds(distro_syncer *s, double now) {
  const int P = s->L.P;
  for (int p = 0; p < P; p++) {
    sy_fragment *F = &s->frag[p];
    if (!F->open) continue;
    int asked_live = 0, reported = 0, asked_reported = 0;
    for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
      if (F->asked[i] && s->learners[i] && s->learners[i]->alive) asked_live++;
    for (int k = 0; k < F->nrep; k++)
      if (!F->rep[k].late) {
        reported++;
        const int id = F->rep[k].learner;
        if (F->asked[id] && s->learners[id] && s->learners[id]->alive) asked_reported++;
      }
    if (asked_live == 0 && reported == 0) {
      if (now - F->t_open > s->opt.timeout_s) {
        distro__syncer_log(s, "fragment %d: round %llu abandoned (nobody left to report)", p,
                           (unsigned long long)F->round);
        drop_reports(F);
        F->open = 0;
      }
      continue;
    }
    const int K = s->opt.quorum < asked_live ? s->opt.quorum : asked_live > 0 ? asked_live : 1;
    if (reported < K) continue;
    if (F->t_quorum < 0) {
      F->t_quorum = now;
      const double ttq = now - F->t_open;
      s->ema_quorum = s->ema_n ? 0.8 * s->ema_quorum + 0.2 * ttq : ttq;
      s->ema_n++;
      const double g = s->opt.grace_gamma * (s->opt.overlap * median_step(s) - s->ema_quorum - s->ema_sync);
      F->grace = g > 0 ? g : 0;
    }
    if (now >= F->t_quorum + F->grace || asked_reported >= asked_live) merge(s, p, now);
  }
}

static void liveness(distro_syncer *s, double now) {
  int live = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++) {
    sy_learner *l = s->learners[i];
    if (!l || !l->alive) continue;
    if (now - l->last_seen > s->opt.timeout_s) {
      l->alive = 0;
      l->ready = 0;
      distro__syncer_log(s, "learner %d timed out (silent %.2f s); it leaves the quorum", i, now - l->last_seen);
      if (s->seeder == i) s->seeder = -1;
      continue;
    }
    live++;
  }
  pthread_mutex_lock(&s->mu);
  s->live_now = live;
  pthread_mutex_unlock(&s->mu);
}

distro_status distro_syncer_run(distro_syncer *s) {
  if (!s) return distro__fail(DISTRO_ERR_INVALID, "syncer is NULL");
  zmq_pollitem_t items[2] = {{s->router, 0, ZMQ_POLLIN, 0}, {s->zap, 0, ZMQ_POLLIN, 0}};
  const int nitems = s->zap ? 2 : 1;
  double next_hb = 0;
  s->seeder = -1;
  s->next_open = distro__sy_now();
  distro__syncer_log(s, "syncer epoch %llu serving on %s%s", (unsigned long long)s->epoch, s->endpoint,
                     s->curve ? " (CURVE)" : "");
  while (!atomic_load(&s->stop)) {
    if (zmq_poll(items, nitems, 5) < 0 && zmq_errno() != EINTR)
      return distro__fail(DISTRO_ERR_COMM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
    if (s->zap) zap_serve(s);
    double now = distro__sy_now();
    for (int budget = 0; budget < 256; budget++) {
      distro__sy_frames fr;
      const int got = distro__sy_recv(s->router, &fr);
      if (got <= 0) break;
      handle(s, &fr, now);
      distro__sy_frames_free(&fr);
    }
    now = distro__sy_now();
    liveness(s, now);
    if (now >= next_hb) {
      distro__sy_msg m = {0};
      m.type = DISTRO__SY_HEARTBEAT;
      m.fragment = DISTRO__SY_NONE;
      m.a = s->merges;
      for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
        if (s->learners[i] && s->learners[i]->alive) {
          m.learner = (uint32_t)i;
          send_to(s, s->learners[i], &m, NULL);
        }
      next_hb = now + s->opt.heartbeat_s;
    }
    if (!s->initialized) continue;
    if (now >= s->next_open) {
      const int p = s->next_p;
      if (!s->frag[p].open && count_live(s, 1) > 0) {
        open_round(s, p, now);
        s->next_p = (p + 1) % s->L.P;
        s->next_open = now + interval(s);
      } else {
        s->next_open = now + 0.25 * interval(s);
      }
    }
    rounds(s, now);
  }
  return DISTRO_OK;
}
