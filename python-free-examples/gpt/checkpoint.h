/* Checkpoints: model parameters, every rank's optimizer state and data RNG,
 * and the step, in one file written by rank 0 (temp file + rename). */
#ifndef GPT_CHECKPOINT_H
#define GPT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include <distro/distro.h>

#include "model.h"

/* What must match for a resume. */
typedef struct {
  gpt_config model;
  int32_t optim, world, topk, chunk, values;
} ckpt_meta;

/* Collective: every rank calls it. Returns -1 on success, else the lowest
 * rank that failed (the same on every rank); that rank's err says why. */
int checkpoint_save(distro_comm *comm, const char *path, const ckpt_meta *meta, int64_t step, const gpt_model *m,
                    const distro_optim *opt, uint64_t rng_state, char *err, size_t errlen);

/* Collective, returns like checkpoint_save. Restores the parameters, this
 * rank's optimizer state (with --clip-per-tensor's shares) and data RNG,
 * and the step. */
int checkpoint_load(distro_comm *comm, const char *path, const ckpt_meta *meta, int64_t *step, gpt_model *m,
                    distro_optim *opt, uint64_t *rng_state, char *err, size_t errlen);

#endif
