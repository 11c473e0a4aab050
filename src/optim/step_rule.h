/* Internal: the size of the step that DeMo and DisTrO-AdamW take, in one
 * place for every path that applies it (the CPU apply, the look-ahead, the
 * CUDA step and the tests that recompute it). */
#ifndef DISTRO_OPTIM_STEP_RULE_H
#define DISTRO_OPTIM_STEP_RULE_H

#include <stdint.h>

/* DisTrO-AdamW's step per element, in units of lr, once the second moment
 * has seen enough steps: p -= DISTRO__ADAMW_SIGN_STEP r_t lr sign(Q), where
 * r_t is RAdam's variance rectification of the second moment at step t
 * (distro__adamw_step_scale; docs/design.md "The step": with r_t the full
 * lr is the step at every size measured, no constant between sizes). */
#define DISTRO__ADAMW_SIGN_STEP 1.0f

/* DISTRO__ADAMW_SIGN_STEP times r_t for the aggregate of step t (1-based):
 * 0 while the second moment's estimate has too few samples for its variance
 * to be defined (t <= 4 at beta2 0.95), rising to 1 as t grows (r_t 0.48 at
 * t = 15, 0.87 at 50, 0.98 at 100 for beta2 0.95). Computed with IEEE
 * multiplies, divides and a square root only, so every rank and device gets
 * the same bits. */
double distro__adamw_step_scale(double beta2, int64_t t);
/* The sign step's own warm-up. A sign step moves every element by its full
 * size from the first steps on, where AdamW's update shrinks as its
 * gradients turn noisy; at a high lr that needs a longer warm-up than
 * AdamW's (docs/design.md, "Across learning rates"). The library cannot
 * see the caller's schedule, only its lr at each step, so it stretches the
 * warm-up it sees: while the caller's lr rises, the step is 1/STRETCH of
 * its size; once the lr stops rising after W steps, the step grows linearly
 * to full size at step STRETCH W. */
#define DISTRO__ADAMW_WARMUP_STRETCH 1.5

typedef struct {
  float lr_last; /* the lr of the latest observed step */
  int64_t seen;  /* steps observed */
  int64_t rise;  /* W, the steps over which the caller's lr rose; 0 while it still rises */
} distro__ramp;

/* Observes the lr of the next step (every step, in order). */
void distro__ramp_observe(distro__ramp *r, float lr);
/* The warm-up factor of step t (1-based): 1/STRETCH within the rise, then
 * t / (STRETCH W) up to 1. The same for any state that has observed step t,
 * so an overlapped step may apply the previous step's aggregate after
 * observing its own lr. */
double distro__ramp_scale(const distro__ramp *r, int64_t t);

/* The sign step spreads one size over every coefficient the aggregate
 * holds, so the share of it each coefficient a rank released gets falls as
 * the union of the ranks' selections grows: about 1/sqrt(u) for u
 * coefficients per tile. Their spread s (distro__aggregate_spread: the
 * distinct coefficients of all live ranks' selections per coefficient one
 * rank selects, so u = s topk) is 1 when every rank picked the same ones
 * and at most the number of live ranks. The step was calibrated at two
 * ranks of topk 32 in 32 x 32 tiles, whose union holds at most a
 * sixteenth of a tile (s <= 2). Above the spread where the union reaches
 * that share, the anchor a, the step grows as sqrt(s / a), so each released
 * coefficient keeps about its calibrated share instead of shrinking with
 * the ranks (docs/design.md, "At 4 and 8 ranks"). For selections that keep
 * `density` of the tiles' coefficients, a = 1 / (16 density): 2 at the
 * defaults, 4 at topk 16 of 32 x 32 tiles, whose coefficients already hold
 * a larger share. Never below 2, so denser selections grow as the defaults
 * do. Exactly 1 for s <= a. The growth stops at s = 2a (four ranks' worth
 * at the defaults, g = sqrt(2)): beyond it the extra distinct coefficients
 * are mostly single ranks' noise, and a step grown with them fell far
 * behind at 12 and 16 ranks (docs/design.md, "Beyond 8 ranks"). */
#define DISTRO__SPREAD_CALIBRATED 2.0
#define DISTRO__SPREAD_GROWTH_MOST 2.0
double distro__spread_anchor(double density);
double distro__adamw_spread_scale(double s, double anchor);

/* That step for learning rate lr, warm-up state r (NULL: none) and the
 * growth g (distro__adamw_spread_scale; 1: none; the look-ahead's
 * provisional step takes the latest committed aggregate's), rounded once
 * to float: what every path (CPU, look-ahead, CUDA) applies. */
static inline float distro__adamw_sign_step(double beta2, int64_t t, float lr, const distro__ramp *r, double g) {
  return (float)(distro__adamw_step_scale(beta2, t) * (r ? distro__ramp_scale(r, t) : 1.0) * g * (double)lr);
}

/* Look-ahead overlap: this rank's provisional step while its exchange is in
 * flight, as a fraction of the update's own step (sign: lr; DisTrO-AdamW:
 * its rectified step grown with the spread, distro__adamw_sign_step), along
 * the sign of the rank's whole momentum. DisTrO-AdamW's fraction is
 * DISTRO__AHEAD_ADAMW where the step is not grown (two ranks) and rises
 * with the growth g to the whole grown step: min(1, 0.75 g), rounded once
 * to float. The runs that chose it are in docs/design.md ("At 4 and 8
 * ranks"). */
#define DISTRO__AHEAD_SIGN 1.0f
#define DISTRO__AHEAD_ADAMW 0.75
float distro__ahead_fraction(double g);

#endif
