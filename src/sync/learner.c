/* The learner: its options and tensors, the join (distro_learner_start)
 * and the training thread's side of every step: distro_learner_step
 * reports the fragments the syncer asked for and applies merged fragments
 * whose tau steps have passed, never waiting for the network. The
 * background thread that owns the sockets is learner_bg.c, data-parallel
 * ranks learner_dp.c (docs/protocol.md). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "common/error.h"
#include "common/fnv.h"
#include "compress/outer_codec.h"
#include "sync/learner_bg.h"
#include "sync/learner_dp.h"
#include "sync/learner_state.h"

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

/* Endpoints: well-formed, and reachable from other machines only with
 * CURVE (or insecure). */
static distro_status check_endpoints(const distro_learner_options *o) {
  char why[300];
  const int s_local = distro__sy_endpoint_check(o->syncer, 0, why, sizeof why);
  if (s_local < 0) return distro__fail(DISTRO_ERR_INVALID, "learner options: syncer: %s", why);
  const int v_local = distro__sy_endpoint_check(o->serve_endpoint, 1, why, sizeof why);
  if (v_local < 0) return distro__fail(DISTRO_ERR_INVALID, "learner options: serve endpoint: %s", why);
  if (!o->curve_keypair && !o->insecure && (!s_local || !v_local))
    return distro__fail(DISTRO_ERR_INVALID,
                        "learner options: '%s' is reachable from other machines and CURVE is off: a forged syncer or "
                        "peer could feed this learner, or anyone download its state (give curve_server_key and "
                        "curve_keypair, or set insecure)",
                        !s_local ? o->syncer : o->serve_endpoint);
  return DISTRO_OK;
}

