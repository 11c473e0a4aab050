/* The learner side: the training thread calls distro_learner_step after
 * each inner step and never waits for the network; a background thread owns
 * every ZeroMQ socket (the DEALER to the syncer, a ROUTER serving this
 * learner's state to joining peers, a DEALER to a peer while joining) and
 * exchanges data with the training thread through buffers under a mutex
 * (docs/protocol.md). */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "compress/outer_codec.h"
#include "sync/sync_internal.h"

#define NPEND 8
#define WELCOME_SEED 1u
#define WELCOME_SEEDED 2u
#define WELCOME_FETCH 4u

enum { J_IDLE, J_HELLO, J_SEEDING, J_PEER, J_FETCH, J_DONE, J_FAILED };

typedef struct ln_out {
  distro__sy_msg m;
  uint8_t *payload;
  struct ln_out *next;
} ln_out;

typedef struct ln_tensor {
  char *name;
  float *param;
  int64_t numel;
  unsigned flags;
} ln_tensor;

typedef struct ln_pend {
  uint64_t round;
  double sec;
} ln_pend;

struct distro_learner {
  distro_learner_options opt;
  char *s_syncer, *s_serve, *s_server_key, *s_keypair;
  ln_tensor *t;
  int nt, cap;
  float **tp;
  uint64_t signature;

  /* Shared with the background thread (mu). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int have_layout;
  distro__sy_layout L;
  int tau;
  float *incoming;          /* latest global copy received, fragment-major */
  uint64_t *in_version;
  uint8_t *in_new;
  uint64_t *in_newest;      /* newest of this learner's rounds merged (+1), from FRAGMENT */
  uint64_t *req_round;      /* REQUEST waiting to be answered, 0 none */
  uint64_t *rej_round;      /* a REPORT rejected (stale, round, payload), 0 none */
  ln_out *out_head, *out_tail;
  int join_state, join_source;
  distro_status join_st;
  char join_msg[400];
  int stop;
  uint64_t errors, rejoins, bytes_up, bytes_down;
  int last_error, connected;
  double hb_step_s;
  int64_t hb_steps;

  /* Training thread only. */
  int started;
  float *base;              /* global copy the parameters were last set from */
  uint64_t *version;
  float *snap;              /* parameters at the last report (keep_local) */
  float *scratch;
  double *tok, *stp, *sec, *rep_tok, *rep_stp;
  int64_t *rep_t;
  int *rep_pending;
  ln_pend *pend;            /* P x NPEND */
  int *npend;
  double useful, wasted;
  double last_call, step_ema;
  int64_t tstep;
  uint64_t reports, applies;

  pthread_t th;
  int th_started, mu_init;

  /* Data-parallel learner (opt.comm): rank 0 talks to the syncer. */
  distro_comm *comm;
  int rank, nranks;
  int fr;                   /* fragmenting and max_block from WELCOME (to lay out the other ranks) */
  int64_t maxb;
  uint64_t tokens;          /* counted since start, all ranks */
  uint64_t *ctl;            /* control block broadcast by rank 0 every step */
  size_t ctl_words;
  float *stage;             /* the applied fragments' values, packed */
  uint8_t *bc_tmp;          /* size x BCAST_SLOT bytes for the chunked broadcast */
  distro_learner_stats mirror; /* ranks > 0: rank 0's stats of the last step */
};

#define BCAST_SLOT ((size_t)1 << 20)

static void lg(distro_learner *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void lg(distro_learner *l, const char *fmt, ...) {
  if (!l->opt.log) return;
  char line[768];
  int n = snprintf(line, sizeof line, "learner %d: ", l->opt.learner_id);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  l->opt.log(l->opt.log_ctx, line);
}

distro_learner_options distro_learner_options_default(void) {
  distro_learner_options o;
  memset(&o, 0, sizeof o);
  o.version = DISTRO_LEARNER_OPTIONS_VERSION;
  o.serve_endpoint = "tcp://127.0.0.1:*";
  o.heartbeat_s = 0.2;
  o.timeout_s = 2.0;
  o.join_timeout_s = 30.0;
  o.keep_local = 1;
  o.comm = NULL;
  return o;
}

static char *dup_or_null(const char *s, int *bad) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *bad = 1;
  return d;
}

distro_status distro_learner_create(const distro_learner_options *o, distro_learner **out) {
  distro_status st = DISTRO_OK;
  distro_learner *l = NULL;
  int bad = 0;
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_create: out is NULL");
  *out = NULL;
  if (!o || (o->version != DISTRO_LEARNER_OPTIONS_VERSION && o->version != 1))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: NULL or version %d (want 1 or %d)",
                        o ? o->version : -1, DISTRO_LEARNER_OPTIONS_VERSION);
  distro_learner_options oo = distro_learner_options_default();
  /* Version 1 ends before `comm`. */
  memcpy(&oo, o, o->version == 1 ? offsetof(distro_learner_options, comm) : sizeof oo);
  o = &oo;
  if (o->comm && (distro_comm_size(o->comm) < 1 || distro_comm_rank(o->comm) < 0))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: comm has size %d, rank %d",
                        distro_comm_size(o->comm), distro_comm_rank(o->comm));
  if (!o->syncer || o->learner_id < 0 || o->learner_id >= 256 || !o->serve_endpoint)
    return distro__fail(DISTRO_ERR_INVALID, "learner options: need a syncer endpoint, learner_id in [0, 256) and "
                                            "a serve endpoint");
  if (!(o->heartbeat_s > 0) || !(o->timeout_s > o->heartbeat_s) || !(o->join_timeout_s > 0))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: need heartbeat_s > 0, timeout_s > heartbeat_s, "
                                            "join_timeout_s > 0");
  if ((o->curve_server_key != NULL) != (o->curve_keypair != NULL))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: CURVE needs both curve_server_key and curve_keypair");
  l = calloc(1, sizeof *l);
  if (!l) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  l->opt = *o;
  l->s_syncer = dup_or_null(o->syncer, &bad);
  l->s_serve = dup_or_null(o->serve_endpoint, &bad);
  l->s_server_key = dup_or_null(o->curve_server_key, &bad);
  l->s_keypair = dup_or_null(o->curve_keypair, &bad);
  if (bad) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  l->opt.syncer = l->s_syncer;
  l->opt.serve_endpoint = l->s_serve;
  l->opt.curve_server_key = l->s_server_key;
  l->opt.curve_keypair = l->s_keypair;
  l->comm = o->comm;
  l->rank = o->comm ? distro_comm_rank(o->comm) : 0;
  l->nranks = o->comm ? distro_comm_size(o->comm) : 1;
  if (pthread_mutex_init(&l->mu, NULL) != 0) DISTRO_FAIL(DISTRO_ERR_NOMEM, "pthread_mutex_init failed");
  if (pthread_cond_init(&l->cv, NULL) != 0) {
    pthread_mutex_destroy(&l->mu);
    DISTRO_FAIL(DISTRO_ERR_NOMEM, "pthread_cond_init failed");
  }
  l->mu_init = 1;
  *out = l;
  return DISTRO_OK;
