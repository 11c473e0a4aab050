/* The syncer's clock: liveness, the fragment schedule, rounds and merges
 * (docs/protocol.md, docs/algorithms.md).
 *
 * Per fragment p the syncer opens a round every P intervals: it asks every
 * live learner to REPORT its outer gradient, waits for a quorum of
 * min(K, live learners asked) reports, then for the adaptive grace window
 * max(0, gamma (tau step - t_quorum - t_sync)) (moving averages) or until
 * every learner asked has answered, merges everything it holds for p (late
 * reports of earlier rounds included, re-anchored at the current copy),
 * takes a Nesterov outer step and sends the new fragment to every live
 * learner. Rounds of different fragments overlap in time, and one that is
 * still open is skipped, so it never holds the others up.
 *
 * Liveness: a round closes at its deadline (distro__syncer_round_bound
 * after it opened) whatever the learners do: merged when the quorum is
 * there, else abandoned, its reports kept for p's next round. A learner
 * that says hello on a new connection is asked again (or, as a fresh
 * process, no longer waited for). A job without merges is logged. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compress/outer_codec.h"
#include "optim/outer_merge.h"
#include "sync/bounds.h"
#include "sync/checkpoint.h"
#include "sync/rounds.h"
#include "sync/syncer_state.h"

/* A learner's claimed step time counts up to this (one liar cannot make
 * rounds wait for hours; the median already needs a majority). */
#define MAX_STEP_S 60.0

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_step(distro_syncer *s) {
  double v[DISTRO__SY_MAX_LEARNERS];
  int n = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i] && s->learners[i]->alive && s->learners[i]->ready && s->learners[i]->step_s > 0)
      v[n++] = s->learners[i]->step_s < MAX_STEP_S ? s->learners[i]->step_s : MAX_STEP_S;
  if (!n) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double interval(distro_syncer *s) {
  if (s->opt.interval_s > 0) return s->opt.interval_s;
  const double st = median_step(s);
  return st > 0 ? s->opt.H * st / s->L.P : 0.25;
}

double distro__syncer_round_bound(distro_syncer *s) {
  if (s->opt.round_timeout_s > 0) return s->opt.round_timeout_s;
  const double by_steps = 3 * median_step(s), by_timeout = 2 * s->opt.timeout_s;
  return by_steps > by_timeout ? by_steps : by_timeout;
}

static void ask(distro_syncer *s, int p, int id) {
  const sy_fragment *F = &s->frag[p];
  distro__sy_msg m = {0};
  m.type = DISTRO__SY_REQUEST;
  m.fragment = (uint32_t)p;
  m.learner = (uint32_t)id;
  m.a = F->round;
  m.b = F->version;
  distro__syncer_send_to(s, s->learners[id], &m, NULL);
}

static void open_round(distro_syncer *s, int p, double now) {
  sy_fragment *F = &s->frag[p];
  int asked = 0;
  memset(F->asked, 0, sizeof F->asked);
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (s->learners[i] && s->learners[i]->alive && s->learners[i]->ready && !distro__syncer_quarantined(s, i, now))
      F->asked[i] = 1, asked++;
  if (!asked) return;
  F->round++;
  F->open = 1;
  F->t_open = now;
  F->deadline = now + distro__syncer_round_bound(s);
  F->t_quorum = -1;
  F->grace = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
    if (F->asked[i]) ask(s, p, i);
}