distro_status distro_learner_create(const distro_learner_options *o, distro_learner **out) {
  distro_status st = DISTRO_OK;
  distro_learner *l = NULL;
  int bad = 0;
  if (!out) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_create: out is NULL");
  *out = NULL;
  if (!o || o->version < 1 || o->version > DISTRO_LEARNER_OPTIONS_VERSION)
    return distro__fail(DISTRO_ERR_INVALID, "learner options: NULL or version %d (want 1 to %d)",
                        o ? o->version : -1, DISTRO_LEARNER_OPTIONS_VERSION);
  distro_learner_options oo = distro_learner_options_default();
  /* Version 1 ends before `comm`, version 2 before `insecure`, version 3
   * before `tokens_per_step`. */
  memcpy(&oo, o,
         o->version == 1   ? offsetof(distro_learner_options, comm)
         : o->version == 2 ? offsetof(distro_learner_options, insecure)
         : o->version == 3 ? offsetof(distro_learner_options, tokens_per_step)
                           : sizeof oo);
  o = &oo;
  if (o->comm && (distro_comm_size(o->comm) < 1 || distro_comm_rank(o->comm) < 0))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: comm has size %d, rank %d",
                        distro_comm_size(o->comm), distro_comm_rank(o->comm));
  if (!o->syncer || o->learner_id < 0 || o->learner_id >= 256 || !o->serve_endpoint)
    return distro__fail(DISTRO_ERR_INVALID, "learner options: need a syncer endpoint, learner_id in [0, 256) and "
                                            "a serve endpoint");
  if (!(o->heartbeat_s > 0) || !(o->timeout_s > o->heartbeat_s) || !(o->join_timeout_s > 0) ||
      !isfinite(o->timeout_s) || !isfinite(o->join_timeout_s))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: need heartbeat_s > 0, finite timeout_s > heartbeat_s, "
                                            "finite join_timeout_s > 0");
  if ((o->curve_server_key != NULL) != (o->curve_keypair != NULL))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: CURVE needs both curve_server_key and curve_keypair");
  if (o->curve_allowed && !o->curve_keypair)
    return distro__fail(DISTRO_ERR_INVALID, "learner options: curve_allowed needs curve_keypair");
  if (o->tokens_per_step > ((uint64_t)1 << 53))
    return distro__fail(DISTRO_ERR_INVALID, "learner options: tokens_per_step %llu > 2^53",
                        (unsigned long long)o->tokens_per_step);
  if ((st = check_endpoints(o)) != DISTRO_OK) return st;
  l = calloc(1, sizeof *l);
  if (!l) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  l->opt = *o;
  l->s_syncer = dup_or_null(o->syncer, &bad);
  l->s_serve = dup_or_null(o->serve_endpoint, &bad);
  l->s_server_key = dup_or_null(o->curve_server_key, &bad);
  l->s_keypair = dup_or_null(o->curve_keypair, &bad);
  l->s_allowed = dup_or_null(o->curve_allowed, &bad);
  if (bad) DISTRO_FAIL(DISTRO_ERR_NOMEM, "out of memory");
  l->opt.syncer = l->s_syncer;
  l->opt.serve_endpoint = l->s_serve;
  l->opt.curve_server_key = l->s_server_key;
  l->opt.curve_keypair = l->s_keypair;
  l->opt.curve_allowed = l->s_allowed;
  if (o->curve_keypair) {
    /* Check the keys now (mode, pair), not in the background thread. */
    char pub[41], sec[41];
    DISTRO_CHECK(distro__sy_read_key(o->curve_keypair, pub, sec));
    memset(sec, 0, sizeof sec);
    DISTRO_CHECK(distro__sy_read_key(o->curve_server_key, pub, NULL));
    if (o->curve_allowed) DISTRO_CHECK(distro__sy_load_allowed(o->curve_allowed, &l->allowed, &l->nallowed));
  }
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
  DISTRO__NONNULL("distro_learner_add_tensor", l);
  DISTRO__NONNULL("distro_learner_add_tensor", name);
  DISTRO__NONNULL("distro_learner_add_tensor", param);
  if (numel < 1)
    return distro__fail(DISTRO_ERR_INVALID, "distro_learner_add_tensor('%.64s'): numel is %lld, need at least 1", name,
                        (long long)numel);
  if (l->started || l->th_started)
    return distro__fail(DISTRO_ERR_INVALID, "distro_learner_add_tensor after distro_learner_start");
  if (flags & ~DISTRO_DILOCO_PLAIN_MERGE) return distro__fail(DISTRO_ERR_INVALID, "unknown tensor flags 0x%x", flags);
  if (numel > DISTRO__SY_MAX_NUMEL - l->total)
    return distro__fail(DISTRO_ERR_INVALID,
                        "distro_learner_add_tensor: '%s' of %lld elements makes the model larger than the %lld "
                        "parameters a decoupled job holds",
                        name, (long long)numel, (long long)DISTRO__SY_MAX_NUMEL);
  if (l->nt >= DISTRO__SY_MAX_TENSORS)
    return distro__fail(DISTRO_ERR_INVALID, "distro_learner_add_tensor: more than %d tensors", DISTRO__SY_MAX_TENSORS);
  for (int i = 0; i < l->nt; i++)
    if (strcmp(l->t[i].name, name) == 0) return distro__fail(DISTRO_ERR_INVALID, "tensor '%s' added twice", name);
  if (l->nt == l->cap) {
    const int nc = l->cap ? 2 * l->cap : 8;
    ln_tensor *nt = realloc(l->t, sizeof *nt * (size_t)nc);
    if (nt) l->t = nt;
    float **ntp = realloc(l->tp, sizeof *ntp * (size_t)nc);
    if (ntp) l->tp = ntp;
    if (!nt || !ntp) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
    l->cap = nc;
  }
  char *nm = strdup(name);
  if (!nm) return distro__fail(DISTRO_ERR_NOMEM, "out of memory");
  l->t[l->nt] = (ln_tensor){nm, param, numel, flags};
  l->tp[l->nt] = param;
  l->nt++;
  l->total += numel;
  return DISTRO_OK;
}

uint64_t distro_learner_signature(const distro_learner *l) {
  if (!l || l->nt < 1) return 0;
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < l->nt; i++) {
    h = distro__fnv1a(h, l->t[i].name, strlen(l->t[i].name) + 1);
    h = distro__fnv1a(h, &l->t[i].numel, sizeof l->t[i].numel);
    h = distro__fnv1a(h, &l->t[i].flags, sizeof l->t[i].flags);
  }
  return h;
}

