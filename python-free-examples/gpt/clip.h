/* Gradient clipping for the trainer: by the global norm once backward is
 * done, or (--clip-per-tensor) each tensor by its own norm as backward
 * completes it, which the gradient-ready exchange needs. */
#ifndef GPT_CLIP_H
#define GPT_CLIP_H

#include <distro/optim.h>

#include "model.h"

/* Global L2 norm of this rank's gradient (returned), clipped to max_norm
 * (0: no clip). Thread-count independent. */
float gpt_clip_global(gpt_model *m, float max_norm);

/* --clip-per-tensor's memory, this rank's own: each tensor's usual share of
 * the squared gradient norm, an EMA (0.9) over the steps starting from its
 * share of the parameters. Checkpoints keep it. */
typedef struct {
  int n;         /* tensors */
  double *share; /* per tensor: the EMA of its squared norm over the whole's */
  double *ss;    /* per tensor: this step's squared norm, before clipping */
} gpt_clip_shares;
/* 0, or -1 when out of memory. */
int gpt_clip_shares_init(gpt_clip_shares *s, const gpt_model *m);
/* After backward: this step's shares enter the EMA (a step whose gradient
 * is all zeros leaves it). Returns the step's squared norm before clipping. */
double gpt_clip_shares_update(gpt_clip_shares *s);
void gpt_clip_shares_free(gpt_clip_shares *s);

/* gpt_backward_hooked's hook for --clip-per-tensor: each tensor is clipped
 * to max_norm * sqrt(its usual share) and, with opt, marked ready
 * (distro_optim_grad_ready) with lr. */
typedef struct {
  gpt_model *m;
  float max_norm, lr;
  distro_optim *opt;       /* NULL: clip only */
  gpt_clip_shares *shares; /* read for the budgets; this step's ss recorded */
  distro_status st;        /* the first failure of distro_optim_grad_ready */
  char err[512];
} gpt_clip_each;
void gpt_clip_each_ready(void *ctx, int first, int count);

#endif