fail:
  distro_learner_free(l);
  return st;
}

distro_status distro_learner_add_tensor(distro_learner *l, const char *name, float *param, int64_t numel,
                                        unsigned flags) {
  if (!l || !name || !param || numel < 1)
    return distro__fail(DISTRO_ERR_INVALID, "distro_learner_add_tensor: NULL argument or numel < 1");
  if (l->started) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_add_tensor after distro_learner_start");
  if (flags & ~DISTRO_DILOCO_PLAIN_MERGE) return distro__fail(DISTRO_ERR_INVALID, "unknown tensor flags 0x%x", flags);
  for (int i = 0; i < l->nt; i++)
    if (strcmp(l->t[i].name, name) == 0) return distro__fail(DISTRO_ERR_INVALID, "tensor '%s' added twice", name);
  if (l->nt == l->cap) {
    const int nc = l->cap ? 2 * l->cap : 8;
    ln_tensor *nt = realloc(l->t, sizeof *nt * (size_t)nc);
    float **ntp = realloc(l->tp, sizeof *ntp * (size_t)nc);
    if (nt) l->t = nt;
    if (ntp) l->tp = ntp;
    if (!nt || !ntp) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
    l->cap = nc;
  }
  char *nm = strdup(name);
  if (!nm) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  l->t[l->nt] = (ln_tensor){nm, param, numel, flags};
  l->tp[l->nt] = param;
  l->nt++;
  return DISTRO_OK;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* ---------------------------------------------- buffers (under mu) */

static distro_status alloc_buffers(distro_learner *l) {
  const int P = l->L.P;
  const size_t N = (size_t)l->L.total;
  int64_t maxf = 1;
  for (int p = 0; p < P; p++)
    if (l->L.frags.numel[p] > maxf) maxf = l->L.frags.numel[p];
  l->incoming = calloc(N, sizeof(float));
  l->base = calloc(N, sizeof(float));
  l->snap = calloc(N, sizeof(float));
  l->scratch = calloc((size_t)maxf, sizeof(float));
  l->in_version = calloc((size_t)P, 8);
  l->in_new = calloc((size_t)P, 1);
  l->in_newest = calloc((size_t)P, 8);
  l->req_round = calloc((size_t)P, 8);
  l->rej_round = calloc((size_t)P, 8);
  l->version = calloc((size_t)P, 8);
  l->tok = calloc((size_t)P, sizeof(double));
  l->stp = calloc((size_t)P, sizeof(double));
  l->sec = calloc((size_t)P, sizeof(double));
  l->rep_tok = calloc((size_t)P, sizeof(double));
  l->rep_stp = calloc((size_t)P, sizeof(double));
  l->rep_t = calloc((size_t)P, sizeof(int64_t));
  l->rep_pending = calloc((size_t)P, sizeof(int));
  l->pend = calloc((size_t)P * NPEND, sizeof(ln_pend));
  l->npend = calloc((size_t)P, sizeof(int));
  if (!l->incoming || !l->base || !l->snap || !l->scratch || !l->in_version || !l->in_new || !l->in_newest ||
      !l->req_round || !l->rej_round || !l->version || !l->tok || !l->stp || !l->sec || !l->rep_tok ||
      !l->rep_stp || !l->rep_t || !l->rep_pending || !l->pend || !l->npend)
    return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  return DISTRO_OK;
}

static void free_buffers(distro_learner *l) {
  void *b[] = {l->incoming, l->base, l->snap, l->scratch, l->in_version, l->in_new, l->in_newest, l->req_round,
               l->rej_round, l->version, l->tok, l->stp, l->sec, l->rep_tok, l->rep_stp, l->rep_t, l->rep_pending,
               l->pend, l->npend};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++) free(b[i]);
  distro__sy_layout_destroy(&l->L);
}

/* ------------------------------------------------- background thread */

typedef struct bg {
  distro_learner *l;
  void *ctx, *dealer, *server, *peer;
  char pub[41], sec[41], server_pub[41];
  int curve;
  char serve_ep[256];
  uint64_t epoch;
  double last_heard, next_hb, t_join_step, next_hello;
  int has_state; /* joined once: hellos carry the versions */
} bg;

static void set_join(distro_learner *l, int state, distro_status st, const char *msg) {
  pthread_mutex_lock(&l->mu);
  l->join_state = state;
  l->join_st = st;
  if (msg) snprintf(l->join_msg, sizeof l->join_msg, "%s", msg);
  pthread_cond_broadcast(&l->cv);
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
  m.b = b->has_state ? 1u : 0u;
  m.payload_bytes = (uint32_t)n;
  send_syncer(b, &m, buf);
  free(buf);
  b->next_hello = now + 1.0;
}

/* Parses a STATE body into `incoming` (newer versions only). */
static int take_state(distro_learner *l, const uint8_t *pl, size_t pn) {
  const int P = l->L.P;
  if (pn != 8 * (size_t)P + 4 * (size_t)l->L.total) return -1;
  pthread_mutex_lock(&l->mu);
  for (int p = 0; p < P; p++) {
    const uint64_t v = distro__get_u64(pl + 8 * (size_t)p);
    if (v >= l->in_version[p]) {
      memcpy(l->incoming + l->L.frag_off[p], pl + 8 * (size_t)P + 4 * (size_t)l->L.frag_off[p],
             4 * (size_t)l->L.frags.numel[p]);
      l->in_version[p] = v;
    }
  }
  l->bytes_down += pn + DISTRO__SY_HEADER;
  pthread_mutex_unlock(&l->mu);
  return 0;
}

/* The join finished: source 1 peer, 2 syncer, 3 seeded. */
static void joined(bg *b, int source) {
  pthread_mutex_lock(&b->l->mu);
  b->l->join_source = source;
  pthread_mutex_unlock(&b->l->mu);
  b->has_state = 1;
  set_join(b->l, J_DONE, DISTRO_OK, NULL);
  lg(b->l, "joined (%s)", source == 1 ? "state pulled from a peer" : source == 2 ? "state fetched from the syncer" : "seeded the syncer");
}

