/* DisTrO-AdamW's rectified step (step_rule.h; docs/algorithms.md, section 1). */
#include "optim/step_rule.h"

#include <math.h>

double distro__adamw_step_scale(double beta2, int64_t t) {
  /* RAdam (Liu et al., 2019): the length of the second moment's EMA, rho,
   * and its rectification r_t of the adaptive step. A beta2 so small that
   * rho never exceeds 4 leaves nothing to rectify. */
  const double rinf = 2.0 / (1.0 - beta2) - 1.0;
  if (!(rinf > 4.0)) return DISTRO__ADAMW_SIGN_STEP;
  double bt = 1.0, x = beta2; /* beta2^t by squaring: no libm pow, the same bits everywhere */
  for (int64_t e = t; e > 0; e >>= 1) {
    if (e & 1) bt *= x;
    x *= x;
  }
  const double rt = rinf - 2.0 * (double)t * bt / (1.0 - bt);
  if (!(rt > 4.0)) return 0.0;
  return DISTRO__ADAMW_SIGN_STEP * sqrt((rt - 4.0) * (rt - 2.0) * rinf / ((rinf - 4.0) * (rinf - 2.0) * rt));
}

double distro__spread_anchor(double density) {
  /* exact for power-of-two densities: 2 at the defaults' 1/32, 4 at 1/64 */
  const double a = 1.0 / (16.0 * density);
  return a > DISTRO__SPREAD_CALIBRATED ? a : DISTRO__SPREAD_CALIBRATED;
}

double distro__adamw_spread_scale(double s, double anchor) {
  if (!(s > anchor)) return 1.0;
  const double most = DISTRO__SPREAD_GROWTH_MOST * anchor;
  return sqrt((s < most ? s : most) / anchor);
}

float distro__ahead_fraction(double g) { return (float)fmin(1.0, DISTRO__AHEAD_ADAMW * g); }

void distro__ramp_observe(distro__ramp *r, float lr) {
  r->seen++;
  /* The rise ends at the first step whose lr is not above the one before. */
  if (r->rise == 0 && r->seen > 1 && !(lr > r->lr_last)) r->rise = r->seen - 1;
  r->lr_last = lr;
}

double distro__ramp_scale(const distro__ramp *r, int64_t t) {
  const double k = DISTRO__ADAMW_WARMUP_STRETCH;
  if (r->rise == 0 || t <= r->rise) return 1.0 / k; /* within the caller's rise */
  const double f = (double)t / (k * (double)r->rise);
  return f < 1.0 ? f : 1.0;
}