distro_status distro_learner_start(distro_learner *l) {
  distro_status st = DISTRO_OK;
  if (!l) return distro__fail(DISTRO_ERR_INVALID, "learner is NULL");
  if (l->started || l->th_started) return distro__fail(DISTRO_ERR_INVALID, "distro_learner_start called twice");
  if (l->nt < 1) return distro__fail(DISTRO_ERR_INVALID, "no tensors registered");
  const uint64_t h = distro_learner_signature(l);
  l->signature = h;
  if (l->rank == 0)
    distro__ln_log(l, "model signature %016llx (%d tensors, %lld parameters)", (unsigned long long)h, l->nt,
                   (long long)l->total);
  if (l->comm) {
    /* Every rank must have registered the same tensors. */
    uint64_t mine[2], sig[2 * 256];
    if (l->nranks > 256) return distro__fail(DISTRO_ERR_INVALID, "a learner has at most 256 ranks");
    l->bc_tmp = malloc(DISTRO__LN_BCAST_SLOT * (size_t)l->nranks);
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
      if ((st = distro__ln_dp_start(l, 0)) != DISTRO_OK) return st;
      l->started = 1;
      l->last_call = distro__sy_now();
      return DISTRO_OK;
    }
  }
  if (pthread_create(&l->th, NULL, distro__ln_bg_main, l) != 0) {
    st = distro__fail(DISTRO_ERR_NOMEM, "cannot start the learner's background thread");
    if (l->comm) distro__ln_dp_start(l, 0);
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
    const distro_status bs = distro__ln_dp_start(l, js == J_DONE);
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
  st->forged = l->forged;
  st->no_merge_s = l->t_last_merge > 0 ? distro__sy_now() - l->t_last_merge : 0;
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
    if (l->rank != 0) return distro__ln_dp_follow(l, out);
  }
  l->tokens += tokens;
  if (l->opt.tokens_per_step && tokens > l->opt.tokens_per_step && !l->tps_warned) {
    l->tps_warned = 1;
    distro__ln_log(l, "a step of %llu tokens exceeds the declared tokens_per_step %llu: the syncer cuts the token "
                      "claims of its reports to the declared rate",
                   (unsigned long long)tokens, (unsigned long long)l->opt.tokens_per_step);
  }
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
    uint64_t claim_tokens = (uint64_t)llround(l->tok[p]), claim_steps = (uint64_t)llround(l->stp[p]);
    if (l->report_hook) l->report_hook(l->report_hook_ctx, p, th, l->base + o, n, &claim_tokens, &claim_steps);
    const distro__fragments *f = &l->L.frags;
    for (int qq = f->start[p]; qq < f->start[p + 1]; qq++)
      distro__outer_encode(l->L.codec, th + l->L.piece_elem[qq], f->pieces[qq].count, l->L.block,
                           pl + l->L.piece_byte[qq]);
    q->m.type = DISTRO__SY_REPORT;
    q->m.fragment = (uint32_t)p;
    q->m.a = round;
    q->m.b = l->version[p];
    q->m.c = claim_tokens;
    q->m.d = claim_steps;
    q->m.e = l->step_ema;
    q->m.payload_bytes = (uint32_t)l->L.frag_bytes[p];
    q->payload = pl;
    q->step = (uint64_t)l->tstep;
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
    distro_status bs = distro__ln_dp_bcast(l, l->ctl, 8 * l->ctl_words);
    if (bs == DISTRO_OK && packed) bs = distro__ln_dp_bcast(l, l->stage, sizeof(float) * packed);
    if (bs != DISTRO_OK) return bs;
  }
  return st;
}

distro_status distro_learner_get_stats(distro_learner *l, distro_learner_stats *st) {
  DISTRO__NONNULL("distro_learner_get_stats", l);
  DISTRO__NONNULL("distro_learner_get_stats", st);
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
  DISTRO__NONNULL("distro_learner_get_global", l);
  DISTRO__NONNULL("distro_learner_get_global", name);
  DISTRO__NONNULL("distro_learner_get_global", out);
  if (!l->started)
    return distro__fail(DISTRO_ERR_INVALID, "distro_learner_get_global: the learner is not started (distro_learner_start)");
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
  distro__ln_free_buffers(l);
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
  free(l->s_allowed);
  free(l->allowed);
  if (l->mu_init) {
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
  }
  free(l);
}
