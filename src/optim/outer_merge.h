/* Merging learners' outer gradients and the outer SGD step, shared by the
 * DiLoCo mode (payloads decoded on the fly) and the Decoupled DiLoCo syncer
 * (decoded reports): the rules of docs/diloco.md in one place. */
#ifndef DISTRO_OPTIM_OUTER_MERGE_H
#define DISTRO_OPTIM_OUTER_MERGE_H

#include <stdint.h>
#include <distro/diloco.h>

#include "optim/fragment.h"

/* Weights w_m (sum 1, float64): tokens_m^2 / steps_m for the token merges,
 * uniform otherwise and when every weight is 0. w may alias tokens. */
void distro__outer_weights(distro_merge mode, int n, const double *tokens, const double *steps, double *w);

/* Where the n learners' outer gradients of one fragment come from. Element
 * offsets inside the fragment are piece_elem[q] (as in the merge below). */
typedef struct {
  void *ctx;
  /* out[pieces q0..q1) = sum over learners r, in order, of coef[r] * delta_r */
  void (*accumulate)(void *ctx, int q0, int q1, const float *coef, float *out);
  /* || delta_r || over pieces q0..q1, in float64 and a fixed order */
  double (*norm)(void *ctx, int r, int q0, int q1);
} distro__outer_source;

/* out = the merged outer gradient of fragment p (numel[p] floats): the
 * weighted sum, or for the radial merges, per tensor within the fragment,
 * (sum w_m |delta_m|) * u / |u| with u = sum (w_m / |delta_m|) delta_m,
 * falling back to the weighted sum for tensors flagged
 * DISTRO_DILOCO_PLAIN_MERGE or with a zero or non-finite norm. Scratch:
 * coef 2n floats, nrm n doubles. */
void distro__outer_merge(const distro__fragments *f, const int64_t *piece_elem, const unsigned *tflags, int p,
                         distro_merge mode, int n, const double *w, const distro__outer_source *src, float *out,
                         float *coef, double *nrm);

/* Sum of squares in a fixed order (64 Ki blocks in parallel, then in order). */
double distro__sumsq(const float *x, int64_t n);

/* Outer SGD with momentum on n elements: m' = mu*m + g; theta' = theta -
 * lr*(g + mu*m') (Nesterov) or theta - lr*m'. Writes theta' to new_theta
 * (which may alias g) and m' to new_mom; returns 0 if g, m' or theta' is not
 * finite anywhere (the caller then keeps theta and m). */
int distro__outer_step(const float *theta, const float *mom, const float *g, int64_t n, float lr, float mu,
                       int nesterov, float *new_theta, float *new_mom);

#endif
