/* Gradient clipping for the trainer: the whole gradient's norm, once
 * backward is done. --clip-per-tensor, which the gradient-ready exchange
 * needs, is the library's options.clip_norm. */
#ifndef GPT_CLIP_H
#define GPT_CLIP_H

#include "model.h"

/* Global L2 norm of this rank's gradient (returned), clipped to max_norm
 * (0: no clip). Thread-count independent. */
float gpt_clip_global(gpt_model *m, float max_norm);

#endif
