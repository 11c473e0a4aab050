/* The syncer's defences against a hostile learner that holds a valid key
 * (docs/protocol.md, "Threat model"): every report's norm bounded by the
 * round's and the job's scale (clipped or refused), token claims held to
 * what the syncer can check and weights capped, the robust rule's
 * configuration checked, and per-learner accountability with quarantine.
 * The merge itself is merge.c, the step cap rounds.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "optim/outer_merge.h"
#include "sync/bounds.h"

/* A weight cut down by more than this factor past its cap counts as an
 * out-of-bound report (a small excess is an honest learner's speed). */
#define HARD_CAP_FACTOR 8.0
/* A token claim is held to the learner's tokens per step within this. */
#define TOKENS_SLACK 1.01

static int cmp_d(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The lower median of the positive finite values (0 if none). Zeros are
 * left out: a free rider's empty report must not set the scale. */
static double lower_median_pos(double *v, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    if (v[i] > 0 && isfinite(v[i])) v[k++] = v[i];
  if (!k) return 0;
  qsort(v, (size_t)k, sizeof *v, cmp_d);
  return v[(k - 1) / 2];
}

/* Sum of squares in float64, serial (a fragment's few reports: no thread
 * start-up on a busy machine) and in a fixed order. */
static double sumsq(const float *x, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; j++) s += (double)x[j] * x[j];
  return s;
}

static int auto_f(const distro_syncer_options *o) { return o->robust_f > 0 ? o->robust_f : (o->quorum - 1) / 2; }

distro_status distro__syncer_check_bounds(const distro_syncer_options *o) {
  if ((int)o->robust < 0 || (int)o->robust > DISTRO_SYNC_ROBUST_MEDIAN)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: unknown robust rule %d", (int)o->robust);
  if ((int)o->out_of_bound < 0 || (int)o->out_of_bound > DISTRO_SYNC_BOUND_REFUSE)
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: unknown out_of_bound %d", (int)o->out_of_bound);
  if (o->robust_f < 0 || o->robust_f > 127 || (o->robust == DISTRO_SYNC_ROBUST_MEDIAN && o->robust_f != 0))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: robust_f %d (>= 0; 0 with the median)", o->robust_f);
  if (o->robust != DISTRO_SYNC_ROBUST_NONE) {
    const int f = o->robust == DISTRO_SYNC_ROBUST_TRIMMED ? auto_f(o) : (o->quorum - 1) / 2;
    if (f < 1 || o->quorum < 2 * f + 1)
      return distro__fail(DISTRO_ERR_INVALID,
                          "syncer options: the %s with quorum %d tolerates %s (f = %d needs a quorum >= 2f + 1 = %d; "
                          "with fewer reports the rule degenerates to the mean): raise the quorum",
                          o->robust == DISTRO_SYNC_ROBUST_TRIMMED ? "trimmed mean" : "median", o->quorum,
                          f < 1 ? "no hostile report" : "fewer hostile reports than asked", f < 1 ? 1 : f,
                          2 * (f < 1 ? 1 : f) + 1);
  }
  if (!(o->clip_multiple == 0 || (o->clip_multiple >= 1 && isfinite(o->clip_multiple))) ||
      !(o->report_max_rel >= 0 && isfinite(o->report_max_rel)) ||
      !(o->step_max_rel >= 0 && isfinite(o->step_max_rel)) ||
      !(o->weight_cap == 0 || (o->weight_cap >= 1 && isfinite(o->weight_cap))))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: clip_multiple %g and weight_cap %g must be 0 or >= 1, "
                                            "report_max_rel %g and step_max_rel %g >= 0 (all finite)",
                        o->clip_multiple, o->weight_cap, o->report_max_rel, o->step_max_rel);
  if (!(o->min_step_s >= 0 && isfinite(o->min_step_s)))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: min_step_s %g must be finite and >= 0", o->min_step_s);
  if (o->quarantine_after < 0 || !(o->quarantine_s >= 0 && isfinite(o->quarantine_s)))
    return distro__fail(DISTRO_ERR_INVALID, "syncer options: quarantine_after %d or quarantine_s %g out of range",
                        o->quarantine_after, o->quarantine_s);
  return DISTRO_OK;
}

