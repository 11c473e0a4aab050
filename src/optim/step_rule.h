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
/* That step for learning rate lr, rounded once to float: what every path
 * (CPU, look-ahead, CUDA) applies. */
static inline float distro__adamw_sign_step(double beta2, int64_t t, float lr) {
  return (float)(distro__adamw_step_scale(beta2, t) * (double)lr);
}

/* Look-ahead overlap: this rank's provisional step while its exchange is in
 * flight, as a fraction of the update's own step (sign: lr; DisTrO-AdamW:
 * its rectified step, distro__adamw_step_scale), along the sign of the
 * rank's whole momentum. 0.75 and 1.0 were compared on the demo model with
 * the rectified step; the runs are in docs/design.md, "Overlap". */
#define DISTRO__AHEAD_SIGN 1.0f
#define DISTRO__AHEAD_ADAMW 0.75f

#endif