static void send_state_to(bg *b, const void *rid, size_t rid_n, uint32_t to) {
  distro_learner *l = b->l;
  const int P = l->L.P;
  distro__sy_msg m = {0};
  m.learner = to;
  m.fragment = DISTRO__SY_NONE;
  if (!l->have_layout || b->l->join_state != J_DONE) {
    distro__sy_send_error(b->server, rid, rid_n, 0, to, DISTRO_SYNC_E_NOT_READY, DISTRO__SY_GET_STATE,
                          "this learner has not joined yet");
    return;
  }
  const size_t n = 8 * (size_t)P + 4 * (size_t)l->L.total;
  uint8_t *buf = malloc(n);
  if (!buf) return;
  pthread_mutex_lock(&l->mu);
  for (int p = 0; p < P; p++) distro__put_u64(buf + 8 * (size_t)p, l->in_version[p]);
  memcpy(buf + 8 * (size_t)P, l->incoming, 4 * (size_t)l->L.total);
  pthread_mutex_unlock(&l->mu);
  m.type = DISTRO__SY_STATE;
  m.a = (uint64_t)P;
  m.payload_bytes = (uint32_t)n;
  distro__sy_send(b->server, rid, rid_n, &m, buf);
  free(buf);
  lg(l, "served its state to learner %u", (unsigned)to);
}