void distro__syncer_describe_bounds(const distro_syncer_options *o, char *out, size_t n) {
  char rule[160];
  if (o->robust == DISTRO_SYNC_ROBUST_TRIMMED)
    snprintf(rule, sizeof rule, "trimmed mean, tolerates f = %d hostile report(s) per merge (quorum %d, merges with "
                                ">= %d reports)",
             auto_f(o), o->quorum, 2 * auto_f(o) + 1);
  else if (o->robust == DISTRO_SYNC_ROBUST_MEDIAN)
    snprintf(rule, sizeof rule, "coordinate-wise median, tolerates f = (n - 1) / 2 of n reports (%d at the quorum %d)",
             (o->quorum - 1) / 2, o->quorum);
  else
    snprintf(rule, sizeof rule, "no robust rule (a hostile report moves the merge within its bound)");
  char claims[160];
  if (o->weight_cap > 0)
    snprintf(claims, sizeof claims, "claims held to the declared tokens per step, the step counter and the elapsed "
                                    "time (fastest step %g s or a quarter of the learner's own)",
             o->min_step_s);
  else
    snprintf(claims, sizeof claims, "claims not checked");
  snprintf(out, n, "%s; reports %s beyond %g x median norm and %g x |Theta|; steps beyond %g x |Theta| not applied; "
                   "weight cap %g x median; %s; quarantine after %d out-of-bound reports for %g s",
           rule, o->out_of_bound == DISTRO_SYNC_BOUND_REFUSE ? "refused" : "clipped", o->clip_multiple,
           o->report_max_rel, o->step_max_rel, o->weight_cap, claims, o->quarantine_after, o->quarantine_s);
}

int distro__syncer_robust_f(const distro_syncer *s, int n) {
  switch (s->opt.robust) {
    case DISTRO_SYNC_ROBUST_TRIMMED: return auto_f(&s->opt);
    case DISTRO_SYNC_ROBUST_MEDIAN: return n > 0 ? (n - 1) / 2 : 0;
    default: return 0;
  }
}

int distro__syncer_quarantined(const distro_syncer *s, int id, double now) {
  const sy_learner *l = id >= 0 && id < DISTRO__SY_MAX_LEARNERS ? s->learners[id] : NULL;
  return l && now < l->quarantined_until;
}

void distro__syncer_strike(distro_syncer *s, int id, int out, double now, const char *why) {
  sy_learner *l = id >= 0 && id < DISTRO__SY_MAX_LEARNERS ? s->learners[id] : NULL;
  if (!l) return;
  if (!out) {
    if (l->strikes > 0) l->strikes--;
    return;
  }
  l->strikes++;
  if (s->opt.quarantine_after <= 0 || l->strikes < s->opt.quarantine_after || now < l->quarantined_until) return;
  pthread_mutex_lock(&s->mu);
  l->quarantined_until = now + s->opt.quarantine_s;
  l->quarantines++;
  s->quarantines++;
  pthread_mutex_unlock(&s->mu);
  l->strikes = 0;
  distro__syncer_log(s,
                     "learner %d quarantined for %.0f s: %d reports out of bounds (last: %s); it is not asked and its "
                     "reports are refused (clipped %llu, refused %llu, capped %llu so far)",
                     id, s->opt.quarantine_s, s->opt.quarantine_after, why, (unsigned long long)l->clipped,
                     (unsigned long long)l->refused, (unsigned long long)l->capped);
}

/* What a learner's claims are held to (docs/protocol.md, "Honest token
 * weights"). Its tokens per step are fixed for the job at its HELLO (else
 * by its first report), per learner id. The steps a report of fragment p
 * claims count from the learner's last report of p before the version the
 * report is based on was sent to it (it applied that version, so it
 * counted its steps afresh from that report on, or later), or from its
 * join: they cannot exceed what its step counter advanced since then, nor
 * the elapsed time (plus timeout_s for the report's transit) divided by its
 * fastest plausible step (min_step_s, or a quarter of the fastest step time
 * it claimed), each plus 2H + 8 steps. */
#define STEP_TIME_SLACK 4.0

static double steps_slack(const distro_syncer *s) { return 2.0 * s->opt.H + 8; }