void distro__syncer_reasked(distro_syncer *s, int id, int has_state) {
  if (!s->initialized) return;
  for (int p = 0; p < s->L.P; p++) {
    sy_fragment *F = &s->frag[p];
    if (!F->open || !F->asked[id]) continue;
    int answered = 0;
    for (int k = 0; k < F->nrep; k++) answered |= F->rep[k].learner == id && F->rep[k].round == F->round;
    if (answered) continue;
    if (has_state) {
      ask(s, p, id); /* its request went to the old connection */
    } else {
      F->asked[id] = 0; /* a fresh process has no report to give */
    }
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
    nd[i] = malloc(sizeof(float) * (size_t)s->L.maxf);
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
  double tok[256], stp[256], mstp[256], mtime[256], w[256];
  if (nr > 256 || ensure_deltas(s, nr) != 0) {
    distro__syncer_log(s, "fragment %d: %d reports, cannot merge (memory)", p, nr);
    drop_reports(F);
    F->open = 0;
    return;
  }
  uint64_t bytes_in = 0, tokens = 0;
  uint32_t mask = 0;
  int ids[256], keep[256];
  double nrm[256];
  for (int i = 0; i < nr; i++) {
    const sy_report *rp = &F->rep[i];
    float *d = s->deltas[i];
    for (int q = f->start[p]; q < f->start[p + 1]; q++)
      distro__outer_decode(s->L.codec, rp->enc + s->L.piece_byte[q], f->pieces[q].count, s->L.block,
                           d + s->L.piece_elem[q]);
    if (rp->base < F->version) {
      /* Re-anchor at the current copy: Theta_now - theta_m = delta + (Theta_now - Theta_base). */
      const float *old = distro__syncer_history(s, F, rp->base);
      if (old)
        for (int64_t j = 0; j < n; j++) d[j] += F->global[j] - old[j];
    }
    tok[i] = rp->tokens;
    stp[i] = rp->steps;
    mstp[i] = rp->max_steps;
    mtime[i] = rp->max_by_time;
    ids[i] = rp->learner;
  }
  /* Bounds, token claims and weights (bounds.c); refused reports leave the
   * merge (they stay in F->rep only to be freed). */
  const int nk = distro__syncer_screen(s, p, nr, ids, s->deltas, tok, stp, mstp, mtime, w, keep, nrm, now);
  for (int i = 0; i < nr; i++) {
    sy_learner *l = s->learners[ids[i]];
    if (keep[i] || !l || !l->alive) continue;
    /* Refused: the learner counts the work as lost. */
    static const char why[] = "report out of bounds: refused (see the syncer's log)";
    distro__sy_msg m = {0};
    m.type = DISTRO__SY_ERROR;
    m.learner = (uint32_t)ids[i];
    m.fragment = (uint32_t)p;
    m.a = DISTRO_SYNC_E_REFUSED;
    m.b = DISTRO__SY_REPORT;
    m.c = F->rep[i].round;
    m.payload_bytes = (uint32_t)(sizeof why - 1);
    distro__syncer_send_to(s, l, &m, why);
  }
  float *kd[256];
  double kw[256];
  int k = 0;
  for (int i = 0; i < nr; i++) {
    if (!keep[i]) continue;
    const sy_report *rp = &F->rep[i];
    kd[k] = s->deltas[i];
    kw[k++] = w[i];
    tokens += (uint64_t)tok[i];
    bytes_in += s->L.frag_bytes[p] + DISTRO__SY_HEADER;
    if (rp->learner < 32) mask |= 1u << rp->learner;
  }
  const int f_rob = distro__syncer_robust_f(s, nk);
  if (nk == 0 || (s->opt.robust != DISTRO_SYNC_ROBUST_NONE && nk < 2 * f_rob + 1)) {
    /* Too few reports left after the refusals: the round ends as an
     * abandoned one, the kept reports wait for p's next round. */
    distro__syncer_log(s, "fragment %d: round %llu not merged: %d report(s) kept, the %s needs %d; kept for the next "
                       "round", p, (unsigned long long)F->round, nk,
                       s->opt.robust == DISTRO_SYNC_ROBUST_NONE ? "merge" : "robust rule", 2 * f_rob + 1);
    int kept = 0;
    for (int i = 0; i < nr; i++)
      if (keep[i]) {
        F->rep[i].late = 1;
        F->rep[kept++] = F->rep[i];
      } else {
        free(F->rep[i].enc);
      }
    F->nrep = kept;
    F->open = 0;
    pthread_mutex_lock(&s->mu);
    s->abandoned++;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  float *g = s->scratch, *sm = s->scratch + s->L.maxf, *keepv = s->scratch + 2 * s->L.maxf;
  float coef[2 * 256];
  double cn[256];
  if (s->opt.robust != DISTRO_SYNC_ROBUST_NONE)
    distro__sy_trimmed_mean(&s->L, p, nk, f_rob, (const float *const *)kd, g);
  else
    distro__sy_merge(&s->L, p, s->opt.merge, nk, (const float *const *)kd, kw, g, coef, cn);
  memcpy(keepv, F->global, sizeof(float) * (size_t)n);
  /* New global into g (in place), new momentum into sm; committed below. */
  int ok = distro__outer_step(F->global, F->mom, g, n, s->opt.outer_lr, s->opt.outer_momentum, s->opt.nesterov,
                              g, sm);
  if (ok && s->opt.step_max_rel > 0) {
    /* A global step that cannot explode: the update against the fragment's size. */
    double dd = 0, gg = 0;
    for (int64_t j = 0; j < n; j++) {
      const double dj = (double)g[j] - (double)keepv[j];
      dd += dj * dj;
      gg += (double)keepv[j] * keepv[j];
    }
    if (gg > 0 && sqrt(dd) > s->opt.step_max_rel * sqrt(gg)) {
      char who[160];
      size_t o = 0;
      who[0] = 0;
      for (int i = 0; i < nr && o + 8 < sizeof who; i++)
        if (keep[i]) o += (size_t)snprintf(who + o, sizeof who - o, "%s%d", o ? "," : "", ids[i]);
      distro__syncer_log(s,
                         "fragment %d: merged update not applied: |step| %.4g > %g x |Theta| %.4g (reports of "
                         "learners %s); version %llu kept",
                         p, sqrt(dd), s->opt.step_max_rel, sqrt(gg), who, (unsigned long long)F->version);
      pthread_mutex_lock(&s->mu);
      s->steps_skipped++;
      pthread_mutex_unlock(&s->mu);
      drop_reports(F);
      F->open = 0;
      return;
    }
  }
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
  distro__syncer_remember_norms(s, p, nr, nrm, keep);
  s->t_progress = now;
  if (s->opt.max_staleness > 0) {
    sy_hist *h = &F->hist[(F->version - 1) % (uint64_t)s->opt.max_staleness];
    if (!h->data) h->data = malloc(sizeof(float) * (size_t)s->L.maxf);
    if (h->data) {
      memcpy(h->data, keepv, sizeof(float) * (size_t)n);
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
    for (int r = 0; r < nr; r++)
      if (F->rep[r].learner == i && keep[r]) {
        cnt++;
        if (F->rep[r].round + 1 > newest) newest = F->rep[r].round + 1;
      }
    l->merged += cnt;
    m.learner = (uint32_t)i;
    m.c = cnt;
    m.d = newest;
    distro__syncer_send_to(s, l, &m, F->global);
    distro__syncer_fragment_sent(s, l, p, F->version);
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
  info.participants = nk;
  info.participant_mask = mask;
  info.time_to_quorum_s = F->t_quorum >= 0 ? F->t_quorum - F->t_open : 0;
  info.grace_s = F->grace;
  info.waited_s = now - F->t_open;
  info.merge_s = t1 - t0;
  info.bytes_in = bytes_in;
  info.bytes_out = bytes_out;
  info.tokens = tokens;
  char idl[160];
  size_t o = 0;
  idl[0] = 0;
  for (int r = 0; r < nr && o + 8 < sizeof idl; r++)
    if (keep[r])
      o += (size_t)snprintf(idl + o, sizeof idl - o, "%s%d%s", o ? "," : "", F->rep[r].learner, F->rep[r].late ? "*" : "");
  distro__syncer_log(s,
                     "merge frag=%d version=%llu round=%llu quorum=%d live=%d participants=%d ids=%s "
                     "to_quorum=%.4f grace=%.4f waited=%.4f merge=%.5f bytes_in=%llu bytes_out=%llu tokens=%llu",
                     p, (unsigned long long)F->version, (unsigned long long)F->round, info.quorum, live, nk, idl,
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

/* Learner ids a round still waits for, as "1,3" (for log lines). */
static void waiting_for(distro_syncer *s, const sy_fragment *F, char *out, size_t n) {
  size_t o = 0;
  out[0] = 0;
  for (int i = 0; i < DISTRO__SY_MAX_LEARNERS && o + 8 < n; i++) {
    if (!F->asked[i] || !s->learners[i] || !s->learners[i]->alive) continue;
    int answered = 0;
    for (int k = 0; k < F->nrep; k++) answered |= F->rep[k].learner == i && !F->rep[k].late;
    if (!answered) o += (size_t)snprintf(out + o, n - o, "%s%d", o ? "," : "", i);
  }
  if (!o) snprintf(out, n, "nobody alive");
}

static void abandon(distro_syncer *s, int p, double now, int reported, int K) {
  sy_fragment *F = &s->frag[p];
  char ids[200];
  waiting_for(s, F, ids, sizeof ids);
  distro__syncer_log(s,
                     "fragment %d: round %llu abandoned after %.2f s with %d of %d reports (waited for learners %s); "
                     "its reports are kept for the next round",
                     p, (unsigned long long)F->round, now - F->t_open, reported, K, ids);
  for (int k = 0; k < F->nrep; k++) F->rep[k].late = 1;
  F->open = 0;
  pthread_mutex_lock(&s->mu);
  s->abandoned++;
  pthread_mutex_unlock(&s->mu);
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
    int K = s->opt.quorum < asked_live ? s->opt.quorum : asked_live > 0 ? asked_live : 1;
    /* The trimmed mean needs 2f + 1 reports whoever is alive: with fewer,
     * the round waits (and at its deadline keeps its reports). */
    if (s->opt.robust == DISTRO_SYNC_ROBUST_TRIMMED && K < 2 * distro__syncer_robust_f(s, reported) + 1)
      K = 2 * distro__syncer_robust_f(s, reported) + 1;
    if (reported < K) {
      if (now >= F->deadline) abandon(s, p, now, reported, K);
      continue;
    }
    if (F->t_quorum < 0) {
      F->t_quorum = now;
      const double ttq = now - F->t_open;
      s->ema_quorum = s->ema_n ? 0.8 * s->ema_quorum + 0.2 * ttq : ttq;
      s->ema_n++;
      const double g = s->opt.grace_gamma * (s->opt.overlap * median_step(s) - s->ema_quorum - s->ema_sync);
      F->grace = g > 0 ? g : 0;
    }
    if (now >= F->t_quorum + F->grace || asked_reported >= asked_live || now >= F->deadline) merge(s, p, now);
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
      continue;
    }
    live++;
  }
  /* A seeder that went away, or never seeds, gives the layout up: the next
   * hello may propose its own. */
  if (!s->initialized && s->seeder >= 0) {
    const sy_learner *l = s->learners[s->seeder];
    const double limit = 5 * s->opt.timeout_s;
    if (!l || !l->alive || now - s->t_seed_asked > limit) {
      distro__syncer_log(s, "learner %d did not seed (%s); its layout is dropped", s->seeder,
                         l && l->alive ? "no SEED in time" : "gone");
      distro__syncer_free_state(s);
      s->seeder = -1;
    }
  }
  pthread_mutex_lock(&s->mu);
  if (live > 0 && s->live_now == 0) s->t_progress = now; /* idle time is not a stall */
  s->live_now = live;
  pthread_mutex_unlock(&s->mu);
}

/* No merge for a long time while learners are live: say so, with what each
 * open round waits for. */
static void stall_report(distro_syncer *s, double now) {
  if (s->live_now == 0) return;
  const double bound = 2 * distro__syncer_round_bound(s) + 2 * interval(s);
  const double quiet = now - s->t_progress;
  if (quiet < bound || now < s->next_stall_log) return;
  char what[600];
  size_t o = 0;
  what[0] = 0;
  for (int p = 0; p < s->L.P && o + 80 < sizeof what; p++) {
    const sy_fragment *F = &s->frag[p];
    if (!F->open) continue;
    char ids[200];
    waiting_for(s, F, ids, sizeof ids);
    o += (size_t)snprintf(what + o, sizeof what - o, "; fragment %d round %llu waits for learners %s", p,
                          (unsigned long long)F->round, ids);
  }
  distro__syncer_log(s, "no merge for %.1f s (live %d, ready %d, quorum %d, %llu rounds abandoned)%s", quiet,
                     s->live_now, distro__syncer_count_live(s, 1), s->opt.quorum, (unsigned long long)s->abandoned,
                     what);
  s->next_stall_log = now + bound;
}

void distro__syncer_tick(distro_syncer *s, double now) {
  liveness(s, now);
  if (now >= s->next_hb) {
    distro__sy_msg m = {0};
    m.type = DISTRO__SY_HEARTBEAT;
    m.fragment = DISTRO__SY_NONE;
    m.a = s->merges;
    for (int i = 0; i < DISTRO__SY_MAX_LEARNERS; i++)
      if (s->learners[i] && s->learners[i]->alive) {
        m.learner = (uint32_t)i;
        distro__syncer_send_to(s, s->learners[i], &m, NULL);
      }
    s->next_hb = now + s->opt.heartbeat_s;
  }
  if (!s->initialized) return;
  if (now >= s->next_open) {
    /* The next fragment in turn whose round is not still open. */
    int p = -1;
    for (int k = 0; k < s->L.P && p < 0; k++)
      if (!s->frag[(s->next_p + k) % s->L.P].open) p = (s->next_p + k) % s->L.P;
    if (p >= 0 && distro__syncer_count_live(s, 1) > 0) {
      open_round(s, p, now);
      s->next_p = (p + 1) % s->L.P;
      s->next_open = now + interval(s);
    } else {
      s->next_open = now + 0.25 * interval(s);
    }
  }
  rounds(s, now);
  stall_report(s, now);
}
