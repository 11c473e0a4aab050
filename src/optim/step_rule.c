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
