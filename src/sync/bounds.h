/* Internal: the syncer's defences against hostile learners (bounds.c). */
#ifndef DISTRO_SYNC_BOUNDS_H
#define DISTRO_SYNC_BOUNDS_H

#include "sync/syncer_state.h"

/* Checks the version 3 options (the robust rule must not degenerate). */
distro_status distro__syncer_check_bounds(const distro_syncer_options *o);
/* "trimmed mean, tolerates f = 1 of quorum 3" (for the start line). */
void distro__syncer_describe_bounds(const distro_syncer_options *o, char *out, size_t n);
/* Hostile reports the robust rule drops from each side for n reports (0: none). */
int distro__syncer_robust_f(const distro_syncer *s, int n);
/* 1 while learner id is quarantined. */
int distro__syncer_quarantined(const distro_syncer *s, int id, double now);
/* One report of learner id was out of bounds (out = 1: clipped, refused,
 * capped hard) or within them (out = 0); quarantines after too many. */
void distro__syncer_strike(distro_syncer *s, int id, int out, double now, const char *why);
/* Before a merge of fragment p: bounds the n decoded reports (deltas) of
 * learners ids[] with claims tok/stp (at most max_stp steps): clips them in
 * place, or marks keep[i] = 0 (refused); cuts the claims (or, with REFUSE,
 * refuses the report), and writes the weights w (sum 1 over the kept ones,
 * 0 for the others) and each report's norm after clipping. Logs each event
 * with the learner id. Returns the reports kept. */
int distro__syncer_screen(distro_syncer *s, int p, int n, const int *ids, float *const *deltas, double *tok,
                          double *stp, const double *max_stp, const double *max_by_time, double *w, int *keep,
                          double *norm, double now);
/* A HELLO of learner id declaring tps tokens per step (0: none): 0 when it
 * agrees with what the job fixed for the id, else -1 and the reason. */
int distro__syncer_hello_tokens(const distro_syncer *s, int id, uint64_t tps, char *why, size_t n);
/* The learner said hello (enroll): fixes a declared tokens per step, and a
 * fresh process (has_state 0) starts its step windows now. */
void distro__syncer_hello_claims(distro_syncer *s, sy_learner *l, int fresh_record, int has_state, uint64_t tps,
                                 double now);
/* A report of fragment p based on version `base` was accepted now: the
 * most steps it may claim (and in *by_time the elapsed time's bound alone,
 * INFINITY when none); remembers it as the learner's last report of p. */
double distro__syncer_steps_bound(distro_syncer *s, sy_learner *l, int p, uint64_t base, double now, double *by_time);
/* Fragment p at `version` was sent to the learner. */
void distro__syncer_fragment_sent(distro_syncer *s, sy_learner *l, int p, uint64_t version);
/* After a merge: remembers the kept reports' norms for later bounds. */
void distro__syncer_remember_norms(distro_syncer *s, int p, int n, const double *norm, const int *keep);

#endif