static void *connect_dealer(bg *b, const char *ep, const char *server_pub) {
  void *s = zmq_socket(b->ctx, ZMQ_DEALER);
  if (!s) return NULL;
  int linger = 0, hwm = 10000, ivl = 100;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
  if (b->curve && server_pub && server_pub[0]) {
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
  pthread_mutex_lock(&b->l->mu);
  b->l->join_state = J_FETCH;
  pthread_mutex_unlock(&b->l->mu);
}

static void on_welcome(bg *b, const distro__sy_msg *m, const uint8_t *pl, size_t pn, double now) {
  distro_learner *l = b->l;
  size_t off = 0;
  if (pn < 28) goto bad;
  const uint32_t P = distro__get_u32(pl), codec = distro__get_u32(pl + 4), block = distro__get_u32(pl + 8),
                 fr = distro__get_u32(pl + 12);
  const int64_t maxb = (int64_t)distro__get_u64(pl + 16);
  const uint32_t tau = distro__get_u32(pl + 24);
  off = 28;
  if (P < 1 || P > 4096 || (pn - off) / 8 < P) goto bad;
  const uint8_t *vers = pl + off;
  off += 8 * (size_t)P;
  if (pn - off < 6) goto bad;
  const uint32_t peer = distro__get_u32(pl + off);
  off += 4;
  const size_t el = (size_t)pl[off] | ((size_t)pl[off + 1] << 8);
  off += 2;
  if (el > 255 || pn - off < el + 2) goto bad;
  char ep[256], key[41] = "";
  memcpy(ep, pl + off, el);
  ep[el] = 0;
  off += el;
  const size_t kl = (size_t)pl[off] | ((size_t)pl[off + 1] << 8);
  off += 2;
  if ((kl != 0 && kl != 40) || pn - off != kl) goto bad;
  memcpy(key, pl + off, kl);
  key[kl] = 0;
  b->epoch = m->epoch;
  b->last_heard = now;
  if (!l->have_layout) {
    int64_t *numel = malloc(sizeof *numel * (size_t)l->nt);
    unsigned *flags = malloc(sizeof *flags * (size_t)l->nt);
    distro_status st = DISTRO_ERR_NOMEM;
    if (numel && flags) {
      for (int i = 0; i < l->nt; i++) numel[i] = l->t[i].numel, flags[i] = l->t[i].flags;
      pthread_mutex_lock(&l->mu);
      st = distro__sy_layout_build(&l->L, l->nt, numel, flags, l->signature, (int)P, (distro_fragmenting)fr, maxb,
                                   (distro_outer_codec)codec, (int)block);
      if (st == DISTRO_OK) st = alloc_buffers(l);
      if (st == DISTRO_OK) l->have_layout = 1, l->tau = (int)tau, l->fr = (int)fr, l->maxb = maxb;
      pthread_mutex_unlock(&l->mu);
    }
    free(numel);
    free(flags);
    if (st != DISTRO_OK) {
      set_join(l, J_FAILED, DISTRO_ERR_SHAPE, "cannot lay out the model with the syncer's settings");
      return;
    }
  } else if ((int)P != l->L.P || (int)codec != (int)l->L.codec || (int)block != l->L.block) {
    set_join(l, J_FAILED, DISTRO_ERR_SHAPE, "the syncer's fragment settings changed");
    return;
  }
  if (m->b & WELCOME_SEED) {
    /* Seed the global copy: the parameters (first join, the training
     * thread waits in start()) or the global copy held (rejoin). */
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
    if (!b->has_state) {
      pthread_mutex_lock(&l->mu);
      l->join_state = J_SEEDING;
      pthread_mutex_unlock(&l->mu);
    }
    lg(l, "seeds the syncer");
    return;
  }
  if (m->b & WELCOME_SEEDED) {
    if (!b->has_state) {
      pthread_mutex_lock(&l->mu);
      for (uint32_t p = 0; p < P; p++) {
        l->in_version[p] = distro__get_u64(vers + 8 * (size_t)p);
        distro__sy_gather(&l->L, (int)p, l->tp, l->incoming + l->L.frag_off[p]);
      }
      pthread_mutex_unlock(&l->mu);
      joined(b, 3);
    }
    return;
  }
  if (b->has_state) {
    /* Rejoin (the syncer restarted or timed us out): upload what is newer. */
    for (uint32_t p = 0; p < P; p++) {
      const uint64_t sv = distro__get_u64(vers + 8 * (size_t)p);
      pthread_mutex_lock(&l->mu);
      const uint64_t mine = l->in_version[p];
      pthread_mutex_unlock(&l->mu);
      if (mine > sv) {
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
        lg(l, "uploads fragment %u version %llu (syncer has %llu)", (unsigned)p, (unsigned long long)mine,
           (unsigned long long)sv);
      }
    }
    lg(l, "rejoined (syncer epoch %llu)", (unsigned long long)m->epoch);
    return;
  }
  if (peer != DISTRO__SY_NONE && ep[0] && !(m->b & WELCOME_FETCH)) {
    if (b->peer) zmq_close(b->peer);
    b->peer = connect_dealer(b, ep, key);
    if (b->peer) {
      distro__sy_msg g = {0};
      g.type = DISTRO__SY_GET_STATE;
      g.learner = (uint32_t)l->opt.learner_id;
      g.fragment = DISTRO__SY_NONE;
      distro__sy_send(b->peer, NULL, 0, &g, NULL);
      b->t_join_step = now;
      pthread_mutex_lock(&l->mu);
      l->join_state = J_PEER;
      pthread_mutex_unlock(&l->mu);
      lg(l, "pulls the state from learner %u at %s", (unsigned)peer, ep);
      return;
    }
  }
  start_fetch(b, now);
  return;
bad:
  lg(l, "WELCOME of %zu bytes does not parse", pn);
}

static void on_syncer_msg(bg *b, distro__sy_frames *fr, double now) {
  distro_learner *l = b->l;
  distro__sy_msg m;
  char why[256];
  if (fr->n < 1 || fr->n > 2 || fr->truncated) return;
  const uint8_t *pl = fr->n == 2 ? fr->data[1] : NULL;
  const size_t pn = fr->n == 2 ? fr->size[1] : 0;
  if (distro__sy_decode(fr->data[0], fr->size[0], pl, pn, &m, why, sizeof why) != 0) {
    lg(l, "dropped a message from the syncer: %s", why);
    return;
  }
  b->last_heard = now;
  pthread_mutex_lock(&l->mu);
  l->connected = 1;
  pthread_mutex_unlock(&l->mu);
  if (m.type == DISTRO__SY_WELCOME) {
    on_welcome(b, &m, pl, pn, now);
    return;
  }
  if (b->has_state && m.type != DISTRO__SY_ERROR && b->epoch && m.epoch != b->epoch) {
    lg(l, "syncer epoch changed %llu -> %llu: says hello again", (unsigned long long)b->epoch,
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
      if (b->has_state && m.fragment < (uint32_t)l->L.P) {
        pthread_mutex_lock(&l->mu);
        l->req_round[m.fragment] = m.a;
        pthread_mutex_unlock(&l->mu);
      }
      break;
    case DISTRO__SY_FRAGMENT:
      if (l->have_layout && m.fragment < (uint32_t)l->L.P && pn == 4 * (size_t)l->L.frags.numel[m.fragment]) {
        const uint32_t p = m.fragment;
        pthread_mutex_lock(&l->mu);
        if (m.b > l->in_version[p]) {
          memcpy(l->incoming + l->L.frag_off[p], pl, pn);
          l->in_version[p] = m.b;
          l->in_new[p] = 1;
        }
        if (m.d > l->in_newest[p]) l->in_newest[p] = m.d;
        l->bytes_down += pn + DISTRO__SY_HEADER;
        pthread_mutex_unlock(&l->mu);
      }
      break;
    case DISTRO__SY_STATE:
      if (l->have_layout && l->join_state == J_FETCH && take_state(l, pl, pn) == 0) joined(b, 2);
      break;
    case DISTRO__SY_ERROR: {
      char msg[300];
      const size_t k = pn < sizeof msg - 1 ? pn : sizeof msg - 1;
      if (k) memcpy(msg, pl, k);
      msg[k] = 0;
      pthread_mutex_lock(&l->mu);
      l->errors++;
      l->last_error = (int)m.a;
      if (m.b == DISTRO__SY_REPORT && m.fragment < (uint32_t)l->L.P &&
          (m.a == DISTRO_SYNC_E_STALE || m.a == DISTRO_SYNC_E_ROUND || m.a == DISTRO_SYNC_E_PAYLOAD))
        l->rej_round[m.fragment] = m.c;
      const int js = l->join_state;
      pthread_mutex_unlock(&l->mu);
      lg(l, "error reply %s to %s: %s", distro_sync_error_name((int)m.a), distro__sy_type_name((int)m.b), msg);
      if (m.a == DISTRO_SYNC_E_SIGNATURE && js != J_DONE) {
        char j[400];
        snprintf(j, sizeof j, "the syncer refused this model: %s", msg);
        set_join(l, J_FAILED, DISTRO_ERR_SHAPE, j);
      } else if (m.a == DISTRO_SYNC_E_NOT_READY && js != J_DONE) {
        b->next_hello = now + 0.2;
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
  (void)now;
  if (fr->n < 1 || fr->n > 2) return;
  const uint8_t *pl = fr->n == 2 ? fr->data[1] : NULL;
  const size_t pn = fr->n == 2 ? fr->size[1] : 0;
  if (distro__sy_decode(fr->data[0], fr->size[0], pl, pn, &m, why, sizeof why) != 0) return;
  if (m.type == DISTRO__SY_STATE && l->join_state == J_PEER && take_state(l, pl, pn) == 0) {
    joined(b, 1);
  } else if (m.type == DISTRO__SY_ERROR && l->join_state == J_PEER) {
    b->t_join_step = -1e9; /* fall back to the syncer */
  }
  zmq_close(b->peer);
  b->peer = NULL;
}

static void on_server_msg(bg *b, distro__sy_frames *fr) {
  distro__sy_msg m;
  char why[256];
  if (fr->n != 2) return;
  if (distro__sy_decode(fr->data[1], fr->size[1], NULL, 0, &m, why, sizeof why) != 0) {
    distro__sy_send_error(b->server, fr->data[0], fr->size[0], 0, DISTRO__SY_NONE, DISTRO_SYNC_E_MALFORMED, 0, why);
    return;
  }
  if (m.type == DISTRO__SY_GET_STATE) send_state_to(b, fr->data[0], fr->size[0], m.learner);
}

static void flush_out(bg *b) {
  distro_learner *l = b->l;
  pthread_mutex_lock(&l->mu);
  ln_out *q = l->out_head;
  l->out_head = l->out_tail = NULL;
  pthread_mutex_unlock(&l->mu);
  while (q) {
    ln_out *next = q->next;
    send_syncer(b, &q->m, q->payload);
    free(q->payload);
    free(q);
    q = next;
  }
}

static int bg_setup(bg *b) {
  distro_learner *l = b->l;
  b->ctx = zmq_ctx_new();
  if (!b->ctx) return -1;
  if (l->opt.curve_keypair) {
    char spub[41];
    if (distro__sy_read_key(l->opt.curve_keypair, b->pub, b->sec) != DISTRO_OK) return -1;
    if (distro__sy_read_key(l->opt.curve_server_key, spub, NULL) != DISTRO_OK) return -1;
    memcpy(b->server_pub, spub, 41);
    b->curve = 1;
  }
  b->dealer = connect_dealer(b, l->opt.syncer, b->server_pub);
  if (!b->dealer) {
    distro__fail(DISTRO_ERR_COMM, "cannot connect to '%s': %s", l->opt.syncer, zmq_strerror(errno));
    return -1;
  }
  b->server = zmq_socket(b->ctx, ZMQ_ROUTER);
  if (!b->server) return -1;
  int linger = 0;
  zmq_setsockopt(b->server, ZMQ_LINGER, &linger, sizeof linger);
  if (b->curve) {
    int one = 1;
    zmq_setsockopt(b->server, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(b->server, ZMQ_CURVE_SECRETKEY, b->sec, 41);
  }
  if (zmq_bind(b->server, l->opt.serve_endpoint) != 0) {
    distro__fail(DISTRO_ERR_COMM, "cannot bind '%s': %s", l->opt.serve_endpoint, zmq_strerror(errno));
    return -1;
  }
  size_t len = sizeof b->serve_ep;
  if (zmq_getsockopt(b->server, ZMQ_LAST_ENDPOINT, b->serve_ep, &len) != 0) b->serve_ep[0] = 0;
  return 0;
}

static void *bg_main(void *arg) {
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
  send_hello(&b, now);
  pthread_mutex_lock(&l->mu);
  l->join_state = J_HELLO;
  pthread_mutex_unlock(&l->mu);
  for (;;) {
    pthread_mutex_lock(&l->mu);
    const int stop = l->stop;
    const int js = l->join_state;
    pthread_mutex_unlock(&l->mu);
    if (stop) break;
    zmq_pollitem_t it[3] = {{b.dealer, 0, ZMQ_POLLIN, 0}, {b.server, 0, ZMQ_POLLIN, 0}, {b.peer, 0, ZMQ_POLLIN, 0}};
    zmq_poll(it, b.peer ? 3 : 2, 5);
    now = distro__sy_now();
    distro__sy_frames fr;
    for (int k = 0; k < 256 && distro__sy_recv(b.dealer, &fr) > 0; k++) {
      on_syncer_msg(&b, &fr, now);
      distro__sy_frames_free(&fr);
    }
    while (distro__sy_recv(b.server, &fr) > 0) {
      on_server_msg(&b, &fr);
      distro__sy_frames_free(&fr);
    }
    if (b.peer && distro__sy_recv(b.peer, &fr) > 0) {
      on_peer_msg(&b, &fr, now);
      distro__sy_frames_free(&fr);
    }
    flush_out(&b);
    /* Join progress: hello retries, peer fallback. */
    if ((js == J_HELLO && now >= b.next_hello) || (js == J_SEEDING && now >= b.next_hello + 2.0)) send_hello(&b, now);
    if (js == J_PEER && now - b.t_join_step > 3.0) {
      lg(l, "peer did not answer; fetches the state from the syncer");
      if (b.peer) zmq_close(b.peer);
      b.peer = NULL;
      start_fetch(&b, now);
    }
    if (js == J_FETCH && now - b.t_join_step > 3.0) {
      pthread_mutex_lock(&l->mu);
      l->join_state = J_HELLO;
      pthread_mutex_unlock(&l->mu);
      send_hello(&b, now);
    }
    if (now >= b.next_hb) {
      pthread_mutex_lock(&l->mu);
      distro__sy_msg h = {0};
      h.type = DISTRO__SY_HEARTBEAT;
      h.fragment = DISTRO__SY_NONE;
      h.a = (uint64_t)l->hb_steps;
      h.b = l->join_state == J_DONE ? 1u : 0u;
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
      if (was) lg(l, "syncer silent for %.2f s; keeps training and says hello again", now - b.last_heard);
      if (b.has_state && now >= b.next_hello) {
        send_hello(&b, now);
        b.next_hello = now + l->opt.timeout_s;
      }
    }
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
  if (b.ctx) zmq_ctx_term(b.ctx);
  return NULL;
}

/* ------------------------------------------- data-parallel learner ranks */

/* Rank 0's `bytes` at buf reach every rank's buf, in chunks of BCAST_SLOT
 * through the communicator's variable all-gather (the other ranks send
 * nothing). */
static distro_status dp_bcast(distro_learner *l, void *buf, size_t bytes) {
  size_t sizes[256];
  for (size_t off = 0; off < bytes; off += BCAST_SLOT) {
    const size_t n = bytes - off < BCAST_SLOT ? bytes - off : BCAST_SLOT;
    uint8_t *b = (uint8_t *)buf + off;
    distro_status st = l->comm->ops->allgatherv(l->comm, b, l->rank == 0 ? n : 0, l->bc_tmp, BCAST_SLOT, sizes);
    if (st != DISTRO_OK) return st;
    if (sizes[0] != n)
      return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: broadcast of %zu bytes got %zu", l->opt.learner_id,
                          l->rank, n, sizes[0]);
    if (l->rank != 0) memcpy(b, l->bc_tmp, n);
  }
  return DISTRO_OK;
}

/* Control words a data-parallel step broadcasts: applied count, requested
 * count, (fragment, version, keep-local) per apply, fragment per request,
 * then rank 0's stats. */
static size_t ctl_words(int P) { return 2 + 4 * (size_t)P + (sizeof(distro_learner_stats) + 7) / 8; }

static distro_status dp_alloc(distro_learner *l) {
  l->ctl_words = ctl_words(l->L.P);
  l->ctl = calloc(l->ctl_words, 8);
  l->stage = calloc((size_t)l->L.total, sizeof(float));
  if (!l->ctl || !l->stage) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  return DISTRO_OK;
}

/* After rank 0 joined (ok) or failed: every rank gets the layout settings,
 * the versions and the parameters. */
static distro_status dp_start(distro_learner *l, int ok) {
  distro_status st;
  uint64_t h[9] = {0};
  if (l->rank == 0 && ok)
    h[0] = 1, h[1] = (uint64_t)l->L.P, h[2] = (uint64_t)l->fr, h[3] = (uint64_t)l->maxb, h[4] = (uint64_t)l->L.codec,
    h[5] = (uint64_t)l->L.block, h[6] = (uint64_t)l->tau, h[7] = (uint64_t)l->join_source,
    h[8] = (uint64_t)l->L.total;
  if ((st = dp_bcast(l, h, sizeof h)) != DISTRO_OK) return st;
  if (!h[0]) {
    if (l->rank == 0) return DISTRO_OK; /* its own error stands */
    return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: rank 0 could not join the syncer", l->opt.learner_id,
                        l->rank);
  }
  if (l->rank != 0) {
    int64_t *numel = malloc(sizeof *numel * (size_t)l->nt);
    unsigned *flags = malloc(sizeof *flags * (size_t)l->nt);
    st = DISTRO_ERR_NOMEM;
    if (numel && flags) {
      for (int i = 0; i < l->nt; i++) numel[i] = l->t[i].numel, flags[i] = l->t[i].flags;
      st = distro__sy_layout_build(&l->L, l->nt, numel, flags, l->signature, (int)h[1], (distro_fragmenting)h[2],
                                   (int64_t)h[3], (distro_outer_codec)h[4], (int)h[5]);
    }
    free(numel);
    free(flags);
    if (st != DISTRO_OK) return distro__fail(st, "learner %d rank %d: cannot lay out the model as rank 0 did",
                                             l->opt.learner_id, l->rank);
    if ((int64_t)h[8] != l->L.total)
      return distro__fail(DISTRO_ERR_SHAPE, "learner %d rank %d: %lld parameters, rank 0 has %lld", l->opt.learner_id,
                          l->rank, (long long)l->L.total, (long long)h[8]);
    if ((st = alloc_buffers(l)) != DISTRO_OK) return st;
    l->have_layout = 1;
    l->tau = (int)h[6];
    l->join_source = (int)h[7];
  }
  if ((st = dp_alloc(l)) != DISTRO_OK) return st;
  if ((st = dp_bcast(l, l->version, 8 * (size_t)l->L.P)) != DISTRO_OK) return st;
  if ((st = dp_bcast(l, l->base, sizeof(float) * (size_t)l->L.total)) != DISTRO_OK) return st;
  if (l->rank != 0) {
    for (int p = 0; p < l->L.P; p++) distro__sy_scatter(&l->L, p, l->base + l->L.frag_off[p], l->tp);
    memcpy(l->snap, l->base, sizeof(float) * (size_t)l->L.total);
    memset(&l->mirror, 0, sizeof l->mirror);
    l->mirror.reported = -1;
    l->mirror.goodput = 1;
    l->mirror.joined_from_peer = l->join_source;
    l->mirror.ranks = l->nranks;
    l->mirror.connected = 1;
  }
  return DISTRO_OK;
}

/* Ranks > 0: apply what rank 0 applied, snapshot what it reported. */
static distro_status dp_follow(distro_learner *l, distro_learner_stats *out) {
  distro_status st;
  if ((st = dp_bcast(l, l->ctl, 8 * l->ctl_words)) != DISTRO_OK) return st;
  const int P = l->L.P, na = (int)l->ctl[0], nr = (int)l->ctl[1];
  if (na < 0 || na > P || nr < 0 || nr > P)
    return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: bad control block", l->opt.learner_id, l->rank);
  const uint64_t *ap = l->ctl + 2, *rq = l->ctl + 2 + 3 * (size_t)P;
  size_t packed = 0;
  for (int k = 0; k < na; k++) {
    if (ap[3 * k] >= (uint64_t)P)
      return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: bad control block", l->opt.learner_id, l->rank);
    packed += (size_t)l->L.frags.numel[ap[3 * k]];
  }
  if (packed && (st = dp_bcast(l, l->stage, sizeof(float) * packed)) != DISTRO_OK) return st;
  size_t off = 0;
  for (int k = 0; k < na; k++) {
    const int p = (int)ap[3 * k];
    const int64_t n = l->L.frags.numel[p], o = l->L.frag_off[p];
    const float *in = l->stage + off;
    float *th = l->scratch;
    distro__sy_gather(&l->L, p, l->tp, th);
    if (ap[3 * k + 2]) {
      const float *sn = l->snap + o;
      for (int64_t j = 0; j < n; j++) th[j] = in[j] + (th[j] - sn[j]);
    } else {
      memcpy(th, in, sizeof(float) * (size_t)n);
    }
    distro__sy_scatter(&l->L, p, th, l->tp);
    memcpy(l->base + o, in, sizeof(float) * (size_t)n);
    l->version[p] = ap[3 * k + 1];
    off += (size_t)n;
  }
  for (int k = 0; k < nr; k++) {
    const int p = (int)rq[k];
    if (p < 0 || p >= P)
      return distro__fail(DISTRO_ERR_COMM, "learner %d rank %d: bad control block", l->opt.learner_id, l->rank);
    distro__sy_gather(&l->L, p, l->tp, l->snap + l->L.frag_off[p]);
  }
  memcpy(&l->mirror, l->ctl + 2 + 4 * (size_t)P, sizeof l->mirror);
  l->tstep = l->mirror.step;
  l->reports = l->mirror.reports;
  l->applies = l->mirror.applies;
  l->tokens = l->mirror.tokens;
  if (out) *out = l->mirror;
  return DISTRO_OK;
}

/* ------------------------------------------------------ training thread */

distro_status distro_learner_start(distro_learner *l) {
  distro_status st = DISTRO_OK;
  if (!l) return distro__fail(DISTRO_ERR_INVALID, "learner is NULL");
  if (l->started || l->th_started) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_start called twice");
  if (l->nt < 1) return distro__fail(DISTRO_ERR_INVALID, "no tensors registered");
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < l->nt; i++) {
    h = fnv(h, l->t[i].name, strlen(l->t[i].name) + 1);
    h = fnv(h, &l->t[i].numel, sizeof l->t[i].numel);
    h = fnv(h, &l->t[i].flags, sizeof l->t[i].flags);
  }
  l->signature = h;
  if (l->comm) {
    /* Every rank must have registered the same tensors. */
    uint64_t mine[2], sig[2 * 256];
    if (l->nranks > 256) return distro__fail(DISTRO_ERR_INVALID, "a learner has at most 256 ranks");
    l->bc_tmp = malloc(BCAST_SLOT * (size_t)l->nranks);
    mine[0] = h;
    mine[1] = l->bc_tmp != NULL;
    if ((st = distro_comm_allgather(l->comm, mine, sizeof mine, sig)) != DISTRO_OK) return st;
    for (int r = 0; r < l->nranks; r++) /* every rank sees every failure: all fail together */
      if (!sig[2 * r + 1])
        return distro__fail(DISTRO_ERR_NOMEM, "learner %d: rank %d is out of memory", l->opt.learner_id, r);
    for (int r = 1; r < l->nranks; r++)
      if (sig[2 * r] != sig[0])
        return distro__fail(DISTRO_ERR_SHAPE, "learner %d: rank %d registered other tensors than rank 0",
                            l->opt.learner_id, r);
    if (l->rank != 0) {
      if ((st = dp_start(l, 0)) != DISTRO_OK) return st;
      l->started = 1;
      l->last_call = distro__sy_now();
      return DISTRO_OK;
    }
  }
  if (pthread_create(&l->th, NULL, bg_main, l) != 0) {
    st = distro__fail(DISTRO_ERR_NOMEM, "cannot start the learner's background thread");
    if (l->comm) dp_start(l, 0);
    return st;
  }
  l->th_started = 1;
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  const double end = (double)dl.tv_sec + 1e-9 * (double)dl.tv_nsec + l->opt.join_timeout_s;
  dl.tv_sec = (time_t)end;
  dl.tv_nsec = (long)((end - (double)dl.tv_sec) * 1e9);
  pthread_mutex_lock(&l->mu);
  int rc = 0;
  while (l->join_state != J_DONE && l->join_state != J_FAILED && rc == 0) rc = pthread_cond_timedwait(&l->cv, &l->mu, &dl);
  const int js = l->join_state;
  if (js == J_DONE) {
    const int P = l->L.P;
    memcpy(l->base, l->incoming, sizeof(float) * (size_t)l->L.total);
    for (int p = 0; p < P; p++) {
      l->version[p] = l->in_version[p];
      l->in_new[p] = 0;
      distro__sy_scatter(&l->L, p, l->base + l->L.frag_off[p], l->tp);
    }
    memcpy(l->snap, l->base, sizeof(float) * (size_t)l->L.total);
  }
  pthread_mutex_unlock(&l->mu);
  if (l->comm) {
    /* Collective even when this rank failed, so the others learn of it. */
    const distro_status bs = dp_start(l, js == J_DONE);
    if (js == J_DONE && bs != DISTRO_OK) return bs;
  }
  if (js == J_FAILED) DISTRO_FAIL(l->join_st, "learner %d: %s", l->opt.learner_id, l->join_msg);
  if (js != J_DONE)
    DISTRO_FAIL(DISTRO_ERR_TIMEOUT, "learner %d: no answer from the syncer at '%s' within %.1f s (wrong key?)",
                l->opt.learner_id, l->opt.syncer, l->opt.join_timeout_s);
  l->started = 1;
  l->last_call = distro__sy_now();
  return DISTRO_OK;
fail:
  return st;
}

static void resolve(distro_learner *l, int p, uint64_t newest, uint64_t rejected) {
  const int P = l->L.P;
  ln_pend *pd = l->pend + (size_t)p * NPEND;
  int k = 0;
  for (int i = 0; i < l->npend[p]; i++) {
    if (pd[i].round < newest) l->useful += pd[i].sec / P;
    else if (rejected && pd[i].round == rejected) l->wasted += pd[i].sec / P;
    else pd[k++] = pd[i];
  }
  l->npend[p] = k;
}

static void fill_stats(distro_learner *l, distro_learner_stats *st) {
  st->step = l->tstep;
  st->reports = l->reports;
  st->applies = l->applies;
  pthread_mutex_lock(&l->mu);
  st->errors = l->errors;
  st->last_error = l->last_error;
  st->rejoins = l->rejoins;
  st->bytes_up = l->bytes_up;
  st->bytes_down = l->bytes_down;
  st->connected = l->connected;
  st->joined_from_peer = l->join_source;
  pthread_mutex_unlock(&l->mu);
  st->goodput = l->useful + l->wasted > 0 ? l->useful / (l->useful + l->wasted) : 1.0;
  st->step_s = l->step_ema;
  st->tokens = l->tokens;
  st->ranks = l->nranks;
  st->useful_s = l->useful;
  st->wasted_s = l->wasted;
  double pending = 0;
  for (int p = 0; l->started && p < l->L.P; p++) {
    pending += l->sec[p];
    for (int i = 0; i < l->npend[p]; i++) pending += l->pend[(size_t)p * NPEND + i].sec;
  }
  st->pending_s = l->started ? pending / l->L.P : 0;
}

distro_status distro_learner_step(distro_learner *l, uint64_t tokens, distro_learner_stats *out) {
  distro_status st = DISTRO_OK;
  distro_learner_stats s;
  memset(&s, 0, sizeof s);
  s.reported = -1;
  if (!l || !l->started) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_step before distro_learner_start");
  if (l->comm) {
    uint64_t all[256];
    if ((st = distro_comm_allgather(l->comm, &tokens, sizeof tokens, all)) != DISTRO_OK) return st;
    tokens = 0;
    for (int r = 0; r < l->nranks; r++) tokens += all[r];
    if (l->rank != 0) return dp_follow(l, out);
  }
  l->tokens += tokens;
  const int P = l->L.P;
  /* Data-parallel: what the other ranks must repeat (see dp_follow). */
  uint64_t *ctl_ap = l->comm ? l->ctl + 2 : NULL, *ctl_rq = l->comm ? l->ctl + 2 + 3 * (size_t)P : NULL;
  size_t packed = 0;
  int nctl_req = 0;
  const double now = distro__sy_now(), dt = now - l->last_call;
  l->last_call = now;
  l->step_ema = l->tstep ? 0.9 * l->step_ema + 0.1 * dt : dt;
  l->tstep++;
  for (int p = 0; p < P; p++) {
    l->tok[p] += (double)tokens;
    l->stp[p] += 1;
    l->sec[p] += dt;
  }
  uint64_t req[64], newest[64];
  int applied_p[64], nreq = 0;
  int napplied = 0;
  pthread_mutex_lock(&l->mu);
  l->hb_step_s = l->step_ema;
  l->hb_steps = l->tstep;
  for (int p = 0; p < P; p++) {
    if (l->rej_round[p]) {
      const uint64_t r = l->rej_round[p];
      l->rej_round[p] = 0;
      pthread_mutex_unlock(&l->mu);
      resolve(l, p, 0, r);
      pthread_mutex_lock(&l->mu);
    }
    if (l->in_new[p] && (!l->rep_pending[p] || l->tstep >= l->rep_t[p] + l->tau) && napplied < 64) {
      /* Apply the merged fragment. */
      const int64_t n = l->L.frags.numel[p], o = l->L.frag_off[p];
      float *th = l->scratch;
      const float *in = l->incoming + o;
      distro__sy_gather(&l->L, p, l->tp, th);
      const int keep = l->opt.keep_local && l->rep_pending[p];
      if (keep) {
        const float *sn = l->snap + o;
        for (int64_t j = 0; j < n; j++) th[j] = in[j] + (th[j] - sn[j]);
      } else {
        memcpy(th, in, sizeof(float) * (size_t)n);
      }
      distro__sy_scatter(&l->L, p, th, l->tp);
      if (ctl_ap) {
        ctl_ap[3 * napplied] = (uint64_t)p;
        ctl_ap[3 * napplied + 1] = l->in_version[p];
        ctl_ap[3 * napplied + 2] = (uint64_t)keep;
        memcpy(l->stage + packed, in, sizeof(float) * (size_t)n);
        packed += (size_t)n;
      }
      memcpy(l->base + o, in, sizeof(float) * (size_t)n);
      l->version[p] = l->in_version[p];
      l->in_new[p] = 0;
      newest[napplied] = l->in_newest[p];
      applied_p[napplied++] = p;
    }
    if (l->req_round[p] && nreq < 64) {
      req[nreq++] = ((uint64_t)p << 48) | l->req_round[p];
      l->req_round[p] = 0;
    }
  }
  pthread_mutex_unlock(&l->mu);
  for (int k = 0; k < napplied; k++) {
    const int p = applied_p[k];
    if (l->rep_pending[p]) {
      if (l->opt.keep_local) {
        l->tok[p] -= l->rep_tok[p];
        l->stp[p] -= l->rep_stp[p];
      } else {
        l->wasted += l->sec[p] / P; /* steps after the report are overwritten */
        l->sec[p] = 0;
        l->tok[p] = l->stp[p] = 0;
      }
      l->rep_pending[p] = 0;
    } else if (!l->opt.keep_local) {
      l->wasted += l->sec[p] / P;
      l->sec[p] = 0;
      l->tok[p] = l->stp[p] = 0;
    }
    resolve(l, p, newest[k], 0);
    l->applies++;
  }
  s.applied = napplied;
  for (int k = 0; k < nreq; k++) {
    const int p = (int)(req[k] >> 48);
    const uint64_t round = req[k] & ((1ull << 48) - 1);
    const int64_t n = l->L.frags.numel[p], o = l->L.frag_off[p];
    float *th = l->scratch;
    distro__sy_gather(&l->L, p, l->tp, th);
    memcpy(l->snap + o, th, sizeof(float) * (size_t)n);
    if (ctl_rq) ctl_rq[nctl_req++] = (uint64_t)p;
    int finite = 1;
    for (int64_t j = 0; j < n; j++) {
      th[j] = l->base[o + j] - th[j];
      if (!isfinite(th[j])) finite = 0;
    }
    if (!finite) {
      st = distro__fail(DISTRO_ERR_NONFINITE, "learner %d: fragment %d has non-finite parameters; not reported",
                        l->opt.learner_id, p);
      continue;
    }
    ln_out *q = calloc(1, sizeof *q);
    uint8_t *pl = malloc(l->L.frag_bytes[p] ? l->L.frag_bytes[p] : 1);
    if (!q || !pl) {
      free(q);
      free(pl);
      st = distro__fail(DISTRO_ERR_NOMEM, "out of memory");
      continue;
    }
    const distro__fragments *f = &l->L.frags;
    for (int qq = f->start[p]; qq < f->start[p + 1]; qq++)
      distro__outer_encode(l->L.codec, th + l->L.piece_elem[qq], f->pieces[qq].count, l->L.block,
                           pl + l->L.piece_byte[qq]);
    q->m.type = DISTRO__SY_REPORT;
    q->m.fragment = (uint32_t)p;
    q->m.a = round;
    q->m.b = l->version[p];
    q->m.c = (uint64_t)llround(l->tok[p]);
    q->m.d = (uint64_t)llround(l->stp[p]);
    q->m.e = l->step_ema;
    q->m.payload_bytes = (uint32_t)l->L.frag_bytes[p];
    q->payload = pl;
    pthread_mutex_lock(&l->mu);
    if (l->out_tail) l->out_tail->next = q;
    else l->out_head = q;
    l->out_tail = q;
    pthread_mutex_unlock(&l->mu);
    l->rep_tok[p] = l->tok[p];
    l->rep_stp[p] = l->stp[p];
    l->rep_t[p] = l->tstep;
    l->rep_pending[p] = 1;
    ln_pend *pd = l->pend + (size_t)p * NPEND;
    if (l->npend[p] == NPEND) {
      l->wasted += pd[0].sec / P;
      memmove(pd, pd + 1, sizeof *pd * (NPEND - 1));
      l->npend[p]--;
    }
    pd[l->npend[p]++] = (ln_pend){round, l->sec[p]};
    l->sec[p] = 0;
    l->reports++;
    s.reported = p;
  }
  fill_stats(l, &s);
  if (out) *out = s;
  if (l->comm) {
    l->ctl[0] = (uint64_t)napplied;
    l->ctl[1] = (uint64_t)nctl_req;
    memcpy(l->ctl + 2 + 4 * (size_t)P, &s, sizeof s);
    distro_status bs = dp_bcast(l, l->ctl, 8 * l->ctl_words);
    if (bs == DISTRO_OK && packed) bs = dp_bcast(l, l->stage, sizeof(float) * packed);
    if (bs != DISTRO_OK) return bs;
  }
  return st;
}

distro_status distro_learner_get_stats(distro_learner *l, distro_learner_stats *st) {
  if (!l || !st) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_get_stats: NULL argument");
  if (l->comm && l->rank != 0) {
    *st = l->mirror;
    st->reported = -1;
    st->applied = 0;
    return DISTRO_OK;
  }
  memset(st, 0, sizeof *st);
  st->reported = -1;
  fill_stats(l, st);
  return DISTRO_OK;
}

int distro_learner_fragments(const distro_learner *l) { return l && l->started ? l->L.P : 0; }

distro_status distro_learner_versions(const distro_learner *l, uint64_t *v, int P) {
  if (!l || !v || !l->started) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_versions: not started");
  if (P != l->L.P) return distro__fail(DISTRO_ERR_SHAPE, "P = %d, the job has %d fragments", P, l->L.P);
  for (int p = 0; p < P; p++) v[p] = l->version[p];
  return DISTRO_OK;
}

distro_status distro_learner_get_global(const distro_learner *l, const char *name, float *out, int64_t numel) {
  if (!l || !name || !out || !l->started)
    return distro__fail(DISTRO_ERR_INVALID, "distro_learner_get_global: NULL argument or not started");
  int idx = -1;
  for (int i = 0; i < l->nt; i++)
    if (strcmp(l->t[i].name, name) == 0) idx = i;
  if (idx < 0) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_get_global: no tensor '%s'", name);
  if (numel != l->t[idx].numel)
    return distro__fail(DISTRO_ERR_SHAPE, "distro_learner_get_global: '%s' has %lld elements, not %lld", name,
                        (long long)l->t[idx].numel, (long long)numel);
  const distro__fragments *f = &l->L.frags;
  for (int p = 0; p < l->L.P; p++)
    for (int q = f->start[p]; q < f->start[p + 1]; q++)
      if (f->pieces[q].tensor == idx)
        memcpy(out + f->pieces[q].offset, l->base + l->L.frag_off[p] + l->L.piece_elem[q],
               sizeof(float) * (size_t)f->pieces[q].count);
  return DISTRO_OK;
}

void distro_learner_free(distro_learner *l) {
  if (!l) return;
  if (l->th_started) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->th, NULL);
  }
  while (l->out_head) {
    ln_out *n = l->out_head->next;
    free(l->out_head->payload);
    free(l->out_head);
    l->out_head = n;
  }
  free_buffers(l);
  free(l->ctl);
  free(l->stage);
  free(l->bc_tmp);
  for (int i = 0; i < l->nt; i++) free(l->t[i].name);
  free(l->t);
  free(l->tp);
  free(l->s_syncer);
  free(l->s_serve);
  free(l->s_server_key);
  free(l->s_keypair);
  if (l->mu_init) {
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
  }
  free(l);
}
