/* Internal: optimizer state shared by the DeMo and AdamW step files. */
#ifndef DISTRO_OPTIM_INTERNAL_H
#define DISTRO_OPTIM_INTERNAL_H

#include <stdint.h>
#include <distro/optim.h>

#include "compress/chunk.h"
#include "compress/dct.h"
#include "compress/wire.h"

#define DISTRO__MAX_NDIM 8

typedef struct distro__param {
  char *name;
  float *param;
  const float *grad;
  int ndim;
  int64_t shape[DISTRO__MAX_NDIM];
  int64_t numel;
  distro__tiling tiling;
  distro__dct_plan plan;
  float *mom, *mom_next; /* DeMo momentum in the DCT domain; next is staged until commit */
  float *m, *v;          /* AdamW moments */
  uint32_t *idx;         /* this step's selection (DeMo) */
  float *val;
} distro__param;

struct distro_optim {
  distro_options opt;
  distro_comm *comm;
  distro__param *params;
  int nparams, cap;
  int ready;           /* state allocated; tensor list frozen */
  int verified;        /* tensor lists agreed across ranks */
  int64_t step;        /* completed steps */
  int64_t max_numel;
  int64_t total_numel;
  distro__tiling *tilings; /* copy of each param's tiling, for the wire */
  distro__wire_layout layout;
  uint8_t *send, *recv;
  float *scratch_a, *scratch_b, *scratch_c; /* max_numel each */
  uint16_t *counts;                        /* max_numel: selections per coefficient */
  float *flat;                  /* AdamW baseline: all gradients + 1 flag */
};

int distro__uses_adam(const distro_options *o);
distro_status distro__options_check(const distro_options *o);

/* Allocates state once (before the first step or a load). */
distro_status distro__optim_prepare(distro_optim *o);
/* Collective: agrees on the tensor list and on every rank having prepared
 * its state (first step only). */
distro_status distro__optim_verify(distro_optim *o, int local_ok);
/* Index of the first tensor with a non-finite gradient, or -1. */
int distro__first_nonfinite_grad(const distro_optim *o);

/* p <- p(1 - lr wd); m, v <- moments of q; p <- p - lr mhat / (sqrt(vhat) + eps).
 * `t` is the 1-based step for bias correction. Element-wise: deterministic. */
void distro__adamw_update(float *p, float *m, float *v, const float *q, int64_t n, float q_scale,
                          const distro_options *o, float lr, int64_t t);

distro_status distro__demo_step(distro_optim *o, float lr, distro_step_stats *s);
distro_status distro__adamw_step(distro_optim *o, float lr, distro_step_stats *s);

double distro__now(void);

#endif