int distro__syncer_hello_tokens(const distro_syncer *s, int id, uint64_t tps, char *why, size_t n) {
  const sy_learner *l = id >= 0 && id < DISTRO__SY_MAX_LEARNERS ? s->learners[id] : NULL;
  if (s->opt.weight_cap <= 0 || tps == 0 || !l || l->tokens_per_step <= 0) return 0;
  if (l->tps_declared && (double)tps != l->tokens_per_step) {
    snprintf(why, n, "learner %d declares %llu tokens per step; the job fixed %.0f for this id at its first hello "
                     "(give the same tokens_per_step, or use another learner id)",
             id, (unsigned long long)tps, l->tokens_per_step);
    return -1;
  }
  if (!l->tps_declared && (double)tps > l->tokens_per_step * TOKENS_SLACK) {
    snprintf(why, n, "learner %d declares %llu tokens per step; the job fixed %.4g for this id at its first report "
                     "(a hello may not raise it)",
             id, (unsigned long long)tps, l->tokens_per_step);
    return -1;
  }
  return 0;
}

void distro__syncer_hello_claims(distro_syncer *s, sy_learner *l, int fresh_record, int has_state, uint64_t tps,
                                 double now) {
  if (tps > 0 && !l->tps_declared && (l->tokens_per_step <= 0 || (double)tps <= l->tokens_per_step * TOKENS_SLACK)) {
    pthread_mutex_lock(&s->mu);
    l->tokens_per_step = (double)tps;
    l->tps_declared = 1;
    pthread_mutex_unlock(&s->mu);
  }
  if (!has_state) {
    /* A process that has not joined yet: its step counter and its claims
     * start after this. */
    l->t_start = now;
    l->step_min = 0;
    if (l->win && s->initialized) memset(l->win, 0, sizeof *l->win * (size_t)s->L.P);
  } else if (fresh_record) {
    l->t_start = -1; /* rejoined (after a syncer restart, say): its claims may go back further */
  }
}

static sy_window *window(distro_syncer *s, sy_learner *l, int p) {
  if (!l->win) l->win = calloc((size_t)s->L.P, sizeof *l->win);
  return l->win ? &l->win[p] : NULL;
}

double distro__syncer_steps_bound(distro_syncer *s, sy_learner *l, int p, uint64_t base, double now, double *by_time) {
  sy_window *w = window(s, l, p);
  double t0 = l->t_start, h0 = 0;
  for (int k = 0; w && k < DISTRO__SY_ANCHORS; k++)
    if (w->anc[k].valid && w->anc[k].version == base) t0 = w->anc[k].t, h0 = w->anc[k].hb;
  const double slack = steps_slack(s), by_counter = (double)l->hb_steps - h0 + slack;
  const double fastest = fmax(s->opt.min_step_s, l->step_min / STEP_TIME_SLACK);
  *by_time = t0 >= 0 && fastest > 0 ? (now - t0 + s->opt.timeout_s) / fastest + slack : INFINITY;
  const double bound = fmin(by_counter, *by_time);
  if (w) {
    w->rep_t = now;
    w->rep_hb = (double)l->hb_steps;
    w->rep_ok = 1;
  }
  return bound;
}

void distro__syncer_fragment_sent(distro_syncer *s, sy_learner *l, int p, uint64_t version) {
  sy_window *w = window(s, l, p);
  if (!w) return;
  sy_anchor *a = &w->anc[w->next];
  w->next = (w->next + 1) % DISTRO__SY_ANCHORS;
  a->version = version;
  a->t = w->rep_ok ? w->rep_t : l->t_start;
  a->hb = w->rep_ok ? w->rep_hb : 0;
  a->valid = 1;
}

/* The claims of one report against those bounds. Returns 0 when within
 * them, 1 when they were cut (CLIP), -1 when the report is refused
 * (REFUSE); the reason in why. */
