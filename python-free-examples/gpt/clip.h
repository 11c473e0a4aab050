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

/* gpt_backward_hooked's hook for --clip-per-tensor: each tensor is clipped
 * to max_norm * sqrt(its share of the parameters) and, with opt, marked
 * ready (distro_optim_grad_ready) with lr. */
typedef struct {
  gpt_model *m;
  float max_norm, lr;
  distro_optim *opt; /* NULL: clip only */
  double ss;         /* sum of the tensors' squared norms before clipping */
  distro_status st;  /* the first failure of distro_optim_grad_ready */
  char err[512];
} gpt_clip_each;
void gpt_clip_each_ready(void *ctx, int first, int count);

#endif