static int check_claims(distro_syncer *s, int p, int id, sy_learner *l, double *tok, double *stp, double max_stp,
                        double by_time, char *why, size_t wn) {
  int cut = 0;
  const int refuse = s->opt.out_of_bound == DISTRO_SYNC_BOUND_REFUSE;
  const char *verdict = refuse ? "refused" : "capped";
  if (*stp > max_stp) {
    snprintf(why, wn, "claims %.0f steps, its %s allows %.0f", *stp,
             by_time <= max_stp ? "elapsed time (at its fastest claimed step time)" : "step counter", max_stp);
    distro__syncer_log(s, "learner %d fragment %d: %s; steps %s", id, p, why, verdict);
    if (refuse) return -1;
    *tok *= max_stp / *stp;
    *stp = max_stp;
    cut = 1;
  }
  if (*tok > 0) {
    if (l->tokens_per_step == 0) {
      if (*stp >= 1) {
        pthread_mutex_lock(&s->mu);
        l->tokens_per_step = *tok / *stp;
        pthread_mutex_unlock(&s->mu);
      }
    } else if (*tok > l->tokens_per_step * *stp * TOKENS_SLACK + 1) {
      snprintf(why, wn, "claims %.4g tokens in %.0f steps, its %s %.4g tokens per step allow %.4g", *tok, *stp,
               l->tps_declared ? "declared" : "first report's", l->tokens_per_step, l->tokens_per_step * *stp);
      distro__syncer_log(s, "learner %d fragment %d: %s; tokens %s", id, p, why, verdict);
      if (refuse) return -1;
      *tok = l->tokens_per_step * *stp;
      cut = 1;
    }
  }
  return cut;
}

int distro__syncer_screen(distro_syncer *s, int p, int n, const int *ids, float *const *deltas, double *tok,
                          double *stp, const double *max_stp, const double *max_by_time, double *w, int *keep,
                          double *norm, double now) {
  const distro_syncer_options *o = &s->opt;
  const sy_fragment *F = &s->frag[p];
  const int64_t numel = s->L.frags.numel[p];
  double pool[256 + DISTRO__SY_NORM_HIST];
  int np = 0, out[256] = {0};
  char why[256][200];
  for (int i = 0; i < n; i++) {
    keep[i] = 1;
    why[i][0] = 0;
    norm[i] = sqrt(sumsq(deltas[i], numel));
    pool[np++] = norm[i];
  }
  for (int k = 0; k < F->norm_n; k++) pool[np++] = F->norm_hist[k];
  const double med = lower_median_pos(pool, np), gnorm = sqrt(sumsq(F->global, numel));
  double bound = INFINITY;
  if (o->clip_multiple > 0 && med > 0) bound = o->clip_multiple * med;
  if (o->report_max_rel > 0 && gnorm > 0 && o->report_max_rel * gnorm < bound) bound = o->report_max_rel * gnorm;
  uint64_t clipped = 0, refused = 0, capped = 0;
  for (int i = 0; i < n; i++) {
    sy_learner *l = s->learners[ids[i]];
    const int claims = l && o->weight_cap > 0
                           ? check_claims(s, p, ids[i], l, &tok[i], &stp[i], max_stp[i], max_by_time[i], why[i],
                                          sizeof why[i])
                           : 0;
    if (claims > 0) {
      out[i] = 1;
      l->capped++;
      capped++;
    } else if (claims < 0) {
      out[i] = 1;
      keep[i] = 0;
      refused++;
      l->refused++;
      continue;
    }
    if (norm[i] <= bound) continue;
    snprintf(why[i], sizeof why[i], "report norm %.4g > bound %.4g (%g x median %.4g, %g x |Theta| %.4g)", norm[i],
             bound, o->clip_multiple, med, o->report_max_rel, gnorm);
    out[i] = 1;
    if (o->out_of_bound == DISTRO_SYNC_BOUND_REFUSE) {
      keep[i] = 0;
      refused++;
      if (l) l->refused++;
      distro__syncer_log(s, "learner %d fragment %d: %s; refused", ids[i], p, why[i]);
    } else {
      const float c = (float)(bound / norm[i]);
      float *d = deltas[i];
      for (int64_t j = 0; j < numel; j++) d[j] *= c;
      norm[i] = bound;
      clipped++;
      if (l) l->clipped++;
      distro__syncer_log(s, "learner %d fragment %d: %s; clipped", ids[i], p, why[i]);
    }
  }
  /* Weights of the kept reports: the token rule's claims are checked (and
   * shares capped) whatever the rule, so that a claim is named even when
   * the robust rule gives it no influence. */
  double tk[256], sk[256], wk[256];
  int nk = 0, map[256];
  for (int i = 0; i < n; i++)
    if (keep[i]) tk[nk] = tok[i], sk[nk] = stp[i], map[nk++] = i;
  for (int i = 0; i < n; i++) w[i] = 0;
  if (nk > 0) {
    const distro_merge mode = o->robust != DISTRO_SYNC_ROBUST_NONE ? DISTRO_MERGE_TOKENS : o->merge;
    distro__outer_weights(mode, nk, tk, sk, wk);
    double tmp[256];
    memcpy(tmp, wk, sizeof(double) * (size_t)nk);
    const double wmed = lower_median_pos(tmp, nk), cap = o->weight_cap * wmed;
    int cut = 0;
    for (int k = 0; k < nk && o->weight_cap > 0 && wmed > 0; k++)
      if (wk[k] > cap) {
        const int i = map[k];
        sy_learner *l = s->learners[ids[i]];
        snprintf(why[i], sizeof why[i], "weight share %.4g > %g x median %.4g", wk[k], o->weight_cap, wmed);
        distro__syncer_log(s, "learner %d fragment %d: %s; capped", ids[i], p, why[i]);
        if (wk[k] > HARD_CAP_FACTOR * cap) out[i] = 1;
        wk[k] = cap;
        cut = 1;
        capped++;
        if (l) l->capped++;
      }
    double sum = 0;
    for (int k = 0; k < nk; k++) sum += wk[k];
    for (int k = 0; k < nk; k++) wk[k] = o->robust != DISTRO_SYNC_ROBUST_NONE ? 1.0 / nk : cut ? wk[k] / sum : wk[k];
    for (int k = 0; k < nk; k++) w[map[k]] = wk[k];
  }
  pthread_mutex_lock(&s->mu);
  s->clipped += clipped;
  s->refused += refused;
  s->capped += capped;
  for (int i = 0; i < n; i++) {
    sy_learner *l = s->learners[ids[i]];
    if (!l || !keep[i]) continue;
    l->share = w[i];
    if (w[i] > l->share_max) l->share_max = w[i];
  }
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n; i++) distro__syncer_strike(s, ids[i], out[i], now, why[i]);
  return nk;
}

void distro__syncer_remember_norms(distro_syncer *s, int p, int n, const double *norm, const int *keep) {
  sy_fragment *F = &s->frag[p];
  for (int i = 0; i < n; i++) {
    if (!keep[i] || !(norm[i] > 0) || !isfinite(norm[i])) continue;
    F->norm_hist[F->norm_next] = norm[i];
    F->norm_next = (F->norm_next + 1) % DISTRO__SY_NORM_HIST;
    if (F->norm_n < DISTRO__SY_NORM_HIST) F->norm_n++;
  }
}

distro_status distro_syncer_get_learner_stats(distro_syncer *s, int id, distro_syncer_learner_stats *st) {
  DISTRO__NONNULL("distro_syncer_get_learner_stats", s);
  DISTRO__NONNULL("distro_syncer_get_learner_stats", st);
  if (id < 0 || id >= DISTRO__SY_MAX_LEARNERS)
    return distro__fail(DISTRO_ERR_INVALID, "distro_syncer_get_learner_stats: learner id %d not in [0, %d)", id,
                        DISTRO__SY_MAX_LEARNERS);
  memset(st, 0, sizeof *st);
  pthread_mutex_lock(&s->mu);
  const sy_learner *l = s->learners[id];
  if (l) {
    const double now = distro__sy_now();
    st->known = 1;
    st->alive = l->alive;
    st->reports = l->reports;
    st->merged = l->merged;
    st->clipped = l->clipped;
    st->refused = l->refused;
    st->capped = l->capped;
    st->quarantines = l->quarantines;
    st->quarantined_s = l->quarantined_until > now ? l->quarantined_until - now : 0;
    st->tokens_per_step = l->tokens_per_step;
    st->weight_share = l->share;
    st->weight_share_max = l->share_max;
  }
  pthread_mutex_unlock(&s->mu);
  return DISTRO_OK;
}
